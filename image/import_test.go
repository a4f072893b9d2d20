package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// tarEntry is one entry of a test layer.
type tarEntry struct {
	name string
	typ  byte
	body string
	mode int64
	link string
	pax  map[string]string
	uid  int
	gid  int
}

func dir(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeReg, body: body, mode: 0o644}
}
func symlink(name, to string) tarEntry { return tarEntry{name: name, typ: tar.TypeSymlink, link: to} }

// openTestRoot opens path, which must exist, as the root an extraction
// writes beneath, closed when the test ends.
func openTestRoot(t testing.TB, path string) *os.Root {
	t.Helper()
	root, err := os.OpenRoot(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	return root
}

// testBudget is an extraction budget of 1 MiB and files entries.
func testBudget(files int64) *extractBudget {
	return &extractBudget{bytesLeft: 1 << 20, filesLeft: files, maxBytes: 1 << 20, maxFiles: files}
}

// makeTar writes entries as a tar stream.
func makeTar(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)), PAXRecords: e.pax, Uid: e.uid, Gid: e.gid, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %s: %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func zstded(t testing.TB, b []byte) []byte {
	t.Helper()
	zw, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer zw.Close()
	return zw.EncodeAll(b, nil)
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// The normal two-layer image: the second layer deletes a file with a
// whiteout and hides a directory's lower content with an opaque whiteout.
func normalLayers(t testing.TB) [][]byte {
	l1 := makeTar(t,
		dir("etc/"), file("etc/os-release", "ID=test\n"),
		dir("app/"), file("app/keep", "kept"), file("app/gone", "deleted by layer 2"),
		dir("opq/"), file("opq/lower", "hidden by layer 2"),
		tarEntry{name: "bin/tool", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o755},
		symlink("bin/tool-link", "tool"),
		tarEntry{name: "bin/tool-hard", typ: tar.TypeLink, link: "bin/tool"},
	)
	l2 := makeTar(t,
		file("app/.wh.gone", ""),
		dir("opq/"), file("opq/.wh..wh..opq", ""), file("opq/upper", "new"),
		file("app/added", "layer 2"),
	)
	return [][]byte{l1, l2}
}

var normalConfig = map[string]any{
	"architecture": runtime.GOARCH, "os": "linux",
	"config": map[string]any{
		"Env":        []string{"PATH=/usr/bin:/bin", "APP=1"},
		"Entrypoint": []string{"/bin/tool"},
		"Cmd":        []string{"--serve"},
		"WorkingDir": "/app",
		"User":       "root",
	},
}

// writeOCILayout writes an OCI image layout with the layers (the first
// gzip-compressed, the rest plain) tagged "v1" and returns its manifest
// digest.
func writeOCILayout(t testing.TB, dst string, layers [][]byte, config any) string {
	t.Helper()
	blob := func(b []byte) string {
		h := sha(b)
		p := filepath.Join(dst, "blobs", "sha256", h)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + h
	}
	cfg, _ := json.Marshal(config)
	m := map[string]any{"schemaVersion": 2, "config": map[string]any{"digest": blob(cfg), "size": len(cfg)}}
	var ls []map[string]any
	for i, l := range layers {
		if i == 0 {
			l = gzipped(t, l)
		}
		ls = append(ls, map[string]any{"digest": blob(l), "size": len(l)})
	}
	m["layers"] = ls
	mb, _ := json.Marshal(m)
	md := blob(mb)
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []map[string]any{{
		"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": len(mb),
		"annotations": map[string]string{refNameAnnotation: "v1"},
	}}})
	os.WriteFile(filepath.Join(dst, "index.json"), idx, 0o644)
	os.WriteFile(filepath.Join(dst, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	return md
}

// tarDir packs a directory's regular files into a tar file.
func tarDir(t testing.TB, src, dst string) {
	t.Helper()
	var entries []tarEntry
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		rel, _ := filepath.Rel(src, p)
		entries = append(entries, file(filepath.ToSlash(rel), string(b)))
		return nil
	})
	if err := os.WriteFile(dst, makeTar(t, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeDockerArchive writes what `docker save` (before Docker 25) writes.
func writeDockerArchive(t testing.TB, dst string, layers [][]byte, config any) string {
	t.Helper()
	cfg, _ := json.Marshal(config)
	entries := []tarEntry{file(sha(cfg)+".json", string(cfg))}
	var names []string
	for i, l := range layers {
		n := fmt.Sprintf("%d/layer.tar", i)
		names = append(names, n)
		entries = append(entries, dir(fmt.Sprintf("%d/", i)), file(n, string(l)))
	}
	mf, _ := json.Marshal([]map[string]any{{"Config": sha(cfg) + ".json", "RepoTags": []string{"app:latest"}, "Layers": names}})
	entries = append(entries, file("manifest.json", string(mf)))
	if err := os.WriteFile(dst, makeTar(t, entries...), 0o644); err != nil {
		t.Fatal(err)
	}
	return "sha256:" + sha(cfg)
}

// storeListing is every path in the store with its type, for comparing a
// store before and after a refused import.
func storeListing(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, fmt.Sprintf("%s %v", p, d.Type()))
		return nil
	})
	return out
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: import chowns entries and finalize writes a root-owned tree")
	}
}

