package redteam

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/seccomp"
)

// Cases about the kernel boundary that a single program and the
// declarative checks cannot judge: the compiled seccomp filter against every
// system call number, the descriptors and limits of the sandbox's processes
// as the host's /proc shows them, the host's own responsiveness during a
// bomb, processes that try to outlive their run, and what moat itself keeps
// of a flood of output.
func registerKernelCases() {
	register(Case{
		ID: "sc-syscall-sweep", Category: "seccomp", Severity: "critical",
		Threat: "a system call the policy denies is reachable anyway: the filter installed in the sandbox differs from the policy table (a compiler bug, a rule in the wrong order, an x32 number slipping through)",
		Why: "a prober in the sandbox calls every amd64 number 0..471 and every x32 number (nr|0x40000000) with zero arguments; for each one the compiled seccomp.Default() answers with an errno at zero arguments (explicit denials, conditional rules such as socket(0) -> EAFNOSUPPORT, the ENOSYS default, the x32 EPERM), the host requires exactly that errno. " +
			"Numbers that would disturb the prober are skipped: " + sweepSkipDoc(),
		custom: syscallSweep,
		PerTier: map[string]TierExpect{"gvisor": {NotApplicable: true,
			Reason: "the sweep compares the filter installed on the program with the native tier's policy table (seccomp.Default()); on gVisor no such filter is installed on the program: the Sentry implements or refuses each call itself, and the host filters are gVisor's own, whose presence on every host thread of the run the host_procs cases check"}},
	})
	register(Case{
		ID: "priv-inherited-fds", Category: "privilege", Severity: "critical",
		Threat: "the program inherits a descriptor beyond 0-2: one its caller leaked into moat (a pipe or socket to a host process, a host directory: runc's CVE-2024-21626), init's status or config pipe; it writes to every descriptor it has, and forges a status (exit 42) into init's through /proc/1/fd",
		Why:    "moat and init pass the program fds 0, 1 and 2 only: descriptors moat inherited are closed or close-on-exec before init starts, init's own are close-on-exec, and init is not dumpable, so /proc/1/fd is closed to the program. The host plants an inheritable pipe in its own process before the run (a careless caller), reads every sandbox process's descriptor table from its own /proc (init excepted), requires the pipe to stay empty and the result to carry the program's real exit status",
		custom: inheritedFDs,
		alone:  true, // the planted descriptor would reach concurrent runs
	})
	register(Case{
		ID: "res-fork-bomb", Category: "resources", Severity: "critical",
		Threat: "a fork bomb (shell function piping into itself in the background) exhausts the host's process table and makes the host unresponsive",
		Why:    "the cgroup pids limit (64) stops the bomb inside the sandbox and the timeout (3 s) kills the whole cgroup; during the bomb the host forks and runs /bin/true twenty times, each within 1 s, and again right after",
		custom: forkBomb,
	})
	register(Case{
		ID: "res-daemon-outlives", Category: "resources", Severity: "high",
		Threat: "a setsid double-forked daemon, ignoring SIGHUP and SIGTERM, outlives its run and keeps executing on the host after moat reported the run over",
		Why:    "init is PID 1 of the run's PID namespace, so its death kills every process in it, and the host kills the cgroup as a whole; right after Run returns, and 300 ms later, the host's /proc has no process in the run's cgroup and no process left of the sandbox's id range that was seen in the run",
		custom: daemonOutlives,
		alone:  true,
	})
	register(Case{
		ID: "res-fd-exhaustion", Category: "resources", Severity: "medium",
		Threat: "open descriptors until the kernel refuses, after trying to raise RLIMIT_NOFILE, to exhaust the host's file table",
		Why:    "RLIMIT_NOFILE (soft and hard) is resources.open_files (64 here) and raising the hard limit needs CAP_SYS_RESOURCE; the host counts every sandbox process's descriptors and reads its limits from its own /proc",
		custom: fdExhaustion,
	})
	register(Case{
		ID: "res-stdout-flood", Category: "resources", Severity: "high",
		Threat: "write 10 GB to stdout to exhaust moat's memory or the caller's disk through the result",
		Why:    "moat keeps at most resources.stdout_bytes (1 MiB) and only counts the rest; the timeout (3 s) ends the flood; the host checks the kept bytes, the count, the output violation, the run's duration and that moat's own peak resident memory grew by less than 64 MiB",
		custom: stdoutFlood,
	})
}

