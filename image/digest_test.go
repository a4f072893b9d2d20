package image

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// writeTree creates a small tree: files, a nested directory, an empty
// directory and a relative symlink.
func writeTree(t *testing.T, dir string) {
	t.Helper()
	mustWrite(t, filepath.Join(dir, "a.txt"), "alpha\n", 0o644)
	mustWrite(t, filepath.Join(dir, "sub", "b.sh"), "#!/bin/sh\necho b\n", 0o755)
	if err := os.MkdirAll(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
}

func mustWrite(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	// WriteFile is subject to umask; tests compare modes, so pin them.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func mustDigest(t *testing.T, dir string) string {
	t.Helper()
	d, _, err := TreeDigest(dir)
	if err != nil {
		t.Fatalf("TreeDigest(%s): %v", dir, err)
	}
	return d
}

func TestTreeDigest(t *testing.T) {
	tests := []struct {
		name     string
		mutate   func(t *testing.T, dir string)
		wantSame bool
		needRoot bool
	}{
		{name: "identical copy", mutate: func(*testing.T, string) {}, wantSame: true},
		{
			name: "mtime change is ignored",
			mutate: func(t *testing.T, dir string) {
				old := time.Unix(1, 0)
				if err := os.Chtimes(filepath.Join(dir, "a.txt"), old, old); err != nil {
					t.Fatal(err)
				}
			},
			wantSame: true,
		},
		{
			name: "content change",
			mutate: func(t *testing.T, dir string) {
				mustWrite(t, filepath.Join(dir, "a.txt"), "alphA\n", 0o644)
			},
		},
		{
			name: "same size content change",
			mutate: func(t *testing.T, dir string) {
				mustWrite(t, filepath.Join(dir, "sub", "b.sh"), "#!/bin/sh\necho c\n", 0o755)
			},
		},
		{
			name: "mode change",
			mutate: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "a.txt"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "setuid bit",
			mutate: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "sub", "b.sh"), 0o755|os.ModeSetuid); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "directory mode change",
			mutate: func(t *testing.T, dir string) {
				if err := os.Chmod(filepath.Join(dir, "empty"), 0o700); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "symlink target change",
			mutate: func(t *testing.T, dir string) {
				p := filepath.Join(dir, "link")
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("sub/b.sh", p); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "symlink replaced by its target's content",
			mutate: func(t *testing.T, dir string) {
				p := filepath.Join(dir, "link")
				if err := os.Remove(p); err != nil {
					t.Fatal(err)
				}
				mustWrite(t, p, "alpha\n", 0o644)
			},
		},
		{
			name: "rename",
			mutate: func(t *testing.T, dir string) {
				if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "c.txt")); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "new empty directory",
			mutate: func(t *testing.T, dir string) {
				if err := os.Mkdir(filepath.Join(dir, "empty", "more"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "new empty file",
			mutate: func(t *testing.T, dir string) {
				mustWrite(t, filepath.Join(dir, "empty", "f"), "", 0o644)
			},
		},
		{
			name: "owner change",
			mutate: func(t *testing.T, dir string) {
				if err := os.Lchown(filepath.Join(dir, "a.txt"), 1000, 1000); err != nil {
					t.Fatal(err)
				}
			},
			needRoot: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needRoot && os.Geteuid() != 0 {
				t.Skip("needs root: chown to another uid")
			}
			base, other := t.TempDir(), t.TempDir()
			writeTree(t, base)
			writeTree(t, other)
			tc.mutate(t, other)
			a, b := mustDigest(t, base), mustDigest(t, other)
			if (a == b) != tc.wantSame {
				var la, lb bytes.Buffer
				WriteListing(&la, base)
				WriteListing(&lb, other)
				t.Errorf("same digest = %v, want %v\nbase:\n%s\nother:\n%s", a == b, tc.wantSame, la.String(), lb.String())
			}
			if !strings.HasPrefix(a, "sha256:") || len(a) != len("sha256:")+64 {
				t.Errorf("digest %q is not sha256:<64 hex>", a)
			}
		})
	}
}

// TestTreeDigestNeverFollowsSymlinks changes what links point at, outside
// the tree, and expects the digest not to notice: links are hashed as their
// target string, never through it.
func TestTreeDigestNeverFollowsSymlinks(t *testing.T) {
	outside := t.TempDir()
	mustWrite(t, filepath.Join(outside, "secret"), "host data\n", 0o600)
	mustWrite(t, filepath.Join(outside, "dir", "x"), "x\n", 0o644)

	tree := t.TempDir()
	for name, target := range map[string]string{
		"abs-file": filepath.Join(outside, "secret"),
		"abs-dir":  filepath.Join(outside, "dir"),
		"dangling": "/nonexistent/path",
		"loop":     "loop",
	} {
		if err := os.Symlink(target, filepath.Join(tree, name)); err != nil {
			t.Fatal(err)
		}
	}
	before := mustDigest(t, tree)

	mustWrite(t, filepath.Join(outside, "secret"), "changed host data\n", 0o600)
	mustWrite(t, filepath.Join(outside, "dir", "y"), "new file\n", 0o644)
	if after := mustDigest(t, tree); after != before {
		t.Errorf("digest changed from %s to %s when only link targets outside the tree changed", before, after)
	}

	var listing bytes.Buffer
	size, err := WriteListing(&listing, tree)
	if err != nil {
		t.Fatal(err)
	}
	if size != 0 {
		t.Errorf("size = %d, want 0: a tree of symlinks has no regular file content", size)
	}
	if strings.Contains(listing.String(), `"abs-dir/x"`) {
		t.Errorf("listing descended into a symlinked directory:\n%s", listing.String())
	}
}

// TestWriteListingQuotesNames checks that a file name with a newline cannot
// forge an extra listing line.
func TestWriteListingQuotesNames(t *testing.T) {
	tree := t.TempDir()
	mustWrite(t, filepath.Join(tree, "evil\n\"x\" f 0644 0 0 0 -"), "", 0o644)
	var listing bytes.Buffer
	if _, err := WriteListing(&listing, tree); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(listing.String(), "\n"); got != 2 {
		t.Errorf("listing has %d lines, want 2 (root and one file):\n%s", got, listing.String())
	}
}

func TestDevNumbers(t *testing.T) {
	tests := []struct {
		name         string
		dev          uint64
		major, minor uint64
	}{
		{"null", 0x0103, 1, 3},
		{"large minor", 0x0000_0000_0010_0f01, 15, 0x101},
		{"large major", 0x0000_1000_0000_0000, 0x1000, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := devMajor(tc.dev); got != tc.major {
				t.Errorf("devMajor(%#x) = %d, want %d", tc.dev, got, tc.major)
			}
			if got := devMinor(tc.dev); got != tc.minor {
				t.Errorf("devMinor(%#x) = %d, want %d", tc.dev, got, tc.minor)
			}
		})
	}
}
