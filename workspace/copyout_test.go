package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// host is a test layout: a workspace, an output dir that does not exist
// yet, and host files beside them that the sandbox must never reach.
type host struct {
	base, ws, out, secret string
	snap                  *Snapshot
}

func newHost(t *testing.T, inputs ...node) *host {
	t.Helper()
	ws, snap := populated(t, inputs...)
	base := filepath.Dir(ws)
	h := &host{base: base, ws: ws, out: filepath.Join(base, "out"), secret: filepath.Join(base, "secret"), snap: snap}
	build(t, h.secret, file("canary", "HOST SECRET", 0o600), dir("dir", 0o755), file("dir/canary", "HOST SECRET", 0o600))
	return h
}

// outside lists what exists beside the workspace and outDir, so a test can
// check nothing was written outside outDir.
func (h *host) outside(t *testing.T) map[string]string {
	t.Helper()
	m := tree(t, h.secret)
	for _, e := range mustReadDir(t, h.base) {
		switch e {
		case "ws", "out", "secret", "src":
		default:
			m["base/"+e] = "unexpected"
		}
	}
	return m
}

func mustReadDir(t testing.TB, d string) []string {
	t.Helper()
	es, err := os.ReadDir(d)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestCopyOut(t *testing.T) {
	base := []node{dir("d", 0o755), file("d/keep.txt", "keep", 0o644), file("gone.txt", "gone", 0o644), file("mod.txt", "old", 0o644)}
	tests := []struct {
		name string
		// mutate runs in the workspace's proj dir before the diff.
		mutate func(t *testing.T, h *host, root string)
		// race runs after the diff, before CopyOut: the sandbox's last move.
		race func(t *testing.T, h *host, root string)
		// forge edits the change list (a hostile guest agent's list).
		forge       func(changes []result.FileChange) []result.FileChange
		lim         Limits
		wantOut     map[string]string
		wantSkipped map[string]string // path -> substring of reason
		wantViol    []string          // violation kinds
	}{
		{
			name: "normal copy of added and modified",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, file("new.txt", "new", 0o640), dir("nd", 0o750), file("nd/deep/x", "x", 0o600))
				writeFile(t, root, "mod.txt", "new content")
				rm(t, root, "gone.txt")
			},
			wantOut: map[string]string{
				"proj": "dir 0755", "proj/new.txt": "file 0640 new", "proj/mod.txt": "file 0644 new content",
				"proj/nd": "dir 0750", "proj/nd/deep": "dir 0755", "proj/nd/deep/x": "file 0600 x",
			},
		},
		{
			name:   "setuid stripped",
			mutate: func(t *testing.T, h *host, root string) { build(t, root, file("suid", "s", 0o4755), dir("sg", 0o2775)) },
			wantOut: map[string]string{
				"proj": "dir 0755", "proj/suid": "file 0755 s", "proj/sg": "dir 0755",
			},
		},
		{
			// A sandbox's 01777 tmp must not become a 0777 directory on
			// the host that any local user could plant files in.
			name: "group and other write stripped, sticky too",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, dir("tmp", 0o1777), file("tmp/f", "f", 0o666), dir("open", 0o777), file("open/x", "x", 0o777),
					dir("grp", 0o2770), file("grp/g", "g", 0o620), file("all", "a", 0o7777), file("ro", "r", 0o444))
			},
			wantOut: map[string]string{
				"proj": "dir 0755", "proj/tmp": "dir 0755", "proj/tmp/f": "file 0644 f", "proj/open": "dir 0755",
				"proj/open/x": "file 0755 x", "proj/grp": "dir 0750", "proj/grp/g": "file 0600 g", "proj/all": "file 0755 a",
				"proj/ro": "file 0444 r",
			},
		},
		{
			name: "symlinks to host are not followed or copied",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, link("leak", filepath.Join(h.secret, "canary")), link("leakdir", filepath.Join(h.secret, "dir")),
					link("rel", "../../secret/canary"))
			},
			wantOut:     map[string]string{},
			wantSkipped: map[string]string{"proj/leak": "symlink", "proj/leakdir": "symlink", "proj/rel": "symlink"},
		},
		{
			name: "forged types do not make a symlink followed",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, link("leak", filepath.Join(h.secret, "canary")), link("leakdir", filepath.Join(h.secret, "dir")))
			},
			forge: func([]result.FileChange) []result.FileChange {
				return []result.FileChange{
					{Path: "proj/leak", Change: result.Added, Type: "file"},
					{Path: "proj/leakdir", Change: result.Added, Type: "dir"},
					{Path: "proj/leakdir/canary", Change: result.Added, Type: "file"},
				}
			},
			wantOut: map[string]string{},
			wantSkipped: map[string]string{
				"proj/leak": "now a symlink", "proj/leakdir": "now a symlink", "proj/leakdir/canary": "not a directory",
			},
		},
		{
			name: "dir swapped for symlink after diff",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, dir("sw", 0o755), file("sw/canary", "sandbox", 0o644), file("sw/z", "z", 0o644))
			},
			race: func(t *testing.T, h *host, root string) {
				rm(t, root, "sw")
				build(t, root, link("sw", filepath.Join(h.secret, "dir")))
			},
			wantOut: map[string]string{},
			wantSkipped: map[string]string{
				"proj/sw": "now a symlink", "proj/sw/canary": "not a directory", "proj/sw/z": "not a directory",
			},
		},
		{
			name: "parent dir swapped for symlink after diff",
			mutate: func(t *testing.T, h *host, root string) {
				writeFile(t, root, "d/keep.txt", "changed")
			},
			race: func(t *testing.T, h *host, root string) {
				rm(t, root, "d")
				build(t, root, link("d", filepath.Join(h.secret, "dir")))
			},
			forge: func(c []result.FileChange) []result.FileChange {
				return append(c, result.FileChange{Path: "proj/d/canary", Change: result.Added, Type: "file"})
			},
			wantOut:     map[string]string{},
			wantSkipped: map[string]string{"proj/d/keep.txt": "not a directory", "proj/d/canary": "not a directory"},
		},
		{
			name:   "file swapped for a different file after diff",
			mutate: func(t *testing.T, h *host, root string) { writeFile(t, root, "mod.txt", "diffed") },
			race:   func(t *testing.T, h *host, root string) { writeFile(t, root, "mod.txt", "swapped") },
			wantOut: map[string]string{
				"proj": "dir 0755",
			},
			wantSkipped: map[string]string{"proj/mod.txt": "content changed since the diff"},
		},
		{
			name:   "fifo not copied and does not block",
			mutate: func(t *testing.T, h *host, root string) { build(t, root, fifo("p")) },
			forge: func([]result.FileChange) []result.FileChange {
				return []result.FileChange{{Path: "proj/p", Change: result.Modified, Type: "file"}}
			},
			wantOut:     map[string]string{},
			wantSkipped: map[string]string{"proj/p": "FIFO"},
		},
		{
			name:        "fifo in the diff is skipped",
			mutate:      func(t *testing.T, h *host, root string) { build(t, root, fifo("p")) },
			wantOut:     map[string]string{},
			wantSkipped: map[string]string{"proj/p": "device, FIFO or socket"},
		},
		{
			name: "per-file cap",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, file("big", strings.Repeat("b", 11), 0o644), file("ok", strings.Repeat("o", 10), 0o644))
			},
			lim:         Limits{FileBytes: 10},
			wantOut:     map[string]string{"proj": "dir 0755", "proj/ok": "file 0644 oooooooooo"},
			wantSkipped: map[string]string{"proj/big": "resources.file_size=10"},
			wantViol:    []string{"file-size"},
		},
		{
			name: "total cap",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, file("a", "aaaaaaaaaa", 0o644), file("b", "bbbbbbbbbb", 0o644), file("c", "cc", 0o644))
			},
			lim:         Limits{Bytes: 15},
			wantOut:     map[string]string{"proj": "dir 0755", "proj/a": "file 0644 aaaaaaaaaa", "proj/c": "file 0644 cc"},
			wantSkipped: map[string]string{"proj/b": "workspace.size=15"},
			wantViol:    []string{"disk"},
		},
		{
			name: "entry cap",
			mutate: func(t *testing.T, h *host, root string) {
				build(t, root, file("a", "a", 0o644), file("b", "b", 0o644), file("c", "c", 0o644))
			},
			lim:         Limits{Files: 3}, // proj, a, b
			wantOut:     map[string]string{"proj": "dir 0755", "proj/a": "file 0644 a", "proj/b": "file 0644 b"},
			wantSkipped: map[string]string{"proj/c": "workspace.files=3"},
			wantViol:    []string{"files"},
		},
		{
			name: "hostile paths in the change list",
			forge: func([]result.FileChange) []result.FileChange {
				var c []result.FileChange
				for _, p := range []string{"../secret/canary", "/etc/passwd", "proj/../../secret/canary", "", "a\x00b", "./proj/mod.txt", "proj//mod.txt", "proj/mod.txt/"} {
					c = append(c, result.FileChange{Path: p, Change: result.Added, Type: "file"})
				}
				return c
			},
			wantOut: map[string]string{},
			wantSkipped: map[string]string{
				"../secret/canary": "invalid path", "/etc/passwd": "invalid path", "proj/../../secret/canary": "invalid path",
				"": "invalid path", "a\x00b": "invalid path", "./proj/mod.txt": "invalid path", "proj//mod.txt": "invalid path",
				"proj/mod.txt/": "invalid path",
			},
		},
		{
			name:   "duplicates and deleted entries",
			mutate: func(t *testing.T, h *host, root string) { writeFile(t, root, "mod.txt", "m") },
			forge: func(c []result.FileChange) []result.FileChange {
				return append(c, c[0], result.FileChange{Path: "proj/d/keep.txt", Change: result.Deleted, Type: "file"})
			},
			wantOut:     map[string]string{"proj": "dir 0755", "proj/mod.txt": "file 0644 m"},
			wantSkipped: map[string]string{"proj/mod.txt": "duplicate"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, base...)
			root := filepath.Join(h.ws, "proj")
			if tc.mutate != nil {
				tc.mutate(t, h, root)
			}
			changes, err := Diff(h.ws, h.snap, DiffLimits{})
			if err != nil {
				t.Fatalf("Diff: %v", err)
			}
			if tc.race != nil {
				tc.race(t, h, root)
			}
			if tc.forge != nil {
				changes = tc.forge(changes)
			}
			before := h.outside(t)
			rep, err := CopyOut(h.ws, changes, h.out, tc.lim)
			if err != nil {
				t.Fatalf("CopyOut: %v", err)
			}
			if d := diffMaps(before, h.outside(t)); d != "" {
				t.Errorf("host outside outDir changed:\n%s", d)
			}
			if d := diffMaps(tc.wantOut, tree(t, h.out)); d != "" {
				t.Errorf("outDir differs:\n%s", d)
			}
			skipped := map[string]string{}
			for _, s := range rep.Skipped {
				skipped[s.Path] = s.Reason
			}
			for p, want := range tc.wantSkipped {
				if !strings.Contains(skipped[p], want) {
					t.Errorf("skip reason for %q = %q, want it to contain %q", p, skipped[p], want)
				}
			}
			for p, why := range skipped {
				if _, ok := tc.wantSkipped[p]; !ok {
					t.Errorf("unexpected skip %q: %s", p, why)
				}
			}
			var kinds []string
			for _, v := range rep.Violations {
				kinds = append(kinds, v.Kind)
			}
			if strings.Join(kinds, ",") != strings.Join(tc.wantViol, ",") {
				t.Errorf("violations = %v, want %v", kinds, tc.wantViol)
			}
			var n int64
			for _, c := range rep.Copied {
				n += c.Size
				if c.Type == "file" {
					b, err := os.ReadFile(filepath.Join(h.out, c.Path))
					if err != nil || sum(string(b)) != c.SHA256 {
						t.Errorf("copied %q: report sha %s does not match the file (%v)", c.Path, c.SHA256, err)
					}
				}
			}
			if n != rep.Bytes {
				t.Errorf("report Bytes %d, sum of copied sizes %d", rep.Bytes, n)
			}
		})
	}
}