// sweepSkip are the numbers the prober must not call even with zero
// arguments, because if the filter let them through they would end,
// block, fork or re-filter the prober itself. Every one is allowed by the
// policy except where noted; the x32 numbers of the same calls are skipped
// too.
var sweepSkip = map[int]string{
	unix.SYS_EXIT: "exit", unix.SYS_EXIT_GROUP: "exit_group", unix.SYS_RT_SIGRETURN: "rt_sigreturn",
	unix.SYS_PAUSE: "pause", unix.SYS_RT_SIGSUSPEND: "rt_sigsuspend",
	unix.SYS_SELECT: "select (NULL timeout blocks)", unix.SYS_PSELECT6: "pselect6", unix.SYS_PPOLL: "ppoll",
	unix.SYS_RT_SIGTIMEDWAIT: "rt_sigtimedwait",
	unix.SYS_FORK:            "fork", unix.SYS_VFORK: "vfork", unix.SYS_CLONE: "clone (flags 0 forks)",
	unix.SYS_KILL: "kill", unix.SYS_TKILL: "tkill", unix.SYS_TGKILL: "tgkill", unix.SYS_RT_TGSIGQUEUEINFO: "rt_tgsigqueueinfo",
	unix.SYS_SECCOMP:         "seccomp (zero arguments is SECCOMP_SET_MODE_STRICT)",
	unix.SYS_SET_TID_ADDRESS: "set_tid_address",
}

// kernelPassthrough are numbers recent kernels run without consulting
// seccomp at all, so no filter can refuse them: uretprobe (Linux 6.13) and
// uprobe (6.16) exist only for the return trampolines of uprobes, which the
// sandbox cannot create (perf_event_open is denied, there is no tracefs).
// Called from anywhere else they do nothing but kill the caller with SIGILL
// (uretprobe) or fail with ENXIO (uprobe). The sweep checks exactly that
// harmless outcome; anything else is an escape. docs/THREATS.md lists them.
var kernelPassthrough = map[int]struct {
	name   string
	signal unix.Signal
	errno  unix.Errno
}{
	335: {name: "uretprobe", signal: unix.SIGILL},
	336: {name: "uprobe", errno: unix.ENXIO},
}

