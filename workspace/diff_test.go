package workspace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/result"
)

// describe renders a change compactly for comparison.
func describe(c result.FileChange) string {
	s := fmt.Sprintf("%s %s %q %s", c.Change, c.Type, c.Path, c.Mode)
	if c.Target != "" {
		s += " -> " + c.Target
	}
	return s
}

func TestDiff(t *testing.T) {
	base := []node{
		dir("d", 0o755), file("d/a.txt", "alpha", 0o644), file("d/b.txt", "bravo", 0o644),
		dir("d/sub", 0o755), file("d/sub/c.txt", "charlie", 0o644),
		file("top.txt", "top", 0o644), link("ln", "top.txt"),
	}
	tests := []struct {
		name   string
		mutate func(t *testing.T, root string) // root is <ws>/proj
		want   []result.FileChange
	}{
		{name: "no change", mutate: func(*testing.T, string) {}},
		{
			name: "added file dir and nested file",
			mutate: func(t *testing.T, root string) {
				build(t, root, file("new.txt", "n", 0o600), dir("nd", 0o700), file("nd/x", "x", 0o644))
			},
			want: []result.FileChange{ch("added", "file", "proj/nd/x", "0644"), ch("added", "dir", "proj/nd", "0700"), ch("added", "file", "proj/new.txt", "0600")},
		},
		{
			name:   "modified content same size",
			mutate: func(t *testing.T, root string) { writeFile(t, root, "d/a.txt", "ALPHA") },
			want:   []result.FileChange{ch("modified", "file", "proj/d/a.txt", "0644")},
		},
		{
			name:   "modified mode",
			mutate: func(t *testing.T, root string) { chmod(t, root, "d/b.txt", 0o600) },
			want:   []result.FileChange{ch("modified", "file", "proj/d/b.txt", "0600")},
		},
		{
			name:   "setuid added is reported",
			mutate: func(t *testing.T, root string) { chmod(t, root, "top.txt", 0o4755) },
			want:   []result.FileChange{ch("modified", "file", "proj/top.txt", "4755")},
		},
		{
			name:   "dir mode change",
			mutate: func(t *testing.T, root string) { chmod(t, root, "d/sub", 0o700) },
			want:   []result.FileChange{ch("modified", "dir", "proj/d/sub", "0700")},
		},
		{
			name:   "deleted file",
			mutate: func(t *testing.T, root string) { rm(t, root, "d/a.txt") },
			want:   []result.FileChange{ch("deleted", "file", "proj/d/a.txt", "0644")},
		},
		{
			name:   "deleted dir with contents",
			mutate: func(t *testing.T, root string) { rm(t, root, "d/sub") },
			want:   []result.FileChange{ch("deleted", "dir", "proj/d/sub", "0755"), ch("deleted", "file", "proj/d/sub/c.txt", "0644")},
		},
		{
			name: "file replaced by dir",
			mutate: func(t *testing.T, root string) {
				rm(t, root, "top.txt")
				build(t, root, dir("top.txt", 0o755), file("top.txt/in", "i", 0o644))
			},
			want: []result.FileChange{ch("modified", "dir", "proj/top.txt", "0755"), ch("added", "file", "proj/top.txt/in", "0644")},
		},
		{
			name: "dir replaced by symlink",
			mutate: func(t *testing.T, root string) {
				rm(t, root, "d/sub")
				build(t, root, link("d/sub", "/etc"))
			},
			want: []result.FileChange{ch("modified", "symlink", "proj/d/sub", "0777", "/etc"), ch("deleted", "file", "proj/d/sub/c.txt", "0644")},
		},
		{
			name: "symlink retargeted",
			mutate: func(t *testing.T, root string) {
				rm(t, root, "ln")
				build(t, root, link("ln", "d/a.txt"))
			},
			want: []result.FileChange{ch("modified", "symlink", "proj/ln", "0777", "d/a.txt")},
		},
		{
			name: "symlink to host not followed",
			mutate: func(t *testing.T, root string) {
				build(t, root, link("etc", "/etc"), link("up", "../../.."))
			},
			want: []result.FileChange{ch("added", "symlink", "proj/etc", "0777", "/etc"), ch("added", "symlink", "proj/up", "0777", "../../..")},
		},
		{
			name: "unicode and odd names",
			mutate: func(t *testing.T, root string) {
				build(t, root, file("héllo wörld.txt", "u", 0o644), file("new\nline", "n", 0o644), file("tab\tname", "t", 0o644),
					file(" lead", "s", 0o644), file("-dash", "d", 0o644), file("*glob?[x]", "g", 0o644), file("\x1b[31mred", "e", 0o644),
					file("bad\xffutf8", "b", 0o644))
			},
			want: []result.FileChange{
				ch("added", "file", "proj/ lead", "0644"), ch("added", "file", "proj/*glob?[x]", "0644"), ch("added", "file", "proj/-dash", "0644"),
				ch("added", "file", "proj/\x1b[31mred", "0644"), ch("added", "file", "proj/bad\xffutf8", "0644"), ch("added", "file", "proj/héllo wörld.txt", "0644"),
				ch("added", "file", "proj/new\nline", "0644"), ch("added", "file", "proj/tab\tname", "0644"),
			},
		},
		{
			name:   "fifo added is other",
			mutate: func(t *testing.T, root string) { build(t, root, fifo("p")) },
			want:   []result.FileChange{ch("added", "other", "proj/p", "0644")},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wsDir, snap := populated(t, base...)
			old := unix.Umask(0)
			tc.mutate(t, filepath.Join(wsDir, "proj"))
			unix.Umask(old)
			changes, err := Diff(wsDir, snap, DiffLimits{})
			if err != nil {
				t.Fatalf("Diff: %v", err)
			}
			want := append([]result.FileChange(nil), tc.want...)
			sort.Slice(want, func(i, j int) bool { return want[i].Path < want[j].Path })
			var got, wantS []string
			for _, c := range changes {
				got = append(got, describe(c))
			}
			for _, c := range want {
				wantS = append(wantS, describe(c))
			}
			if strings.Join(got, "\n") != strings.Join(wantS, "\n") {
				t.Errorf("Diff =\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(wantS, "\n  "))
			}
			for i := 1; i < len(changes); i++ {
				if changes[i-1].Path >= changes[i].Path {
					t.Errorf("not sorted: %q before %q", changes[i-1].Path, changes[i].Path)
				}
			}
			for _, c := range changes {
				if c.Type == "file" && c.Change != result.Deleted {
					b, err := os.ReadFile(filepath.Join(wsDir, c.Path))
					if err != nil {
						t.Fatal(err)
					}
					if c.SHA256 != sum(string(b)) || c.Size != int64(len(b)) {
						t.Errorf("%q: sha %s size %d, want %s %d", c.Path, c.SHA256, c.Size, sum(string(b)), len(b))
					}
				}
			}
		})
	}
}

