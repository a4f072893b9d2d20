package image

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestWritebackClosesFiles: every file handed over, more than the queue
// holds and not a whole number of batches, is closed by the time wait returns, with its content intact.
func TestWritebackClosesFiles(t *testing.T) {
	dir := t.TempDir()
	w := newWriteback()
	var files []*os.File
	for i := range 3*writebackBatch*writebackQueue + writebackBatch/2 {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString("content")
		files = append(files, f)
		w.add(f)
	}
	if err := w.wait(); err != nil {
		t.Fatalf("wait: %v", err)
	}
	for _, f := range files {
		if f.Fd() != ^uintptr(0) {
			t.Fatalf("%s still open after wait", f.Name())
		}
		if b, err := os.ReadFile(f.Name()); err != nil || string(b) != "content" {
			t.Fatalf("%s: %q, %v", f.Name(), b, err)
		}
	}
}