func sweepSkipDoc() string {
	names := make([]string, 0, len(sweepSkip))
	for _, n := range sweepSkip {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ") + "; clone3 and reboot are denied and called"
}

// sweeper calls every number given on its command line with six zero
// arguments, each in a child of its own (a call the kernel answers with a
// signal ends only that child; an alarm ends one that blocks), and prints
// "nr errno" (errno 0 for success) or "nr signal N".
const sweeper = `
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
for a in sys.argv[1:]:
    nr = int(a)
    pid = os.fork()
    if pid == 0:
        signal.alarm(2)
        ctypes.set_errno(0)
        r = libc.syscall(L(nr), L(0), L(0), L(0), L(0), L(0), L(0))
        os.write(1, b"%d %d\n" % (nr, 0 if r >= 0 else ctypes.get_errno()))
        os._exit(0)
    _, st = os.waitpid(pid, 0)
    if os.WIFSIGNALED(st):
        os.write(1, b"%d signal %d\n" % (nr, os.WTERMSIG(st)))
print("sweep done", flush=True)
`

func syscallSweep(ctx context.Context, r *runner) (string, string, int) {
	pol := seccomp.Default()
	filter, err := pol.Compile()
	if err != nil {
		return Error, "compile the policy: " + err.Error(), 0
	}
	table := seccomp.Table(pol)
	// want: the errno the compiled filter gives each number at zero
	// arguments, for those it refuses.
	want := map[int]unix.Errno{}
	allowed, x32, skipped := 0, 0, 0
	var nrs []string
	for _, base := range []int{0, 0x40000000} {
		for _, e := range table {
			if _, skip := sweepSkip[e.Nr]; skip {
				skipped++
				continue
			}
			nr := base | e.Nr
			act, errno, err := seccomp.Evaluate(filter, unix.AUDIT_ARCH_X86_64, nr, [6]uint64{})
			if err != nil {
				return Error, fmt.Sprintf("evaluate %d: %v", nr, err), 0
			}
			switch act {
			case seccomp.Errno:
				want[nr] = errno
				if base != 0 {
					x32++
				}
			case seccomp.Allow, seccomp.Log:
				allowed++
			default:
				return Error, fmt.Sprintf("policy decides %d by %v: the sweep cannot call it", nr, act), 0
			}
			nrs = append(nrs, strconv.Itoa(nr))
		}
	}
	m := r.defaults()
	m.Tier = r.tier
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: append([]string{"python3", "-c", sweeper}, nrs...)})
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	out := decode(res.Stdout)
	if !strings.Contains(out, "sweep done") {
		return Error, fmt.Sprintf("the prober did not finish (termination %s, stderr %q)", res.Termination, clip(decode(res.Stderr), 300)), 1
	}
	got := map[int]unix.Errno{}
	killed := map[int]unix.Signal{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2:
			nr, err1 := strconv.Atoi(f[0])
			en, err2 := strconv.Atoi(f[1])
			if err1 == nil && err2 == nil {
				got[nr] = unix.Errno(en)
			}
		case len(f) == 3 && f[1] == "signal":
			nr, err1 := strconv.Atoi(f[0])
			sig, err2 := strconv.Atoi(f[2])
			if err1 == nil && err2 == nil {
				killed[nr] = unix.Signal(sig)
			}
		}
	}
	var bad []string
	passed := 0
	for nr, w := range want {
		g, ok := got[nr]
		sig, dead := killed[nr]
		if pt, isPT := kernelPassthrough[nr]; isPT {
			switch {
			case pt.signal != 0 && dead && sig == pt.signal, pt.errno != 0 && ok && g == pt.errno:
				passed++
				continue
			case ok && g == w:
				// Kernels before 6.13 / 6.16 (the microvm tier's guest
				// kernel 6.1): the kernel consults the filter for the
				// number, which answers as the policy says; judged below.
			default:
				bad = append(bad, fmt.Sprintf("%s (%d, run by the kernel past seccomp): want only %v, got %s", pt.name, nr, pt, errnoOrSignal(g, ok, sig, dead)))
				continue
			}
		}
		switch {
		case dead:
			// The policy answers this number with an errno: a signal means
			// the kernel ran it, past the filter.
			bad = append(bad, fmt.Sprintf("%s: want %s, the kernel ran it and sent %s", sweepName(nr), unix.ErrnoName(w), unix.SignalName(sig)))
		case !ok:
			return Error, fmt.Sprintf("the prober did not report number %d", nr), 1
		case g != w:
			bad = append(bad, fmt.Sprintf("%s: want %s, got %s", sweepName(nr), unix.ErrnoName(w), errnoOrOK(g)))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return Escaped, fmt.Sprintf("%d of %d denied numbers answered otherwise than the policy: %s", len(bad), len(want), clip(strings.Join(bad, "; "), 600)), 1
	}
	return Contained, fmt.Sprintf("%d denied numbers (%d native, %d x32) each returned the policy's errno (%d run by the kernel past seccomp, harmlessly: uretprobe, uprobe); %d allowed numbers called; %d skipped",
		len(want), len(want)-x32, x32, passed, allowed, skipped), 1
}

func errnoOrSignal(g unix.Errno, ok bool, sig unix.Signal, dead bool) string {
	if dead {
		return unix.SignalName(sig)
	}
	if ok {
		return errnoOrOK(g)
	}
	return "no report"
}

