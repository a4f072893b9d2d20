package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/guest/relay"
	"github.com/moat-sandbox/moat/internal/fsrules"
	"github.com/moat-sandbox/moat/internal/loopback"
	"github.com/moat-sandbox/moat/seccomp"
)

func init() {
	// unshare(CLONE_NEWCGROUP) affects only the calling thread; keeping
	// main on one OS thread makes the program (started from main) inherit
	// the namespace.
	if len(os.Args) > 1 && os.Args[1] == nswire.Arg {
		runtime.LockOSThread()
	}
}

// Main runs init. It never returns.
func Main() {
	// Only the native tier starts init, as PID 1 of a new PID namespace
	// with its pipes on fds 3-5. Anyone else typing the hidden argument
	// gets an explanation, not a half-built sandbox.
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "moat: "+nswire.Arg+" is Moat's internal sandbox init; use 'moat run'")
		os.Exit(2)
	}
	absorbSignals()
	status := os.NewFile(nswire.StatusFD, "status")
	st := &reporter{w: status}
	code, err := run(st)
	if err != nil {
		st.send(nswire.Status{Error: err.Error()})
		os.Exit(1)
	}
	os.Exit(code)
}

// absorbSignals keeps init alive when the program signals it. The program
// runs as init's own user, so `kill 1` reaches init; the kernel passes to a
// namespace's PID 1 only the signals it handles, and the Go runtime handles
// every one and exits (or dumps its stacks and exits) on these by default:
// a session command's `kill 1` ended the whole sandbox, which went on
// reporting itself running. Caught and dropped instead. Not ignored: an
// ignored disposition would outlive the program's execve, and it must
// start with every signal at its default. The host's own signals arrive
// as frames (Signal), or as SIGKILL from outside the namespace.
func absorbSignals() {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGABRT,
		unix.SIGTRAP, unix.SIGSYS, unix.SIGSTKFLT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGALRM,
		unix.SIGWINCH)
	go func() {
		// Dropped, but in OCI mode (see handleSignal).
		for sig := range ch {
			handleSignal(sig)
		}
	}()
}

type reporter struct {
	mu sync.Mutex
	w  *os.File
}

func (r *reporter) send(s nswire.Status) {
	b, _ := json.Marshal(s)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		r.w.Write(append(b, '\n'))
	}
}

// close ends the reports: an OCI container's runtime reads only up to
// Ready, then exits; the exit status says the rest.
func (r *reporter) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.w != nil {
		r.w.Close()
		r.w = nil
	}
}

