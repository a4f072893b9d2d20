package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
)

// node describes one entry of a test tree.
type node struct {
	path string
	kind string // "file", "dir", "symlink", "fifo", "hardlink" (target = existing path)
	data string
	mode uint32 // raw permission bits incl. setuid etc.; 0 means 0644 / 0755
	tgt  string
}

func file(p, data string, mode uint32) node {
	return node{path: p, kind: "file", data: data, mode: mode}
}
func dir(p string, mode uint32) node { return node{path: p, kind: "dir", mode: mode} }
func link(p, target string) node     { return node{path: p, kind: "symlink", tgt: target} }
func fifo(p string) node             { return node{path: p, kind: "fifo", mode: 0o644} }

// build creates nodes beneath root. Directory modes are applied last,
// deepest first, so restrictive modes do not get in the way.
func build(t testing.TB, root string, nodes ...node) {
	t.Helper()
	var dirs []node
	for _, n := range nodes {
		p := filepath.Join(root, n.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch n.kind {
		case "file":
			if err = os.WriteFile(p, []byte(n.data), 0o600); err == nil {
				err = unix.Chmod(p, orDefault(n.mode, 0o644))
			}
		case "dir":
			err = os.MkdirAll(p, 0o755)
			dirs = append(dirs, n)
		case "symlink":
			err = os.Symlink(n.tgt, p)
		case "fifo":
			err = unix.Mkfifo(p, n.mode)
		case "hardlink":
			err = os.Link(filepath.Join(root, n.tgt), p)
		default:
			t.Fatalf("unknown node kind %q", n.kind)
		}
		if err != nil {
			t.Fatalf("build %s %s: %v", n.kind, n.path, err)
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].path > dirs[j].path })
	for _, n := range dirs {
		if err := unix.Chmod(filepath.Join(root, n.path), orDefault(n.mode, 0o755)); err != nil {
			t.Fatal(err)
		}
	}
}

func orDefault(m, d uint32) uint32 {
	if m == 0 {
		return d
	}
	return m
}

// tree describes every entry beneath root, without following symlinks:
// "file 0644 <content>", "dir 0755", "symlink -> <target>", "other 0644".
func tree(t testing.TB, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		mode := st.Mode & 0o7777
		switch fileType(st.Mode) {
		case "file":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %04o %s", mode, b)
		case "dir":
			out[rel] = fmt.Sprintf("dir %04o", mode)
		case "symlink":
			tg, _ := os.Readlink(p)
			out[rel] = "symlink -> " + tg
		default:
			out[rel] = fmt.Sprintf("other %04o", mode)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func diffMaps(want, got map[string]string) string {
	var b strings.Builder
	keys := map[string]bool{}
	for k := range want {
		keys[k] = true
	}
	for k := range got {
		keys[k] = true
	}
	var ks []string
	for k := range keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		w, wok := want[k]
		g, gok := got[k]
		switch {
		case !wok:
			fmt.Fprintf(&b, "  unexpected %q: %q\n", k, g)
		case !gok:
			fmt.Fprintf(&b, "  missing %q: want %q\n", k, w)
		case w != g:
			fmt.Fprintf(&b, "  %q: got %q, want %q\n", k, g, w)
		}
	}
	return b.String()
}

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func me() Owner { return Owner{UID: os.Geteuid(), GID: os.Getegid()} }

// populated copies nodes in as one input "src" -> "proj" and returns the
// workspace dir and snapshot.
func populated(t *testing.T, nodes ...node) (string, *Snapshot) {
	t.Helper()
	base := t.TempDir()
	src, ws := filepath.Join(base, "src"), filepath.Join(base, "ws")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	build(t, src, nodes...)
	snap, err := CopyIn(ws, []manifest.Input{{Src: src, Dst: "proj"}}, me(), Limits{})
	if err != nil {
		t.Fatalf("CopyIn: %v", err)
	}
	return ws, snap
}
