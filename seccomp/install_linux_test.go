package seccomp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The privileged tests re-exec the test binary as a victim process that
// installs the default filter (irreversible) and then runs one probe. A
// control run of the same probe without the filter shows that the filter,
// not the environment, caused the result.
const (
	victimEnv  = "MOAT_SECCOMP_VICTIM"  // probe name
	controlEnv = "MOAT_SECCOMP_CONTROL" // "1": do not install the filter
)

func TestMain(m *testing.M) {
	if name := os.Getenv(victimEnv); name != "" {
		os.Exit(runVictim(name, os.Getenv(controlEnv) == "1"))
	}
	os.Exit(m.Run())
}

type probe struct {
	name string
	// run returns the errno of the probed system call, 0 for success, or an
	// error when the probe itself went wrong.
	run  func(v *victim) (unix.Errno, error)
	want unix.Errno
	// killed: the filter must kill the process with SIGSYS.
	killed bool
	// control: run without the filter too and expect a different result.
	// Off where an unfiltered run is unsafe (PTRACE_TRACEME would make the
	// test binary the victim's tracer) or where the point is that nothing
	// changes (fork+exec, threads).
	control bool
	// selfInstall: the probe calls Install itself instead of the victim.
	selfInstall bool
	// controlNeedsRoot: only as root does the kernel itself not return the
	// filter's errno (mount, bpf, clone(CLONE_NEWNS)).
	controlNeedsRoot bool
}

// victim is the state shared by probes in the victim process.
type victim struct {
	// oldThread runs functions on an OS thread that existed before Install.
	oldThread chan func()
}

func (v *victim) onOldThread(f func()) {
	done := make(chan struct{})
	v.oldThread <- func() { f(); close(done) }
	<-done
}

func rawErrno(trap uintptr, a ...uintptr) unix.Errno {
	var args [3]uintptr
	copy(args[:], a)
	_, _, e := unix.Syscall(trap, args[0], args[1], args[2])
	return e
}

func errnoOf(err error) (unix.Errno, error) {
	if err == nil {
		return 0, nil
	}
	var e unix.Errno
	if errors.As(err, &e) {
		return e, nil
	}
	return 0, err
}

