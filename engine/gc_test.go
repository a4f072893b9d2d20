package engine

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestHeldLocks: a run whose lock a live process holds is alive; the same
// file unlocked is not.
func TestHeldLocks(t *testing.T) {
	lock := filepath.Join(t.TempDir(), "lock")
	f, err := os.Create(lock)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if HeldLocks()(lock) {
		t.Fatal("an unlocked file counts as held")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !HeldLocks()(lock) {
		t.Error("a locked file does not count as held")
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if HeldLocks()(lock) {
		t.Error("the file still counts as held after unlocking")
	}
}