func TestImportFormats(t *testing.T) {
	needRoot(t)
	layers := normalLayers(t)
	tests := []struct {
		name string
		// make writes the source into dir and returns it and the
		// expected source digest ("" to compute from the file).
		make      func(t *testing.T, dir string) (string, string)
		whiteouts bool // layer 2 applied
		config    bool
	}{
		{"oci layout with tag", func(t *testing.T, d string) (string, string) {
			md := writeOCILayout(t, filepath.Join(d, "layout"), layers, normalConfig)
			return "oci:" + filepath.Join(d, "layout") + ":v1", md
		}, true, true},
		{"oci layout untagged", func(t *testing.T, d string) (string, string) {
			md := writeOCILayout(t, filepath.Join(d, "layout"), layers, normalConfig)
			return "oci:" + filepath.Join(d, "layout"), md
		}, true, true},
		{"oci archive", func(t *testing.T, d string) (string, string) {
			md := writeOCILayout(t, filepath.Join(d, "layout"), layers, normalConfig)
			tarDir(t, filepath.Join(d, "layout"), filepath.Join(d, "img.tar"))
			return "oci-archive:" + filepath.Join(d, "img.tar"), md
		}, true, true},
		{"docker archive", func(t *testing.T, d string) (string, string) {
			id := writeDockerArchive(t, filepath.Join(d, "img.tar"), layers, normalConfig)
			return "docker-archive:" + filepath.Join(d, "img.tar"), id
		}, true, true},
		{"rootfs tar", func(t *testing.T, d string) (string, string) {
			os.WriteFile(filepath.Join(d, "r.tar"), layers[0], 0o644)
			return "rootfs:" + filepath.Join(d, "r.tar"), "sha256:" + sha(layers[0])
		}, false, false},
		{"rootfs tar.gz", func(t *testing.T, d string) (string, string) {
			b := gzipped(t, layers[0])
			os.WriteFile(filepath.Join(d, "r.tar.gz"), b, 0o644)
			return "rootfs:" + filepath.Join(d, "r.tar.gz"), "sha256:" + sha(b)
		}, false, false},
		{"rootfs tar.zst", func(t *testing.T, d string) (string, string) {
			b := zstded(t, layers[0])
			os.WriteFile(filepath.Join(d, "r.tar.zst"), b, 0o644)
			return "rootfs:" + filepath.Join(d, "r.tar.zst"), "sha256:" + sha(b)
		}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			srcStr, wantSrcDigest := tc.make(t, d)
			src, err := ParseSource(srcStr)
			if err != nil {
				t.Fatal(err)
			}
			s := NewStore(filepath.Join(d, "store"))
			var progress bytes.Buffer
			img, err := s.Import(context.Background(), "app", src, ImportOptions{Progress: &progress})
			if err != nil {
				t.Fatalf("Import: %v\n%s", err, progress.String())
			}
			if !strings.Contains(progress.String(), "layer 1 of") {
				t.Errorf("progress names no layer:\n%s", progress.String())
			}
			got, err := s.Lookup("app")
			if err != nil {
				t.Fatalf("Lookup after import: %v", err)
			}
			if got.Digest != img.Digest || got.SourceDigest != wantSrcDigest || got.Source != srcStr {
				t.Errorf("stored digest %s source %s %s; want %s, %s %s", got.Digest, got.Source, got.SourceDigest, img.Digest, srcStr, wantSrcDigest)
			}
			// The digest from the extractor's remembered sums is the
			// digest of the tree read afresh (filesums.go).
			if d, _, err := TreeDigest(got.Root); err != nil || d != img.Digest {
				t.Errorf("TreeDigest of the stored tree = %s, %v; the import stored it as %s", d, err, img.Digest)
			}
			r := got.Root
			read := func(p string) string { b, _ := os.ReadFile(filepath.Join(r, p)); return string(b) }
			if read("app/keep") != "kept" || read("etc/os-release") != "ID=test\n" {
				t.Errorf("layer 1 content missing")
			}
			if read("etc/passwd") != imagePasswd {
				t.Errorf("etc/passwd not finalised: %q", read("etc/passwd"))
			}
			if l, _ := os.Readlink(filepath.Join(r, "bin/tool-link")); l != "tool" {
				t.Errorf("symlink = %q", l)
			}
			if read("bin/tool-hard") != "#!/bin/sh\n" {
				t.Errorf("hard link content = %q", read("bin/tool-hard"))
			}
			absent := func(p string) bool { _, err := os.Lstat(filepath.Join(r, p)); return errors.Is(err, fs.ErrNotExist) }
			if tc.whiteouts {
				if !absent("app/gone") || !absent("opq/lower") || !absent("app/.wh.gone") || !absent("opq/.wh..wh..opq") {
					t.Errorf("whiteouts not applied (or written as files)")
				}
				if read("opq/upper") != "new" || read("app/added") != "layer 2" {
					t.Errorf("layer 2 content missing")
				}
			}
			if tc.config {
				if !slices.Equal(got.Entrypoint, []string{"/bin/tool"}) || !slices.Equal(got.Cmd, []string{"--serve"}) ||
					got.WorkingDir != "/app" || got.User != "root" || !slices.Equal(got.Env, []string{"PATH=/usr/bin:/bin", "APP=1"}) {
					t.Errorf("config not recorded: %+v", got)
				}
			} else if !slices.Equal(got.Env, []string{defaultImportPath}) {
				t.Errorf("Env = %q, want the default PATH", got.Env)
			}
			// The same source again stores the same content digest.
			again, err := s.Import(context.Background(), "app", src, ImportOptions{})
			if err != nil || again.Digest != img.Digest {
				t.Errorf("re-import: %v, digest %s vs %s", err, again.Digest, img.Digest)
			}
		})
	}
}

