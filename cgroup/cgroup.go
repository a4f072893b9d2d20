package cgroup

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/runid"
)

// cfsPeriodUs is the CFS bandwidth period: 100 ms, the kernel default.
const cfsPeriodUs = 100000

// minQuotaUs is the smallest CFS quota the kernel accepts (1 ms).
const minQuotaUs = 1000

// killTimeout bounds Kill, and rmdirTimeout the rmdir retries of Destroy. A
// process in uninterruptible sleep (D state, e.g. on a slow disk or NFS)
// takes a SIGKILL only when it returns to user space, and its cgroup cannot
// be removed until then.
// freezeWait bounds one wait for a cgroup to report itself frozen.
const freezeWait = 100 * time.Millisecond

const (
	killTimeout  = 5 * time.Second
	rmdirTimeout = 2 * time.Second
)

// Limits are the resource limits of one run. A zero field means "no limit
// from moat" for that resource; the engine decides whether that is allowed.
type Limits struct {
	// MemoryBytes caps the run's memory. Swap is never allowed: on v1 the
	// memory+swap limit is set to the same value, on v2 memory.swap.max is 0.
	MemoryBytes int64
	// Pids caps the number of tasks (processes and threads) in the run.
	Pids int
	// CPUs is the CPU bandwidth in CPUs: a quota of CPUs*100ms per 100ms
	// period. At least 0.01.
	CPUs float64
}

func (l Limits) validate() error {
	if l.MemoryBytes < 0 {
		return fmt.Errorf("cgroup limits: MemoryBytes %d is negative; use 0 for no limit", l.MemoryBytes)
	}
	if l.Pids < 0 {
		return fmt.Errorf("cgroup limits: Pids %d is negative; use 0 for no limit", l.Pids)
	}
	if l.CPUs < 0 || math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) {
		return fmt.Errorf("cgroup limits: CPUs %v is not a non-negative number; use 0 for no limit", l.CPUs)
	}
	if l.CPUs > 0 {
		q := l.CPUs * cfsPeriodUs
		if q < minQuotaUs {
			return fmt.Errorf("cgroup limits: CPUs %v is below the kernel minimum of %v", l.CPUs, float64(minQuotaUs)/cfsPeriodUs)
		}
		if q > math.MaxInt64/2 {
			return fmt.Errorf("cgroup limits: CPUs %v is too large", l.CPUs)
		}
	}
	return nil
}

func (l Limits) quotaUs() int64 { return int64(l.CPUs * cfsPeriodUs) }

// Stats is what a run used, read from the kernel's counters.
type Stats struct {
	// CPU is user+system CPU time of every process that ran in the cgroup.
	CPU time.Duration
	// PeakMemory is the highest memory usage in bytes. It stays valid after
	// the processes died. On v2 kernels before 5.19 (no memory.peak) it is
	// the highest memory.current seen by any Stats call, so call Stats
	// periodically there.
	PeakMemory int64
	// OOMKills is how many processes the kernel OOM-killed for this
	// cgroup's memory limit.
	OOMKills int
	// MemoryMaxHits is how often usage reached the memory limit and the
	// kernel had to reclaim (v1 memory.failcnt + memory.memsw.failcnt, v2
	// memory.events "max"). Hits without OOM kills mean the run was slowed,
	// not killed. Best effort on v1: Linux 6.18 leaves failcnt at 0 even
	// across an OOM kill. OOMKills is reliable on both.
	MemoryMaxHits int
	// PidsMaxHits is how often a fork or clone failed because pids.max was
	// reached (pids.events "max" on v1 and v2).
	PidsMaxHits int
}

// ForcedChargeSlack is how far a memory cgroup's peak may exceed its limit
// while the limit held: the kernel charges some pages whatever the limit
// (__GFP_NOFAIL allocations, and those of a task being OOM-killed, so that
// it can exit: try_charge_memcg's "force"). In practice this is a few pages
// (4 KiB seen on a gVisor Sentry killed at 96 MiB, 12 KiB at 64 MiB). A
// missing or unenforced limit shows tens of MiB more.
const ForcedChargeSlack = 1 << 20

// PeakWithin says whether a peak memory usage respects limit, allowing the
// kernel's forced charges (ForcedChargeSlack).
func PeakWithin(peak, limit int64) bool { return peak <= limit+ForcedChargeSlack }

