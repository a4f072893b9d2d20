// Package vmagent is Moat's guest agent for the microvm tier: PID 1 of a
// throw-away VM. It loads the virtio modules, mounts the image read-only,
// receives one command over a virtio-serial port, runs it as an
// unprivileged user under cgroup and rlimit bounds, streams its output,
// sends back the workspace and the result, and powers the VM off.
//
// It is small and static (CGO_ENABLED=0). It must never be trusted by the
// host: everything it sends is checked and bounded there. It must never
// run the command as root or give it a writable image.
package vmagent

import (
	"archive/tar"
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/internal/fsrules"
	"github.com/moat-sandbox/moat/internal/loopback"
	"github.com/moat-sandbox/moat/seccomp"
)

// ExecArg is the hidden argument under which the agent re-executes itself
// inside the image's root to set rlimits and exec the command.
const ExecArg = "-moat-vmagent-exec"

// ModulesOrder is the initramfs file listing the modules to load, one
// path a line, in dependency order.
const ModulesOrder = "/modules.order"

const (
	newRoot  = "/mnt/root"
	cgroupFS = "/sys/fs/cgroup"
	runCG    = cgroupFS + "/run"
)

// IsAgent reports whether this process is the guest's PID 1 started from
// the Moat initramfs.
func IsAgent() bool {
	return os.Getpid() == 1 && os.Args[0] == "/init"
}

// Main runs the agent; it never returns.
func Main() {
	if len(os.Args) > 1 && os.Args[1] == ExecArg {
		execCommand(os.Args[2:])
	}
	port, err := setup()
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat vmagent: %v\n", err)
		if port != nil {
			vmwire.WriteFrame(port, vmwire.FrameFail, []byte(err.Error()))
		}
		powerOff()
	}
	a := &agent{port: port}
	if err := a.serve(); err != nil {
		a.send(vmwire.FrameFail, []byte(err.Error()))
	}
	// The host kills the VM once it has read the result. Powering off at
	// once would drop what still sits in the port's queue, not yet passed
	// on by QEMU to a host that reads slower than the guest writes (the
	// last pieces of a large workspace, the result itself: seen with
	// 10000 files under TCG). So wait for the host; the bound only matters
	// if it never comes (a dead moat's VMM dies with it anyway).
	time.Sleep(lingerForHost)
	powerOff()
}

// lingerForHost is how long the agent waits, its work done, for the host
// to kill the VM before it powers off by itself.
const lingerForHost = time.Minute