// writeZeroBomb writes a gzip-compressed tar whose one entry declares
// declared bytes of zeros, followed by only written bytes of them: an
// extractor that honours its cap stops long before the data runs out, and
// the test never spends time or disk on the full size.
func writeZeroBomb(t *testing.T, path string, declared, written int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: declared}); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, 1<<20)
	for left := written; left > 0; left -= int64(len(zeros)) {
		if _, err := tw.Write(zeros[:min(left, int64(len(zeros)))]); err != nil {
			t.Fatal(err)
		}
	}
	// No tw.Close: the archive is cut short, as the real 10 GiB would be.
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeSparseTar writes, with GNU tar --sparse in the given --format
// (gnu: the old sparse type 'S'; posix: PAX sparse 1.0), a rootfs tar of
// one sparse file of size bytes that holds only tail at its end: a
// 10 GiB hole costs a few blocks of archive and none of disk.
func writeSparseTar(t *testing.T, path, format string, size int64, tail string) {
	t.Helper()
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("needs GNU tar to write sparse archives")
	}
	dir := t.TempDir()
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(tail), size-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, err := exec.Command("tar", "--sparse", "--format="+format, "-C", dir, "-cf", path, "sparse").CombinedOutput(); err != nil {
		t.Fatalf("tar --sparse --format=%s: %v\n%s", format, err, out)
	}
}