func run(st *reporter) (int, error) {
	cfgPipe := os.NewFile(nswire.ConfigFD, "config")
	cfg := &nswire.Config{}
	if err := nswire.ReadFrame(cfgPipe, &cfg.Setup); err != nil {
		return 1, fmt.Errorf("read setup: %w", err)
	}
	// Into the run's cgroup first (v1): this thread, the process's leader,
	// to which main is locked (see init above) and from which the program
	// and every session command is forked, so that they are born inside,
	// and init's memory is charged there. Init's other runtime threads
	// stay outside; they run only init's own code (the egress relay).
	if n := cfg.CgroupFDs; n > 0 {
		if n > 16 {
			return 1, fmt.Errorf("setup: %d cgroup files; at most 16 hierarchies", n)
		}
		fds := make([]int, n)
		for i := range fds {
			fds[i] = nswire.CgroupFD + i
		}
		if err := cgroup.Join(fds); err != nil {
			return 1, err
		}
	}
	if !filepath.IsAbs(cfg.Root) {
		return 1, fmt.Errorf("setup: root %q is not absolute", cfg.Root)
	}
	oci := cfg.OCI
	ttySlave := -1
	if oci != nil {
		ociSignals(true, 0)
		if err := ociBuildRoot(cfg); err != nil {
			return 1, err
		}
		if oci.Terminal != nil {
			var err error
			if ttySlave, err = ociTerminal(*oci.Terminal, cfg.UID, cfg.GID); err != nil {
				return 1, err
			}
		} else {
			unix.Close(nswire.OCIFDSocket)
		}
	} else if err := buildRoot(cfg); err != nil {
		return 1, err
	}
	// A joined UTS or network namespace (a pod's) belongs to another
	// user namespace: init may not change it, and its owner set it up.
	if oci == nil || oci.NewUTS {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return 1, fmt.Errorf("sethostname: %w", err)
		}
	}
	if oci == nil || oci.NewNet {
		if err := loopback.Up(); err != nil {
			return 1, err
		}
	}
	var egress net.Listener
	if cfg.EgressPort != 0 {
		var err error
		if egress, err = listenEgress(cfg.EgressPort); err != nil {
			return 1, err
		}
	}

	// Wait for the start frame. The host sends it once we are inside the
	// run's cgroup; a closed pipe means the sandbox is being destroyed
	// unused.
	var start nswire.Start
	if err := nswire.ReadFrame(cfgPipe, &start); err != nil {
		return 1, fmt.Errorf("read start: %w", err)
	}

	// A cgroup namespace rooted at the run's cgroup: /proc/self/cgroup
	// shows "/" and nothing of the host's hierarchy.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return 1, fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	if oci != nil {
		if err := setOCIRlimits(oci.Rlimits); err != nil {
			return 1, err
		}
	} else if err := setRlimits(cfg.Rlimits); err != nil {
		return 1, err
	}
	degraded, err := dropPrivileges(cfg)
	if err != nil {
		return 1, err
	}

	// Only fds 0-2 may reach the program. Whatever else init holds, its
	// own or inherited from whoever started moat (a shell's stray pipe, a
	// caller's socket to a container runtime: the CVE-2024-21626 class),
	// is marked close-on-exec here, after the last fd init opens itself.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 1, fmt.Errorf("mark inherited descriptors close-on-exec: %w", err)
	}

	// Seccomp goes last. Init confines itself completely before it even
	// knows the command, so that a prepared sandbox (a warm pool's) has
	// only the fork and exec left to do; what init does after this line
	// (read one frame, stat the program, fork, wait, report) is what any
	// program may do under the same filter.
	if len(cfg.Seccomp) == 0 {
		return 1, errors.New("no seccomp filter in the config: refusing to run unfiltered")
	}
	if err := seccomp.Install(cfg.Seccomp); err != nil {
		return 1, fmt.Errorf("install seccomp filter: %w", err)
	}
	if egress != nil {
		fd, nofile := nswire.EgressFD, cfg.Rlimits.NoFile
		if oci != nil {
			fd, nofile = oci.EgressFD, ociNoFile(oci.Rlimits)
		}
		go relay.Serve(egress, fmt.Sprintf("/proc/self/fd/%d", fd), bridgeLimit(nofile))
	}
	if start.Serve {
		// From here on init is exactly as confined as the commands it
		// starts: they inherit everything above from this thread.
		cfgPipe.Close()
		return serve(st, degraded)
	}

	st.send(nswire.Status{Ready: true})
	if err := nswire.ReadFrame(cfgPipe, &cfg.Command); err != nil {
		return 1, fmt.Errorf("read command: %w", err)
	}
	if oci != nil {
		// The runtime's create has returned once it read Ready; the
		// program waits for start, and its status becomes ours.
		st.close()
		if err := waitStart(); err != nil {
			return 1, err
		}
	}
	if len(cfg.Argv) == 0 || cfg.Argv[0] == "" {
		return 1, errors.New("command: empty argv")
	}
	path, lookErr := lookPath(cfg.Argv[0], cfg.Dir, cfg.Env)

	if lookErr != nil {
		st.send(nswire.Status{Started: true, Degraded: degraded})
		fmt.Fprintf(os.Stderr, "moat: %v\n", lookErr)
		var nf *notFoundError
		if errors.As(lookErr, &nf) && nf.exists {
			st.send(nswire.Status{Exited: true, Exit: 126, NotExecutable: true})
			ociRecordExit(oci, nswire.Status{Exited: true, Exit: 126, NotExecutable: true})
			return ociCode(oci, 126), nil
		}
		st.send(nswire.Status{Exited: true, Exit: 127, NotFound: true})
		ociRecordExit(oci, nswire.Status{Exited: true, Exit: 127, NotFound: true})
		return ociCode(oci, 127), nil
	}

	attr := &syscall.ProcAttr{
		Dir:   cfg.Dir,
		Env:   cfg.Env,
		Files: []uintptr{0, 1, 2},
		// Its own process group, so signals we forward reach every
		// process it starts in the foreground.
		Sys: &syscall.SysProcAttr{Setpgid: true},
	}
	if ttySlave >= 0 {
		// An OCI container's terminal: its own session, the terminal
		// its controlling one, so that job control and ^C work.
		t := uintptr(ttySlave)
		attr.Files = []uintptr{t, t, t}
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	forked := time.Now()
	pid, err := syscall.ForkExec(path, cfg.Argv, attr)
	if ttySlave >= 0 {
		unix.Close(ttySlave)
	}
	if err != nil {
		st.send(nswire.Status{Started: true, Degraded: degraded})
		fmt.Fprintf(os.Stderr, "moat: cannot execute %s: %v\n", cfg.Argv[0], err)
		st.send(nswire.Status{Exited: true, Exit: 126, NotExecutable: true})
		return ociCode(oci, 126), nil
	}
	if oci != nil {
		ociSignals(false, pid)
	}
	st.send(nswire.Status{Started: true, Degraded: degraded})

	var ws unix.WaitStatus
	if oci != nil {
		// This thread stays locked: an OCI container's execs are forked
		// from it, inside the cgroup and with its emptied bounding set.
		ws = ociServe(pid, oci.Exec)
	} else {
		// The program is running; nothing needs this thread's namespaces any
		// more. Unlocking lets the few goroutines below share it instead of
		// each needing a new OS thread (which the pids limit counts).
		runtime.UnlockOSThread()
		// The host's signals for the program come as frames on the config
		// pipe (Signal), queued there until read: none is lost to the
		// program's first instants, and this goroutine's thread is started
		// while the program already runs.
		go forwardSignals(cfgPipe, pid)
		ws = reap(pid)
	}
	s := nswire.Status{Exited: true, DurationNS: time.Since(forked).Nanoseconds()}
	switch {
	case ws.Exited():
		s.Exit = ws.ExitStatus()
	case ws.Signaled():
		s.Signal = int(ws.Signal())
		s.Exit = 128 + s.Signal
	}
	st.send(s)
	ociRecordExit(oci, s)
	// Returning ends PID 1: the kernel kills every process left in the
	// namespace, including daemons that escaped the process group.
	return ociCode(oci, s.Exit), nil
}