func sweepName(nr int) string {
	prefix := ""
	if nr&0x40000000 != 0 {
		prefix, nr = "x32 ", nr&^0x40000000
	}
	if n := seccomp.SyscallName(nr); n != "" {
		return fmt.Sprintf("%s%s(%d)", prefix, n, nr)
	}
	return fmt.Sprintf("%s%d", prefix, nr)
}

func errnoOrOK(e unix.Errno) string {
	if e == 0 {
		return "success"
	}
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return strconv.Itoa(int(e))
}

// sandboxProc is one process of a run as the host sees it.
type sandboxProc struct {
	pid    int
	isInit bool // PID 1 of the run's PID namespace
	cmd    string
}

// hostView reads a host pid's namespace pid and command line. Init is
// recognised by its pid in the innermost namespace (the last NSpid field),
// which stays 1 while it exits, unlike its command line.
func hostView(pid int) (sandboxProc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return sandboxProc{}, false
	}
	st := parseStatus(string(b))
	ns := strings.Fields(st["NSpid"])
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return sandboxProc{
		pid:    pid,
		isInit: len(ns) > 1 && ns[len(ns)-1] == "1",
		cmd:    strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " ")),
	}, true
}

// sampler calls fn for every process of the run every 5 ms until stopped.
type sampler struct {
	poller
	mu   sync.Mutex
	id   string
	errs []string
	seen int
	// runtime: the tier runs the program inside a user-space kernel and
	// the sampled processes are the runtime's (onRuntime).
	runtime bool
}

// onRuntime samples, with fn, the host processes of a user-space kernel's
// runtime (engine.Request.OnRuntime, called before OnStart), on tiers where
// the program's processes are not host processes; onStart then only
// records the run's id.
func (s *sampler) onRuntime(fn func(p sandboxProc)) func(func() ([]int, error)) {
	return func(procs func() ([]int, error)) {
		s.runtime = true
		s.onStart(fn)("", procs)
	}
}

func (s *sampler) onStart(fn func(p sandboxProc)) func(string, func() ([]int, error)) {
	return func(id string, procs func() ([]int, error)) {
		if id != "" {
			s.id = id
		}
		if s.runtime && id != "" {
			return
		}
		s.sample(procs, func(err error) {
			s.mu.Lock()
			s.errs = append(s.errs, err.Error())
			s.mu.Unlock()
		}, func(pid int) {
			if p, ok := hostView(pid); ok {
				s.mu.Lock()
				s.seen++
				s.mu.Unlock()
				fn(p)
			}
		})
	}
}

func (s *sampler) problem() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == 0 {
		if len(s.errs) > 0 {
			return s.errs[0]
		}
		return "the host never saw a sandbox process"
	}
	return ""
}