var probes = []probe{
	{name: "ptrace_traceme", want: unix.EPERM, run: func(*victim) (unix.Errno, error) {
		return rawErrno(unix.SYS_PTRACE, unix.PTRACE_TRACEME), nil
	}},
	{name: "unshare_newuser", want: unix.EPERM, control: true, run: func(*victim) (unix.Errno, error) {
		// Unfiltered, a multithreaded process gets EINVAL here.
		return errnoOf(unix.Unshare(unix.CLONE_NEWUSER))
	}},
	{name: "exec_with_clone_newns", want: unix.EPERM, control: true, controlNeedsRoot: true, run: func(*victim) (unix.Errno, error) {
		// os/exec passes Cloneflags to clone(2): the filter's flag check.
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS}
		return errnoOf(cmd.Run())
	}},
	{name: "mount_tmpfs", want: unix.EPERM, control: true, controlNeedsRoot: true, run: func(*victim) (unix.Errno, error) {
		// Unfiltered as root: ENOENT, the target does not exist.
		return errnoOf(unix.Mount("none", "/nonexistent-moat-seccomp-probe", "tmpfs", 0, ""))
	}},
	{name: "io_uring_setup", want: unix.EPERM, control: true, run: func(*victim) (unix.Errno, error) {
		return rawErrno(unix.SYS_IO_URING_SETUP, 1, 0), nil // unfiltered: EFAULT
	}},
	{name: "bpf_prog_load", want: unix.EPERM, control: true, controlNeedsRoot: true, run: func(*victim) (unix.Errno, error) {
		return rawErrno(unix.SYS_BPF, unix.BPF_PROG_LOAD, 0, 0), nil // unfiltered: EFAULT
	}},
	{name: "x32_getpid", want: unix.EPERM, control: true, run: func(*victim) (unix.Errno, error) {
		// Unfiltered: ENOSYS without CONFIG_X86_X32_ABI, the pid with it.
		return rawErrno(x32Bit | unix.SYS_GETPID), nil
	}},
	{name: "socket_netlink", want: unix.EAFNOSUPPORT, control: true, run: func(*victim) (unix.Errno, error) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
		if err == nil {
			unix.Close(fd)
		}
		return errnoOf(err)
	}},
	{name: "ioctl_tiocsti_high_bits", want: unix.EPERM, control: true, run: func(*victim) (unix.Errno, error) {
		// A pipe, not a terminal: unfiltered this is ENOTTY and injects nothing.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			return 0, err
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		c := byte('x')
		return rawErrno(unix.SYS_IOCTL, uintptr(p[0]), 1<<32|tiocsti, uintptr(unsafe.Pointer(&c))), nil
	}},
	{name: "personality_read_implies_exec", want: unix.EPERM, control: true, run: func(*victim) (unix.Errno, error) {
		return rawErrno(unix.SYS_PERSONALITY, readImpliesExec), nil
	}},
	{name: "tsync_old_thread_filtered", want: unix.EPERM, control: true, run: func(v *victim) (unix.Errno, error) {
		// A thread that existed before Install must be filtered too.
		var e unix.Errno
		v.onOldThread(func() { e = rawErrno(unix.SYS_IO_URING_SETUP, 1, 0) })
		return e, nil
	}},
	{name: "all_threads_have_filter_and_nnp", want: 0, run: func(*victim) (unix.Errno, error) {
		return 0, checkAllThreadsFiltered()
	}},
	{name: "tsync_failure_names_thread", selfInstall: true, run: func(v *victim) (unix.Errno, error) {
		// Give the old thread a filter of its own, which is not an ancestor
		// of the installing thread's, so the kernel cannot synchronise it.
		var tid int
		var setupErr error
		v.onOldThread(func() {
			tid = unix.Gettid()
			allowAll := []unix.SockFilter{stmt(opRetK, retAllow)}
			prog := unix.SockFprog{Len: 1, Filter: &allowAll[0]}
			if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
				setupErr = err
				return
			}
			if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog))); e != 0 {
				setupErr = e
			}
		})
		if setupErr != nil {
			return 0, fmt.Errorf("per-thread filter: %w", setupErr)
		}
		filter, err := Default().Compile()
		if err != nil {
			return 0, err
		}
		err = Install(filter)
		var tsErr *TSyncError
		if !errors.As(err, &tsErr) || tsErr.TID != tid {
			return 0, fmt.Errorf("Install = %v, want a TSyncError naming thread %d", err, tid)
		}
		// Nothing was installed: a syscall the filter denies still works here.
		if e := rawErrno(unix.SYS_IO_URING_SETUP, 1, 0); e == unix.EPERM {
			return 0, fmt.Errorf("io_uring_setup = EPERM after a failed TSYNC install")
		}
		return 0, nil
	}},
	{name: "fork_exec_still_works", want: 0, run: func(*victim) (unix.Errno, error) {
		if err := exec.Command("/bin/true").Run(); err != nil {
			return 0, fmt.Errorf("/bin/true: %w", err)
		}
		// dash forks for the pipeline and the subshell.
		out, err := exec.Command("/bin/sh", "-c", "echo ok | cat; (exit 3); echo $?").Output()
		if err != nil || string(out) != "ok\n3\n" {
			return 0, fmt.Errorf("/bin/sh: %q, %v", out, err)
		}
		return 0, nil
	}},
	{name: "go_runtime_still_works", want: 0, run: func(*victim) (unix.Errno, error) {
		return 0, exerciseRuntime()
	}},
	{name: "int80_i386_killed", killed: true, control: true, run: func(*victim) (unix.Errno, error) {
		return 0, int80Getpid()
	}},
}

func runVictim(name string, control bool) int {
	var pr *probe
	for i := range probes {
		if probes[i].name == name {
			pr = &probes[i]
		}
	}
	if pr == nil {
		fmt.Fprintf(os.Stderr, "unknown probe %q\n", name)
		return 2
	}
	v := &victim{oldThread: make(chan func())}
	started := make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked: the thread stays this goroutine's
		close(started)
		for f := range v.oldThread {
			f()
		}
	}()
	<-started
	if !control && !pr.selfInstall {
		filter, err := Default().Compile()
		if err == nil {
			err = Install(filter)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	errno, err := pr.run(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "probe %s: %v\n", name, err)
		return 2
	}
	fmt.Printf("errno %d\n", int(errno))
	return 0
}

type victimResult struct {
	errno  unix.Errno
	state  *os.ProcessState
	stderr string
}

func runChild(t *testing.T, name string, control bool) victimResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"="+name)
	if control {
		cmd.Env = append(cmd.Env, controlEnv+"=1")
	}
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := victimResult{state: cmd.ProcessState, stderr: stderr.String()}
	if ctx.Err() != nil {
		t.Fatalf("victim %s timed out", name)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("victim %s: %v", name, err)
	}
	if f := strings.Fields(stdout.String()); len(f) == 2 && f[0] == "errno" {
		n, _ := strconv.Atoi(f[1])
		res.errno = unix.Errno(n)
	}
	return res
}

func killedBy(st *os.ProcessState) (syscall.Signal, bool) {
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return ws.Signal(), true
}

