package redteam

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
)

// Cases about what the kernel keeps per host user or for the whole host
// rather than per namespace or cgroup: a sandbox must not be able to use
// up a budget that host processes (or other runs) draw on too, nor signal
// through one to a concurrent run. Each is judged on the host while the
// program holds the resource: the host's own attempt to use it must work.

func registerHostWideCases() {
	for _, c := range []Case{
		{
			ID: "hostwide-inotify-budget", Category: "resources", Severity: "medium", Unsandboxed: true,
			Threat: "create inotify instances until the kernel refuses, then hold them: when the sandbox's user namespace belongs to host root, they count against root's 128, and every root process on the host gets EMFILE from inotify_init1",
			Why:    "each native run's user namespace is owned by the run's own host id (a range per live run), so its instances count against that id's budget; gVisor and the microVM keep their own",
			custom: hostInotifyBudget, alone: true,
		},
		{
			ID: "hostwide-sigpending-budget", Category: "resources", Severity: "medium", Unsandboxed: true,
			Threat: "queue as many real-time signals to itself as host root may have pending (RLIMIT_SIGPENDING), with the signal blocked: charged to the user namespace's owner, host root's rt_sigqueueinfo fails with EAGAIN, and new sandboxes' init spins in its all-threads setuid",
			Why:    "the signals count against the run's own host id, the owner of its user namespace, never root's",
			custom: hostSigpendingBudget, alone: true,
		},
		{
			ID: "hostwide-aio-pool", Category: "resources", Severity: "medium",
			Threat: "take the host's whole kernel AIO pool (fs.aio-max-nr) with eight io_setup calls and hold it: every host process gets EAGAIN from io_setup",
			Why:    "the native tier's seccomp policy answers the io_* calls with ENOSYS (libaio users fall back to threads); gVisor's Sentry and the microVM's kernel have their own AIO",
			custom: hostAIOPool, alone: true,
		},
		{
			ID: "covert-pipe-buffers", Category: "exfiltration", Severity: "medium",
			Threat: "a run pushes its user over the per-user pipe-buffer budget (fs.pipe-user-pages-soft) with 1 MiB pipes; a concurrent run sees its own new pipes shrink to 8 KiB: a bit per interval between runs, and other tenants' pipes throttled",
			Why:    "each native run has a host id range of its own, so the kernel keeps its pipe pages on its own books",
			custom: covertPipeBuffers,
		},
		{
			ID: "covert-fds-in-flight", Category: "exfiltration", Severity: "medium",
			Threat: "a run puts descriptors in flight over a unix socket until ETOOMANYREFS; a concurrent run of the same host user then cannot pass even one descriptor (a covert bit, and Python multiprocessing breaks)",
			Why:    "descriptors in flight are counted per host user, and each native run has a host id range of its own",
			custom: covertFDsInFlight,
		},
	} {
		register(c)
	}
}

// holdPy is the shape of the hold programs: the attack, then "held N" on
// stdout, then a pause while the host looks.
const holdPy = `
import ctypes, os, sys, time, signal, fcntl, socket
libc = ctypes.CDLL(None, use_errno=True)
%s
print("held", n, "errno", ctypes.get_errno(), flush=True)
time.sleep(3)
`

// hold runs program (the body of holdPy, which sets n) in a sandbox of
// the tier under attack and, once it says it holds the resource, calls
// probe on the host five times over a second. It returns the probe
// failures and what the program printed.
func (r *runner) hold(ctx context.Context, program string, probe func() error) (failures []string, printed string, err error) {
	m := r.defaults()
	m.Tier = r.tier
	live := &netLines{want: "held", seen: make(chan struct{})}
	done := make(chan error, 1)
	var out string
	go func() {
		res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", fmt.Sprintf(holdPy, program)}, LiveStdout: live})
		if err == nil {
			out = strings.TrimSpace(decode(res.Stdout) + decode(res.Stderr))
		}
		done <- err
	}()
	select {
	case <-live.seen:
		for range 5 {
			if err := probe(); err != nil {
				failures = append(failures, err.Error())
			}
			time.Sleep(200 * time.Millisecond)
		}
		err = <-done
	case err = <-done:
	}
	return failures, out, err
}

