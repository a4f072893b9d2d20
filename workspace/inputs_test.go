package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

func TestInputFiles(t *testing.T) {
	tests := []struct {
		name string
		src  []node
		// dst is the input's Dst (default "proj"); file, when set, makes
		// the input that one file of src instead of the whole tree.
		dst, file string
		limits    func(m *manifest.Manifest)
		want      map[string]string // path -> "MODE content"
		wantWarn  []string          // "empty-dir PATH", "mode-zero PATH"
		wantErr   []string
		limit     string // LimitError.Field expected
	}{
		{
			name: "files and directories, sorted, modes kept",
			src:  []node{dir("a", 0o750), file("a/b.txt", "deep", 0o640), file("top.txt", "top", 0o644), file("run.sh", "#!/bin/sh", 0o755)},
			want: map[string]string{"proj/a/b.txt": "0640 deep", "proj/run.sh": "0755 #!/bin/sh", "proj/top.txt": "0644 top"},
		},
		{
			name: "setuid and sticky bits are stripped",
			src:  []node{file("suid", "x", 0o4755), file("sgid", "y", 0o2750)},
			want: map[string]string{"proj/sgid": "0750 y", "proj/suid": "0755 x"},
		},
		{
			name: "a symlink is sent as a copy of the file it leads to, with that file's mode",
			src:  []node{dir("d", 0), file("d/f", "target", 0o600), link("l1", "d/f"), link("d/up", "../l1")},
			want: map[string]string{"proj/d/f": "0600 target", "proj/l1": "0600 target", "proj/d/up": "0600 target"},
		},
		{
			name:     "an empty directory is reported, not sent",
			src:      []node{dir("empty", 0), dir("full", 0), file("full/f", "x", 0)},
			want:     map[string]string{"proj/full/f": "0644 x"},
			wantWarn: []string{"empty-dir proj/empty"},
		},
		{
			name:     "a file of mode 0000 is sent and reported",
			src:      []node{file("a", "a", 0o644), file("locked", "secret", 0o1000)},
			want:     map[string]string{"proj/a": "0644 a", "proj/locked": "0000 secret"},
			wantWarn: []string{"mode-zero proj/locked"},
		},
		{
			name:     "warnings come in path order",
			src:      []node{file("b", "b", 0o1000), dir("c", 0), dir("a", 0)},
			want:     map[string]string{"proj/b": "0000 b"},
			wantWarn: []string{"empty-dir proj/a", "mode-zero proj/b", "empty-dir proj/c"},
		},
		{
			name: "a single file as the input",
			src:  []node{file("f.txt", "one", 0o640)},
			dst:  "in/f.txt", file: "f.txt",
			want: map[string]string{"in/f.txt": "0640 one"},
		},
		{
			name:    "a symlink to a directory is refused",
			src:     []node{dir("d", 0), file("d/f", "f", 0), link("todir", "d")},
			wantErr: []string{"copy inputs: symlink proj/todir -> \"d\" leads to a directory", "replace the link with the file"},
		},
		{
			name:    "a dangling symlink is refused",
			src:     []node{link("dangling", "nope/x")},
			wantErr: []string{"symlink proj/dangling -> \"nope/x\" leads to nothing"},
		},
		{
			name:    "a symlink out of its input is refused by copy-in",
			src:     []node{link("out", "../../etc/passwd")},
			wantErr: []string{"copy inputs: copy-in:", "out"},
		},
		{
			name:    "a FIFO is refused by copy-in",
			src:     []node{fifo("pipe")},
			wantErr: []string{"copy inputs: copy-in:", "pipe"},
		},
		{
			name:    "the manifest's workspace.files bounds the inputs",
			src:     []node{file("a", "a", 0), file("b", "b", 0), file("c", "c", 0)},
			limits:  func(m *manifest.Manifest) { m.Workspace.Files = 2 },
			wantErr: []string{"workspace.files"},
			limit:   "workspace.files",
		},
		{
			name:    "the manifest's workspace.size bounds the inputs",
			src:     []node{file("big", strings.Repeat("x", 2048), 0)},
			limits:  func(m *manifest.Manifest) { m.Workspace.Size = 1024 },
			wantErr: []string{"workspace.size"},
			limit:   "workspace.size",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The temporary copy goes here, so the test sees it removed.
			tmp := t.TempDir()
			t.Setenv("TMPDIR", tmp)
			src := filepath.Join(t.TempDir(), "src")
			if err := os.Mkdir(src, 0o755); err != nil {
				t.Fatal(err)
			}
			build(t, src, tc.src...)
			in := manifest.Input{Src: src, Dst: "proj"}
			if tc.dst != "" {
				in.Dst = tc.dst
			}
			if tc.file != "" {
				in.Src = filepath.Join(src, tc.file)
			}
			m := manifest.Default()
			m.Inputs = []manifest.Input{in}
			if tc.limits != nil {
				tc.limits(m)
			}
			files, warnings, err := InputFiles(m)

			var warns []string
			for _, w := range warnings {
				switch w.Kind {
				case EmptyDirNotSent:
					warns = append(warns, "empty-dir "+w.Path)
				case ModeZeroSentAsDefault:
					warns = append(warns, "mode-zero "+w.Path)
				default:
					warns = append(warns, fmt.Sprintf("kind %d %s: %v", w.Kind, w.Path, w.Err))
				}
			}
			if fmt.Sprint(warns) != fmt.Sprint(tc.wantWarn) {
				t.Errorf("warnings %q, want %q", warns, tc.wantWarn)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("the temporary copy was left behind: %v", left)
			}
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; want one with %q (files %v)", tc.wantErr, files)
				}
				for _, s := range tc.wantErr {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				var le *LimitError
				if tc.limit != "" && (!errors.As(err, &le) || le.Field != tc.limit) {
					t.Errorf("error %v: want a *LimitError on %s", err, tc.limit)
				}
				if files != nil {
					t.Errorf("files %v returned with an error", files)
				}
				return
			}
			if err != nil {
				t.Fatalf("InputFiles: %v", err)
			}
			got := map[string]string{}
			for i, f := range files {
				if i > 0 && files[i-1].Path >= f.Path {
					t.Errorf("files not sorted: %q before %q", files[i-1].Path, f.Path)
				}
				got[f.Path] = fmt.Sprintf("%04o %s", f.Mode, f.Content)
			}
			if d := diffMaps(tc.want, got); d != "" {
				t.Errorf("files:\n%s", d)
			}
		})
	}
}

