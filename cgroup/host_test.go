package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testvm"
)

// These tests use the real cgroupfs of the host and need root. Every
// cgroup they make is named moat/t<pid>-<n>; TestMain removes any that a
// failing test left, fails the run if there were some, and removes the
// moat/ parents if they did not exist before.

const helperEnv = "MOAT_CGROUP_TEST_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		runHelper(mode)
		return
	}
	if testvm.Guest() {
		// This binary is the init of TestV2InVM's VM (vm_test.go).
		testvm.GuestMain(mountV2, func() int { return runTests(m) })
	}
	os.Exit(runTests(m))
}

// runTests runs the tests and removes (and fails on) what they left.
func runTests(m *testing.M) int {
	var h *Host
	var preexisting []string
	if os.Geteuid() == 0 {
		if hh, err := Detect(); err == nil {
			h = hh
			for _, p := range h.Parents() {
				if exists(p) {
					preexisting = append(preexisting, p)
				}
			}
		}
	}
	code := m.Run()
	if h != nil {
		if ids, err := h.Orphans(); err == nil {
			for _, id := range ids {
				if strings.HasPrefix(id, testPrefix) {
					fmt.Fprintf(os.Stderr, "cgroup tests left moat/%s behind; removing\n", id)
					code = 1
					if err := h.Remove(id); err != nil {
						fmt.Fprintln(os.Stderr, err)
					}
				}
			}
		}
		if len(preexisting) == 0 {
			if err := h.Prune(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}
	}
	return code
}

// runHelper is the re-executed test binary. It waits for one byte on stdin
// (so the parent can Add it to a cgroup first), then does its job.
func runHelper(mode string) {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		os.Exit(3)
	}
	switch mode {
	case "alloc":
		// Touch every page so the memory is really charged.
		buf := make([]byte, 200<<20)
		for i := 0; i < len(buf); i += 4096 {
			buf[i] = 1
		}
		os.Exit(0)
	case "delegated":
		os.Exit(delegatedHelper())
	case "churn":
		// One moat process of many: make, use and destroy runs' cgroups,
		// pruning after each as the tiers' Destroy does.
		os.Exit(churn(churnRounds))
	case "spin":
		// Spin until this process has used 200 ms of CPU, however busy the
		// host is, so the test can expect at least that much.
		for {
			var ru syscall.Rusage
			if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
				os.Exit(1)
			}
			used := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
			if used >= 200*time.Millisecond {
				os.Exit(0)
			}
		}
	}
	os.Exit(2)
}

var testPrefix = fmt.Sprintf("t%d-", os.Getpid())

var idSeq atomic.Int64

func testID() string { return fmt.Sprintf("%s%d", testPrefix, idSeq.Add(1)) }

// requireHost skips unless root on a host with every needed controller.
func requireHost(t testing.TB) *Host {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: creates cgroups under /sys/fs/cgroup (euid %d)", os.Geteuid())
	}
	h, err := Detect()
	var me *MissingError
	if errors.As(err, &me) {
		t.Skipf("needs cgroup controllers: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// create makes a cgroup that is destroyed, and checked gone, at cleanup.
func create(t *testing.T, h *Host, lim Limits) *Cgroup {
	t.Helper()
	id := testID()
	c, err := h.Create(id, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Destroy(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		assertGone(t, h, id)
	})
	return c
}

// assertGone checks with filepath.Glob on every hierarchy that nothing
// named moat/<id> exists.
func assertGone(t testing.TB, h *Host, id string) {
	t.Helper()
	for _, p := range h.Parents() {
		left, err := filepath.Glob(filepath.Join(p, id+"*"))
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Errorf("left behind: %v", left)
		}
	}
}

// startHelper starts the test binary in mode, held at its stdin read, and
// moves it into c. Write to the returned pipe to let it go.
func startHelper(t *testing.T, c *Cgroup, name string, args ...string) (*exec.Cmd, io.WriteCloser) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if name == "" {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+args[0])
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Only this process, by pid, and only if still running.
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	if err := c.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	return cmd, stdin
}