// ociCode is init's exit status: an OCI container's init exits with its
// program's (128+N for a signal, as a shell reports it), which is what
// the engine reads as the container's; a Moat run's init reports the
// status on its pipe and exits 0.
func ociCode(oci *nswire.OCI, code int) int {
	if oci == nil {
		return 0
	}
	return code
}

// forwardSignals sends each Forwarded signal the host asks for to the
// program's process group, until the host closes the pipe.
func forwardSignals(cfg io.Reader, pid int) {
	for {
		var f nswire.Signal
		if err := nswire.ReadFrame(cfg, &f); err != nil {
			return
		}
		if sig := unix.Signal(f.Signal); slices.Contains(nswire.Forwarded, sig) {
			unix.Kill(-pid, sig)
		}
	}
}

// reap waits for every child (PID 1 inherits orphans) until the program
// itself has exited, and returns its status.
func reap(pid int) unix.WaitStatus {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || got == pid {
			// ECHILD cannot happen before the program is reaped; if
			// it does, report what we have rather than spin.
			return ws
		}
	}
}

func setRlimits(r nswire.Rlimits) error {
	set := []struct {
		name     string
		resource int
		value    uint64
	}{
		{"core", unix.RLIMIT_CORE, 0}, // no core dumps: they would land in the workspace and leak memory
		{"nofile", unix.RLIMIT_NOFILE, r.NoFile},
		{"fsize", unix.RLIMIT_FSIZE, r.FSize},
		// A per-uid backstop behind the pids cgroup.
		{"nproc", unix.RLIMIT_NPROC, r.NProc},
		{"cpu", unix.RLIMIT_CPU, r.CPUSeconds},
	}
	for _, s := range set {
		lim := unix.Rlimit{Cur: s.value, Max: s.value}
		if s.resource == unix.RLIMIT_CPU {
			// SIGXCPU at the soft limit, SIGKILL one second later.
			lim.Max = s.value + 1
		}
		if err := unix.Setrlimit(s.resource, &lim); err != nil {
			return fmt.Errorf("setrlimit %s=%d: %w", s.name, s.value, err)
		}
	}
	return nil
}