func TestCopyOutOutDir(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, out string)
		wantErr error
		wantMsg string
	}{
		{name: "missing is created", setup: func(*testing.T, string) {}},
		{name: "missing with missing parents", setup: func(*testing.T, string) {}},
		{name: "empty dir", setup: func(t *testing.T, out string) { build(t, out, dir(".", 0o755)) }},
		{name: "not empty", setup: func(t *testing.T, out string) { build(t, out, file("existing", "mine", 0o644)) }, wantErr: ErrOutDirNotEmpty},
		{name: "symlink to a dir", setup: func(t *testing.T, out string) {
			if err := os.Symlink(t.TempDir(), out); err != nil {
				t.Fatal(err)
			}
		}, wantMsg: "not a directory"},
		{name: "a file", setup: func(t *testing.T, out string) { build(t, filepath.Dir(out), file(filepath.Base(out), "x", 0o644)) }, wantMsg: "not a directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ws, snap := populated(t, file("a", "a", 0o644))
			writeFile(t, filepath.Join(ws, "proj"), "a", "b")
			changes, err := Diff(ws, snap, DiffLimits{})
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "out")
			if tc.name == "missing with missing parents" {
				out = filepath.Join(out, "x", "y")
			}
			tc.setup(t, out)
			_, err = CopyOut(ws, changes, out, Limits{})
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("CopyOut error = %v, want %v", err, tc.wantErr)
				}
				if b, _ := os.ReadFile(filepath.Join(out, "existing")); string(b) != "mine" {
					t.Errorf("existing file in outDir changed to %q", b)
				}
			case tc.wantMsg != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("CopyOut error = %v, want it to contain %q", err, tc.wantMsg)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if b, err := os.ReadFile(filepath.Join(out, "proj/a")); err != nil || string(b) != "b" {
					t.Errorf("proj/a = %q, %v; want %q", b, err, "b")
				}
			}
		})
	}
}

