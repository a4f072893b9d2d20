package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/cgroup"
)

// These tests run the tier's cgroup handling for both cgroup versions
// against a fake cgroupfs in a temporary directory: runsc finds cgroups by
// path, so paths are all there is to check. (The host these were written
// on is cgroup v1; the v2 path runs for real only on a v2 host.)

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupsPathV2(t *testing.T) {
	root := t.TempDir()
	tests := []struct {
		name string
		dir  string
		want string // "" means an error
	}{
		{"at the top", filepath.Join(root, "moat", "r1"), "/moat/r1"},
		{"below moat's own cgroup (a systemd unit, a container)", filepath.Join(root, "system.slice", "moat.service", "moat", "r1"), "/system.slice/moat.service/moat/r1"},
		{"outside the hierarchy runsc reads", "/elsewhere/moat/r1", ""},
		{"escaping it", filepath.Join(root, "..", "moat", "r1"), ""},
		{"the root itself", root, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cgroupsPathAt(root, cgroup.V2, "r1", []string{tc.dir})
			switch {
			case tc.want == "" && err == nil:
				t.Errorf("accepted %s as %q", tc.dir, got)
			case tc.want != "" && (err != nil || got != tc.want):
				t.Errorf("cgroupsPath(%s) = %q, %v; want %q", tc.dir, got, err, tc.want)
			}
		})
	}
	if _, err := cgroupsPathAt(root, cgroup.V2, "r1", nil); err == nil {
		t.Error("accepted a cgroup without directories")
	}
}

func TestCgroupsPathV1(t *testing.T) {
	root := t.TempDir()
	var dirs []string
	for _, ctl := range moatV1Controllers {
		dirs = append(dirs, filepath.Join(root, ctl, "moat", "r1"))
	}
	mkdirs(t, dirs...)
	if got, err := cgroupsPathAt(root, cgroup.V1, "r1", dirs); err != nil || got != "/moat/r1" {
		t.Errorf("cgroupsPath = %q, %v; want /moat/r1", got, err)
	}
	// A controller co-mounted elsewhere: runsc would put the sandbox in a
	// directory that is not the run's.
	other := t.TempDir()
	moved := append([]string{}, dirs...)
	moved[1] = filepath.Join(other, "memory", "moat", "r1")
	mkdirs(t, moved[1])
	if _, err := cgroupsPathAt(root, cgroup.V1, "r1", moved); err == nil || !strings.Contains(err.Error(), "not the run's cgroup") {
		t.Errorf("a controller runsc would not find was accepted: %v", err)
	}
	if err := os.Remove(filepath.Join(root, "pids", "moat", "r1")); err != nil {
		t.Fatal(err)
	}
	if _, err := cgroupsPathAt(root, cgroup.V1, "r1", dirs); err == nil {
		t.Error("a missing controller directory was accepted")
	}
}

// TestForeignCgroups: on v1 runsc creates moat/<id> in the hierarchies
// Moat does not use, and the tier removes them when runsc did not; on v2
// runsc creates nothing, and the tier must touch nothing.
func TestForeignCgroups(t *testing.T) {
	for _, v := range []cgroup.Version{cgroup.V1, cgroup.V2} {
		t.Run(v.String(), func(t *testing.T) {
			root := t.TempDir()
			// r1's own cgroup exists (a live run); r2's is gone (killed).
			mkdirs(t, filepath.Join(root, "freezer", "moat", "r1"), filepath.Join(root, "moat", "r1"))
			for _, ctl := range []string{"blkio", "devices", "systemd"} {
				mkdirs(t, filepath.Join(root, ctl, "moat", "r1"), filepath.Join(root, ctl, "moat", "r2"))
			}
			if v == cgroup.V2 {
				if d := foreignDirs(root, v, "r1"); d != nil {
					t.Errorf("foreign dirs on v2: %v", d)
				}
			} else if d := foreignDirs(root, v, "r1"); len(d) != len(runscV1Controllers)-len(moatV1Controllers) {
				t.Errorf("foreign dirs on v1: %v", d)
			}
			pruneForeignAt(root, v)
			for _, ctl := range []string{"blkio", "devices", "systemd"} {
				r1, r2 := exists(filepath.Join(root, ctl, "moat", "r1")), exists(filepath.Join(root, ctl, "moat", "r2"))
				if !r1 {
					t.Errorf("%s: the live run's cgroup was pruned", ctl)
				}
				if want := v == cgroup.V2; r2 != want {
					t.Errorf("%s: orphan r2 exists=%v after prune, want %v", ctl, r2, want)
				}
			}
			if err := removeForeign(root, v, "r1"); err != nil {
				t.Fatal(err)
			}
			for _, ctl := range []string{"blkio", "devices", "systemd"} {
				if got, want := exists(filepath.Join(root, ctl, "moat", "r1")), v == cgroup.V2; got != want {
					t.Errorf("%s: r1 exists=%v after removeForeign, want %v", ctl, got, want)
				}
			}
			// Moat's own directories are package cgroup's, never these
			// functions'.
			for _, d := range []string{filepath.Join(root, "freezer", "moat", "r1"), filepath.Join(root, "moat", "r1")} {
				if !exists(d) {
					t.Errorf("%s was removed", d)
				}
			}
		})
	}
}

func TestCheckUnified(t *testing.T) {
	if err := checkUnified(t.TempDir()); err == nil || !strings.Contains(err.Error(), "another file system") {
		t.Errorf("a plain directory passed as the cgroup2 mount: %v", err)
	}
	if err := checkUnified(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing directory passed as the cgroup2 mount")
	}
}