// judgeHold turns a hold's outcome into a verdict.
func judgeHold(what string, failures []string, printed string, err error) (string, string, int) {
	switch {
	case err != nil:
		return Error, "run: " + err.Error(), 1
	case len(failures) > 0:
		return Escaped, fmt.Sprintf("while the sandbox held %s (it said %q), the host failed: %s", what, printed, failures[0]), 1
	case !strings.Contains(printed, "held"):
		return Error, fmt.Sprintf("the attack did not run to its hold: %q", printed), 1
	}
	return Contained, fmt.Sprintf("the host used %s throughout while the sandbox held what it could (%q)", what, printed), 1
}

func hostInotifyBudget(ctx context.Context, r *runner) (string, string, int) {
	probe := func() error {
		fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("inotify_init1 as root: %w", err)
		}
		unix.Close(fd)
		return nil
	}
	if err := probe(); err != nil {
		return Error, "before the attack: " + err.Error(), 0
	}
	f, out, err := r.hold(ctx, `
fds = []
while len(fds) < 4096:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
n = len(fds)`, probe)
	return judgeHold("inotify instances", f, out, err)
}

// hostSignal is the real-time signal the host queues to itself.
const hostSignal = syscall.Signal(40)

func hostSigpendingBudget(ctx context.Context, r *runner) (string, string, int) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_SIGPENDING, &lim); err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	ch := make(chan os.Signal, 64)
	signal.Notify(ch, hostSignal)
	defer signal.Stop(ch)
	var mu sync.Mutex
	probe := func() error {
		mu.Lock()
		defer mu.Unlock()
		// rt_sigqueueinfo, not kill: only a queued signal (si_code < 0)
		// is refused at the pending-signal limit.
		var info [128]byte
		*(*int32)(unsafe.Pointer(&info[0])) = int32(hostSignal)
		*(*int32)(unsafe.Pointer(&info[8])) = -1 // SI_QUEUE
		*(*int32)(unsafe.Pointer(&info[16])) = int32(os.Getpid())
		_, _, e := unix.RawSyscall(unix.SYS_RT_SIGQUEUEINFO, uintptr(os.Getpid()), uintptr(hostSignal), uintptr(unsafe.Pointer(&info[0])))
		if e != 0 {
			return fmt.Errorf("rt_sigqueueinfo as root: %w", e)
		}
		select {
		case <-ch:
		case <-time.After(time.Second):
		}
		return nil
	}
	if err := probe(); err != nil {
		return Error, "before the attack: " + err.Error(), 0
	}
	// Host root's limit and some: at that count root's budget is spent if
	// the signals are root's.
	want := strconv.FormatUint(min(lim.Cur, 1<<20)+64, 10)
	f, out, err := r.hold(ctx, `
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n = 0
for _ in range(`+want+`):
    try:
        os.kill(os.getpid(), signal.SIGRTMIN)
    except OSError:
        break
    n += 1`, probe)
	return judgeHold("pending signals", f, out, err)
}

func hostAIOPool(ctx context.Context, r *runner) (string, string, int) {
	probe := func() error {
		var aioCtx uint64
		if _, _, e := unix.RawSyscall(unix.SYS_IO_SETUP, 1, uintptr(unsafe.Pointer(&aioCtx)), 0); e != 0 {
			return fmt.Errorf("io_setup on the host: %w", e)
		}
		unix.RawSyscall(unix.SYS_IO_DESTROY, uintptr(aioCtx), 0, 0)
		return nil
	}
	if err := probe(); err != nil {
		return Error, "before the attack: " + err.Error(), 0
	}
	max := 65536
	if b, err := os.ReadFile("/proc/sys/fs/aio-max-nr"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			max = v
		}
	}
	f, out, err := r.hold(ctx, fmt.Sprintf(`
ctxs = []
for _ in range(64):
    c = ctypes.c_ulong(0)
    if libc.syscall(206, %d, ctypes.byref(c)) != 0:
        break
    ctxs.append(c)
n = len(ctxs)`, max/16), probe)
	return judgeHold("AIO contexts", f, out, err)
}

// pair runs a sender and a receiver concurrently and returns the
// receiver's output.
func (r *runner) pair(ctx context.Context, sender, receiver string) (string, error) {
	m := r.defaults()
	m.Tier = r.tier
	var wg sync.WaitGroup
	var recv string
	errs := make([]error, 2)
	for i, prog := range []string{sender, receiver} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog}})
			if err != nil {
				errs[i] = err
				return
			}
			if i == 1 {
				recv = strings.TrimSpace(decode(res.Stdout) + decode(res.Stderr))
			}
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		return "", fmt.Errorf("sender: %v; receiver: %v", errs[0], errs[1])
	}
	return recv, nil
}