func inheritedFDs(ctx context.Context, r *runner) (string, string, int) {
	// A careless caller: an inheritable pipe whose write end moat holds
	// when it starts the run. Only the read end is close-on-exec.
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		return Error, "pipe: " + err.Error(), 0
	}
	unix.CloseOnExec(p[0])
	defer unix.Close(p[0])
	planted := p[1]
	closePlanted := sync.OnceFunc(func() { unix.Close(planted) })
	defer closePlanted()

	// The writes and the forgery run first, then the program becomes
	// "sleep 1": python's own descriptors are close-on-exec (PEP 446), so
	// whatever sleep holds once it has loaded was inherited.
	prog := `
import os, json
print("fds", sorted(os.listdir("/proc/self/fd")), flush=True)
forged = (json.dumps({"exited": True, "exit": 42}) + "\n").encode()
for fd in range(3, 1024):
    try:
        os.write(fd, b"moat-leak " + forged); print("wrote inherited fd", fd, flush=True)
    except OSError:
        pass
for fd in range(0, 16):
    try:
        w = os.open(f"/proc/1/fd/{fd}", os.O_WRONLY)
        os.write(w, forged); print("wrote init fd", fd, flush=True)
    except OSError:
        pass
os.execv("/bin/sleep", ["sleep", "1"])
`
	var mu sync.Mutex
	var bad string
	checked := 0
	firstSleep := map[int]time.Time{}
	var s sampler
	look := func(p sandboxProc) {
		if p.isInit {
			return
		}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		settled := false
		if p.cmd == "sleep 1" {
			if _, ok := firstSleep[p.pid]; !ok {
				firstSleep[p.pid] = time.Now()
			}
			settled = time.Since(firstSleep[p.pid]) > 50*time.Millisecond
		}
		if settled {
			checked++
		}
		for _, e := range ents {
			n, _ := strconv.Atoi(e.Name())
			target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid, e.Name()))
			switch {
			case bad != "":
			case n <= 2 && !(strings.HasPrefix(target, "pipe:") || strings.HasPrefix(target, "socket:") || target == "/dev/null"):
				bad = fmt.Sprintf("pid %d (%s) has fd %d -> %s (want a pipe or /dev/null)", p.pid, p.cmd, n, target)
			case n > 2 && settled:
				bad = fmt.Sprintf("pid %d (%s) holds inherited fd %d -> %s", p.pid, p.cmd, n, target)
			}
		}
	}
	// On a tier with a user-space kernel the program's descriptors are
	// the Sentry's, not host descriptors: the host-side evidence is that
	// no runtime process (which would pass it on) holds the planted pipe.
	var pst unix.Stat_t
	if err := unix.Fstat(planted, &pst); err != nil {
		return Error, "fstat: " + err.Error(), 0
	}
	pipeName := fmt.Sprintf("pipe:[%d]", pst.Ino)
	runtimeLook := func(p sandboxProc) {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		checked++
		for _, e := range ents {
			if t, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid, e.Name())); t == pipeName && bad == "" {
				bad = fmt.Sprintf("runtime pid %d (%s) holds the planted host pipe as fd %s", p.pid, clip(p.cmd, 40), e.Name())
			}
		}
	}
	m := r.defaults()
	m.Tier = r.tier
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog}, OnStart: s.onStart(look), OnRuntime: s.onRuntime(runtimeLook)})
	s.stop()
	closePlanted()
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	if p := s.problem(); p != "" {
		return Error, p, 1
	}
	buf := make([]byte, 4096)
	unix.SetNonblock(p[0], true)
	n, _ := unix.Read(p[0], buf)
	out := decode(res.Stdout)
	switch {
	case n > 0:
		return Escaped, fmt.Sprintf("the program wrote %d bytes into a host pipe moat inherited (%q); also: %s", n, clip(string(buf[:n]), 60), clip(bad, 200)), 1
	case bad != "":
		return Escaped, bad, 1
	case checked == 0:
		return Error, fmt.Sprintf("the host never read the settled program's descriptors (output %q)", clip(out+decode(res.Stderr), 300)), 1
	case res.ExitCode != 0 || res.Termination != "exited":
		return Escaped, fmt.Sprintf("the result says %s with exit %d, the program exited 0: a forged status reached the host (output %q)", res.Termination, res.ExitCode, clip(out, 200)), 1
	}
	if s.runtime {
		return Contained, fmt.Sprintf("the planted host pipe stayed empty; %d samples of the runtime's host descriptor tables: none holds it; the forged status did not reach the result (exit 0)", checked), 1
	}
	return Contained, fmt.Sprintf("the planted host pipe stayed empty; %d samples of the program's descriptor table: only 0-2, pipes or /dev/null; the forged status did not reach the result (exit 0)", checked), 1
}

// hostForkLatency runs /bin/true n times on the host and returns the
// slowest start-to-exit time.
func hostForkLatency(n int) (time.Duration, error) {
	var worst time.Duration
	for i := 0; i < n; i++ {
		t := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return 0, err
		}
		worst = max(worst, time.Since(t))
	}
	return worst, nil
}