// dropPrivileges turns init from root of the user namespace into the
// unprivileged sandbox user, on every thread of this Go process.
func dropPrivileges(cfg *nswire.Config) (degraded []string, err error) {
	lastCap, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return nil, fmt.Errorf("read cap_last_cap: %w", err)
	}
	var last int
	fmt.Sscanf(strings.TrimSpace(string(lastCap)), "%d", &last)
	if err := checkKeepCaps(cfg.UID, cfg.KeepCaps); err != nil {
		return nil, err
	}
	// Empty the bounding set (but for a build step's KeepCaps) so no
	// execve can ever regain a capability. The bounding set is per
	// thread; the program is forked from this thread (main is locked to
	// it), so this thread's set is the one it inherits. init's other
	// threads run only Go runtime code and lose all effective
	// capabilities with the setresuid below (or keepOnly for uid 0).
	for c := 0; c <= last; c++ {
		if slices.Contains(cfg.KeepCaps, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return nil, fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	// Supplementary groups were emptied when the host started us
	// (Credential with no groups), and setgroups is denied in this user
	// namespace (so no process can drop a group to get around a
	// group-deny permission). Verify rather than trust.
	if groups, err := syscall.Getgroups(); err != nil || len(groups) > 0 {
		return nil, fmt.Errorf("supplementary groups not empty: %v %v", groups, err)
	}
	if err := syscall.Setresgid(cfg.GID, cfg.GID, cfg.GID); err != nil {
		return nil, fmt.Errorf("setresgid %d: %w", cfg.GID, err)
	}
	// Changing uid from 0 clears the permitted, effective and ambient sets.
	if err := syscall.Setresuid(cfg.UID, cfg.UID, cfg.UID); err != nil {
		return nil, fmt.Errorf("setresuid %d: %w", cfg.UID, err)
	}
	if cfg.UID == 0 {
		// A build step's root: staying uid 0 cleared nothing, so the
		// sets are cut to KeepCaps by hand, on every thread. With
		// no_new_privs (below) execve keeps at most this permitted set
		// for a uid-0 program, and the bounding set above says the same.
		if err := keepOnly(cfg.KeepCaps); err != nil {
			return nil, err
		}
	}
	// The credential change reset the parent-death signal; set it again so
	// init dies with the host's moat process. The kernel signals the
	// process if any of its threads asked for it. An OCI container's init
	// outlives the runtime's create by design: the engine's shim, its new
	// parent, kills it.
	if cfg.OCI == nil {
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return nil, fmt.Errorf("set parent-death signal: %w", err)
		}
	}
	// If the host died before that, no signal will come: its end of the
	// status pipe is closed, which poll reports as an error on ours.
	if hostGone() {
		return nil, errors.New("host side went away during setup")
	}
	// Not dumpable: /proc/1/* becomes inaccessible to the program (same uid
	// otherwise), so it cannot read our memory or reach /proc/1/exe, the
	// host's moat binary (CVE-2019-5736).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("set non-dumpable: %w", err)
	}
	// no_new_privs on this thread, the one the program is forked from;
	// Landlock and seccomp's TSYNC then set it on every other thread.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("set no_new_privs: %w", err)
	}

	abi, err := ll.LandlockGetABIVersion()
	if err != nil || abi < 1 {
		if cfg.RequireLandlock {
			return nil, fmt.Errorf("landlock is not available on this kernel (abi %d: %v); the manifest can accept running without it with security.allow_missing: [landlock]", abi, err)
		}
		degraded = append(degraded, "landlock")
	} else {
		// Read-only everywhere, read-write only in the workspace and /tmp,
		// plus the writable devices; a build step's tree is its to write.
		var err error
		if cfg.WritableRoot || cfg.OCI != nil {
			// An OCI container writes where its mounts let it (a
			// writable root, the spec's tmpfs mounts): the mounts'
			// read-only flags say where it may not.
			err = fsrules.RestrictBuild()
		} else {
			err = fsrules.RestrictTerminals("/dev/pts", sandboxDevices()...)
		}
		if err != nil {
			return nil, fmt.Errorf("landlock: %w", err)
		}
	}
	return degraded, nil
}