func covertPipeBuffers(ctx context.Context, r *runner) (string, string, int) {
	sender := `
import fcntl, os, time
ps = []
while len(ps) < 100:
    try:
        rd, wr = os.pipe()
        fcntl.fcntl(wr, 1031, 1 << 20)  # F_SETPIPE_SZ
    except OSError:
        break
    ps.append((rd, wr))
time.sleep(4)
`
	receiver := `
import fcntl, os, time
time.sleep(1)
sizes = set()
for _ in range(20):
    rd, wr = os.pipe()
    sizes.add(fcntl.fcntl(wr, 1032))  # F_GETPIPE_SZ
    os.close(rd); os.close(wr)
    time.sleep(0.1)
print("sizes", sorted(sizes))
`
	out, err := r.pair(ctx, sender, receiver)
	if err != nil {
		return Error, err.Error(), 2
	}
	if !strings.HasPrefix(out, "sizes [") {
		return Error, fmt.Sprintf("the receiver did not run to its end: %q", out), 2
	}
	if strings.Contains(out, "8192") || strings.Contains(out, "4096") {
		return Escaped, fmt.Sprintf("the receiver's new pipes shrank while the sender held its pipe pages: %s", out), 2
	}
	return Contained, "the receiver's pipes kept their size while the sender held 100 MiB of pipe buffers: " + out, 2
}

func covertFDsInFlight(ctx context.Context, r *runner) (string, string, int) {
	sender := `
import socket, os, time
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
a.setblocking(False)
n = 0
for _ in range(200):
    try:
        socket.send_fds(a, [b"x"], [b.fileno()] * 250)
    except OSError:
        break
    n += 250
time.sleep(4)
`
	receiver := `
import socket, time
time.sleep(1)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
errs = set()
for _ in range(20):
    try:
        socket.send_fds(a, [b"x"], [b.fileno()])
        socket.recv_fds(b, 1, 1)
        errs.add("ok")
    except OSError as e:
        errs.add(e.strerror)
    time.sleep(0.1)
print("results", sorted(errs))
`
	out, err := r.pair(ctx, sender, receiver)
	if err != nil {
		return Error, err.Error(), 2
	}
	if !strings.HasPrefix(out, "results [") {
		return Error, fmt.Sprintf("the receiver did not run to its end: %q", out), 2
	}
	if out != "results ['ok']" {
		return Escaped, fmt.Sprintf("passing one descriptor failed in the receiver while the sender held descriptors in flight: %s", out), 2
	}
	return Contained, "the receiver passed descriptors throughout while the sender held its own in flight", 2
}

func registerHostIdentityCase() {
	register(Case{
		ID: "det-host-identity", Category: "detection", Severity: "low", Unsandboxed: true,
		Threat: "read what identifies the host and its other tenants' activity: the boot command line, the kernel build string, this boot's id (the same in every run on a host) and the host's disk activity",
		Why:    "the native tier masks /proc/cmdline, /proc/version, /proc/diskstats and boot_id (empty files); gVisor and the microVM show their own kernel's",
		custom: hostIdentity,
	})
}

func hostIdentity(ctx context.Context, r *runner) (string, string, int) {
	files := []string{"/proc/cmdline", "/proc/version", "/proc/sys/kernel/random/boot_id", "/proc/diskstats"}
	host := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if v := strings.TrimSpace(string(b)); err == nil && v != "" {
			// The first line identifies: a boot id, a command line, the
			// first disk's counters' device name.
			first, _, _ := strings.Cut(v, "\n")
			host[f] = first
		}
	}
	if len(host) == 0 {
		return Error, "host setup: none of " + strings.Join(files, ", ") + " is readable on the host", 0
	}
	m := r.defaults()
	m.Tier = r.tier
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", `
import sys
for f in sys.argv[1:]:
    try:
        print(f, repr(open(f).read()))
    except OSError as e:
        print(f, "error", e)
`, files[0], files[1], files[2], files[3]}})
	if err != nil {
		return Error, "run: " + err.Error(), 1
	}
	out := decode(res.Stdout)
	if !strings.Contains(out, files[0]) {
		return Error, fmt.Sprintf("the probe did not run: %q", out+decode(res.Stderr)), 1
	}
	for _, f := range files {
		if v, ok := host[f]; ok && strings.Contains(out, v) {
			return Escaped, fmt.Sprintf("the sandbox read the host's %s (%q)", f, v), 1
		}
	}
	return Contained, "none of the host's boot command line, kernel build string, boot id or disk statistics reached the sandbox", 1
}