func TestInputFilesNoInputs(t *testing.T) {
	files, warnings, err := InputFiles(manifest.Default())
	if files != nil || warnings != nil || err != nil {
		t.Errorf("InputFiles without inputs = %v, %v, %v; want nothing", files, warnings, err)
	}
}

func TestResolveInputLink(t *testing.T) {
	// A snapshot built by hand: ResolveInputLink must hold on its own,
	// also for what CopyIn would have refused.
	snap := &Snapshot{entries: map[string]Entry{
		"proj":          {Type: "dir", Mode: 0o755},
		"proj/d":        {Type: "dir", Mode: 0o755},
		"proj/d/f":      {Type: "file", Mode: 0o640},
		"proj/l1":       {Type: "symlink", Target: "d/f"},
		"proj/d/up":     {Type: "symlink", Target: "../l1"},
		"proj/d/self":   {Type: "symlink", Target: "."},
		"proj/viadir":   {Type: "symlink", Target: "d/self/f"},
		"proj/dots":     {Type: "symlink", Target: "./d/../d//f"},
		"proj/todir":    {Type: "symlink", Target: "d"},
		"proj/toroot":   {Type: "symlink", Target: "d/.."},
		"proj/dangling": {Type: "symlink", Target: "nope/x"},
		"proj/thru":     {Type: "symlink", Target: "d/f/x"},
		"proj/out":      {Type: "symlink", Target: "../other/f"},
		"proj/d/out2":   {Type: "symlink", Target: "../../other/f"},
		"proj/abs":      {Type: "symlink", Target: "/proj/d/f"},
		"proj/viaabs":   {Type: "symlink", Target: "abs"},
		"proj/loop1":    {Type: "symlink", Target: "loop2"},
		"proj/loop2":    {Type: "symlink", Target: "loop1"},
		"proj/pipe":     {Type: "other", Mode: 0o644},
		"proj/topipe":   {Type: "symlink", Target: "pipe"},
		"other":         {Type: "dir", Mode: 0o755},
		"other/f":       {Type: "file", Mode: 0o644},
	}}
	tests := []struct {
		name, link string
		want       string // the file's path; "" when refused
		wantErr    string
	}{
		{"to a file", "proj/l1", "proj/d/f", ""},
		{"through another link", "proj/d/up", "proj/d/f", ""},
		{"through a link to its own directory", "proj/viadir", "proj/d/f", ""},
		{"dot, dot-dot and empty components", "proj/dots", "proj/d/f", ""},
		{"to a directory", "proj/todir", "", "leads to a directory"},
		{"back to the input's root", "proj/toroot", "", "leads to a directory"},
		{"to nothing", "proj/dangling", "", "leads to nothing"},
		{"through a file", "proj/thru", "", "leads through a file"},
		{"out of its input", "proj/out", "", "leads outside its input"},
		{"out of its input from below", "proj/d/out2", "", "leads outside its input"},
		{"an absolute target", "proj/abs", "", "leads outside its input"},
		{"through a link with an absolute target", "proj/viaabs", "", "leads outside its input"},
		{"a loop", "proj/loop1", "", "has too many levels of symlinks"},
		{"to something not a regular file", "proj/topipe", "", "does not lead to a regular file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, e, err := ResolveInputLink(snap, "proj", tc.link)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("ResolveInputLink(%s) = %q; want an error %q", tc.link, got, tc.wantErr)
				}
				target := snap.entries[tc.link].Target
				for _, s := range []string{"symlink " + tc.link + " -> " + fmt.Sprintf("%q", target), tc.wantErr, "a run on a server receives regular files only; replace the link with the file"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q lacks %q", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("ResolveInputLink(%s): %v", tc.link, err)
			}
			if got != tc.want || e != snap.entries[tc.want] {
				t.Errorf("ResolveInputLink(%s) = %q %+v; want %q %+v", tc.link, got, e, tc.want, snap.entries[tc.want])
			}
		})
	}
}

// The modes InputFiles reports are fs.FileMode permission bits.
var _ fs.FileMode = InputFile{}.Mode