// checkKeepCaps refuses kept capabilities that are not nswire.BuildCaps,
// or kept by a program that is not uid 0 (a capability kept across a
// change of uid would need the ambient set, which Moat never fills).
func checkKeepCaps(uid int, keep []int) error {
	if len(keep) > 0 && uid != 0 {
		return fmt.Errorf("setup: capabilities kept for uid %d; only a build step's uid 0 keeps any", uid)
	}
	for _, c := range keep {
		if !slices.Contains(nswire.BuildCaps, c) {
			return fmt.Errorf("setup: capability %d may not be kept; only a build step's (nswire.BuildCaps) may", c)
		}
	}
	return nil
}

// capSets is the permitted/effective set of keep, in capset's two words.
func capSets(keep []int) (data [2]unix.CapUserData) {
	for _, c := range keep {
		data[c/32].Permitted |= 1 << (c % 32)
	}
	for i := range data {
		data[i].Effective = data[i].Permitted
	}
	return data
}

// keepOnly sets the permitted and effective sets of every thread of init
// to keep, and the inheritable set to nothing. Capability sets are per
// thread: a raw capset on this one alone would leave the runtime's other
// threads with every capability of the user namespace.
func keepOnly(keep []int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := capSets(keep)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset %v: %w", keep, e)
	}
	return nil
}

type notFoundError struct {
	name   string
	exists bool
	reason string
}

func (e *notFoundError) Error() string {
	return fmt.Sprintf("%s: %s", e.name, e.reason)
}

// lookPath resolves name with the program's PATH, inside the image.
func lookPath(name, dir string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return name, checkExec(name, p)
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	var found *notFoundError
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		err := checkExec(name, p)
		if err == nil {
			return p, nil
		}
		if nf := (*notFoundError)(nil); errors.As(err, &nf) && nf.exists && found == nil {
			found = nf
		}
	}
	if found != nil {
		return "", found
	}
	return "", &notFoundError{name: name, reason: "command not found in the image (PATH=" + path + ")"}
}

func checkExec(name, p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return &notFoundError{name: name, reason: "no such file in the image"}
	}
	if fi.IsDir() {
		return &notFoundError{name: name, exists: true, reason: "is a directory"}
	}
	if fi.Mode()&0o111 == 0 {
		return &notFoundError{name: name, exists: true, reason: "permission denied (not executable)"}
	}
	return nil
}

// hostGone reports whether the host end of the status pipe is closed: the
// moat process died.
func hostGone() bool {
	fds := []unix.PollFd{{Fd: nswire.StatusFD, Events: 0}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}
