package engine

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestRunAlive: a run whose lock a live process holds is alive; the same
// directory unlocked, or without a lock file, is not.
func TestRunAlive(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs", "abcd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if RunAlive(dir) {
		t.Fatal("a run directory without a lock file counts as alive")
	}
	f, err := os.Create(filepath.Join(dir, runLock))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if RunAlive(dir) {
		t.Fatal("an unlocked run counts as alive")
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if !RunAlive(dir) {
		t.Error("a locked run does not count as alive")
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	if RunAlive(dir) {
		t.Error("the run still counts as alive after unlocking")
	}
}

// TestGCWaitsForClaims: a run directory is claimed under runs/'s shared
// lock, so a GC (another moat's) that starts in between waits for the
// claim to finish and then sees a live run, never a lockless directory
// to collect.
func TestGCWaitsForClaims(t *testing.T) {
	e, err := New(Options{Home: t.TempDir(), Exe: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := e.lockRuns(unix.LOCK_SH)
	if err != nil {
		t.Fatal(err)
	}
	// A claim halfway: the directory made, its lock not yet.
	dir := filepath.Join(e.Home(), "runs", newID())
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	done := make(chan GCReport)
	go func() {
		rep, err := e.GC()
		if err != nil {
			t.Errorf("GC: %v", err)
		}
		done <- rep
	}()
	select {
	case rep := <-done:
		t.Fatalf("GC ran during a claim: %+v", rep)
	case <-time.After(200 * time.Millisecond):
	}
	f, err := os.OpenFile(filepath.Join(dir, runLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	unlock()
	if rep := <-done; len(rep.Runs) != 0 {
		t.Errorf("GC collected %v, a run claimed while it waited", rep.Runs)
	}
	if _, err := os.Stat(filepath.Join(dir, runLock)); err != nil {
		t.Errorf("the claimed run lost its lock file: %v", err)
	}
	os.RemoveAll(dir)
}

// claimStressEnv makes the test binary a claimStress worker.
const claimStressEnv = "MOAT_TEST_CLAIM_STRESS"

// TestClaimGCAcrossProcesses: many moat processes of one home claim,
// collect and release runs at once, as parallel `moat run`s do (each
// starts with a GC). No GC may collect another process's live run, no
// claim may fail, and nothing is left. Before runs/ was a lock, a GC that
// read a claim's directory under its temporary name took the renamed run
// for dead and removed its cgroup (issue 17).
func TestClaimGCAcrossProcesses(t *testing.T) {
	const procs, rounds = 8, 150
	home := t.TempDir()
	if home := os.Getenv(claimStressEnv); home != "" {
		claimStress(t, home, rounds)
		return
	}
	if _, err := New(Options{Home: home, Exe: "/bin/true"}); err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	outs := make([]*bytes.Buffer, procs)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^TestClaimGCAcrossProcesses$", "-test.count=1")
		cmd.Env = append(os.Environ(), claimStressEnv+"="+home)
		outs[i] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("worker %d: %v\n%s", i, err, outs[i])
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(home, "runs")); len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("left under runs/: %v", names)
	}
}

// claimStress is one worker: claim, GC (as the next moat run would),
// check the claim survived, release.
func claimStress(t *testing.T, home string, rounds int) {
	e, err := New(Options{Home: home, Exe: "/bin/true", NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range rounds {
		id := newID()
		release, err := e.claim(id)
		if err != nil {
			t.Fatalf("round %d: claim: %v", i, err)
		}
		rep, err := e.GC()
		if err != nil {
			t.Errorf("round %d: GC: %v", i, err)
		}
		if len(rep.Runs) != 0 || len(rep.Cgroups) != 0 {
			t.Errorf("round %d: GC collected %+v, but every run was alive", i, rep)
		}
		if !held(filepath.Join(home, "runs", id, runLock)) {
			t.Fatalf("round %d: run %s lost its lock or directory while alive", i, id)
		}
		release(true)
	}
}