// Cgroup is one run's cgroup. Its methods are safe for concurrent use.
type Cgroup struct {
	id   string
	host *Host
	// dirs are the run's directories, one per hierarchy (v1) or one (v2),
	// in creation order.
	dirs []string
	// Per-controller directories; on v2 all are dirs[0].
	memDir, pidsDir, cpuDir, acctDir, freezerDir string
	// fd is the v2 O_PATH directory fd for CLONE_INTO_CGROUP, or -1.
	fd int
	// parentsFD holds the parents lock shared while the cgroup exists
	// (Host.holdParents), or is -1.
	parentsFD int

	mu        sync.Mutex
	destroyed bool
	peakSeen  int64 // v2 without memory.peak: max memory.current observed
}

// handle returns a Cgroup for moat/<id> without creating anything.
func (h *Host) handle(id string) *Cgroup {
	c := &Cgroup{id: id, host: h, fd: -1, parentsFD: -1}
	if h.Version == V2 {
		d := filepath.Join(h.v2Parent, id)
		c.dirs = []string{d}
		c.memDir, c.pidsDir, c.cpuDir, c.acctDir, c.freezerDir = d, d, d, d, d
		return c
	}
	dir := func(ctl string) string {
		d := filepath.Join(h.v1[ctl], parentName, id)
		if !slices.Contains(c.dirs, d) {
			c.dirs = append(c.dirs, d)
		}
		return d
	}
	c.freezerDir = dir("freezer")
	c.memDir = dir("memory")
	c.pidsDir = dir("pids")
	c.cpuDir = dir("cpu")
	c.acctDir = dir("cpuacct")
	return c
}

// Create makes the run's cgroup moat/<id> (in every needed v1 hierarchy, or
// one v2 directory) and applies lim. An existing moat/<id> is an error: it
// is never adopted. On any failure everything Create made is removed.
func (h *Host) Create(id string, lim Limits) (*Cgroup, error) {
	if err := runid.Check(id); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	if err := lim.validate(); err != nil {
		return nil, err
	}
	pfd, err := h.holdParents()
	if err != nil {
		return nil, err
	}
	c := h.handle(id)
	c.parentsFD = pfd
	// Undo in reverse on failure. A fresh cgroup holds no process, so
	// removing it is a plain rmdir.
	var undo []string
	ok := false
	defer func() {
		if ok {
			return
		}
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		for _, d := range slices.Backward(undo) {
			h.fs.rmdir(d)
		}
		c.releaseParents()
		h.Prune()
	}()
	if err := h.prepare(); err != nil {
		return nil, err
	}
	for _, d := range c.dirs {
		err := h.fs.mkdir(d)
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create cgroup %s: %s already exists (an orphan? see Orphans/Remove)", id, d)
		}
		if err != nil {
			return nil, fmt.Errorf("create cgroup %s: mkdir %s: %w", id, d, err)
		}
		undo = append(undo, d)
	}
	if h.Version == V1 {
		err = c.applyV1(lim)
	} else {
		err = c.applyV2(lim)
	}
	if err != nil {
		return nil, fmt.Errorf("create cgroup %s: %w", id, err)
	}
	if h.Version == V2 {
		fd, err := unix.Open(c.dirs[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("create cgroup %s: open %s: %w", id, c.dirs[0], err)
		}
		c.fd = fd
	}
	ok = true
	return c, nil
}

