package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
)

func TestCopyIn(t *testing.T) {
	tests := []struct {
		name    string
		src     []node
		lim     Limits
		want    map[string]string // the workspace tree, under "proj/"
		wantErr []string          // substrings of the error, all required
		limit   string            // LimitError.Field expected
	}{
		{
			name: "nested dirs and modes",
			src: []node{
				dir("a", 0o750), dir("a/b", 0o700), file("a/b/c.txt", "deep", 0o640),
				file("top.txt", "top", 0o644), file("exec.sh", "#!/bin/sh", 0o755), dir("empty", 0o755),
				dir("ro", 0o555), file("ro/f", "r", 0o444),
			},
			want: map[string]string{
				"proj": "dir 0755", "proj/a": "dir 0750", "proj/a/b": "dir 0700", "proj/a/b/c.txt": "file 0640 deep",
				"proj/top.txt": "file 0644 top", "proj/exec.sh": "file 0755 #!/bin/sh", "proj/empty": "dir 0755",
				"proj/ro": "dir 0555", "proj/ro/f": "file 0444 r",
			},
		},
		{
			name: "setuid setgid sticky stripped",
			src:  []node{file("suid", "x", 0o4755), file("sgid", "y", 0o2755), dir("sticky", 0o1777), dir("sgiddir", 0o2775)},
			want: map[string]string{
				"proj": "dir 0755", "proj/suid": "file 0755 x", "proj/sgid": "file 0755 y",
				"proj/sticky": "dir 0777", "proj/sgiddir": "dir 0775",
			},
		},
		{
			name: "symlinks inside kept as links",
			src: []node{
				dir("d", 0), file("d/f", "f", 0), link("l1", "d/f"), link("d/up", "../l1"), link("d/self", "."),
				link("dangling", "nope/x"), link("toroot", "d/.."), link("viadir", "d/self/f"),
			},
			want: map[string]string{
				"proj": "dir 0755", "proj/d": "dir 0755", "proj/d/f": "file 0644 f", "proj/l1": "symlink -> d/f",
				"proj/d/up": "symlink -> ../l1", "proj/d/self": "symlink -> .", "proj/dangling": "symlink -> nope/x",
				"proj/toroot": "symlink -> d/..", "proj/viadir": "symlink -> d/self/f",
			},
		},
		{
			name: "hardlinks become independent copies",
			src:  []node{file("h1", "same", 0), {path: "h2", kind: "hardlink", tgt: "h1"}},
			want: map[string]string{"proj": "dir 0755", "proj/h1": "file 0644 same", "proj/h2": "file 0644 same"},
		},
		{name: "relative escape", src: []node{dir("d", 0), link("d/etc", "../../etc")}, wantErr: []string{"d/etc", `"../../etc"`, "outside"}},
		{name: "absolute target", src: []node{link("pw", "/etc/passwd")}, wantErr: []string{"pw", `"/etc/passwd"`, "outside"}},
		{name: "absolute target inside is still outside", src: []node{file("f", "", 0), link("abs", "/proc/self/root")}, wantErr: []string{"abs", "outside"}},
		{name: "chain through dir link escapes", src: []node{link("d", "."), link("l", "d/..")}, wantErr: []string{"l", `"d/.."`, "outside"}},
		{name: "chain of links escapes", src: []node{link("a", "b"), link("b", "c"), link("c", "../x")}, wantErr: []string{`"b"`, "outside"}},
		{name: "nested dir link chain escapes", src: []node{dir("p", 0), link("p/q", ".."), link("r", "p/q/..")}, wantErr: []string{"r", "outside"}},
		{name: "symlink loop", src: []node{link("a", "b"), link("b", "a")}, wantErr: []string{"too many levels"}},
		{name: "empty-ish escape via dot dot only", src: []node{link("up", "..")}, wantErr: []string{"up", "outside"}},
		{name: "fifo rejected", src: []node{dir("d", 0), fifo("d/pipe")}, wantErr: []string{"d/pipe", "FIFO", "only regular files, directories and symlinks"}},
		{
			name: "bytes limit", src: []node{file("a", "12345", 0), file("b", "123456", 0)}, lim: Limits{Bytes: 10},
			wantErr: []string{"workspace.size", "more than 10 bytes"}, limit: "workspace.size",
		},
		{
			name: "bytes limit exact fits", src: []node{file("a", "12345", 0), file("b", "12345", 0)}, lim: Limits{Bytes: 10},
			want: map[string]string{"proj": "dir 0755", "proj/a": "file 0644 12345", "proj/b": "file 0644 12345"},
		},
		{
			name: "files limit", src: []node{file("a", "", 0), file("b", "", 0), file("c", "", 0)}, lim: Limits{Files: 3},
			wantErr: []string{"workspace.files", "more than 3 files"}, limit: "workspace.files",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			src, ws := filepath.Join(base, "src"), filepath.Join(base, "ws")
			for _, d := range []string{src, ws} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			build(t, src, tc.src...)
			snap, err := CopyIn(ws, []manifest.Input{{Src: src, Dst: "proj"}}, me(), tc.lim)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("CopyIn succeeded, want error containing %q", tc.wantErr)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				var le *LimitError
				if got := errors.As(err, &le); got != (tc.limit != "") || (got && le.Field != tc.limit) {
					t.Errorf("errors.As LimitError = %v (%+v), want field %q", got, le, tc.limit)
				}
				return
			}
			if err != nil {
				t.Fatalf("CopyIn: %v", err)
			}
			if d := diffMaps(tc.want, tree(t, ws)); d != "" {
				t.Errorf("workspace tree differs:\n%s", d)
			}
			// The snapshot agrees with what is on disk.
			for p, desc := range tree(t, ws) {
				e, ok := snap.Lookup(p)
				if !ok {
					t.Errorf("snapshot misses %q", p)
					continue
				}
				if e.Type == "file" {
					content := strings.SplitN(desc, " ", 3)[2]
					if e.SHA256 != sum(content) || e.Size != int64(len(content)) {
						t.Errorf("snapshot %q = %+v, want sha %s size %d", p, e, sum(content), len(content))
					}
				}
			}
			if snap.Len() != len(tc.want) {
				t.Errorf("snapshot has %d entries, want %d: %v", snap.Len(), len(tc.want), snap.Paths())
			}
		})
	}
}