// FuzzCopyOutPaths feeds arbitrary change lists to CopyOut over a workspace
// full of escaping symlinks and checks nothing is ever written outside
// outDir, nothing outside the workspace is read into it, and no symlink
// lands in outDir.
func FuzzCopyOutPaths(f *testing.F) {
	for _, s := range []string{
		"proj/f", "../../x", "/abs", "a\x00b", "proj/up/secret/canary", "proj/abs/passwd", "proj/d/f",
		"proj/dl/canary", "proj", "proj/./f", "proj/d/../f", "proj/f/", "..", ".", strings.Repeat("a/", 300),
	} {
		for _, typ := range []string{"file", "dir", "symlink", "other"} {
			f.Add(s, typ)
		}
	}
	base := f.TempDir()
	src, ws, secret := filepath.Join(base, "src"), filepath.Join(base, "ws"), filepath.Join(base, "secret")
	build(f, secret, file("canary", "HOST SECRET", 0), dir("dir", 0))
	build(f, src, file("keep", "k", 0))
	if err := os.Mkdir(ws, 0o755); err != nil {
		f.Fatal(err)
	}
	if _, err := CopyIn(ws, []manifest.Input{{Src: src, Dst: "proj"}}, me(), Limits{}); err != nil {
		f.Fatal(err)
	}
	build(f, filepath.Join(ws, "proj"), file("f", "f", 0), dir("d", 0), file("d/f", "df", 0),
		link("up", "../../.."), link("abs", "/etc"), link("dl", secret), link("fl", filepath.Join(secret, "canary")))

	f.Fuzz(func(t *testing.T, p, typ string) {
		out, err := os.MkdirTemp(base, "out")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(out)
		changes := []result.FileChange{{Path: p, Change: result.Added, Type: typ}, {Path: p + "/x", Change: result.Modified, Type: "file"}}
		if _, err := CopyOut(ws, changes, out, Limits{}); err != nil {
			t.Fatalf("CopyOut(%q, %q): %v", p, typ, err)
		}
		for _, e := range mustReadDir(t, base) {
			if e != "src" && e != "ws" && e != "secret" && !strings.HasPrefix(e, "out") {
				t.Fatalf("CopyOut(%q) wrote %q beside outDir", p, e)
			}
		}
		if got := mustReadDir(t, secret); len(got) != 2 {
			t.Fatalf("secret dir changed: %v", got)
		}
		if got := mustReadDir(t, filepath.Join(secret, "dir")); len(got) != 0 {
			t.Fatalf("secret/dir changed: %v", got)
		}
		err = filepath.WalkDir(out, func(q string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type()&os.ModeSymlink != 0 || !(d.Type().IsRegular() || d.IsDir()) {
				t.Errorf("outDir holds a non-regular entry %q (%v)", q, d.Type())
			}
			if d.Type().IsRegular() {
				b, _ := os.ReadFile(q)
				if strings.Contains(string(b), "HOST SECRET") {
					t.Errorf("host secret copied into %q", q)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// TestCopyOutSwapAfterStat swaps the entry between CopyOut's fstatat and
// its open, the window a live sandbox would race: each swap must fail that
// entry closed (no host file read, no hang on a FIFO).
func TestCopyOutSwapAfterStat(t *testing.T) {
	tests := []struct {
		name string
		typ  string
		swap func(t *testing.T, h *host, p string)
		want string
	}{
		{name: "file to symlink", typ: "file", swap: func(t *testing.T, h *host, p string) {
			rm(t, filepath.Dir(p), filepath.Base(p))
			build(t, filepath.Dir(p), link(filepath.Base(p), filepath.Join(h.secret, "canary")))
		}, want: "symlink"},
		{name: "file to fifo", typ: "file", swap: func(t *testing.T, h *host, p string) {
			rm(t, filepath.Dir(p), filepath.Base(p))
			build(t, filepath.Dir(p), fifo(filepath.Base(p)))
		}, want: "FIFO"},
		{name: "file to another file", typ: "file", swap: func(t *testing.T, h *host, p string) {
			// Rename, not remove: the old inode stays alive so its number
			// is not reused for the new file.
			if err := os.Rename(p, p+".old"); err != nil {
				t.Fatal(err)
			}
			build(t, filepath.Dir(p), file(filepath.Base(p), "other", 0o644))
		}, want: "replaced"},
		{name: "dir to symlink", typ: "dir", swap: func(t *testing.T, h *host, p string) {
			rm(t, filepath.Dir(p), filepath.Base(p))
			build(t, filepath.Dir(p), link(filepath.Base(p), filepath.Join(h.secret, "dir")))
		}, want: "swapped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			root := filepath.Join(h.ws, "proj")
			if tc.typ == "dir" {
				build(t, root, dir("x", 0o755))
			} else {
				build(t, root, file("x", "sandbox", 0o644))
			}
			changes, err := Diff(h.ws, h.snap, DiffLimits{})
			if err != nil {
				t.Fatal(err)
			}
			testHookAfterStat = func(p string) {
				if p == "proj/x" {
					tc.swap(t, h, filepath.Join(h.ws, p))
				}
			}
			t.Cleanup(func() { testHookAfterStat = nil })
			rep, err := CopyOut(h.ws, changes, h.out, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Skipped) != 1 || rep.Skipped[0].Path != "proj/x" || !strings.Contains(rep.Skipped[0].Reason, tc.want) {
				t.Fatalf("Skipped = %+v, want proj/x skipped with %q", rep.Skipped, tc.want)
			}
			if _, err := os.Lstat(filepath.Join(h.out, "proj/x")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("proj/x exists in outDir after the swap: %v", err)
			}
		})
	}
}