func forkBomb(ctx context.Context, r *runner) (string, string, int) {
	m := r.defaults()
	m.Resources.Pids = 64
	m.Resources.Timeout = manifest.Duration(3 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if err := m.Validate(); err != nil {
		return Error, "manifest: " + err.Error(), 0
	}
	m.Tier = r.tier
	var during time.Duration
	var duringErr error
	var wg sync.WaitGroup
	started := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-started
		time.Sleep(time.Second)
		during, duringErr = hostForkLatency(20)
	}()
	var once sync.Once
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"sh", "-c", "b() { b | b & }; b; sleep 10"},
		OnStart: func(string, func() ([]int, error)) { once.Do(func() { close(started) }) }})
	once.Do(func() { close(started) })
	wg.Wait()
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	if duringErr != nil {
		return Escaped, "the host could not run /bin/true during the bomb: " + duringErr.Error(), 1
	}
	after, err := hostForkLatency(5)
	if err != nil {
		return Escaped, "the host could not run /bin/true after the bomb: " + err.Error(), 1
	}
	hasPids := false
	for _, v := range res.Violations {
		hasPids = hasPids || v.Kind == "pids"
	}
	switch {
	case !hasPids:
		return Escaped, fmt.Sprintf("no pids violation recorded (violations %v)", res.Violations), 1
	case res.Termination != "timeout" && res.Termination != "pids":
		return Escaped, fmt.Sprintf("termination %s, want timeout or pids", res.Termination), 1
	case res.DurationMS > 4500:
		return Escaped, fmt.Sprintf("the bomb ran %.0f ms, bound 4500 ms", res.DurationMS), 1
	case during > time.Second || after > time.Second:
		return Escaped, fmt.Sprintf("the host was slow to run /bin/true: %v during the bomb, %v after", during, after), 1
	}
	return Contained, fmt.Sprintf("pids limit enforced, terminated: %s after %.0f ms; host /bin/true took at most %v during the bomb, %v after",
		res.Termination, res.DurationMS, during.Round(time.Millisecond), after.Round(time.Millisecond)), 1
}

func daemonOutlives(ctx context.Context, r *runner) (string, string, int) {
	prog := `
import os, signal, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        while True:
            time.sleep(30)
    os._exit(0)
time.sleep(0.3)
print("parent leaves its daemon behind", flush=True)
`
	var mu sync.Mutex
	seen := map[int]bool{}
	var s sampler
	m := r.defaults()
	m.Tier = r.tier
	mark := func(p sandboxProc) {
		mu.Lock()
		seen[p.pid] = true
		mu.Unlock()
	}
	// On a user-space kernel's tier the daemon lives in the Sentry: the
	// host evidence is the same, nothing left in the run's cgroup, and
	// none of the runtime's processes seen during the run still alive.
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog},
		OnStart: s.onStart(mark), OnRuntime: s.onRuntime(mark)})
	s.stop()
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	if p := s.problem(); p != "" {
		return Error, p, 1
	}
	if res.Termination != "exited" {
		return Error, fmt.Sprintf("the program ended %s, not by itself", res.Termination), 1
	}
	for _, wait := range []time.Duration{0, 300 * time.Millisecond} {
		time.Sleep(wait)
		if left := runProcesses(s.id, seen, s.runtime); len(left) > 0 {
			return Escaped, fmt.Sprintf("%v after Run returned, processes of the run are alive: %s", wait, strings.Join(left, "; ")), 1
		}
	}
	return Contained, fmt.Sprintf("%d sandbox processes seen during the run; none in cgroup moat/%s or among them right after Run returned and 300 ms later", len(seen), s.id), 1
}

