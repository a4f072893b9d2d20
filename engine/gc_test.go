package engine

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
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

// TestGCLeavesClaims: GC runs beside other moat processes' runs, so a run
// directory being claimed, its lock file created but not yet locked, is
// alive while fresh; an old one is an orphan, and so is a run directory
// nobody locks.
func TestGCLeavesClaims(t *testing.T) {
	home := t.TempDir()
	e, err := New(Options{Home: home, Exe: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	runs := filepath.Join(home, "runs")
	mk := func(name string, age time.Duration) string {
		dir := filepath.Join(runs, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "lock"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if age > 0 {
			old := time.Now().Add(-age)
			if err := os.Chtimes(dir, old, old); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	claiming := mk(claimPrefix+"aaaa", 0)
	stale := mk(claimPrefix+"bbbb", time.Minute)
	dead := mk("cccc", 0)
	rep, err := e.GC()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(claiming); err != nil {
		t.Errorf("GC removed a run being claimed: %v", err)
	}
	for _, dir := range []string{stale, dead} {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("GC left %s (err %v)", dir, err)
		}
	}
	slices.Sort(rep.Runs)
	if want := []string{"bbbb", "cccc"}; !slices.Equal(rep.Runs, want) {
		t.Errorf("GC reported runs %v, want %v", rep.Runs, want)
	}
}