func powerOff() {
	unix.Sync()
	// QEMU runs with -no-reboot, so a restart ends the VMM too; power-off
	// is tried first for VMMs with ACPI.
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// setup brings the guest up to the point where the port is open.
func setup() (*os.File, error) {
	for _, m := range []struct{ src, dst, typ, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID|unix.MS_NOEXEC, m.data); err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	list, err := os.ReadFile(ModulesOrder)
	if err != nil {
		return nil, err
	}
	for _, mod := range strings.Fields(string(list)) {
		if err := loadModule(mod); err != nil {
			return nil, err
		}
	}
	port, err := openPort("moat")
	if err != nil {
		return nil, err
	}
	if err := waitFor("/dev/vda"); err != nil {
		return port, err
	}
	// The image is mounted read-only, without setuid or devices: the
	// command runs as an unprivileged user and must not regain root
	// through a setuid binary of the image.
	os.MkdirAll(newRoot, 0o755)
	if err := unix.Mount("/dev/vda", newRoot, "ext4", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "noload"); err != nil {
		return port, fmt.Errorf("mount image: %w", err)
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	hello, _ := json.Marshal(vmwire.Hello{Kernel: unix.ByteSliceToString(uts.Release[:])})
	return port, vmwire.WriteFrame(port, vmwire.FrameHello, hello)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}

func waitFor(path string) error {
	for i := 0; i < 1000; i++ {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear", path)
}

// openPort finds the virtio-serial port with this name.
func openPort(want string) (*os.File, error) {
	for i := 0; i < 1000; i++ {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			name, _ := os.ReadFile(p)
			if strings.TrimSpace(string(name)) == want {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if err := waitFor(dev); err != nil {
					return nil, err
				}
				return os.OpenFile(dev, os.O_RDWR, 0)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("virtio-serial port %s did not appear", want)
}

type agent struct {
	port *os.File
	mu   sync.Mutex
}

func (a *agent) send(typ byte, p []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return vmwire.WriteFrame(a.port, typ, p)
}

func (a *agent) serve() error {
	r := bufio.NewReaderSize(a.port, 1<<20)
	typ, payload, err := vmwire.ReadFrame(r)
	if err != nil {
		return err
	}
	if typ != vmwire.FrameRequest {
		return fmt.Errorf("expected a request, got frame %q", typ)
	}
	var req vmwire.Request
	if err := json.Unmarshal(payload, &req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	if req.UID <= 0 {
		return errors.New("request: refusing to run the command as root")
	}
	if len(req.Seccomp) == 0 {
		return errors.New("request: no seccomp filter; refusing to run the command unfiltered")
	}
	if err := freshen(&req); err != nil {
		return err
	}
	if err := mountRun(&req); err != nil {
		return err
	}
	if err := installTrust(&req); err != nil {
		return err
	}
	// The same hostname as on every other tier, not the kernel's "(none)".
	if err := unix.Sethostname([]byte("moat")); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// Loopback only, as on every tier with network mode none: the
	// program may talk to itself (a local server and its tests), and the
	// VM has no other interface, so this opens no route off it.
	if err := loopback.Up(); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	if req.EgressPort != 0 {
		if err := startEgress(req.EgressPort); err != nil {
			return err
		}
	}
	// The workspace tar arrives next.
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- extract(pr, filepath.Join(newRoot, "workspace"), req.UID) }()
	for {
		typ, payload, err := vmwire.ReadFrame(r)
		if err != nil {
			pw.CloseWithError(err)
			return err
		}
		if typ == vmwire.FrameWorkspaceEnd {
			pw.Close()
			break
		}
		if typ != vmwire.FrameWorkspace {
			return fmt.Errorf("expected workspace, got frame %q", typ)
		}
		pw.Write(payload)
	}
	if err := <-done; err != nil {
		return fmt.Errorf("workspace in: %w", err)
	}
	res := a.run(&req, r)
	if err := a.sendWorkspace(filepath.Join(newRoot, "workspace")); err != nil {
		return fmt.Errorf("workspace out: %w", err)
	}
	b, _ := json.Marshal(res)
	return a.send(vmwire.FrameResult, b)
}

// mountRun gives the image root its writable and virtual file systems.
func mountRun(req *vmwire.Request) error {
	uid := strconv.Itoa(req.UID)
	for _, m := range []struct {
		dst, typ string
		flags    uintptr
		data     string
	}{
		// Sizes bound the guest's memory use too: tmpfs lives in RAM.
		{"workspace", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%s,gid=%s", max(req.WorkspaceBytes, 4096), max(req.WorkspaceFiles+1, 16), uid, uid)},
		{"tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, fmt.Sprintf("size=%d,mode=1777", max(req.TmpBytes, 4096))},
		// hidepid: the command (uid 1000) sees only its own processes,
		// not the agent (PID 1, root) nor anything else of the guest's.
		{"proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "hidepid=invisible"},
		{"dev", "tmpfs", unix.MS_NOSUID | unix.MS_NOEXEC, "size=64k,mode=0755"},
	} {
		if err := unix.Mount(m.typ, filepath.Join(newRoot, m.dst), m.typ, m.flags, m.data); err != nil {
			return fmt.Errorf("mount /%s: %w", m.dst, err)
		}
	}
	// Kernel addresses and other tasks' timers stay hidden even though
	// the kernel is the guest's own (KASLR of the guest still matters to a
	// guest-kernel exploit): the same files native masks.
	for _, f := range []string{"kallsyms", "kcore", "keys", "timer_list", "sched_debug"} {
		p := filepath.Join(newRoot, "proc", f)
		if _, err := os.Stat(p); err == nil {
			if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("mask /proc/%s: %w", f, err)
			}
		}
	}
	// A minimal /dev: no block devices (the image disk stays out of reach
	// even to a root the command should never become).
	for _, d := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		p := filepath.Join(newRoot, "dev", d.name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", d.name, err)
		}
		// mknod applies the agent's umask (022): without this the
		// command (uid 1000) could not write /dev/null.
		if err := unix.Chmod(p, 0o666); err != nil {
			return fmt.Errorf("chmod /dev/%s: %w", d.name, err)
		}
	}
	// shm is /tmp, as on the native tier: POSIX semaphores and shared
	// memory (Python's multiprocessing) need a writable /dev/shm.
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "shm": "../tmp"} {
		os.Symlink(target, filepath.Join(newRoot, "dev", name))
	}
	// The command's own cgroup bounds memory (no swap) and processes.
	if err := unix.Mount("cgroup2", cgroupFS, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	if err := os.WriteFile(cgroupFS+"/cgroup.subtree_control", []byte("+memory +pids"), 0); err != nil {
		return fmt.Errorf("enable cgroup controllers: %w", err)
	}
	if err := os.Mkdir(runCG, 0o755); err != nil {
		return err
	}
	set := map[string]string{"memory.swap.max": "0"}
	if req.MemoryBytes > 0 {
		set["memory.max"] = strconv.FormatInt(req.MemoryBytes, 10)
	}
	if req.Pids > 0 {
		set["pids.max"] = strconv.Itoa(req.Pids)
	}
	for k, v := range set {
		if err := os.WriteFile(filepath.Join(runCG, k), []byte(v), 0); err != nil && k != "memory.swap.max" {
			return fmt.Errorf("cgroup %s: %w", k, err)
		}
	}
	return nil
}

func (a *agent) run(req *vmwire.Request, r io.Reader) *vmwire.Result {
	cg, err := os.Open(runCG)
	if err != nil {
		return &vmwire.Result{Error: err.Error()}
	}
	defer cg.Close()
	// Landlock, as on the native tier, wherever the guest kernel has it;
	// without it, the run fails unless the manifest accepted that.
	var degraded []string
	useLandlock := true
	if abi, err := ll.LandlockGetABIVersion(); err != nil || abi < 1 {
		if !req.AllowNoLandlock {
			return &vmwire.Result{Error: fmt.Sprintf("landlock is not available in the guest kernel (abi %d: %v); the manifest can accept running without it with security.allow_missing: [landlock]", abi, err)}
		}
		useLandlock, degraded = false, []string{"landlock"}
	}
	// Only what execCommand applies, not the command's argv and
	// environment again: one argument string is bounded (MAX_ARG_STRLEN).
	lim, _ := json.Marshal(vmwire.Request{UID: req.UID, OpenFiles: req.OpenFiles, FileSizeBytes: req.FileSizeBytes, CPUTime: req.CPUTime, Seccomp: req.Seccomp, Landlock: useLandlock})
	cmd := exec.Command("/proc/self/exe", append([]string{ExecArg, string(lim)}, req.Argv...)...)
	cmd.Args[0] = "/init"
	cmd.Env = req.Env
	cmd.Dir = req.Dir
	// The command's standard streams are pipes owned by its uid: a
	// program may reopen them by path (/dev/stdout, /dev/stderr,
	// /proc/self/fd/N), and the kernel checks that open against the
	// pipe's owner and mode (0600), so pipes of the agent's (root) would
	// refuse it.
	var pipes [6]*os.File // stdin r, w; stdout r, w; stderr r, w
	for i := 0; i < 6; i += 2 {
		if pipes[i], pipes[i+1], err = os.Pipe(); err != nil {
			closeAll(pipes[:])
			return &vmwire.Result{Error: "stdio pipes: " + err.Error()}
		}
	}
	stdin := pipes[1]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0], pipes[3], pipes[5]
	for _, f := range []*os.File{pipes[0], pipes[3], pipes[5]} {
		if err := f.Chown(req.UID, req.UID); err != nil {
			closeAll(pipes[:])
			return &vmwire.Result{Error: "give the command its standard streams: " + err.Error()}
		}
	}
	var copies sync.WaitGroup
	for _, o := range []struct {
		r   *os.File
		typ byte
	}{{pipes[2], vmwire.FrameStdout}, {pipes[4], vmwire.FrameStderr}} {
		copies.Add(1)
		go func() {
			defer copies.Done()
			io.Copy(&vmwire.FrameWriter{W: a.send, Typ: o.typ}, o.r)
			o.r.Close()
		}()
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:      newRoot,
		Setsid:      true,
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
		Pdeathsig:   syscall.SIGKILL,
	}
	err = cmd.Start()
	// The command has its ends (or never will): ours go, so that EOF on
	// stdout and stderr means every writer is gone.
	closeAll([]*os.File{pipes[0], pipes[3], pipes[5]})
	if err != nil {
		stdin.Close()
		copies.Wait()
		return &vmwire.Result{Error: "start: " + err.Error()}
	}
	go func() {
		for {
			typ, p, err := vmwire.ReadFrame(r)
			if err != nil || typ == vmwire.FrameStdinEnd {
				stdin.Close()
				return
			}
			if typ == vmwire.FrameStdin {
				stdin.Write(p)
			}
		}
	}()
	var timedOut atomic.Bool
	if req.Timeout > 0 {
		t := time.AfterFunc(time.Duration(req.Timeout), func() {
			timedOut.Store(true)
			os.WriteFile(runCG+"/cgroup.kill", []byte("1"), 0)
		})
		defer t.Stop()
	}
	werr := cmd.Wait()
	// Whatever the command left behind dies with it, as on the other
	// tiers: a background process does not keep the run going.
	os.WriteFile(runCG+"/cgroup.kill", []byte("1"), 0)
	// Then the rest of the output: what is in the pipes, up to EOF, which
	// comes once the killed processes are gone.
	copies.Wait()
	// A killed process with no pipe of ours (a detached loop writing to
	// /dev/null) may still finish the system call it was in (a rename)
	// after EOF: the workspace is sent only once the cgroup is empty, so
	// that nothing changes it while it is walked.
	waitEmpty(runCG, 5*time.Second)
	res := &vmwire.Result{TimedOut: timedOut.Load(), Degraded: degraded}
	if ps := cmd.ProcessState; ps != nil {
		ws := ps.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			res.Signal = int(ws.Signal())
		} else {
			res.ExitCode = ws.ExitStatus()
		}
		res.CPU = int64(ps.UserTime() + ps.SystemTime())
	} else if werr != nil {
		res.Error = werr.Error()
	}
	res.OOMKills = int(eventCount(runCG+"/memory.events", "oom_kill"))
	res.PidsMax = int(eventCount(runCG+"/pids.events", "max"))
	var sfs unix.Statfs_t
	if unix.Statfs(filepath.Join(newRoot, "workspace"), &sfs) == nil {
		switch {
		case sfs.Bavail == 0:
			res.WorkspaceFull = "disk"
		case sfs.Ffree == 0:
			res.WorkspaceFull = "files"
		}
	}
	if b, err := os.ReadFile(runCG + "/memory.peak"); err == nil {
		res.PeakMemory, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	}
	return res
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// waitEmpty waits until no process is left in cgroup cg (cgroup.events
// says "populated 0"), for at most d: a process stuck in the kernel must
// not hang the run, and copy-out checks every path on its own anyway.
func waitEmpty(cg string, d time.Duration) {
	deadline := time.Now().Add(d)
	for eventCount(cg+"/cgroup.events", "populated") != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

func eventCount(file, key string) int64 {
	b, _ := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// execCommand runs in the image root, still root: it empties the
// capability bounding set, sets no_new_privs, becomes the unprivileged
// user, lowers the rlimits, applies Landlock and seccomp and becomes the
// command. The bounding set and
// no_new_privs are per thread and execve keeps the calling thread's, so
// everything happens on one locked thread.
func execCommand(args []string) {
	runtime.LockOSThread()
	if len(args) < 2 {
		os.Exit(127)
	}
	var req vmwire.Request
	if err := json.Unmarshal([]byte(args[0]), &req); err != nil || req.UID <= 0 {
		os.Exit(127)
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			fmt.Fprintf(os.Stderr, "moat: drop capability %d: %v\n", c, err)
			os.Exit(126)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		os.Exit(126)
	}
	// Setgroups, Setgid and Setuid apply to every thread of the process.
	if err := syscall.Setgroups(nil); err != nil {
		os.Exit(126)
	}
	if err := syscall.Setgid(req.UID); err != nil {
		os.Exit(126)
	}
	if err := syscall.Setuid(req.UID); err != nil {
		os.Exit(126)
	}
	set := func(res int, v uint64) {
		if v > 0 {
			unix.Setrlimit(res, &unix.Rlimit{Cur: v, Max: v})
		}
	}
	set(unix.RLIMIT_NOFILE, uint64(req.OpenFiles))
	set(unix.RLIMIT_FSIZE, uint64(req.FileSizeBytes))
	set(unix.RLIMIT_CORE, 0)
	if req.CPUTime > 0 {
		s := uint64((time.Duration(req.CPUTime) + time.Second - 1) / time.Second)
		unix.Setrlimit(unix.RLIMIT_CPU, &unix.Rlimit{Cur: s, Max: s + 1})
	}
	// Landlock (the same ruleset as the native tier's init): read and
	// execute everywhere, write only in the workspace, /tmp and the
	// writable devices, whatever the mounts and modes would allow. Paths
	// are the image root's: this process is already chrooted into it.
	if req.Landlock {
		err := fsrules.Restrict("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: landlock: %v\n", err)
			os.Exit(126)
		}
	}
	argv := args[1:]
	path := argv[0]
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat: %s: command not found\n", path)
			os.Exit(127)
		}
		path = p
	}
	// Seccomp goes last, as close to the exec as possible: everything
	// after it (the exec, or the error report) runs under the filter.
	if len(req.Seccomp) == 0 {
		fmt.Fprintln(os.Stderr, "moat: no seccomp filter")
		os.Exit(126)
	}
	if err := seccomp.Install(req.Seccomp); err != nil {
		fmt.Fprintf(os.Stderr, "moat: install seccomp filter: %v\n", err)
		os.Exit(126)
	}
	err := unix.Exec(path, argv, os.Environ())
	fmt.Fprintf(os.Stderr, "moat: exec %s: %v\n", argv[0], err)
	os.Exit(126)
}

// extract unpacks the host's workspace tar (trusted: the host wrote it).
func extract(r io.Reader, dir string, uid int) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if !filepath.IsLocal(h.Name) {
			return fmt.Errorf("entry %q is not local", h.Name)
		}
		p := filepath.Join(dir, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode)&0o777); err != nil {
				return err
			}
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		default:
			continue
		}
		os.Lchown(p, uid, uid)
		if h.Typeflag != tar.TypeSymlink {
			os.Chtimes(p, h.ModTime, h.ModTime)
		}
	}
}

