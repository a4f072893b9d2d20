package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/image"
)

// storedHome returns a MOAT_HOME whose store holds the build of name
// made from content, current or not, as a build or import leaves it.
func storeBuild(t *testing.T, home, name, content string, current bool) string {
	t.Helper()
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "tool"), []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	digest, size, err := image.TreeDigest(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	dir := filepath.Join(home, "images", name, hexDigest)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rootfs, filepath.Join(dir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf(`{"name":%q,"digest":%q,"size":%d,"env":["PATH=/bin"],"built":"2026-12-01T10:00:00Z"}`, name, digest, size)
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	if current {
		if err := os.Symlink(hexDigest, filepath.Join(home, "images", name, "current")); err != nil {
			t.Fatal(err)
		}
	}
	return digest
}

func TestImageStoreCommands(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name    string
		args    []string
		code    int
		wantOut []string
		wantErr []string
		// after checks the store once the command ran.
		after func(t *testing.T, home string, old, cur string)
	}{
		{name: "list shows size, created and current", args: []string{"image", "list"}, wantOut: []string{"NAME", "nodeapp", "sha256:", "B ", "2026-12-01", "current", "no"}},
		{name: "inspect prints JSON", args: []string{"image", "inspect", "nodeapp"}, wantOut: []string{`"name": "nodeapp"`, `"files": 2`, `"current": true`, `"created": "2026-12-01T10:00:00Z"`, `"env"`}},
		{name: "inspect unknown names it and the known ones", args: []string{"image", "inspect", "cobol"}, code: exitUsage, wantErr: []string{`"cobol"`, "nodeapp", "python"}},
		{name: "rm without a name", args: []string{"image", "rm"}, code: exitUsage, wantErr: []string{"name one image"}},
		{name: "rm the default image needs --force", args: []string{"image", "rm", "python"}, code: exitUsage, wantErr: []string{"--force"}},
		{name: "rm of an image not stored", args: []string{"image", "rm", "--force", "ruby"}, code: exitUsage, wantErr: []string{"ruby", "stored images: nodeapp"}},
		{name: "rm removes every build", args: []string{"image", "rm", "nodeapp"}, wantOut: []string{"removed nodeapp", "freed"},
			after: func(t *testing.T, home, old, cur string) {
				for _, d := range []string{old, cur} {
					if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(d, "sha256:"))); !os.IsNotExist(err) {
						t.Errorf("build %s still there after rm (%v)", d, err)
					}
				}
			}},
		{name: "gc removes the old build and keeps the current one", args: []string{"image", "gc"}, wantOut: []string{"removed nodeapp", "removed 1 unused builds", "freed"},
			after: func(t *testing.T, home, old, cur string) {
				if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(old, "sha256:"))); !os.IsNotExist(err) {
					t.Errorf("old build still there after gc (%v)", err)
				}
				if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(cur, "sha256:"))); err != nil {
					t.Errorf("current build gone after gc: %v", err)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			if err := os.Chmod(home, 0o711); err != nil {
				t.Fatal(err)
			}
			old := storeBuild(t, home, "nodeapp", "v1", false)
			cur := storeBuild(t, home, "nodeapp", "v2", true)
			if err := os.Chmod(filepath.Join(home, "images"), 0o700); err != nil {
				t.Fatal(err)
			}
			out := moat(t, invocation{args: tc.args, env: []string{"MOAT_HOME=" + home}})
			out.check(t, tc.code, tc.wantOut, tc.wantErr, nil)
			if tc.name == "inspect prints JSON" {
				var v map[string]any
				if err := json.Unmarshal([]byte(out.stdout), &v); err != nil {
					t.Errorf("inspect output is not JSON: %v", err)
				}
			}
			if tc.after != nil {
				tc.after(t, home, old, cur)
			}
		})
	}
}

// diskPath is where the microVM tier keeps the root disk of digest
// (tier/microvm/disks.go).
func diskPath(home, digest string) string {
	return filepath.Join(home, "microvm", "images", strings.TrimPrefix(digest, "sha256:")+".ext4")
}