// runProcesses lists host processes that are still in the run's cgroup, or
// were seen in the run and still run with a sandbox uid (a pid reused by an
// unrelated host process keeps its host uid).
//
// With runtime, the seen pids are a user-space kernel's host processes,
// which run as host root: any of them still alive with this run's state
// directory in its command line (runsc's --root) is left behind.
func runProcesses(id string, seen map[int]bool, runtime bool) []string {
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, dir := range procs {
		pid, _ := strconv.Atoi(filepath.Base(dir))
		cg, err := os.ReadFile(dir + "/cgroup")
		if err != nil {
			continue
		}
		if strings.Contains(string(cg), "/moat/"+id+"\n") || strings.Contains(string(cg), "/moat/"+id+"/") {
			left = append(left, fmt.Sprintf("pid %d in cgroup moat/%s", pid, id))
			continue
		}
		if !seen[pid] {
			continue
		}
		b, err := os.ReadFile(dir + "/status")
		if err != nil {
			continue
		}
		st := parseStatus(string(b))
		if runtime {
			if cmd, _ := os.ReadFile(dir + "/cmdline"); bytes.Contains(cmd, []byte("/"+id+"/")) && !strings.HasPrefix(st["State"], "Z") {
				left = append(left, fmt.Sprintf("runtime pid %d (%s)", pid, clip(strings.ReplaceAll(string(cmd), "\x00", " "), 60)))
			}
			continue
		}
		uid, _ := strconv.ParseInt(firstField(st["Uid"]), 10, 64)
		if uid >= 0x70000000 && !strings.HasPrefix(st["State"], "Z") {
			cmd, _ := os.ReadFile(dir + "/cmdline")
			left = append(left, fmt.Sprintf("pid %d (%s) uid %d", pid, strings.ReplaceAll(string(cmd), "\x00", " "), uid))
		}
	}
	return left
}

func fdExhaustion(ctx context.Context, r *runner) (string, string, int) {
	const limit = 64
	prog := `
import os, resource, time
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1 << 20, 1 << 20))
    print("raised RLIMIT_NOFILE")
except (ValueError, OSError) as e:
    print("raise refused:", e)
fds = []
try:
    while len(fds) < 1 << 20:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("opened", len(fds), "then", e, flush=True)
time.sleep(0.5)
`
	var mu sync.Mutex
	most, above, checked := 0, 0, 0
	var bad string
	var s sampler
	look := func(p sandboxProc) {
		if p.isInit {
			return
		}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		if err != nil {
			return
		}
		lims, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.pid))
		mu.Lock()
		defer mu.Unlock()
		checked++
		// Descriptors numbered at or above the limit cannot have been
		// opened under it: they were inherited (priv-inherited-fds judges
		// those). The limit bounds the rest.
		own, hi := 0, 0
		for _, e := range ents {
			if n, _ := strconv.Atoi(e.Name()); n >= limit {
				hi++
			} else {
				own++
			}
		}
		most, above = max(most, own), max(above, hi)
		for _, line := range strings.Split(string(lims), "\n") {
			if f := strings.Fields(line); strings.HasPrefix(line, "Max open files") && len(f) >= 5 {
				soft, _ := strconv.Atoi(f[3])
				hard, _ := strconv.Atoi(f[4])
				if (soft > limit || hard > limit || f[3] == "unlimited" || f[4] == "unlimited") && bad == "" {
					bad = fmt.Sprintf("pid %d (%s) has RLIMIT_NOFILE %s/%s, manifest %d", p.pid, p.cmd, f[3], f[4], limit)
				}
			}
		}
	}
	// On a user-space kernel's tier the program's descriptors are the
	// Sentry's and its RLIMIT_NOFILE is applied in the Sentry by the guest:
	// the host evidence is that the program's descriptors never become host
	// descriptors, i.e. no runtime process's host descriptor table grows
	// past runtimeFDs (the Sentry holds ~126 of its own, measured).
	const runtimeFDs = 512
	hostMost := 0
	runtimeLook := func(p sandboxProc) {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		if err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		checked++
		hostMost = max(hostMost, len(ents))
		if len(ents) > runtimeFDs && bad == "" {
			bad = fmt.Sprintf("runtime pid %d (%s) holds %d host descriptors, bound %d: the program's descriptors reach the host", p.pid, clip(p.cmd, 40), len(ents), runtimeFDs)
		}
	}
	m := r.defaults()
	m.Resources.OpenFiles = limit
	m.Resources.Timeout = manifest.Duration(4 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if err := m.Validate(); err != nil {
		return Error, "manifest: " + err.Error(), 0
	}
	m.Tier = r.tier
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog}, OnStart: s.onStart(look), OnRuntime: s.onRuntime(runtimeLook)})
	s.stop()
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	if p := s.problem(); p != "" {
		return Error, p, 1
	}
	if s.runtime {
		switch {
		case bad != "":
			return Escaped, bad, 1
		case checked == 0:
			return Error, "the host never read a runtime process's descriptors", 1
		case !strings.Contains(decode(res.Stdout), "opened"):
			return Error, fmt.Sprintf("the program never hit the limit (output %q)", clip(decode(res.Stdout)+decode(res.Stderr), 200)), 1
		}
		return Contained, fmt.Sprintf("the program reached EMFILE inside the Sentry; %d samples of the runtime's host descriptor tables: at most %d, bound %d", checked, hostMost, runtimeFDs), 1
	}
	switch {
	case bad != "":
		return Escaped, bad, 1
	case most > limit:
		return Escaped, fmt.Sprintf("a sandbox process held %d descriptors below %d, limit %d", most, limit, limit), 1
	case checked == 0:
		return Error, "the host never read a program process's descriptors", 1
	case !strings.Contains(decode(res.Stdout), "opened"):
		return Error, fmt.Sprintf("the program never hit the limit (output %q)", clip(decode(res.Stdout)+decode(res.Stderr), 200)), 1
	}
	return Contained, fmt.Sprintf("RLIMIT_NOFILE never above %d over %d samples of every sandbox process, EMFILE reached at %d descriptors (plus %d inherited above the limit)", limit, checked, most, above), 1
}