func TestCopyInHardlinksIndependent(t *testing.T) {
	ws, _ := populated(t, file("h1", "same", 0), node{path: "h2", kind: "hardlink", tgt: "h1"})
	var a, b unix.Stat_t
	if err := unix.Lstat(filepath.Join(ws, "proj/h1"), &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(ws, "proj/h2"), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino == b.Ino || a.Nlink != 1 || b.Nlink != 1 {
		t.Errorf("hardlinked inputs share an inode in the workspace: ino %d/%d nlink %d/%d", a.Ino, b.Ino, a.Nlink, b.Nlink)
	}
}

func TestCopyInInputs(t *testing.T) {
	base := t.TempDir()
	srcDir := filepath.Join(base, "srcdir")
	build(t, srcDir, file("f", "F", 0))
	build(t, base, file("single.txt", "S", 0o640), link("linkdir", "srcdir"), fifo("pipe"))
	tests := []struct {
		name     string
		inputs   []manifest.Input
		prefill  []node // already in the workspace
		want     map[string]string
		wantErr  []string
		wantSent error
	}{
		{
			name:   "single file with nested dst",
			inputs: []manifest.Input{{Src: filepath.Join(base, "single.txt"), Dst: "a/b/s.txt"}},
			want:   map[string]string{"a": "dir 0755", "a/b": "dir 0755", "a/b/s.txt": "file 0640 S"},
		},
		{
			name: "two inputs side by side",
			inputs: []manifest.Input{
				{Src: srcDir, Dst: "x"},
				{Src: filepath.Join(base, "single.txt"), Dst: "x/inner/s.txt"},
			},
			want: map[string]string{"x": "dir 0755", "x/f": "file 0644 F", "x/inner": "dir 0755", "x/inner/s.txt": "file 0640 S"},
		},
		{
			name:   "dst is cleaned",
			inputs: []manifest.Input{{Src: filepath.Join(base, "single.txt"), Dst: "./a//s.txt"}},
			want:   map[string]string{"a": "dir 0755", "a/s.txt": "file 0640 S"},
		},
		{name: "top-level symlink src rejected", inputs: []manifest.Input{{Src: filepath.Join(base, "linkdir"), Dst: "d"}}, wantErr: []string{"inputs[0].src", "is a symlink", "top-level symlinks are not followed"}},
		{name: "relative src", inputs: []manifest.Input{{Src: "rel/path", Dst: "d"}}, wantErr: []string{"inputs[0].src", "not absolute"}},
		{name: "missing src", inputs: []manifest.Input{{Src: filepath.Join(base, "nope"), Dst: "d"}}, wantErr: []string{"inputs[0].src", "no such file"}},
		{name: "fifo src", inputs: []manifest.Input{{Src: filepath.Join(base, "pipe"), Dst: "d"}}, wantErr: []string{"inputs[0].src", "FIFO"}},
		{name: "dst escapes", inputs: []manifest.Input{{Src: srcDir, Dst: "../x"}}, wantErr: []string{"inputs[0].dst", "beneath /workspace"}},
		{name: "dst absolute", inputs: []manifest.Input{{Src: srcDir, Dst: "/etc"}}, wantErr: []string{"inputs[0].dst", "relative"}},
		{name: "dst is workspace root", inputs: []manifest.Input{{Src: srcDir, Dst: "."}}, wantErr: []string{"inputs[0].dst", "beneath /workspace"}},
		{name: "dst empty", inputs: []manifest.Input{{Src: srcDir, Dst: ""}}, wantErr: []string{"inputs[0].dst", "empty"}},
		{
			name:    "dst collides",
			inputs:  []manifest.Input{{Src: srcDir, Dst: "x"}, {Src: filepath.Join(base, "single.txt"), Dst: "x/f"}},
			wantErr: []string{"inputs[1].dst", "already exists"},
		},
		{
			name:    "dst under a copied symlink",
			inputs:  []manifest.Input{{Src: filepath.Join(base, "single.txt"), Dst: "s"}, {Src: srcDir, Dst: "s/x"}},
			wantErr: []string{"inputs[1].dst", "not a directory"},
		},
		{
			name:     "workspace not empty",
			prefill:  []node{file("planted", "x", 0)},
			inputs:   []manifest.Input{{Src: srcDir, Dst: "x"}},
			wantSent: ErrWorkspaceNotEmpty,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ws := t.TempDir()
			build(t, ws, tc.prefill...)
			snap, err := CopyIn(ws, tc.inputs, me(), Limits{})
			if tc.wantSent != nil {
				if !errors.Is(err, tc.wantSent) {
					t.Fatalf("CopyIn error = %v, want %v", err, tc.wantSent)
				}
				return
			}
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("CopyIn succeeded, want error containing %q", tc.wantErr)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("CopyIn: %v", err)
			}
			if d := diffMaps(tc.want, tree(t, ws)); d != "" {
				t.Errorf("workspace tree differs:\n%s", d)
			}
			if snap.Len() != len(tc.want) {
				t.Errorf("snapshot has %d entries, want %d: %q", snap.Len(), len(tc.want), snap.Paths())
			}
		})
	}
}

func TestCopyInChown(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: chown to another uid requires CAP_CHOWN")
	}
	owner := Owner{UID: 12345, GID: 23456}
	base := t.TempDir()
	src, ws := filepath.Join(base, "src"), filepath.Join(base, "ws")
	build(t, src, dir("d", 0o700), file("d/f", "x", 0o4755), link("d/l", "f"))
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := CopyIn(ws, []manifest.Input{{Src: src, Dst: "p/proj"}}, owner, Limits{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"p", "p/proj", "p/proj/d", "p/proj/d/f", "p/proj/d/l"} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(ws, p), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != owner.UID || int(st.Gid) != owner.GID {
			t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, owner.UID, owner.GID)
		}
		if st.Mode&0o7000 != 0 {
			t.Errorf("%s has special mode bits %04o", p, st.Mode&0o7777)
		}
	}
}