func readBack(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestHostDetect(t *testing.T) {
	h := requireHost(t)
	t.Logf("%v, parents %v, memsw %v", h.Version, h.Parents(), h.memsw)
	if h.Version == V1 {
		for _, c := range v1Controllers {
			if h.v1[c] == "" {
				t.Errorf("v1 %s hierarchy not found", c)
			}
		}
	}
}

func TestCreateDestroyLeavesNothing(t *testing.T) {
	h := requireHost(t)
	tests := []struct {
		name string
		lim  Limits
	}{
		{"no limits", Limits{}},
		{"memory only", Limits{MemoryBytes: 16 << 20}},
		{"all limits", Limits{MemoryBytes: 64 << 20, Pids: 64, CPUs: 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := testID()
			c, err := h.Create(id, tc.lim)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range c.Dirs() {
				if !exists(d) {
					t.Errorf("%s not created", d)
				}
			}
			if err := c.Destroy(); err != nil {
				t.Fatal(err)
			}
			assertGone(t, h, id)
			if err := c.Destroy(); err != nil {
				t.Errorf("second Destroy: %v", err)
			}
		})
	}
}

func TestLimitsReadBack(t *testing.T) {
	h := requireHost(t)
	tests := []struct {
		name string
		lim  Limits
	}{
		{"small", Limits{MemoryBytes: 32 << 20, Pids: 16, CPUs: 0.25}},
		{"large", Limits{MemoryBytes: 4 << 30, Pids: 4096, CPUs: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := create(t, h, tc.lim)
			mem := fmt.Sprint(tc.lim.MemoryBytes)
			quota := fmt.Sprint(int64(tc.lim.CPUs * 100000))
			var checks []struct{ dir, file, want string }
			add := func(dir, file, want string) {
				checks = append(checks, struct{ dir, file, want string }{dir, file, want})
			}
			if h.Version == V1 {
				add(c.memDir, "memory.limit_in_bytes", mem)
				if h.memsw {
					add(c.memDir, "memory.memsw.limit_in_bytes", mem)
				}
				add(c.pidsDir, "pids.max", fmt.Sprint(tc.lim.Pids))
				add(c.cpuDir, "cpu.cfs_quota_us", quota)
				add(c.cpuDir, "cpu.cfs_period_us", "100000")
				// CVE-2022-0492: we never arm release_agent.
				for _, d := range c.Dirs() {
					add(d, "notify_on_release", "0")
				}
			} else {
				add(c.memDir, "memory.max", mem)
				if exists(filepath.Join(c.memDir, "memory.swap.max")) {
					add(c.memDir, "memory.swap.max", "0")
				}
				add(c.memDir, "memory.oom.group", "1")
				add(c.pidsDir, "pids.max", fmt.Sprint(tc.lim.Pids))
				add(c.cpuDir, "cpu.max", quota+" 100000")
			}
			for _, ck := range checks {
				if got := readBack(t, ck.dir, ck.file); got != ck.want {
					t.Errorf("%s/%s = %q, want %q", ck.dir, ck.file, got, ck.want)
				}
			}
		})
	}
}

func TestCreateRejects(t *testing.T) {
	h := requireHost(t)
	tests := []struct {
		name string
		id   string
		lim  Limits
	}{
		{"empty id", "", Limits{}},
		{"slash", "a/b", Limits{}},
		{"dotdot", "..", Limits{}},
		{"escape", "../../x", Limits{}},
		{"dot", "a.b", Limits{}},
		{"negative memory", "ok", Limits{MemoryBytes: -1}},
		{"negative pids", "ok", Limits{Pids: -1}},
		{"tiny cpu", "ok", Limits{CPUs: 0.001}},
		{"NaN cpu", "ok", Limits{CPUs: nan()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := h.Create(tc.id, tc.lim)
			if err == nil {
				c.Destroy()
				t.Fatalf("Create(%q, %+v) succeeded", tc.id, tc.lim)
			}
			assertGone(t, h, "ok")
		})
	}
}

func nan() float64 { z := 0.0; return z / z }

func TestCreateUndoesPartialFailure(t *testing.T) {
	h := requireHost(t)
	// The kernel rejects a CFS quota above ~2^44 us (EINVAL). The quota is
	// the last write, after every directory and the memory and pids limits.
	id := testID()
	c, err := h.Create(id, Limits{MemoryBytes: 16 << 20, Pids: 8, CPUs: 1e9})
	if err == nil {
		c.Destroy()
		t.Fatal("Create with an impossible CPU quota succeeded")
	}
	t.Logf("expected error: %v", err)
	assertGone(t, h, id)
}

func TestCreateExistingFails(t *testing.T) {
	h := requireHost(t)
	c := create(t, h, Limits{})
	if _, err := h.Create(c.ID(), Limits{}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second Create = %v, want already exists", err)
	}
	for _, d := range c.Dirs() {
		if !exists(d) {
			t.Errorf("failed duplicate Create removed %s", d)
		}
	}
}

func TestKillAndDestroyKillProcess(t *testing.T) {
	h := requireHost(t)
	tests := []struct {
		name string
		stop func(*Cgroup) error
	}{
		{"Kill", (*Cgroup).Kill},
		{"Destroy", (*Cgroup).Destroy},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := create(t, h, Limits{MemoryBytes: 64 << 20, Pids: 16})
			cmd, _ := startHelper(t, c, "/bin/sleep", "30")
			pids, err := c.Procs()
			if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
				t.Fatalf("Procs = %v, %v; want to contain %d", pids, err, cmd.Process.Pid)
			}
			if err := tc.stop(c); err != nil {
				t.Fatal(err)
			}
			err = cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Errorf("sleep ended with %v, want SIGKILL", err)
			}
			if pids, _ := c.Procs(); len(pids) != 0 {
				t.Errorf("Procs after %s = %v", tc.name, pids)
			}
		})
	}
}