// applyV1 writes the limits of a fresh v1 cgroup. Unset limits are not
// written: a new cgroup starts unlimited, and every write costs.
func (c *Cgroup) applyV1(lim Limits) error {
	if lim.MemoryBytes > 0 {
		v := strconv.FormatInt(lim.MemoryBytes, 10)
		// Order matters: the kernel keeps memsw >= limit and refuses a
		// memsw write below the current limit (EINVAL). A new cgroup starts
		// with both unlimited, so the limit goes first, then memsw gets the
		// same value, which leaves no room for swap.
		if err := writeFile(filepath.Join(c.memDir, "memory.limit_in_bytes"), v); err != nil {
			return err
		}
		if c.host.memsw {
			if err := writeFile(filepath.Join(c.memDir, "memory.memsw.limit_in_bytes"), v); err != nil {
				return err
			}
		} else {
			// No swap accounting: memsw cannot forbid swap, so at least
			// tell reclaim not to swap this cgroup's anonymous memory.
			// Best effort: the file is read-only on some kernels.
			_ = writeFile(filepath.Join(c.memDir, "memory.swappiness"), "0")
		}
	}
	if lim.Pids > 0 {
		if err := writeFile(filepath.Join(c.pidsDir, "pids.max"), strconv.Itoa(lim.Pids)); err != nil {
			return err
		}
	}
	if lim.CPUs > 0 {
		// cpu.cfs_period_us is not written: a new cgroup's period is the
		// kernel's fixed default of 100 ms, which is what we want.
		if err := writeFile(filepath.Join(c.cpuDir, "cpu.cfs_quota_us"), strconv.FormatInt(lim.quotaUs(), 10)); err != nil {
			return err
		}
	}
	return nil
}

