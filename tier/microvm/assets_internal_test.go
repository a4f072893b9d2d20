package microvm

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestBuildRootDiskConcurrent: builds of one image's disk at once (two
// runs after a rebuild) each write a file of their own and only the first
// gets the name, so every caller holds the same whole ext4 and no
// temporary file is left.
func TestBuildRootDiskConcurrent(t *testing.T) {
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("needs mkfs.ext4 (e2fsprogs): " + err.Error())
	}
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "hello"), []byte(strings.Repeat("x", 1<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	digest := "sha256:" + strings.Repeat("ab", 32)
	const n = 4
	var wg sync.WaitGroup
	outs, held, errs := make([]string, n), make([]*os.File, n), make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i], held[i], errs[i] = buildRootDisk(cache, digest, root)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
		t.Cleanup(func() { held[i].Close() })
		if !stillNamed(held[i], outs[i]) {
			t.Errorf("build %d holds a file %s no longer names", i, outs[i])
		}
	}
	if out, err := exec.Command("e2fsck", "-fn", outs[0]).CombinedOutput(); err != nil {
		t.Errorf("e2fsck %s: %v\n%s", outs[0], err, out)
	}
	left, _ := filepath.Glob(filepath.Join(cache, "images", ".tmp-*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
}