// TestImageMicroVMDisks: `moat image gc` and `moat image rm` remove the
// microVM tier's disks of builds no longer stored, and keep the others,
// those a sandbox holds and the directories of builds still running.
func TestImageMicroVMDisks(t *testing.T) {
	needRoot(t)
	gone := "sha256:" + strings.Repeat("d", 64) // an image removed before disks were pruned
	tests := []struct {
		name  string
		args  []string
		code  int
		setup func(t *testing.T, home string, disk map[string]string)
		// removed and kept name disks: "old" (of the build gc prunes),
		// "cur" (of the current build), "gone" (of no stored build).
		removed, kept []string
		// staleBuildGone: the abandoned disk build is removed (a young
		// one, maybe still running, never is).
		staleBuildGone   bool
		wantOut, wantErr []string
	}{
		{name: "gc removes the disks of builds no longer stored, those it prunes too", args: []string{"image", "gc"},
			removed: []string{"old", "gone"}, kept: []string{"cur"}, staleBuildGone: true,
			wantOut: []string{"removed abandoned microVM disk build", "removed 1 unused builds, 1 abandoned builds, 2 microVM disks", "8.0 KiB"}},
		{name: "gc keeps a disk a live sandbox holds", args: []string{"image", "gc"},
			setup: func(t *testing.T, home string, disk map[string]string) {
				f, err := os.Open(disk["gone"])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
					t.Fatal(err)
				}
			},
			removed: []string{"old"}, kept: []string{"cur", "gone"}, staleBuildGone: true,
			wantOut: []string{"1 microVM disks"}},
		{name: "rm removes the disks of its builds, no other", args: []string{"image", "rm", "nodeapp"},
			removed: []string{"old", "cur"}, kept: []string{"gone"}, wantOut: []string{"freed"}},
		{name: "rm keeps a disk another image's build has", args: []string{"image", "rm", "nodeapp"},
			setup: func(t *testing.T, home string, disk map[string]string) {
				storeBuild(t, home, "twin", "v2", true) // nodeapp's current, under another name
			},
			removed: []string{"old"}, kept: []string{"cur", "gone"}},
		{name: "gc removes no disk when the store cannot be read", args: []string{"image", "gc"}, code: exitMoat,
			setup: func(t *testing.T, home string, disk map[string]string) {
				if err := os.RemoveAll(filepath.Join(home, "images")); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(home, "images"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			kept: []string{"old", "cur", "gone"}, staleBuildGone: true, wantErr: []string{"prune microVM disks: which images are stored"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			if err := os.Chmod(home, 0o711); err != nil {
				t.Fatal(err)
			}
			disk := map[string]string{
				"old":  diskPath(home, storeBuild(t, home, "nodeapp", "v1", false)),
				"cur":  diskPath(home, storeBuild(t, home, "nodeapp", "v2", true)),
				"gone": diskPath(home, gone),
			}
			if err := os.Chmod(filepath.Join(home, "images"), 0o700); err != nil {
				t.Fatal(err)
			}
			for _, p := range disk {
				if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(strings.Repeat("x", 8192)), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// Disk builds: one killed an hour ago, one that may be running.
			stale := filepath.Join(filepath.Dir(disk["gone"]), ".tmp-aaaaaaaaaaaaaaaa-1")
			young := filepath.Join(filepath.Dir(disk["gone"]), ".tmp-bbbbbbbbbbbbbbbb-2")
			for _, d := range []string{stale, young} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(d, "root.ext4"), []byte("half"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			hourAgo := time.Now().Add(-time.Hour)
			if err := os.Chtimes(stale, hourAgo, hourAgo); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(t, home, disk)
			}
			out := moat(t, invocation{args: tc.args, env: []string{"MOAT_HOME=" + home}})
			out.check(t, tc.code, tc.wantOut, tc.wantErr, nil)
			for _, k := range tc.removed {
				if _, err := os.Lstat(disk[k]); !os.IsNotExist(err) {
					t.Errorf("the %s disk is still there (%v)", k, err)
				}
				digest := "sha256:" + strings.TrimSuffix(filepath.Base(disk[k]), ".ext4")
				if !strings.Contains(out.stdout, "removed microVM disk "+digest) {
					t.Errorf("stdout does not say the %s disk %s was removed", k, digest)
				}
			}
			for _, k := range tc.kept {
				if _, err := os.Lstat(disk[k]); err != nil {
					t.Errorf("the %s disk is gone: %v", k, err)
				}
			}
			if _, err := os.Lstat(stale); os.IsNotExist(err) != tc.staleBuildGone {
				t.Errorf("abandoned disk build gone = %v, want %v", os.IsNotExist(err), tc.staleBuildGone)
			}
			if _, err := os.Lstat(young); err != nil {
				t.Errorf("young disk build gone: %v", err)
			}
		})
	}
}