// applyV2 writes the limits of a fresh v2 cgroup.
func (c *Cgroup) applyV2(lim Limits) error {
	d := c.dirs[0]
	if lim.MemoryBytes > 0 {
		if err := writeFile(filepath.Join(d, "memory.max"), strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
	}
	// No swap, whether or not a memory limit is set. The file is absent
	// when swap accounting is off (then there is nothing to forbid).
	if err := writeFile(filepath.Join(d, "memory.swap.max"), "0"); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	// memory.oom.group=1: on OOM the kernel kills the whole run at once
	// instead of one process (usually the biggest child), so a run never
	// continues half-dead, and "oom" is the run's termination cause. v1 has
	// no equivalent; there the engine kills the rest after an OOM kill.
	if err := writeFile(filepath.Join(d, "memory.oom.group"), "1"); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	if lim.Pids > 0 {
		if err := writeFile(filepath.Join(d, "pids.max"), strconv.Itoa(lim.Pids)); err != nil {
			return err
		}
	}
	if lim.CPUs > 0 {
		v := strconv.FormatInt(lim.quotaUs(), 10) + " " + strconv.Itoa(cfsPeriodUs)
		if err := writeFile(filepath.Join(d, "cpu.max"), v); err != nil {
			return err
		}
	}
	return nil
}

// SetCPUs sets the cgroup's CPU bandwidth to cpus CPUs (a quota of
// cpus*100ms per 100ms period), or removes the limit when cpus is 0. A
// tier whose setup is Moat's own work (a VM booting its kernel) creates
// the cgroup without a CPU limit and sets it when the program starts, so
// the program's share is what the manifest says and the setup is not
// slowed by a small one.
func (c *Cgroup) SetCPUs(cpus float64) error {
	lim := Limits{CPUs: cpus}
	if err := lim.validate(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return fmt.Errorf("cgroup %s: set CPUs: destroyed", c.id)
	}
	var file, v string
	if c.host.Version == V1 {
		file, v = filepath.Join(c.cpuDir, "cpu.cfs_quota_us"), "-1"
		if cpus > 0 {
			v = strconv.FormatInt(lim.quotaUs(), 10)
		}
	} else {
		file, v = filepath.Join(c.cpuDir, "cpu.max"), "max "+strconv.Itoa(cfsPeriodUs)
		if cpus > 0 {
			v = strconv.FormatInt(lim.quotaUs(), 10) + " " + strconv.Itoa(cfsPeriodUs)
		}
	}
	if err := writeFile(file, v); err != nil {
		return fmt.Errorf("cgroup %s: set CPUs: %w", c.id, err)
	}
	return nil
}

// ID returns the run id the cgroup was created for.
func (c *Cgroup) ID() string { return c.id }

// Dirs returns the cgroup's directories (one per v1 hierarchy, or one).
func (c *Cgroup) Dirs() []string { return slices.Clone(c.dirs) }

// Add moves process pid (with all its threads) into the cgroup. On v1 it is
// written into every hierarchy, freezer first; if a later write fails the
// process is partly moved and the caller should Destroy the cgroup, which
// kills it. Prefer FD with CLONE_INTO_CGROUP on v2: the child then starts
// inside the cgroup, with no window in which it runs unlimited.
func (c *Cgroup) Add(pid int) error {
	if pid <= 0 {
		return fmt.Errorf("cgroup %s: add pid %d: not a pid", c.id, pid)
	}
	s := strconv.Itoa(pid)
	// A v1 migration waits for an RCU grace period in each hierarchy
	// (about 1-2 ms each here); the hierarchies are independent, so the
	// writes go in parallel and the waits overlap.
	errs := make([]error, len(c.dirs))
	var wg sync.WaitGroup
	for i, d := range c.dirs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := writeFile(filepath.Join(d, "cgroup.procs"), s); err != nil {
				errs[i] = fmt.Errorf("cgroup %s: add pid %d: %w", c.id, pid, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// JoinFiles opens, on v1, every hierarchy's "tasks" file of the cgroup
// for writing, for a thread to move itself in with Join instead of being
// moved with Add. Open them as root: the kernel judges a write by the
// credentials of the file's opener, so the thread may be an unprivileged
// one (init in its user namespace). The caller closes them. On v2 it
// returns nil: use FD with CLONE_INTO_CGROUP.
//
// Why: a cgroup.procs write (Add) takes the kernel's global
// cgroup_threadgroup_rwsem for writing, and the first writer after a quiet
// spell waits for an RCU grace period (8-16 ms measured here, on every cold
// run). A thread that moves itself ("0" written to tasks) needs no
// threadgroup stability and skips that lock (cgroup_procs_write_start in
// kernel/cgroup/cgroup.c).
func (c *Cgroup) JoinFiles() ([]*os.File, error) {
	if c.fd >= 0 {
		return nil, nil
	}
	var files []*os.File
	for _, d := range c.dirs {
		p := filepath.Join(d, "tasks")
		fd, err := openRetry(p, unix.O_WRONLY|unix.O_CLOEXEC)
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return nil, fmt.Errorf("cgroup %s: open %s: %w", c.id, p, err)
		}
		files = append(files, os.NewFile(uintptr(fd), p))
	}
	return files, nil
}

// Join moves the calling thread (not its process's other threads) into
// the cgroups whose "tasks" files are open on fds (from JoinFiles), and
// closes the fds. Processes and threads the thread creates afterwards are
// born in its cgroups, so a caller locked to its OS thread
// (runtime.LockOSThread) that forks every process it starts puts all of
// them inside; the v1 memory controller charges the whole process's memory
// to its thread group leader's cgroup, so the leader is the thread to move.
func Join(fds []int) error {
	var errs []error
	for _, fd := range fds {
		for {
			_, err := unix.Write(fd, []byte("0"))
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("join cgroup (fd %d): %w", fd, err))
			}
			break
		}
		unix.Close(fd)
	}
	return errors.Join(errs...)
}

// FD returns an O_PATH directory fd of the v2 cgroup, for
// syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}. It stays open until
// Destroy. ok is false on v1, which has no CLONE_INTO_CGROUP.
func (c *Cgroup) FD() (fd int, ok bool) {
	if c.fd < 0 {
		return -1, false
	}
	return c.fd, true
}

// Procs returns the pids in the cgroup, sorted. On v1 it is the union over
// every hierarchy, so a process that a failed Add left in some of them is
// still seen (and killed). A missing directory counts as empty.
func (c *Cgroup) Procs() ([]int, error) {
	var all []int
	for _, d := range c.dirs {
		data, err := readFile(filepath.Join(d, "cgroup.procs"))
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", c.id, err)
		}
		pids, err := parsePids(data)
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: %s: %w", c.id, d, err)
		}
		all = append(all, pids...)
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// Kill kills every process in the cgroup and returns once the cgroup is
// empty, or with an error naming the pids left after 2 s.
//
// It is race-free against forks: on v2 with cgroup.kill (5.14+) the kernel
// kills the whole cgroup, including children forked meanwhile. Otherwise
// the cgroup is frozen (v2 cgroup.freeze, v1 freezer.state), so nothing in
// it can fork or exit and reuse of a pid is impossible, every pid in
// cgroup.procs gets SIGKILL, and the cgroup is thawed so the signals are
// delivered; repeated until empty.
func (c *Cgroup) Kill() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kill()
}