// ch builds an expected change.
func ch(change, typ, path, mode string, target ...string) result.FileChange {
	c := result.FileChange{Change: result.Change(change), Type: typ, Path: path, Mode: mode}
	if len(target) > 0 {
		c.Target = target[0]
	}
	return c
}

func writeFile(t *testing.T, root, p, data string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, root, p string, mode uint32) {
	t.Helper()
	if err := unix.Chmod(filepath.Join(root, p), mode); err != nil {
		t.Fatal(err)
	}
}

func rm(t *testing.T, root, p string) {
	t.Helper()
	if err := os.RemoveAll(filepath.Join(root, p)); err != nil {
		t.Fatal(err)
	}
}

func TestDiffLimits(t *testing.T) {
	tests := []struct {
		name      string
		src       []node
		mutate    func(t *testing.T, root string)
		lim       DiffLimits
		field     string
		check     func(t *testing.T, changes []result.FileChange)
		wantCount int // -1: don't check
	}{
		{
			name: "max entries stops the walk",
			mutate: func(t *testing.T, root string) {
				for i := range 500 {
					writeFile(t, root, fmt.Sprintf("f%03d", i), "x")
				}
			},
			lim:   DiffLimits{MaxEntries: 50},
			field: "DiffLimits.MaxEntries",
			check: func(t *testing.T, changes []result.FileChange) {
				if len(changes) > 50 {
					t.Errorf("%d changes past MaxEntries 50", len(changes))
				}
			},
		},
		{
			name: "partial walk infers no deletions in unlisted dirs",
			src:  []node{dir("keep", 0), file("keep/a", "a", 0), file("keep/b", "b", 0)},
			mutate: func(t *testing.T, root string) {
				for i := range 300 {
					writeFile(t, root, fmt.Sprintf("zz%03d", i), "x")
				}
			},
			lim:   DiffLimits{MaxEntries: 3},
			field: "DiffLimits.MaxEntries",
			check: func(t *testing.T, changes []result.FileChange) {
				for _, c := range changes {
					if c.Change == result.Deleted {
						t.Errorf("partial walk reported %s", describe(c))
					}
				}
			},
		},
		{
			name: "hash budget: unhashable old file reported modified",
			src:  []node{file("big", strings.Repeat("b", 100), 0), file("small", "s", 0)},
			mutate: func(t *testing.T, root string) {
			},
			lim:   DiffLimits{MaxHashBytes: 10},
			field: "DiffLimits.MaxHashBytes",
			check: func(t *testing.T, changes []result.FileChange) {
				if len(changes) != 1 || changes[0].Path != "proj/big" || changes[0].Change != result.Modified || changes[0].SHA256 != "" {
					t.Errorf("changes = %+v, want proj/big modified with no sha", changes)
				}
			},
		},
		{
			name: "max depth",
			mutate: func(t *testing.T, root string) {
				build(t, root, file("a/b/c/d/e/f/g", "deep", 0))
			},
			lim:   DiffLimits{MaxDepth: 4},
			field: "DiffLimits.MaxDepth",
			check: func(t *testing.T, changes []result.FileChange) {
				for _, c := range changes {
					if strings.Count(c.Path, "/") > 4 {
						t.Errorf("entry deeper than MaxDepth: %q", c.Path)
					}
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wsDir, snap := populated(t, tc.src...)
			tc.mutate(t, filepath.Join(wsDir, "proj"))
			changes, err := Diff(wsDir, snap, tc.lim)
			var le *LimitError
			if !errors.As(err, &le) || le.Field != tc.field {
				t.Fatalf("Diff error = %v, want a LimitError on %s", err, tc.field)
			}
			if v := Violations(err); len(v) == 0 || v[0].Kind != "diff" || !strings.Contains(v[0].Limit, tc.field) {
				t.Errorf("Violations = %+v", v)
			}
			tc.check(t, changes)
		})
	}
}

// TestDiffNilSnapshot checks that with no snapshot every entry is added.
func TestDiffNilSnapshot(t *testing.T) {
	ws := t.TempDir()
	build(t, ws, file("a", "a", 0), dir("d", 0))
	changes, err := Diff(ws, nil, DiffLimits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != 2 || changes[0].Change != result.Added || changes[1].Change != result.Added {
		t.Errorf("changes = %+v, want two added", changes)
	}
}
