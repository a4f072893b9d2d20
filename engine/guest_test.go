package engine

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestSameSource(t *testing.T) {
	bi := func(gover, rev, modified, cgo string) *debug.BuildInfo {
		b := &debug.BuildInfo{GoVersion: gover, Main: debug.Module{Path: "github.com/moat-sandbox/moat"}}
		for k, v := range map[string]string{"vcs.revision": rev, "vcs.modified": modified, "CGO_ENABLED": cgo} {
			if v != "-" {
				b.Settings = append(b.Settings, debug.BuildSetting{Key: k, Value: v})
			}
		}
		return b
	}
	clean := bi("go1.26.8", "abc123", "false", "0")
	other := bi("go1.26.8", "def456", "false", "0")
	otherModule := bi("go1.26.8", "abc123", "false", "0")
	otherModule.Main.Path = "example.com/fork"
	tests := []struct {
		name        string
		self, guest *debug.BuildInfo
		want        string // substring of the error; "" for a match
	}{
		{"same clean commit", clean, clean, ""},
		{"another commit", clean, other, "revision def456"},
		{"another Go", clean, bi("go1.26.7", "abc123", "false", "0"), "built with go1.26.7"},
		{"another module", clean, otherModule, "module"},
		{"moat from a modified tree", bi("go1.26.8", "abc123", "true", "0"), clean, "uncommitted"},
		{"guest from a modified tree", clean, bi("go1.26.8", "abc123", "true", "0"), "uncommitted"},
		{"moat without VCS", bi("go1.26.8", "-", "-", "0"), clean, "no VCS revision"},
		{"guest without VCS", clean, bi("go1.26.8", "-", "-", "0"), "revision"},
		{"guest with cgo", clean, bi("go1.26.8", "abc123", "false", "1"), "cgo"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := sameSource(tc.self, tc.guest)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("want a match, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
}

// TestCheckGuestOwnership: a guest binary that someone other than root
// could replace is never used, whatever it was built from.
func TestCheckGuestOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is about root-owned files")
	}
	dir := t.TempDir() // below the world-writable /tmp
	// Below /var/tmp (sticky and world-writable too) for the cases that
	// must fail on the file itself, before any directory is looked at.
	safe, err := os.MkdirTemp("/var/tmp", "moat-guest-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(safe)
	os.Chmod(safe, 0o755)
	self, _ := os.Executable()
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	write := func(p string, mode os.FileMode) string {
		if err := os.WriteFile(p, b, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	tests := []struct {
		name, path, want string
	}{
		{"group-writable file", write(filepath.Join(safe, "gw"), 0o775), "writable by group or others"},
		{"not owned by root", func() string { p := write(filepath.Join(safe, "u"), 0o755); os.Chown(p, 1000, 1000); return p }(), "not owned by root"},
		{"in a world-writable directory", write(filepath.Join(dir, "x"), 0o755), "writable by group or others"},
		{"a symlink", func() string { p := filepath.Join(safe, "l"); os.Symlink(self, p); return p }(), "not a regular file"},
		{"missing", filepath.Join(safe, "none"), "not installed"},
		{"relative", "moat-guest", "not an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkGuest(tc.path, bi)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkGuest(%s) = %v, want an error with %q", tc.path, err, tc.want)
			}
		})
	}
}
