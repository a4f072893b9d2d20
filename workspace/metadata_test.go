package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCheckMetadata(t *testing.T) {
	many := map[string]string{}
	for i := 0; i <= MaxMetadataKeys; i++ {
		many[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name string
		md   map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"token key, printable value", map[string]string{"build_id": "42 ok", "a!#$%&'*+-.^_`|~": ""}, true},
		{"empty key", map[string]string{"": "v"}, false},
		{"space in key", map[string]string{"a b": "v"}, false},
		{"colon in key", map[string]string{"a:b": "v"}, false},
		{"key over the bound", map[string]string{strings.Repeat("k", MaxMetadataKey+1): "v"}, false},
		{"newline in value", map[string]string{"k": "a\nb"}, false},
		{"UTF-8 value", map[string]string{"k": "café"}, false},
		{"value over the bound", map[string]string{"k": strings.Repeat("v", MaxMetadataValue+1)}, false},
		{"too many keys", many, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMetadata(tc.md)
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrBadPath)) {
				t.Errorf("CheckMetadata: %v, want ok %v (an ErrBadPath)", err, tc.ok)
			}
		})
	}
}

// xattrsWork skips when dir's filesystem keeps no user xattrs.
func xattrsWork(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".probe")
	os.WriteFile(p, nil, 0o644)
	defer os.Remove(p)
	if err := unix.Setxattr(p, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("the test directory's filesystem keeps no user xattrs: %v", err)
	}
}

func TestFilesMetadata(t *testing.T) {
	ws := t.TempDir()
	xattrsWork(t, ws)
	f, err := OpenFiles(ws, Owner{UID: os.Getuid(), GID: os.Getgid()}, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	os.WriteFile(filepath.Join(ws, "file"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(ws, "dir"), 0o755)
	os.Symlink("file", filepath.Join(ws, "link"))
	os.Symlink("/etc/passwd", filepath.Join(ws, "out"))
	if err := unix.Mkfifo(filepath.Join(ws, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	md := map[string]string{"owner": "alice"}
	tests := []struct {
		name string
		path string
		ok   bool
	}{
		{"file", "file", true},
		{"directory", "dir", true},
		{"the workspace", ".", true},
		{"symlink to a file (not followed)", "link", false},
		{"symlink out of the workspace", "out", false},
		{"fifo (refused, never blocks)", "fifo", false},
		{"missing", "nope", false},
		{"escaping path", "../x", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := f.SetMetadata(tc.path, md)
			if (err == nil) != tc.ok {
				t.Fatalf("SetMetadata(%s): %v, want ok %v", tc.path, err, tc.ok)
			}
			in, serr := f.Stat(tc.path)
			if tc.ok && (serr != nil || in.Metadata["owner"] != "alice") {
				t.Errorf("Stat(%s): %v metadata %v", tc.path, serr, in.Metadata)
			}
			if !tc.ok && serr == nil && in.Metadata != nil {
				t.Errorf("Stat(%s) has metadata %v after a refused set", tc.path, in.Metadata)
			}
		})
	}
	// Through the symlink nothing was written to its target either.
	if v, err := unix.Getxattr("/etc/passwd", "user.owner", make([]byte, 16)); err == nil {
		t.Errorf("/etc/passwd got user.owner (%d bytes)", v)
	}
	// A rename keeps it, and ReadDir reports it.
	if err := f.Rename("file", "moved"); err != nil {
		t.Fatal(err)
	}
	list, err := f.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range list {
		if in.Name == "moved" && in.Metadata["owner"] != "alice" {
			t.Errorf("ReadDir: moved has metadata %v", in.Metadata)
		}
	}
	// Open reports the metadata of the file it opened (a snapshot copies
	// both).
	fh, in, err := f.Open("moved")
	if err != nil {
		t.Fatal(err)
	}
	fh.Close()
	if in.Metadata["owner"] != "alice" {
		t.Errorf("Open: metadata %v", in.Metadata)
	}
}

// What the sandbox set on its own files is read as hostile input: names
// and values the API would refuse are not metadata.
func TestReadMetadataFilters(t *testing.T) {
	dir := t.TempDir()
	xattrsWork(t, dir)
	p := filepath.Join(dir, "f")
	os.WriteFile(p, nil, 0o644)
	set := map[string]string{
		"user.ok":          "fine",
		"user.bad key":     "v",
		"user.binary":      "\x00\x01",
		"user.":            "empty",
		"user.long":        strings.Repeat("v", MaxMetadataValue+1),
		"trusted.not-ours": "v",
	}
	for k, v := range set {
		// trusted.* needs CAP_SYS_ADMIN and "user." alone is refused by
		// the kernel: what fails to be set is not there to be read.
		unix.Setxattr(p, k, []byte(v), 0)
	}
	fh, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	md, err := ReadMetadata(fh)
	if err != nil {
		t.Fatal(err)
	}
	if len(md) != 1 || md["ok"] != "fine" {
		t.Errorf("ReadMetadata: %q, want only ok=fine", md)
	}
}

func FuzzCheckMetadata(f *testing.F) {
	f.Add("owner", "alice")
	f.Add("a b", "v")
	f.Add("k", "caf\xc3\xa9")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, k, v string) {
		if CheckMetadata(map[string]string{k: v}) != nil {
			return
		}
		if k == "" || len(k) > MaxMetadataKey || len(v) > MaxMetadataValue || strings.ContainsAny(k, " :/\x00") {
			t.Errorf("accepted %q=%q", k, v)
		}
	})
}
