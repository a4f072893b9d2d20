package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFilesSymlinkEscape: a path that leads out of the workspace through
// a link the sandbox planted is refused as the caller's bad path
// (ErrBadPath: the API's 400), never followed, and not reported as the
// host failing (a 500).
func TestFilesSymlinkEscape(t *testing.T) {
	ws := t.TempDir()
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o644)
	for name, target := range map[string]string{"out": outside, "up": "../..", "loop": "loop"} {
		if err := os.Symlink(target, filepath.Join(ws, name)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(ws, "a.txt"), []byte("a"), 0o644)
	f, err := OpenFiles(ws, Owner{UID: os.Getuid(), GID: os.Getgid()}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tests := []struct {
		name string
		op   func() error
	}{
		{"stat through a link out", func() error { _, err := f.Stat("out/secret"); return err }},
		{"stat through a relative link up", func() error { _, err := f.Stat("up/etc"); return err }},
		{"open through a link out", func() error { _, _, err := f.Open("out/secret"); return err }},
		{"list through a link out", func() error { _, err := f.ReadDir("out/"); return err }},
		{"write through a link out", func() error { _, err := f.WriteFile("out/new", strings.NewReader("x"), 0o644); return err }},
		{"mkdir through a link out", func() error { return f.MakeDir("out/d") }},
		{"remove through a link out", func() error { return f.Remove("out/secret") }},
		{"rename into a link out", func() error { return f.Rename("a.txt", "out/a.txt") }},
		{"open a link loop", func() error { _, _, err := f.Open("loop/x"); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, ErrBadPath) {
				t.Errorf("err = %v, want ErrBadPath", err)
			}
		})
	}
	if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "host" {
		t.Errorf("the file outside: %q, %v", b, err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("something was created outside: %v", ents)
	}
	// What is inside still works, and a missing file is still missing.
	if _, err := f.Stat("a.txt"); err != nil {
		t.Errorf("stat a.txt: %v", err)
	}
	if _, err := f.Stat("missing"); !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrBadPath) {
		t.Errorf("stat missing: %v, want not-exist", err)
	}
}