func TestInstallVictim(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("the filter is for amd64; GOARCH is %s", runtime.GOARCH)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil || !strings.Contains(string(status), "\nSeccomp:") {
		t.Skip("needs a kernel with CONFIG_SECCOMP_FILTER and /proc (no Seccomp: line in /proc/self/status)")
	}
	root := os.Geteuid() == 0
	for _, pr := range probes {
		t.Run(pr.name, func(t *testing.T) {
			if pr.killed {
				c := runChild(t, pr.name, true)
				if sig, ok := killedBy(c.state); ok || !c.state.Success() {
					t.Skipf("without the filter the probe fails too (signal %v, %s): int 0x80 unavailable (ia32_emulation off?)", sig, c.stderr)
				}
				r := runChild(t, pr.name, false)
				if sig, ok := killedBy(r.state); !ok || sig != unix.SIGSYS {
					t.Fatalf("victim not killed by SIGSYS: %v, errno %v, stderr %s", r.state, r.errno, r.stderr)
				}
				return
			}
			r := runChild(t, pr.name, false)
			if !r.state.Success() {
				t.Fatalf("victim: %v: %s", r.state, r.stderr)
			}
			if r.errno != pr.want {
				t.Fatalf("under the filter: errno %d (%s), want %d (%s)", r.errno, errnoName(r.errno), pr.want, errnoName(pr.want))
			}
			if !pr.control {
				return
			}
			t.Run("without_filter", func(t *testing.T) {
				if pr.controlNeedsRoot && !root {
					t.Skipf("needs root: as uid %d the kernel itself returns %s, so the control cannot show the filter's effect", os.Geteuid(), errnoName(pr.want))
				}
				c := runChild(t, pr.name, true)
				if !c.state.Success() {
					t.Fatalf("control victim: %v: %s", c.state, c.stderr)
				}
				if c.errno == pr.want {
					t.Skipf("without the filter the result is also %s: this environment already denies it, so the run cannot show the filter is the cause", errnoName(c.errno))
				}
				t.Logf("without the filter: errno %d (%s)", c.errno, errnoName(c.errno))
			})
		})
	}
}

// checkAllThreadsFiltered reads every task's status: TSYNC must have put
// each thread in filter mode (2) with no_new_privs.
func checkAllThreadsFiltered() error {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) < 2 {
		return fmt.Errorf("want several threads in /proc/self/task, got %d (%v)", len(tasks), err)
	}
	for _, path := range tasks {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		fields := map[string]string{}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		f.Close()
		if fields["Seccomp"] != "2" || fields["NoNewPrivs"] != "1" {
			return fmt.Errorf("%s: Seccomp %q NoNewPrivs %q, want 2 and 1", path, fields["Seccomp"], fields["NoNewPrivs"])
		}
	}
	return nil
}

// exerciseRuntime uses what the sandbox init relies on after Install: new
// OS threads, GC, timers, channels, signal delivery and a pipe.
func exerciseRuntime() error {
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // forces clone(2) of new threads
			defer runtime.UnlockOSThread()
			buf := make([]byte, 1<<20)
			buf[i] = byte(i)
			time.Sleep(time.Millisecond)
			if unix.Gettid() <= 0 {
				errs <- errors.New("gettid failed")
			}
		}()
	}
	wg.Wait()
	runtime.GC()
	select {
	case err := <-errs:
		return err
	default:
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGUSR1)
	defer signal.Stop(sigs)
	if err := unix.Kill(os.Getpid(), unix.SIGUSR1); err != nil {
		return fmt.Errorf("kill: %w", err)
	}
	select {
	case <-sigs:
	case <-time.After(5 * time.Second):
		return errors.New("SIGUSR1 not delivered")
	}

	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	go func() { w.Write([]byte("ping")); w.Close() }()
	b := make([]byte, 4)
	if err := r.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil { // netpoller: epoll
		return err
	}
	if _, err := r.Read(b); err != nil || string(b) != "ping" {
		return fmt.Errorf("pipe read %q: %v", b, err)
	}
	return nil
}

// int80Getpid makes an i386 system call through int 0x80 from 64-bit code,
// the classic way around a filter that only checks syscall numbers. It runs
// machine code from an executable page (mov eax, 20 (getpid); int 0x80; ret)
// so the test package needs no assembly file.
func int80Getpid() error {
	code := []byte{0xb8, 0x14, 0x00, 0x00, 0x00, 0xcd, 0x80, 0xc3}
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return err
	}
	copy(mem, code)
	// A killed victim must not leave a core file behind.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return err
	}
	// A Go func value points at a word holding the code address.
	entry := uintptr(unsafe.Pointer(&mem[0]))
	fn := *(*func())(unsafe.Pointer(&struct{ p *uintptr }{&entry}))
	runtime.LockOSThread()
	fn()
	runtime.UnlockOSThread()
	return nil
}