// sendWorkspace streams the workspace back as a tar: directories, regular
// files and symlinks, never following a link.
func (a *agent) sendWorkspace(dir string) error {
	tw := tar.NewWriter(&vmwire.FrameWriter{W: a.send, Typ: vmwire.FrameTar})
	var dirs []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil && p != dir && errors.Is(err, fs.ErrNotExist) {
			// Gone since its directory was read: nothing to send.
			return nil
		}
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			link, _ = os.Readlink(p)
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name, h.Uname, h.Gname, h.Uid, h.Gid = rel, "", "", 0, 0
		if fi.IsDir() {
			dirs = append(dirs, rel)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.CopyN(tw, f, fi.Size())
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return a.send(vmwire.FrameTarEnd, nil)
}

// The random(4) ioctls (linux/random.h).
const (
	rndAddEntropy = 0x40085203 // _IOW('R', 0x03, int[2])
	rndReseedCRNG = 0x5207     // _IO('R', 0x07)
)

// freshen makes this VM's state its own before the command starts: a VM
// restored from a snapshot shares the kernel's RNG state and an old clock
// with every other clone. The host's entropy is mixed into the input pool
// (credited, so the kernel counts it) and the CRNG is reseeded at once:
// adding entropy alone changes /dev/urandom's output only at the next
// scheduled reseed. A request with entropy that cannot be applied fails:
// the command must not run with an RNG shared with other VMs.
func freshen(req *vmwire.Request) error {
	if req.Time > 0 {
		ts := unix.NsecToTimespec(req.Time)
		if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
			return fmt.Errorf("set the clock: %w", err)
		}
	}
	if len(req.Entropy) == 0 {
		return nil
	}
	if len(req.Entropy) > 4096 {
		return errors.New("request: more than 4096 bytes of entropy")
	}
	n := (len(req.Entropy) + 3) / 4 * 4
	buf := make([]byte, 8+n)
	binary.NativeEndian.PutUint32(buf[0:], uint32(8*len(req.Entropy))) // entropy_count, bits
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(req.Entropy)))   // buf_size, bytes
	copy(buf[8:], req.Entropy)
	f, err := os.OpenFile("/dev/urandom", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("entropy: %w", err)
	}
	defer f.Close()
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return fmt.Errorf("entropy: RNDADDENTROPY: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); e != 0 {
		return fmt.Errorf("entropy: RNDRESEEDCRNG: %w", e)
	}
	return nil
}