func (c *Cgroup) kill() error {
	deadline := time.Now().Add(killTimeout)
	pids, err := c.Procs()
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		// Nothing can enter a cgroup by itself, so empty stays empty.
		return nil
	}
	if c.host.Version == V2 {
		err := writeFile(filepath.Join(c.dirs[0], "cgroup.kill"), "1")
		if err == nil {
			return c.waitEmpty(deadline)
		}
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("cgroup %s: kill: %w", c.id, err)
		}
		// Kernel before 5.14: fall back to freeze and kill.
	}
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		if err := c.freezeKillThaw(deadline); err != nil {
			return err
		}
		if pids, err = c.Procs(); err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: kill: pids %v still present after %v (uninterruptible sleep?)", c.id, pids, killTimeout)
		}
		time.Sleep(pause)
	}
}

func (c *Cgroup) freezeKillThaw(deadline time.Time) (err error) {
	if err := c.freeze(true, deadline); err != nil {
		return err
	}
	defer func() {
		if terr := c.freeze(false, deadline); terr != nil && err == nil {
			err = terr
		}
	}()
	// Read the pids again now that the cgroup is frozen: the list read
	// before may miss a child forked in the meantime.
	pids, err := c.Procs()
	if err != nil {
		return err
	}
	for _, p := range pids {
		// ESRCH: it exited between the read and the kill; fine.
		if err := unix.Kill(p, unix.SIGKILL); err != nil && err != unix.ESRCH {
			return fmt.Errorf("cgroup %s: kill pid %d: %w", c.id, p, err)
		}
	}
	return nil
}

// freeze freezes (on=true) or thaws the cgroup. Freezing waits until the
// kernel reports the cgroup frozen, but only until the deadline: a task in
// D state stays "freezing", and it will still take the queued SIGKILL.
func (c *Cgroup) freeze(on bool, deadline time.Time) error {
	var file, val, state, want string
	if c.host.Version == V2 {
		file, state = "cgroup.freeze", "cgroup.events"
		val, want = "0", "frozen 0"
		if on {
			val, want = "1", "frozen 1"
		}
	} else {
		file, state = "freezer.state", "freezer.state"
		val, want = "THAWED", "THAWED"
		if on {
			val, want = "FROZEN", "FROZEN"
		}
	}
	f := filepath.Join(c.freezerDir, file)
	if err := writeFile(f, val); err != nil {
		if errors.Is(err, unix.ENOENT) {
			// No freezer to use: the freezer directory of a partial orphan
			// is gone, or a v2 kernel before 5.2 has no cgroup.freeze. Kill
			// anyway; the loop in kill catches children forked meanwhile.
			return nil
		}
		return fmt.Errorf("cgroup %s: freeze: %w", c.id, err)
	}
	if !on {
		return nil
	}
	s := filepath.Join(c.freezerDir, state)
	// Wait briefly, not until the overall deadline: a cgroup that stays
	// "freezing" (a task in D state, a loaded host) is killed anyway, and
	// the caller's loop retries freeze-kill-thaw until it is empty.
	if d := time.Now().Add(freezeWait); d.Before(deadline) {
		deadline = d
	}
	for pause := 100 * time.Microsecond; time.Now().Before(deadline); pause = min(2*pause, 10*time.Millisecond) {
		data, err := readFile(s)
		if err != nil {
			return fmt.Errorf("cgroup %s: freeze: %w", c.id, err)
		}
		if containsLine(data, want) {
			return nil
		}
		time.Sleep(pause)
	}
	return nil
}

func containsLine(data []byte, line string) bool {
	return slices.Contains(strings.Split(string(data), "\n"), line)
}

// waitEmpty polls cgroup.procs until it is empty or the deadline passes.
func (c *Cgroup) waitEmpty(deadline time.Time) error {
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		pids, err := c.Procs()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: kill: pids %v still present after %v (uninterruptible sleep?)", c.id, pids, killTimeout)
		}
		time.Sleep(pause)
	}
}

// Stats reads the cgroup's usage counters. Call it after Kill for final
// numbers: the counters outlive the processes (not the cgroup).
func (c *Cgroup) Stats() (Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.host.Version == V1 {
		return c.statsV1()
	}
	return c.statsV2()
}