// TestKillWhileForking kills a shell that forks short-lived children as
// fast as it can, so Kill races with forks and exits every time.
func TestKillWhileForking(t *testing.T) {
	h := requireHost(t)
	for i := range 5 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			// pids.max is only a safety net here; the churn stays below it.
			c := create(t, h, Limits{Pids: 64})
			cmd, stdin := startHelper(t, c, "/bin/sh", "-c", `read x; while :; do /bin/sh -c 'exit 0' & /bin/true; done`)
			stdin.Write([]byte("go\n"))
			time.Sleep(50 * time.Millisecond)
			if err := c.Kill(); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if pids, _ := c.Procs(); len(pids) != 0 {
				t.Errorf("Procs after Kill = %v", pids)
			}
		})
	}
}

func TestForkBomb(t *testing.T) {
	h := requireHost(t)
	const limit = 16
	c := create(t, h, Limits{Pids: limit, MemoryBytes: 256 << 20})
	// dash exits when a fork fails; the sleeps it started stay behind
	// (reparented) in the cgroup, which is what Kill must then clean up.
	cmd, stdin := startHelper(t, c, "/bin/sh", "-c", `read x; i=0; while [ $i -lt 200 ]; do /bin/sleep 30 & i=$((i+1)); done; wait`)
	stdin.Write([]byte("go\n"))
	deadline := time.Now().Add(10 * time.Second)
	var st Stats
	for {
		var err error
		if st, err = c.Stats(); err != nil {
			t.Fatal(err)
		}
		if st.PidsMaxHits > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.PidsMaxHits == 0 {
		t.Fatalf("no pids.max hit after 10s: %+v", st)
	}
	pids, err := c.Procs()
	if err != nil {
		t.Fatal(err)
	}
	if len(pids) > limit {
		t.Errorf("%d processes in the cgroup, limit %d", len(pids), limit)
	}
	t.Logf("pids.max hits %d, %d processes in the cgroup", st.PidsMaxHits, len(pids))
	// The host can still fork.
	if out, err := exec.Command("/bin/sh", "-c", "echo ok").Output(); err != nil || string(out) != "ok\n" {
		t.Errorf("host fork failed: %q %v", out, err)
	}
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if pids, _ := c.Procs(); len(pids) != 0 {
		t.Errorf("Procs after Kill = %v", pids)
	}
}

func TestOOM(t *testing.T) {
	h := requireHost(t)
	const limit = 32 << 20
	c := create(t, h, Limits{MemoryBytes: limit, Pids: 64})
	cmd, stdin := startHelper(t, c, "", "alloc")
	stdin.Write([]byte("go"))
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("allocator ended with %v, want SIGKILL by the OOM killer", err)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats after OOM: %+v", st)
	if st.OOMKills < 1 {
		t.Errorf("OOMKills = %d, want >= 1", st.OOMKills)
	}
	// v1 memory.failcnt and memsw.failcnt stay 0 on Linux 6.18 even across
	// an OOM kill (observed on the CI host), so only v2 is held to it.
	if h.Version == V2 && st.MemoryMaxHits < 1 {
		t.Errorf("MemoryMaxHits = %d, want >= 1", st.MemoryMaxHits)
	}
	// The peak may pass the limit by a page or so: forced charges.
	if st.PeakMemory < limit*3/4 || !PeakWithin(st.PeakMemory, limit) {
		t.Errorf("PeakMemory = %d, want close to the limit %d", st.PeakMemory, limit)
	}
}

func TestStatsCPU(t *testing.T) {
	h := requireHost(t)
	c := create(t, h, Limits{CPUs: 1})
	cmd, stdin := startHelper(t, c, "", "spin")
	stdin.Write([]byte("go"))
	if err := cmd.Wait(); err != nil {
		t.Fatalf("spin helper: %v", err)
	}
	st, err := c.Stats()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("stats after a 200ms CPU spin: %+v", st)
	// rusage and cpuacct account slightly differently; allow 25%.
	if st.CPU < 150*time.Millisecond || st.CPU > 2*time.Second {
		t.Errorf("CPU = %v, want about 200ms", st.CPU)
	}
}

func TestFD(t *testing.T) {
	h := requireHost(t)
	c := create(t, h, Limits{})
	fd, ok := c.FD()
	if h.Version == V1 {
		if ok {
			t.Errorf("FD() = %d, true on v1", fd)
		}
		return
	}
	if !ok {
		t.Fatal("FD() not ok on v2")
	}
	cmd := exec.Command("/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if pids, _ := c.Procs(); !slices.Contains(pids, cmd.Process.Pid) {
		cmd.Process.Kill()
		t.Fatalf("CLONE_INTO_CGROUP child %d not in %v", cmd.Process.Pid, pids)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
}

func TestOrphansRemove(t *testing.T) {
	h := requireHost(t)
	id := testID()
	c, err := h.Create(id, Limits{Pids: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Destroy()
		assertGone(t, h, id)
	})
	// As if moat was SIGKILLed with a run inside: the Cgroup is dropped
	// and only Orphans/Remove know about it.
	cmd, _ := startHelper(t, c, "/bin/sleep", "30")
	ids, err := h.Orphans()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, id) {
		t.Fatalf("Orphans = %v, want to contain %s", ids, id)
	}
	if err := h.Remove(id); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	if cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("orphan's process ended with %v, want SIGKILL", cmd.ProcessState)
	}
	assertGone(t, h, id)
	if ids, _ := h.Orphans(); slices.Contains(ids, id) {
		t.Errorf("Orphans still lists %s", id)
	}
	if err := h.Remove(id); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// BenchmarkCreateDestroy measures the per-run cgroup overhead with all
// limits set, against creating and removing the directories alone (the
// floor no implementation can beat).
func BenchmarkCreateDestroy(b *testing.B) {
	h := requireHost(b)
	lim := Limits{MemoryBytes: 256 << 20, Pids: 256, CPUs: 1}
	// Prepare the parents outside the measurement.
	c, err := h.Create(testID(), Limits{})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Destroy(); err != nil {
		b.Fatal(err)
	}
	b.Run("moat", func(b *testing.B) {
		for b.Loop() {
			id := testID()
			c, err := h.Create(id, lim)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Destroy(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("mkdir-rmdir", func(b *testing.B) {
		for b.Loop() {
			id := testID()
			c := h.handle(id)
			for _, d := range c.dirs {
				if err := os.Mkdir(d, 0o755); err != nil {
					b.Fatal(err)
				}
			}
			for _, d := range c.dirs {
				if err := os.Remove(d); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// churnRounds is how many cgroups each churn helper makes.
var churnRounds = 150

// churn makes, measures and destroys rounds cgroups, each followed by a
// Prune, and prints every failure; it returns the exit code.
func churn(rounds int) int {
	h, err := Detect()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	failed := 0
	for i := range rounds {
		id := fmt.Sprintf("%s%d", testPrefix, i)
		c, err := h.Create(id, Limits{MemoryBytes: 64 << 20, Pids: 16, CPUs: 0.5})
		if err == nil {
			_, err = c.Stats()
			if derr := c.Destroy(); err == nil {
				err = derr
			}
		}
		if perr := h.Prune(); err == nil {
			err = perr
		}
		if err != nil {
			fmt.Printf("round %d: %v\n", i, err)
			failed++
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// TestCreateAcrossProcesses: moat processes on one host make and destroy
// runs' cgroups at once, and each prunes the shared moat/ parents when it
// thinks it is the last. A prune must never take the parents from under
// another process's Create (issue 17: "mkdir moat/<id>: no such file or
// directory", "open memory.max: no such file or directory" on v2).
func TestCreateAcrossProcesses(t *testing.T) {
	h := requireHost(t)
	procs := 8
	if n, err := strconv.Atoi(os.Getenv("MOAT_CHURN_PROCS")); err == nil {
		procs = n
	}
	var cmds []*exec.Cmd
	outs := make([]*bytes.Buffer, procs)
	for i := range procs {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=churn")
		cmd.Stdin = strings.NewReader("x")
		outs[i] = &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("process %d of %d (%d cgroups each): %v\n%s", i, procs, churnRounds, err, outs[i])
		}
	}
	ids, err := h.Orphans()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		for _, cmd := range cmds {
			if strings.HasPrefix(id, fmt.Sprintf("t%d-", cmd.Process.Pid)) {
				t.Errorf("moat/%s left behind", id)
			}
		}
	}
}
