package idshift

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const base = 0x72000000 + 7*Range

func ids(t *testing.T, p string) (int, int) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return int(st.Uid), int(st.Gid)
}

// tree builds root with entries of several owners, a hard link, a setuid
// file and a symlink to a host file outside root.
func tree(t *testing.T) (root, outside string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "root")
	outside = filepath.Join(dir, "outside")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "home/user"), 0o755))
	must(os.WriteFile(outside, []byte("x"), 0o600))
	must(os.WriteFile(filepath.Join(root, "bin"), []byte("x"), 0o755))
	must(os.WriteFile(filepath.Join(root, "home/user/f"), []byte("x"), 0o644))
	must(os.Link(filepath.Join(root, "home/user/f"), filepath.Join(root, "hard")))
	must(os.WriteFile(filepath.Join(root, "suid"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(root, "suid"), 0o4755|os.ModeSetuid))
	must(os.Symlink(outside, filepath.Join(root, "link")))
	must(os.Lchown(filepath.Join(root, "home/user"), 1000, 1000))
	must(os.Lchown(filepath.Join(root, "home/user/f"), 1000, 100))
	return root, outside
}

func TestShift(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lchown to other ids")
	}
	tests := []struct {
		name string
		// in is the shifted tree's expected owners; out after Out.
		path    string
		in, out [2]int
	}{
		{"root dir", "", [2]int{base, base}, [2]int{0, 0}},
		{"root's file", "bin", [2]int{base, base}, [2]int{0, 0}},
		{"user's dir", "home/user", [2]int{base + 1000, base + 1000}, [2]int{1000, 1000}},
		{"hard-linked file, mapped once", "hard", [2]int{base + 1000, base + 100}, [2]int{1000, 100}},
		{"symlink itself", "link", [2]int{base, base}, [2]int{0, 0}},
	}
	root, outside := tree(t)
	if err := In(root, base); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run("in/"+tc.name, func(t *testing.T) {
			if u, g := ids(t, filepath.Join(root, tc.path)); [2]int{u, g} != tc.in {
				t.Errorf("owned by %d:%d, want %v", u, g, tc.in)
			}
		})
	}
	if u, _ := ids(t, outside); u != 0 {
		t.Errorf("the file outside, named by a link, was shifted to %d", u)
	}
	if err := Out(root, base); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run("out/"+tc.name, func(t *testing.T) {
			if u, g := ids(t, filepath.Join(root, tc.path)); [2]int{u, g} != tc.out {
				t.Errorf("owned by %d:%d, want %v", u, g, tc.out)
			}
		})
	}
	if fi, _ := os.Lstat(filepath.Join(root, "suid")); fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("the setuid bit was lost: %v", fi.Mode())
	}
}

func TestShiftRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lchown to other ids")
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, root string) string // returns the root to pass
		want  string
	}{
		{"id beyond the range", func(t *testing.T, root string) string {
			os.Lchown(filepath.Join(root, "bin"), 70000, 0)
			return root
		}, "owned by id 70000"},
		{"root is a symlink", func(t *testing.T, root string) string {
			l := filepath.Join(t.TempDir(), "l")
			os.Symlink(root, l)
			return l
		}, "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, _ := tree(t)
			err := In(tc.setup(t, root), base)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
			Out(root, base)
		})
	}
}

func TestRestore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: lchown to other ids")
	}
	tests := []struct {
		name   string
		marked bool
		gone   bool
	}{
		{"shifted tree of a dead run", true, false},
		{"no record", false, false},
		{"tree removed since", true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root, _ := tree(t)
			state := t.TempDir()
			if tc.marked {
				if err := Mark(state, root, base); err != nil {
					t.Fatal(err)
				}
				if err := In(root, base); err != nil {
					t.Fatal(err)
				}
			}
			if tc.gone {
				os.RemoveAll(root)
			}
			if _, err := Restore(state); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(state, markerName)); err == nil {
				t.Error("the record is left")
			}
			if !tc.gone {
				if u, _ := ids(t, filepath.Join(root, "bin")); u != 0 {
					t.Errorf("bin owned by %d after Restore", u)
				}
			}
		})
	}
}
