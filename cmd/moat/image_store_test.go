package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/image"
)

// storedHome returns a MOAT_HOME whose store holds the build of name
// made from content, current or not, as a build or import leaves it.
func storeBuild(t *testing.T, home, name, content string, current bool) string {
	t.Helper()
	rootfs := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "bin", "tool"), []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	digest, size, err := image.TreeDigest(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	hexDigest := strings.TrimPrefix(digest, "sha256:")
	dir := filepath.Join(home, "images", name, hexDigest)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(rootfs, filepath.Join(dir, "rootfs")); err != nil {
		t.Fatal(err)
	}
	meta := fmt.Sprintf(`{"name":%q,"digest":%q,"size":%d,"env":["PATH=/bin"],"built":"2026-12-01T10:00:00Z"}`, name, digest, size)
	if err := os.WriteFile(filepath.Join(dir, "image.json"), []byte(meta), 0o644); err != nil {
		t.Fatal(err)
	}
	if current {
		if err := os.Symlink(hexDigest, filepath.Join(home, "images", name, "current")); err != nil {
			t.Fatal(err)
		}
	}
	return digest
}

func TestImageStoreCommands(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name    string
		args    []string
		code    int
		wantOut []string
		wantErr []string
		// after checks the store once the command ran.
		after func(t *testing.T, home string, old, cur string)
	}{
		{name: "list shows size, created and current", args: []string{"image", "list"}, wantOut: []string{"NAME", "nodeapp", "sha256:", "B ", "2026-12-01", "current", "no"}},
		{name: "inspect prints JSON", args: []string{"image", "inspect", "nodeapp"}, wantOut: []string{`"name": "nodeapp"`, `"files": 2`, `"current": true`, `"created": "2026-12-01T10:00:00Z"`, `"env"`}},
		{name: "inspect unknown names it and the known ones", args: []string{"image", "inspect", "cobol"}, code: exitUsage, wantErr: []string{`"cobol"`, "nodeapp", "python"}},
		{name: "rm without a name", args: []string{"image", "rm"}, code: exitUsage, wantErr: []string{"name one image"}},
		{name: "rm the default image needs --force", args: []string{"image", "rm", "python"}, code: exitUsage, wantErr: []string{"--force"}},
		{name: "rm of an image not stored", args: []string{"image", "rm", "--force", "ruby"}, code: exitUsage, wantErr: []string{"ruby", "stored images: nodeapp"}},
		{name: "rm removes every build", args: []string{"image", "rm", "nodeapp"}, wantOut: []string{"removed nodeapp", "freed"},
			after: func(t *testing.T, home, old, cur string) {
				for _, d := range []string{old, cur} {
					if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(d, "sha256:"))); !os.IsNotExist(err) {
						t.Errorf("build %s still there after rm (%v)", d, err)
					}
				}
			}},
		{name: "gc removes the old build and keeps the current one", args: []string{"image", "gc"}, wantOut: []string{"removed nodeapp", "removed 1 unused builds", "freed"},
			after: func(t *testing.T, home, old, cur string) {
				if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(old, "sha256:"))); !os.IsNotExist(err) {
					t.Errorf("old build still there after gc (%v)", err)
				}
				if _, err := os.Stat(filepath.Join(home, "images", "nodeapp", strings.TrimPrefix(cur, "sha256:"))); err != nil {
					t.Errorf("current build gone after gc: %v", err)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			home := t.TempDir()
			if err := os.Chmod(home, 0o711); err != nil {
				t.Fatal(err)
			}
			old := storeBuild(t, home, "nodeapp", "v1", false)
			cur := storeBuild(t, home, "nodeapp", "v2", true)
			if err := os.Chmod(filepath.Join(home, "images"), 0o700); err != nil {
				t.Fatal(err)
			}
			out := moat(t, invocation{args: tc.args, env: []string{"MOAT_HOME=" + home}})
			out.check(t, tc.code, tc.wantOut, tc.wantErr, nil)
			if tc.name == "inspect prints JSON" {
				var v map[string]any
				if err := json.Unmarshal([]byte(out.stdout), &v); err != nil {
					t.Errorf("inspect output is not JSON: %v", err)
				}
			}
			if tc.after != nil {
				tc.after(t, home, old, cur)
			}
		})
	}
}
