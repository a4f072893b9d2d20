package engine

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestSameSource(t *testing.T) {
	bi := func(gover, ldflags, cgo string) *debug.BuildInfo {
		b := &debug.BuildInfo{GoVersion: gover, Main: debug.Module{Path: "github.com/moat-sandbox/moat"}}
		if ldflags != "-" {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: "-ldflags", Value: ldflags})
		}
		b.Settings = append(b.Settings, debug.BuildSetting{Key: "CGO_ENABLED", Value: cgo})
		return b
	}
	const id = "3f2a9c"
	stamped := sourceIDFlag + id
	otherModule := bi("go1.26.8", stamped, "0")
	otherModule.Main.Path = "example.com/fork"
	tests := []struct {
		name  string
		guest *debug.BuildInfo
		want  string // substring of the error; "" for a match
	}{
		{"same source", bi("go1.26.8", stamped, "0"), ""},
		{"same source, more flags", bi("go1.26.8", "-s -w "+stamped+" -X main.version=v1", "0"), ""},
		{"other source", bi("go1.26.8", sourceIDFlag+"77aa01", "0"), "other source"},
		{"a prefix of the id", bi("go1.26.8", sourceIDFlag+"3f2a9", "0"), "other source"},
		{"no source id", bi("go1.26.8", "-", "0"), "no source ID"},
		{"another Go", bi("go1.26.7", stamped, "0"), "built with go1.26.7"},
		{"another module", otherModule, "module"},
		{"cgo", bi("go1.26.8", stamped, "1"), "cgo"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := sameSource(id, "go1.26.8", tc.guest)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("want a match, got %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("want an error with %q, got %v", tc.want, err)
			}
		})
	}
	if err := checkGuest("/nonexistent", "", "go1.26.8"); err == nil || !strings.Contains(err.Error(), "no source ID") {
		t.Errorf("a moat without a source id must never use moat-guest: %v", err)
	}
}

// TestCheckGuestOwnership: a guest binary that someone other than root
// could replace is never used, whatever it was built from.
func TestCheckGuestOwnership(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the check is about root-owned files")
	}
	open, err := os.MkdirTemp("/var/cache", "moat-guest-open-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(open)
	os.Chmod(open, 0o777) // writable by all, and not sticky
	// Below /var/cache (root's, 0755) for the cases that must fail on the
	// file itself.
	safe, err := os.MkdirTemp("/var/cache", "moat-guest-test-")
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
		{"in a world-writable directory", write(filepath.Join(open, "x"), 0o755), "writable by group or others"},
		{"a symlink", func() string { p := filepath.Join(safe, "l"); os.Symlink(self, p); return p }(), "not a regular file"},
		{"missing", filepath.Join(safe, "none"), "not installed"},
		{"relative", "moat-guest", "not an absolute path"},
		{"a test binary: no source id", write(filepath.Join(safe, "ok"), 0o755), "no source ID"},
		{"below sticky /tmp: no source id", func() string {
			d := t.TempDir()
			os.Chmod(filepath.Dir(d), 0o755)
			os.Chmod(d, 0o755)
			return write(filepath.Join(d, "ok"), 0o755)
		}(), "no source ID"},
		{"not executable by others", write(filepath.Join(safe, "x700"), 0o700), "not executable by others"},
		{"in a directory others cannot search", func() string {
			d := filepath.Join(safe, "closed")
			os.Mkdir(d, 0o700)
			return write(filepath.Join(d, "ok"), 0o755)
		}(), "not searchable by others"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkGuest(tc.path, "some-id", "go1.26.8")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("checkGuest(%s) = %v, want an error with %q", tc.path, err, tc.want)
			}
		})
	}
}

func TestPickGuest(t *testing.T) {
	errUntrusted := errors.New("untrusted")
	errMissing := errors.New("missing")
	tests := []struct {
		name    string
		cands   []string
		verdict map[string]error // nil: accepted
		want    string
		wantErr error
	}{
		{name: "beside moat", cands: []string{"/usr/lib/moat/moat-guest", "/usr/local/lib/moat/moat-guest"}, want: "/usr/lib/moat/moat-guest"},
		{name: "beside moat missing: the default", cands: []string{"/usr/lib/moat/moat-guest", "/usr/local/lib/moat/moat-guest"},
			verdict: map[string]error{"/usr/lib/moat/moat-guest": errMissing}, want: "/usr/local/lib/moat/moat-guest"},
		{name: "beside moat untrusted: the default", cands: []string{"/tmp/lib/moat/moat-guest", "/usr/local/lib/moat/moat-guest"},
			verdict: map[string]error{"/tmp/lib/moat/moat-guest": errUntrusted}, want: "/usr/local/lib/moat/moat-guest"},
		{name: "none: the first reason", cands: []string{"/a", "/b"},
			verdict: map[string]error{"/a": errUntrusted, "/b": errMissing}, wantErr: errUntrusted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := pickGuest(tc.cands, func(p string) error { return tc.verdict[p] })
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Errorf("pickGuest = %q, %v; want %q, %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