func (c *Cgroup) statsV1() (Stats, error) {
	var st Stats
	ns, err := c.readInt(c.acctDir, "cpuacct.usage")
	if err != nil {
		return st, err
	}
	st.CPU = time.Duration(ns)
	if st.PeakMemory, err = c.readInt(c.memDir, "memory.max_usage_in_bytes"); err != nil {
		return st, err
	}
	fail, err := c.readInt(c.memDir, "memory.failcnt")
	if err != nil {
		return st, err
	}
	if c.host.memsw {
		// With memsw == limit a charge fails on the memory+swap counter,
		// which the kernel tries first, so the hit lands in memsw.failcnt
		// and memory.failcnt stays 0. A failed charge counts in one only.
		sw, err := c.readInt(c.memDir, "memory.memsw.failcnt")
		if err != nil {
			return st, err
		}
		fail += sw
	}
	st.MemoryMaxHits = int(fail)
	oom, err := c.readKeyed(c.memDir, "memory.oom_control")
	if err != nil {
		return st, err
	}
	st.OOMKills = int(oom["oom_kill"])
	ev, err := c.readKeyed(c.pidsDir, "pids.events")
	if err != nil {
		return st, err
	}
	st.PidsMaxHits = int(ev["max"])
	return st, nil
}

func (c *Cgroup) statsV2() (Stats, error) {
	var st Stats
	d := c.dirs[0]
	cpu, err := c.readKeyed(d, "cpu.stat")
	if err != nil {
		return st, err
	}
	st.CPU = time.Duration(cpu["usage_usec"]) * time.Microsecond
	peak, err := c.readInt(d, "memory.peak")
	if errors.Is(err, unix.ENOENT) {
		// Before 5.19: the best we have is the highest current usage seen.
		cur, err := c.readInt(d, "memory.current")
		if err != nil {
			return st, err
		}
		c.peakSeen = max(c.peakSeen, cur)
		peak = c.peakSeen
	} else if err != nil {
		return st, err
	}
	st.PeakMemory = peak
	mem, err := c.readKeyed(d, "memory.events")
	if err != nil {
		return st, err
	}
	st.OOMKills = int(mem["oom_kill"])
	st.MemoryMaxHits = int(mem["max"])
	ev, err := c.readKeyed(d, "pids.events")
	if err != nil {
		return st, err
	}
	st.PidsMaxHits = int(ev["max"])
	return st, nil
}

func (c *Cgroup) readInt(dir, name string) (int64, error) {
	p := filepath.Join(dir, name)
	data, err := readFile(p)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s stats: %w", c.id, err)
	}
	v, err := parseInt(data)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s stats: %s: %w", c.id, p, err)
	}
	return v, nil
}

func (c *Cgroup) readKeyed(dir, name string) (map[string]int64, error) {
	data, err := readFile(filepath.Join(dir, name))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s stats: %w", c.id, err)
	}
	return parseKeyed(data), nil
}

// Destroy kills every process in the cgroup, waits until it is empty and
// removes its directory in every hierarchy, retrying for up to 2 s while the
// kernel still reports it busy (dying tasks). It is idempotent; once it
// returns nil nothing named moat/<id> exists. On error the cgroup is left
// for a later Destroy, Remove or `moat gc`, and the error names the pids.
func (c *Cgroup) Destroy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return nil
	}
	if err := c.kill(); err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	deadline := time.Now().Add(rmdirTimeout)
	for _, d := range slices.Backward(c.dirs) {
		if err := c.rmdir(d, deadline); err != nil {
			return err
		}
	}
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	c.destroyed = true
	c.releaseParents()
	// The moat/ parents go too when no other run uses them.
	c.host.Prune()
	return nil
}

// releaseParents lets the parents lock go.
func (c *Cgroup) releaseParents() {
	if c.parentsFD >= 0 {
		unix.Close(c.parentsFD)
		c.parentsFD = -1
	}
}

func (c *Cgroup) rmdir(d string, deadline time.Time) error {
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 20*time.Millisecond) {
		err := c.host.fs.rmdir(d)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			pids, _ := c.Procs()
			return fmt.Errorf("destroy cgroup %s: rmdir %s: %w (pids left: %v)", c.id, d, err, pids)
		}
		time.Sleep(pause)
	}
}