// vmHWM is this process's peak resident set size.
func vmHWM() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	kb, _ := strconv.ParseInt(firstField(parseStatus(string(b))["VmHWM"]), 10, 64)
	return kb << 10
}

func stdoutFlood(ctx context.Context, r *runner) (string, string, int) {
	prog := "import os\nb = b'x' * (1 << 20)\nfor _ in range(10240):\n    os.write(1, b)\n"
	m := r.defaults()
	m.Resources.Timeout = manifest.Duration(3 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	m.Resources.StdoutBytes = 1 << 20
	if err := m.Validate(); err != nil {
		return Error, "manifest: " + err.Error(), 0
	}
	m.Tier = r.tier
	before := vmHWM()
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog}})
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	grew := vmHWM() - before
	kept := int64(len(decode(res.Stdout)))
	hasOutput := false
	for _, v := range res.Violations {
		hasOutput = hasOutput || v.Kind == "output"
	}
	switch {
	case kept > 1<<20:
		return Escaped, fmt.Sprintf("moat kept %d bytes of stdout, cap %d", kept, 1<<20), 1
	case res.Stdout.Bytes <= 1<<20 || !res.Stdout.Truncated:
		return Error, fmt.Sprintf("the flood did not pass the cap (%d bytes counted, truncated %v)", res.Stdout.Bytes, res.Stdout.Truncated), 1
	case !hasOutput:
		return Escaped, fmt.Sprintf("no output violation recorded (violations %v)", res.Violations), 1
	case res.DurationMS > 4000:
		return Escaped, fmt.Sprintf("the flood ran %.0f ms, timeout 3 s", res.DurationMS), 1
	case grew > 64<<20:
		return Escaped, fmt.Sprintf("moat's peak resident memory grew by %d MiB during the flood", grew>>20), 1
	}
	return Contained, fmt.Sprintf("%d MiB written, %d KiB kept, output violation recorded, terminated: %s after %.0f ms, moat's peak RSS grew %d MiB",
		res.Stdout.Bytes>>20, kept>>10, res.Termination, res.DurationMS, grew>>20), 1
}