func TestImportHostile(t *testing.T) {
	needRoot(t)
	outside := t.TempDir() // what an escape would write into
	manyFiles := []tarEntry{dir("many/")}
	for i := range 300 {
		manyFiles = append(manyFiles, file(fmt.Sprintf("many/f%d", i), ""))
	}
	// A host file a write through a link would change.
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	capXattr := map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}
	tests := []struct {
		name    string
		layers  [][]byte // an OCI layout is written from these
		rootfs  func(t *testing.T, path string)
		opts    ImportOptions
		wantErr string // "" means neutralised: the import succeeds
		check   func(t *testing.T, root string)
	}{
		{name: "dot-dot entry", layers: [][]byte{makeTar(t, file("ok", "x"), file("../../../../"+outside+"/escaped", "x"))},
			wantErr: `layer 1 of 1 (sha256:`},
		{name: "dot-dot inside a path", layers: [][]byte{makeTar(t, file("a/../../escaped", "x"))}, wantErr: `".." component`},
		{name: "absolute name", layers: [][]byte{makeTar(t, file(outside+"/abs", "x"))}, wantErr: "absolute name"},
		{name: "absolute symlink then a file through it",
			layers:  [][]byte{makeTar(t, symlink("lnk", outside), file("lnk/pwned", "x"))},
			wantErr: `entry "lnk/pwned": parent lnk is a symlink`},
		// The extractor keeps the directory of the previous entry open;
		// a directory replaced by a link (in the same layer or the next)
		// must be checked again, not written into through the old handle.
		{name: "directory replaced by a symlink, then a file through it",
			layers:  [][]byte{makeTar(t, dir("a/"), dir("a/b/"), file("a/b/x", "x"), symlink("a", outside), file("a/b/pwned", "x"))},
			wantErr: `entry "a/b/pwned": parent a is a symlink`},
		{name: "directory replaced by a symlink in the next layer, then a file through it",
			layers: [][]byte{makeTar(t, dir("a/"), file("a/x", "x")),
				makeTar(t, symlink("a", outside), file("a/pwned", "x"))},
			wantErr: `entry "a/pwned": parent a is a symlink`},
		// It also keeps the directories above it open, to go back up:
		// one replaced from its parent must be looked at again too.
		{name: "directory above the previous entry's replaced by a symlink, then a file through it",
			layers:  [][]byte{makeTar(t, dir("a/"), dir("a/b/"), dir("a/b/c/"), file("a/b/c/x", "x"), file("a/y", "y"), symlink("a/b", outside), file("a/b/c/pwned", "x"))},
			wantErr: `entry "a/b/c/pwned": parent a/b is a symlink`},
		{name: "directory whited out and replaced by a symlink, then a file through it",
			layers:  [][]byte{makeTar(t, dir("a/"), dir("a/b/"), file("a/b/x", "x"), file("a/.wh.b", ""), symlink("a/b", outside), file("a/b/pwned", "x"))},
			wantErr: `entry "a/b/pwned": parent a/b is a symlink`},
		{name: "relative symlink escaping, in a lower layer, then a file through it",
			layers:  [][]byte{makeTar(t, symlink("up", "../../../../../../../../"+outside)), makeTar(t, file("up/pwned", "x"))},
			wantErr: `layer 2 of 2`},
		{name: "hard link to /etc/shadow", layers: [][]byte{makeTar(t, tarEntry{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"})},
			wantErr: `entry "shadow": hard link to "/etc/shadow"`},
		{name: "hard link up and out", layers: [][]byte{makeTar(t, tarEntry{name: "shadow", typ: tar.TypeLink, link: "../../../../etc/shadow"})},
			wantErr: `hard link to`},
		{name: "hard link through a symlink", layers: [][]byte{makeTar(t, symlink("etc2", "/etc"), tarEntry{name: "shadow", typ: tar.TypeLink, link: "etc2/shadow"})},
			wantErr: `parent etc2 is a symlink`},
		{name: "too many files", layers: [][]byte{makeTar(t, manyFiles...)}, opts: ImportOptions{MaxFiles: 100},
			wantErr: "more than 100 files"},
		{name: "whiteout naming nothing", layers: [][]byte{makeTar(t, file(".wh.", ""))}, wantErr: "whiteout names no entry"},
		{name: "zero bomb, 10 GiB of zeros in a gzip rootfs", opts: ImportOptions{MaxBytes: 1 << 20},
			rootfs:  func(t *testing.T, p string) { writeZeroBomb(t, p, 10<<30, 8<<20) },
			wantErr: `entry "zeros": image is larger than 1048576 bytes extracted`},
		{name: "sparse bomb, a 10 GiB hole in an old GNU sparse file", opts: ImportOptions{MaxBytes: 1 << 20},
			rootfs:  func(t *testing.T, p string) { writeSparseTar(t, p, "gnu", 10<<30, "x") },
			wantErr: `entry "sparse": image is larger than 1048576 bytes extracted`},
		{name: "sparse bomb, a 10 GiB hole in a PAX sparse file", opts: ImportOptions{MaxBytes: 1 << 20},
			rootfs:  func(t *testing.T, p string) { writeSparseTar(t, p, "posix", 10<<30, "x") },
			wantErr: `entry "sparse": image is larger than 1048576 bytes extracted`},
		{name: "small sparse file written whole",
			rootfs: func(t *testing.T, p string) { writeSparseTar(t, p, "gnu", 256<<10, "end") },
			check: func(t *testing.T, root string) {
				b, err := os.ReadFile(filepath.Join(root, "sparse"))
				if err != nil || len(b) != 256<<10 || !strings.HasSuffix(string(b), "end") || strings.Trim(string(b[:len(b)-3]), "\x00") != "" {
					t.Errorf("sparse file: %d bytes, err %v; want 256 KiB of zeros ending in \"end\"", len(b), err)
				}
			}},
		{name: "var a symlink out of the tree, etc/shadow a directory: nothing followed, shadow removed",
			layers: [][]byte{makeTar(t, symlink("var", outside), dir("etc/"), dir("etc/shadow/"), file("etc/shadow/x", "x"))},
			check: func(t *testing.T, root string) {
				if l, err := os.Readlink(filepath.Join(root, "var")); err != nil || l != outside {
					t.Errorf("var: link %q, err %v; want the image's link kept", l, err)
				}
				if _, err := os.Lstat(filepath.Join(root, "etc/shadow")); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("etc/shadow: err %v; want it removed", err)
				}
			}},
		{name: "mount points as a symlink out and as a file, replaced by directories",
			layers: [][]byte{makeTar(t, symlink("workspace", outside), file("proc", "x"), symlink("tmp", "/etc"))},
			check: func(t *testing.T, root string) {
				for _, p := range []string{"workspace", "proc", "tmp"} {
					if fi, err := os.Lstat(filepath.Join(root, p)); err != nil || !fi.IsDir() {
						t.Errorf("%s: %v, err %v; want the mount point as a real directory", p, fi, err)
					}
				}
			}},
		// The extractor creates each entry exclusively first and only
		// removes what is at the name when that fails: the entry that
		// was there must be replaced, never written through.
		{name: "symlinks out of the tree, then files and links of the same names",
			layers: [][]byte{makeTar(t, symlink("a", victim), symlink("b", outside+"/new"), symlink("c", victim),
				file("a", "image"), file("b", "image"), symlink("c", "image-link"))},
			check: func(t *testing.T, root string) {
				for _, p := range []string{"a", "b"} {
					if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != "image" {
						t.Errorf("%s: %q, err %v; want the image's file", p, b, err)
					}
				}
				if l, err := os.Readlink(filepath.Join(root, "c")); err != nil || l != "image-link" {
					t.Errorf("c: link %q, err %v; want the second link", l, err)
				}
				if b, _ := os.ReadFile(victim); string(b) != "host" {
					t.Errorf("the host file a link pointed at now holds %q", b)
				}
			}},
		{name: "a hard link's name and a directory replaced by files",
			layers: [][]byte{makeTar(t, file("f", "first"), tarEntry{name: "h", typ: tar.TypeLink, link: "f"}, dir("d/"), file("d/x", "x"),
				file("h", "second"), file("d", "file"))},
			check: func(t *testing.T, root string) {
				for p, want := range map[string]string{"f": "first", "h": "second", "d": "file"} {
					if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
						t.Errorf("%s: %q, err %v; want %q", p, b, err, want)
					}
				}
			}},
		{name: "device node and fifo dropped",
			layers: [][]byte{makeTar(t, dir("home/"), tarEntry{name: "home/null", typ: tar.TypeChar, mode: 0o666},
				tarEntry{name: "home/sda", typ: tar.TypeBlock, mode: 0o666}, tarEntry{name: "home/fifo", typ: tar.TypeFifo, mode: 0o666})},
			check: func(t *testing.T, root string) {
				for _, p := range []string{"home/null", "home/sda", "home/fifo"} {
					if _, err := os.Lstat(filepath.Join(root, p)); !errors.Is(err, fs.ErrNotExist) {
						t.Errorf("%s exists (err %v); special files must be dropped", p, err)
					}
				}
			}},
		{name: "setuid and setgid stripped, capability xattr not applied",
			layers: [][]byte{makeTar(t, dir("bin/"),
				tarEntry{name: "bin/su", typ: tar.TypeReg, body: "x", mode: 0o4755, pax: capXattr},
				tarEntry{name: "bin/sg", typ: tar.TypeReg, body: "x", mode: 0o2755},
				tarEntry{name: "sdir", typ: tar.TypeDir, mode: 0o2775})},
			check: func(t *testing.T, root string) {
				for _, p := range []string{"bin/su", "bin/sg", "sdir"} {
					fi, err := os.Lstat(filepath.Join(root, p))
					if err != nil || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
						t.Errorf("%s: mode %v err %v; setuid/setgid must be stripped", p, fi.Mode(), err)
					}
				}
				if _, err := syscall.Getxattr(filepath.Join(root, "bin/su"), "security.capability", make([]byte, 64)); !errors.Is(err, syscall.ENODATA) {
					t.Errorf("bin/su has security.capability (err %v)", err)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			s := NewStore(filepath.Join(d, "store"))
			// A store that already holds an image, so "unchanged" means
			// more than "still empty".
			os.WriteFile(filepath.Join(d, "seed.tar"), makeTar(t, file("seed", "x")), 0o644)
			if _, err := s.Import(context.Background(), "seed", Source{Kind: SourceRootfs, Path: filepath.Join(d, "seed.tar")}, ImportOptions{}); err != nil {
				t.Fatal(err)
			}
			var src Source
			if tc.rootfs != nil {
				p := filepath.Join(d, "bomb.tar.gz")
				tc.rootfs(t, p)
				src = Source{Kind: SourceRootfs, Path: p}
			} else {
				writeOCILayout(t, filepath.Join(d, "layout"), tc.layers, normalConfig)
				src = Source{Kind: SourceOCILayout, Path: filepath.Join(d, "layout")}
			}
			before := storeListing(t, s.Dir)
			start := time.Now()
			img, err := s.Import(context.Background(), "evil", src, tc.opts)
			if elapsed := time.Since(start); elapsed > 20*time.Second {
				t.Errorf("import took %v; a cap must stop a hostile image quickly", elapsed)
			}
			if entries, _ := os.ReadDir(outside); len(entries) != 0 {
				t.Fatalf("something landed outside the root: %v", entries)
			}
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Import: %v", err)
				}
				tc.check(t, img.Root)
				return
			}
			if err == nil {
				t.Fatalf("Import succeeded; want an error containing %q", tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrBadImage) {
				t.Errorf("error %q; want ErrBadImage containing %q", err, tc.wantErr)
			}
			if after := storeListing(t, s.Dir); !slices.Equal(before, after) {
				t.Errorf("store changed by a refused import:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

func TestImportRefusesBadSources(t *testing.T) {
	d := t.TempDir()
	wrongArch := map[string]any{"architecture": "s390x-not-this", "os": "linux"}
	writeOCILayout(t, filepath.Join(d, "arch"), normalLayers(t), wrongArch)
	writeOCILayout(t, filepath.Join(d, "ok"), normalLayers(t), normalConfig)
	// A layout whose layer blob was swapped after the manifest was written.
	writeOCILayout(t, filepath.Join(d, "tampered"), [][]byte{makeTar(t, file("a", "x"))}, normalConfig)
	blobs, _ := filepath.Glob(filepath.Join(d, "tampered", "blobs", "sha256", "*"))
	for _, b := range blobs {
		if data, _ := os.ReadFile(b); data[0] == 0x1f {
			os.WriteFile(b, gzipped(t, makeTar(t, file("a", "y"))), 0o644)
		}
	}
	if err := os.WriteFile(filepath.Join(d, "rootfs.tar"), makeTar(t, file("a", "x")), 0o644); err != nil {
		t.Fatal(err)
	}
	gz := gzipped(t, makeTar(t, file("a", strings.Repeat("x", 100000))))
	if err := os.WriteFile(filepath.Join(d, "truncated.tar.gz"), gz[:len(gz)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	// The gzip trailer's CRC-32 (the 8 bytes before the end: CRC, then
	// length) flipped: every entry inflates, only the check fails.
	badCRC := bytes.Clone(gz)
	badCRC[len(badCRC)-8] ^= 0xff
	if err := os.WriteFile(filepath.Join(d, "badcrc.tar.gz"), badCRC, 0o644); err != nil {
		t.Fatal(err)
	}
	// 2 MiB of zeros after the archive's end, inside the gzip stream.
	padded := append(makeTar(t, file("a", "x")), make([]byte, 2<<20)...)
	if err := os.WriteFile(filepath.Join(d, "trailing.tar.gz"), gzipped(t, padded), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, src, wantErr string
	}{
		{"truncated gzip", "rootfs:" + filepath.Join(d, "truncated.tar.gz"), "unexpected EOF"},
		{"gzip with a bad CRC", "rootfs:" + filepath.Join(d, "badcrc.tar.gz"), "after the tar archive's end: gzip: invalid checksum"},
		{"gzip stream going on after the archive", "rootfs:" + filepath.Join(d, "trailing.tar.gz"), "more than 1048576 bytes after the tar archive's end"},
		{"no prefix", "image.tar", "no format prefix"},
		{"unknown format", "docker-daemon:app", `unknown format "docker-daemon"`},
		{"missing file", "rootfs:" + filepath.Join(d, "nope.tar"), "open source: image refused: open nope.tar"},
		{"unknown tag", "oci:" + filepath.Join(d, "ok") + ":v2", `tag "v2" not in`},
		{"other architecture", "oci:" + filepath.Join(d, "arch"), `architecture "s390x-not-this"`},
		{"tampered layer", "oci:" + filepath.Join(d, "tampered"), "the source is corrupt or tampered with"},
		{"built-in name", "oci:" + filepath.Join(d, "ok"), "built-in image definition"},
		// The wrong prefix for the file: the error says what each kind
		// of tar is.
		{"rootfs tar as docker-archive", "docker-archive:" + filepath.Join(d, "rootfs.tar"), "no manifest.json at its top level, so this is not an archive written by docker save"},
		{"rootfs tar as oci-archive", "oci-archive:" + filepath.Join(d, "rootfs.tar"), "no index.json at its top level, so this is not an OCI image layout"},
		{"directory without a layout", "oci:" + d, "a plain root filesystem tar is rootfs:FILE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStore(filepath.Join(d, "store-"+strings.ReplaceAll(tc.name, " ", "-")))
			name := "app"
			if tc.name == "built-in name" {
				name = "python"
			}
			src, err := ParseSource(tc.src)
			if err == nil {
				_, err = s.Import(context.Background(), name, src, ImportOptions{})
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrBadImage) {
				t.Fatalf("got %v; want ErrBadImage containing %q", err, tc.wantErr)
			}
			if _, err := os.Lstat(s.Dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a refused import left the store directory %s behind", s.Dir)
			}
		})
	}
}

func TestParseSource(t *testing.T) {
	tests := []struct {
		in   string
		want Source
	}{
		{"docker-archive:a.tar", Source{Kind: SourceDockerArchive, Path: "a.tar"}},
		{"oci-archive:/x/a.tar", Source{Kind: SourceOCIArchive, Path: "/x/a.tar"}},
		{"oci:/x/layout", Source{Kind: SourceOCILayout, Path: "/x/layout"}},
		{"oci:/x/layout:v1.2", Source{Kind: SourceOCILayout, Path: "/x/layout", Tag: "v1.2"}},
		{"oci:/x:y/layout", Source{Kind: SourceOCILayout, Path: "/x:y/layout"}},
		{"rootfs:py.tar.zst", Source{Kind: SourceRootfs, Path: "py.tar.zst"}},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSource(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("ParseSource(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
			if got.String() != tc.in {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
}

// FuzzExtractLayer feeds arbitrary bytes to the layer extractor as a tar
// stream and checks that nothing is ever created outside the root, however
// the stream is formed.
func FuzzExtractLayer(f *testing.F) {
	for _, l := range normalLayers(f) {
		f.Add(l)
	}
	f.Add(makeTar(f, file("../escaped", "x")))
	f.Add(makeTar(f, symlink("lnk", "/tmp"), file("lnk/pwned", "x")))
	f.Add(makeTar(f, symlink("up", ".."), file("up/pwned", "x")))
	f.Add(makeTar(f, tarEntry{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"}))
	f.Add(makeTar(f, tarEntry{name: "dev/null", typ: tar.TypeChar, mode: 0o666}))
	f.Add(makeTar(f, dir("d/"), file("d/.wh..wh..opq", ""), file(".wh.d", "")))
	f.Fuzz(func(t *testing.T, data []byte) {
		base := t.TempDir()
		rootPath := filepath.Join(base, "root")
		os.Mkdir(rootPath, 0o755)
		root := openTestRoot(t, rootPath)
		_, _ = extractLayer(root, bytes.NewReader(data), "fuzz", testBudget(1000), map[string]fs.FileMode{}, newFileSums())
		entries, err := os.ReadDir(base)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Name() != "root" {
			t.Fatalf("extraction created %v beside the root", entries)
		}
		if _, err := os.Lstat("/tmp/pwned"); err == nil {
			t.Fatalf("extraction wrote /tmp/pwned")
		}
	})
}

// TestExtractModesAndOwners: a regular file ends with exactly its mode
// (less setuid and setgid) and its owner, whatever the umask took from the
// mode it was created with and whatever group a setgid directory handed
// it, and the sum remembered for it is the one the digest reads.
func TestExtractModesAndOwners(t *testing.T) {
	root0 := os.Geteuid() == 0
	tests := []struct {
		name     string
		mode     int64
		uid, gid int
		want     fs.FileMode
	}{
		{"0644 root", 0o644, 0, 0, 0o644},
		{"0755 root", 0o755, 0, 0, 0o755},
		{"0600", 0o600, 0, 0, 0o600},
		{"0400", 0o400, 0, 0, 0o400},
		{"0000", 0, 0, 0, 0},
		{"0666 group and other write", 0o666, 0, 0, 0o666},
		{"0777", 0o777, 0, 0, 0o777},
		{"sticky", 0o1755, 0, 0, 0o755 | fs.ModeSticky},
		{"setuid stripped", 0o4755, 0, 0, 0o755},
		{"setgid stripped", 0o2777, 0, 0, 0o777},
		{"other owner", 0o644, 1234, 5678, 0o644},
		{"owner only", 0o640, 1234, 0, 0o640},
		{"group only", 0o640, 0, 5678, 0o640},
	}
	for _, umask := range []int{0o022, 0, 0o077} {
		t.Run(fmt.Sprintf("umask %04o", umask), func(t *testing.T) {
			old := syscall.Umask(umask)
			defer syscall.Umask(old)
			rootPath := filepath.Join(t.TempDir(), "root")
			os.Mkdir(rootPath, 0o755)
			// A directory that hands its group (and its setgid bit) to
			// what is created in it, as an existing tree's may.
			sg := filepath.Join(rootPath, "sg")
			os.Mkdir(sg, 0o755)
			if root0 {
				os.Chown(sg, 0, 4321)
			}
			os.Chmod(sg, 0o2755)
			var entries []tarEntry
			for i, tc := range tests {
				entries = append(entries,
					tarEntry{name: fmt.Sprintf("f%d", i), typ: tar.TypeReg, body: tc.name, mode: tc.mode, uid: tc.uid, gid: tc.gid},
					tarEntry{name: fmt.Sprintf("sg/f%d", i), typ: tar.TypeReg, body: tc.name, mode: tc.mode, uid: tc.uid, gid: tc.gid})
			}
			root := openTestRoot(t, rootPath)
			sums := newFileSums()
			if _, err := extractLayer(root, bytes.NewReader(makeTar(t, entries...)), "modes", testBudget(1000), map[string]fs.FileMode{}, sums); err != nil {
				t.Fatal(err)
			}
			for i, tc := range tests {
				for _, name := range []string{fmt.Sprintf("f%d", i), fmt.Sprintf("sg/f%d", i)} {
					fi, err := os.Lstat(filepath.Join(rootPath, name))
					if err != nil {
						t.Fatal(err)
					}
					if got := fi.Mode(); got != tc.want {
						t.Errorf("%s (%s): mode %v, want %v", name, tc.name, got, tc.want)
					}
					st := fi.Sys().(*syscall.Stat_t)
					if root0 && (int(st.Uid) != tc.uid || int(st.Gid) != tc.gid) {
						t.Errorf("%s (%s): owner %d:%d, want %d:%d", name, tc.name, st.Uid, st.Gid, tc.uid, tc.gid)
					}
					if _, ok := sums.lookup(st); !ok {
						t.Errorf("%s (%s): no remembered sum matches the file", name, tc.name)
					}
				}
			}
			withSums, _, err := treeDigest(rootPath, sums)
			if err != nil {
				t.Fatal(err)
			}
			fresh, _, err := TreeDigest(rootPath)
			if err != nil || withSums != fresh {
				t.Errorf("digest with the remembered sums %s, read afresh %s (%v)", withSums, fresh, err)
			}
		})
	}
}

// TestLockWaitAfterRefusedImport: a refused import of a new name removes
// its lock file and directory; another import waiting for the same name
// makes them again and takes a lock that is the file at the path.
func TestLockWaitAfterRefusedImport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "name")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, lockName)
	first, err := lockNonBlocking(path)
	if err != nil {
		t.Fatal(err)
	}
	// What a refused import does before its deferred Close.
	os.Remove(path)
	os.Remove(dir)
	first.Close()
	second, err := lockWait(t.Context(), path, io.Discard)
	if err != nil {
		t.Fatalf("lockWait after the directory went: %v", err)
	}
	defer second.Close()
	held, _ := second.Stat()
	now, err := os.Stat(path)
	if err != nil || !os.SameFile(held, now) {
		t.Fatalf("the lock held is not the file at %s (%v)", path, err)
	}
	if _, err := lockNonBlocking(path); !errors.Is(err, errLocked) {
		t.Fatalf("a second lock of %s: %v, want errLocked", path, err)
	}
}
