package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// writeRootfsTar writes a rootfs tar of regular files (name -> body) and
// returns its path and its sha256 (the source digest an import records).
func writeRootfsTar(t *testing.T, dir, name string, files [][2]string) (string, string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f[0], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f[1]))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	return p, "sha256:" + hex.EncodeToString(sum[:])
}

// storeFiles lists every path under the store of home, to show that a
// refused import left it as it was.
func storeFiles(t *testing.T, home string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(home, "images"), func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestImageImportCLI: what `moat image import` says and does with good and
// bad input, as a user types it (issue 19 §1 and §4): a refusal exits 2,
// names the field or the layer and entry, says how to fix it, and leaves
// the store unchanged; a good rootfs tar imports with its source digest.
func TestImageImportCLI(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	good, goodDigest := writeRootfsTar(t, dir, "good.tar", [][2]string{{"hello.txt", "hi\n"}})
	escaping, _ := writeRootfsTar(t, dir, "escaping.tar", [][2]string{{"ok", "x"}, {"../../escaped", "x"}})
	twoFiles, _ := writeRootfsTar(t, dir, "two.tar", [][2]string{{"a", "1"}, {"b", "2"}})
	tests := []struct {
		name    string
		args    []string
		code    int
		wantOut []string
		wantErr []string
	}{
		{name: "no arguments", args: []string{"image", "import"}, code: exitUsage,
			wantErr: []string{"want NAME SOURCE", "moat image import mypy rootfs:py.tar"}},
		{name: "source without a format", args: []string{"image", "import", "app", good}, code: exitUsage,
			wantErr: []string{`source "` + good + `"`, "docker-archive:FILE", "oci:DIR[:TAG]", "rootfs:FILE.tar"}},
		{name: "unknown format", args: []string{"image", "import", "app", "docker:" + good}, code: exitUsage,
			wantErr: []string{`unknown format "docker"`, "oci-archive:FILE"}},
		{name: "missing file", args: []string{"image", "import", "app", "rootfs:" + filepath.Join(dir, "nope.tar")}, code: exitUsage,
			wantErr: []string{"nope.tar", "no such file"}},
		{name: "bad name", args: []string{"image", "import", "App", "rootfs:" + good}, code: exitUsage,
			wantErr: []string{`image name "App"`, "must match"}},
		{name: "built-in name", args: []string{"image", "import", "python", "rootfs:" + good}, code: exitUsage,
			wantErr: []string{`"python" is a built-in image definition`, "import under another name"}},
		{name: "max-bytes zero", args: []string{"image", "import", "--max-bytes", "0", "app", "rootfs:" + good}, code: exitUsage,
			wantErr: []string{"--max-bytes 0", "positive"}},
		{name: "max-files negative", args: []string{"image", "import", "--max-files", "-1", "app", "rootfs:" + good}, code: exitUsage,
			wantErr: []string{"--max-files -1", "positive"}},
		{name: "a .. entry names the layer and the entry", args: []string{"image", "import", "app", "rootfs:" + escaping}, code: exitUsage,
			wantErr: []string{"layer 1 of 1", `entry "../../escaped"`, `".." component`}},
		{name: "file cap names the flag", args: []string{"image", "import", "--max-files", "1", "app", "rootfs:" + twoFiles}, code: exitUsage,
			wantErr: []string{`entry "b"`, "more than 1 files", "--max-files"}},
		{name: "a good rootfs tar", args: []string{"image", "import", "app", "rootfs:" + good},
			wantOut: []string{"app sha256:", "from rootfs:" + good + " " + goodDigest}, wantErr: []string{"layer 1 of 1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			if err := os.Chmod(home, 0o711); err != nil {
				t.Fatal(err)
			}
			storeBuild(t, home, "nodeapp", "v1", true)
			before := storeFiles(t, home)
			env := []string{"MOAT_HOME=" + home}
			out := moat(t, invocation{args: tc.args, env: env})
			out.check(t, tc.code, tc.wantOut, tc.wantErr, nil)
			if tc.code != 0 {
				if after := storeFiles(t, home); !slices.Equal(before, after) {
					t.Errorf("a refused import changed the store:\nbefore %q\nafter  %q", before, after)
				}
				return
			}
			inspect := moat(t, invocation{args: []string{"image", "inspect", "app"}, env: env})
			inspect.check(t, 0, []string{`"source": "rootfs:` + good + `"`, `"source_digest": "` + goodDigest + `"`}, nil, nil)
		})
	}
}
