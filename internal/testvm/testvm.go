// Package testvm runs a package's tests inside a small virtual machine, so
// they meet a kernel configuration the host lacks: on a cgroup v1 host,
// cgroup v2 with every controller. The VM boots the microvm tier's guest
// kernel (Debian's cloud kernel) under QEMU with an initramfs holding the
// running test binary as /init and a static busybox for the shell, sleep
// and true that tests start; the test binary's TestMain hands over to
// GuestMain when it finds itself there. Only tests import this package.
//
// The VM is a test harness for Moat's own test binary, not a sandbox: it
// is not jailed, and it always uses TCG (QEMU's emulator), which is slower
// than KVM but works on every host, this nested one included.
package testvm

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/cpio"
	"github.com/moat-sandbox/moat/internal/guestkernel"
	"github.com/moat-sandbox/moat/internal/loopback"
)

// guestEnv marks the VM's init; the kernel hands it over from the command
// line (a parameter with "=" and no "." becomes init's environment).
const guestEnv = "MOAT_TESTVM"

// requireEnv, when set (scripts/test sets it for root), turns a missing
// QEMU, kernel or busybox into a test failure instead of a skip.
const requireEnv = "MOAT_REQUIRE_TESTVM"

// busyboxApplets are the host programs tests start by absolute path.
var busyboxApplets = []string{"sh", "sleep", "true", "cat", "echo"}

// exitMarker precedes m.Run's status on the console.
const exitMarker = "MOAT-TESTVM-EXIT "

// Guest reports whether this process is the VM's init, or the test
// process init starts.
func Guest() bool {
	return os.Getenv(guestEnv) == "1" && (os.Getpid() == 1 || os.Getppid() == 1)
}

// GuestMain is TestMain inside the VM; it never returns. As the VM's init
// it mounts /proc, /sys, /dev and /tmp, brings lo up, loads the disk
// modules, starts the test binary again as its one child and reaps every
// process until that child ends, as a host's init would (tests kill
// processes whose orphans init must reap), then prints the child's status
// for the host and powers the VM off. As that child it runs setup (a
// package's own preparation, e.g. mounting cgroup2), then run (the
// package's usual TestMain body, returning m.Run's status), and exits.
func GuestMain(setup func() error, run func() int) {
	if os.Getpid() == 1 {
		initMain()
	}
	// What the tests start must not take itself for the VM's test process.
	os.Unsetenv(guestEnv)
	code := 1
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "testvm: panic: %v\n", r)
			code = 1
		}
		os.Exit(code)
	}()
	os.Setenv("PATH", "/bin")
	os.Setenv("TMPDIR", "/tmp")
	if setup != nil {
		if err := setup(); err != nil {
			fmt.Fprintf(os.Stderr, "testvm: setup: %v\n", err)
			return
		}
	}
	code = run()
}

// initMain is the VM's PID 1.
func initMain() {
	code := 1
	defer func() {
		fmt.Fprintf(os.Stdout, "\n%s%d\n", exitMarker, code)
		unix.Sync()
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {} // init must not exit: the kernel would panic
	}()
	fail := func(err error) { fmt.Fprintf(os.Stderr, "testvm: %v\n", err) }
	if err := guestMounts(); err != nil {
		fail(err)
		return
	}
	// A booted host's loopback is up: tests serve on 127.0.0.1.
	if err := loopback.Up(); err != nil {
		fail(err)
		return
	}
	if err := loadModules(); err != nil {
		fail(err)
		return
	}
	child := exec.Command("/init", os.Args[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		fail(err)
		return
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			fail(fmt.Errorf("wait: %w", err))
			return
		}
		if pid != child.Process.Pid {
			continue // an orphan, reaped
		}
		switch {
		case ws.Exited():
			code = ws.ExitStatus()
		case ws.Signaled():
			fmt.Fprintf(os.Stderr, "testvm: the test process was killed by %v\n", ws.Signal())
			code = 128 + int(ws.Signal())
		}
		return
	}
}

// MountCgroup2 mounts the unified hierarchy alone at /sys/fs/cgroup, as a
// v2-only host (systemd's default) has it: for a guest's set-up.
func MountCgroup2() error {
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
	}
	return nil
}

func guestMounts() error {
	// The initramfs is the kernel's rootfs, which pivot_root refuses to
	// move (EINVAL): the native tier's init pivots into its image. So init
	// moves onto a bind mount of it, which has a parent mount, as the root
	// of a booted system has.
	if err := os.Mkdir("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/", "/newroot", "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the initramfs: %w", err)
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the initramfs bind to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	for _, m := range []struct{ fstype, target string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"}, {"tmpfs", "/tmp"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, m.target, m.fstype, unix.MS_NOSUID, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	// The kernel found no /dev/console in the initramfs to give init;
	// devtmpfs has one now.
	f, err := os.OpenFile("/dev/console", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	for fd := 0; fd <= 2; fd++ {
		if err := unix.Dup2(int(f.Fd()), fd); err != nil {
			return err
		}
	}
	return f.Close()
}

// moduleDir and moduleOrder are where the initramfs holds the virtio
// modules and the order to load them in.
const (
	moduleDir   = "/lib/modules"
	moduleOrder = "/modules.order"
)

// loadModules loads the modules moduleOrder lists, if any, and waits for
// the disks they bring.
func loadModules() error {
	b, err := os.ReadFile(moduleOrder)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, m := range strings.Fields(string(b)) {
		f, err := os.Open(m)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", m, err)
		}
	}
	for i := 0; i < 500; i++ {
		if _, err := os.Stat("/dev/vda"); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("the virtio modules are loaded but /dev/vda did not appear")
}

// Options sizes the VM and says what it gets besides the test binary.
type Options struct {
	MemoryMiB int           // default 512
	CPUs      int           // default 2
	Timeout   time.Duration // default 3 minutes
	// Files are host files copied into the initramfs: guest path
	// (relative, e.g. "bin/moat") to host path. Modes are kept.
	Files map[string]string
	// Disks are host files attached read-only as virtio disks, in order:
	// /dev/vda, /dev/vdb, ... (the virtio modules are then loaded by
	// GuestMain before setup).
	Disks []string
	// Env is set in the guest's environment (through the kernel command
	// line: names without ".", values without blanks).
	Env map[string]string
}

// Result is what the VM printed and the status m.Run returned inside.
type Result struct {
	Console string
	Code    int
	Elapsed time.Duration
}

// Unavailable says why a VM cannot boot here, or "" when it can.
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "needs root (the tests inside mount cgroupfs in the VM; QEMU itself does not)"
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return "qemu-system-x86_64 is not installed (scripts/setup installs qemu-system-x86)"
	}
	if _, err := os.Stat(filepath.Join(guestkernel.Dir(), "vmlinuz")); err != nil {
		return fmt.Sprintf("no guest kernel at %s (scripts/setup extracts linux-image-cloud-amd64 there)", guestkernel.Dir())
	}
	if _, err := busybox(); err != nil {
		return err.Error()
	}
	return ""
}

// Skip skips t when the VM cannot boot, naming why, or fails it when
// MOAT_REQUIRE_TESTVM is set (as scripts/test does for root).
func Skip(t testing.TB) {
	t.Helper()
	if why := Unavailable(); why != "" {
		if os.Getenv(requireEnv) != "" {
			t.Fatalf("a test VM cannot boot and %s is set: %s", requireEnv, why)
		}
		t.Skipf("a test VM cannot boot here: %s", why)
	}
}

func busybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if ok, _ := static(p); ok {
			return p, nil
		}
	}
	return "", errors.New("no static busybox (Debian: apt-get install busybox-static; scripts/setup does)")
}

// static reports whether the ELF executable at p needs no dynamic loader:
// the initramfs has no libraries.
func static(p string) (bool, error) {
	f, err := elf.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// Run boots a VM whose init is the running test binary with args (test
// flags such as -test.run), waits for it to power off, and returns what it
// printed and m.Run's status inside. An error means the VM did not report
// a status: it did not boot, crashed or timed out.
func Run(ctx context.Context, args []string, opts Options) (*Result, error) {
	for _, a := range args {
		if strings.ContainsAny(a, " \t\n\"") {
			return nil, fmt.Errorf("argument %q: the kernel command line splits at blanks and quotes", a)
		}
	}
	var env []string
	for k, v := range opts.Env {
		if k == "" || strings.ContainsAny(k, ". =\t\n\"") || strings.ContainsAny(v, " \t\n\"") {
			return nil, fmt.Errorf("environment %s=%s: the kernel passes on only names without \".\" and values without blanks or quotes", k, v)
		}
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	if why := Unavailable(); why != "" {
		return nil, errors.New(why)
	}
	if opts.MemoryMiB == 0 {
		opts.MemoryMiB = 512
	}
	if opts.CPUs == 0 {
		opts.CPUs = 2
	}
	if opts.Timeout == 0 {
		opts.Timeout = 3 * time.Minute
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("moat-testvm-%d-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	initrd := filepath.Join(dir, "initramfs.cpio")
	if err := writeInitramfs(initrd, opts); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	// MOAT_TESTVM_DEBUG=1: every kernel message on the console.
	cmdline := guestkernel.Cmdline(os.Getenv("MOAT_TESTVM_DEBUG") != "") + " " + strings.Join(append(env, guestEnv+"=1"), " ") + " -- " + strings.Join(args, " ")
	var disks []string
	for i, d := range opts.Disks {
		id := "disk" + strconv.Itoa(i)
		disks = append(disks, "-drive", "id="+id+",file="+d+",format=raw,if=none,readonly=on",
			"-device", "virtio-blk-device,drive="+id)
	}
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", append([]string{
		// The machine the microvm tier boots this kernel on, under TCG,
		// with the serial port (the console) on QEMU's stdout.
		"-M", guestkernel.Machine(true),
		"-accel", "tcg", "-cpu", guestkernel.TCGCPU,
		"-m", strconv.Itoa(opts.MemoryMiB) + "M", "-smp", strconv.Itoa(opts.CPUs),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio",
		"-kernel", filepath.Join(guestkernel.Dir(), "vmlinuz"), "-initrd", initrd,
		"-append", cmdline}, disks...)...)
	var out capped
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	err = cmd.Run()
	r := &Result{Console: strings.ReplaceAll(out.String(), "\r\n", "\n"), Elapsed: time.Since(start)}
	if ctx.Err() != nil {
		return r, fmt.Errorf("the VM did not power off within %v", opts.Timeout)
	}
	if err != nil {
		return r, fmt.Errorf("qemu: %v", err)
	}
	m := regexp.MustCompile(`(?m)^`+exitMarker+`(\d+)$`).FindAllStringSubmatch(r.Console, -1)
	if len(m) != 1 {
		return r, errors.New("the VM powered off without reporting a status (init crashed or the kernel panicked: see its console)")
	}
	r.Code, _ = strconv.Atoi(m[0][1])
	return r, nil
}

// writeInitramfs packs the running test binary as /init, busybox with its
// applets in /bin, opts.Files, and the virtio modules when opts has disks.
func writeInitramfs(path string, opts Options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if ok, err := static(self); err != nil {
		return err
	} else if !ok {
		return fmt.Errorf("the test binary %s is dynamically linked: build it with CGO_ENABLED=0 (scripts/test does)", self)
	}
	bb, err := busybox()
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp"} {
		w.Dir(d)
	}
	type file struct {
		dst, src string
		perm     uint32
	}
	files := []file{{"init", self, 0o755}, {"bin/busybox", bb, 0o755}}
	dsts := slices.Sorted(maps.Keys(opts.Files))
	for _, dst := range dsts {
		fi, err := os.Stat(opts.Files[dst])
		if err != nil {
			return err
		}
		files = append(files, file{dst, opts.Files[dst], uint32(fi.Mode().Perm())})
	}
	// What every booted host has and tests rely on: localhost resolves
	// (the egress proxy's tests grant it).
	w.Dir("etc")
	w.File("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n::1 localhost\n"))
	made := map[string]bool{"bin": true, "dev": true, "proc": true, "sys": true, "tmp": true, "etc": true}
	if len(opts.Disks) > 0 {
		mods, err := guestkernel.ModuleDir(guestkernel.Dir())
		if err != nil {
			return err
		}
		var order []string
		for _, m := range guestkernel.Modules {
			dst := moduleDir + "/" + filepath.Base(m)
			files = append(files, file{strings.TrimPrefix(dst, "/"), filepath.Join(mods, m), 0o644})
			order = append(order, dst)
		}
		w.File(strings.TrimPrefix(moduleOrder, "/"), 0o644, []byte(strings.Join(order, "\n")))
	}
	for _, f := range files {
		// Parent directories first, once each.
		var parents []string
		for d := filepath.Dir(f.dst); d != "." && !made[d]; d = filepath.Dir(d) {
			parents = append(parents, d)
			made[d] = true
		}
		for i := len(parents) - 1; i >= 0; i-- {
			w.Dir(parents[i])
		}
		b, err := os.ReadFile(f.src)
		if err != nil {
			return err
		}
		w.File(f.dst, f.perm, b)
	}
	for _, a := range busyboxApplets {
		w.Symlink("bin/"+a, "busybox")
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o600)
}

// capped keeps the first 8 MiB of the console: a test that floods it
// cannot grow the host test's memory without bound.
type capped struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const consoleCap = 8 << 20

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := consoleCap - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// Expect is what RunTests requires of the tests inside the VM.
type Expect struct {
	// Ready is text the guest's set-up prints once it is done.
	Ready string
	// Tests are top-level tests, each of which must pass.
	Tests []string
	// SkipReason, when set, allows a skip whose reason contains it (a
	// case ruled out by what is under test, as on the host); any other
	// skip fails, since it would be a path that did not run.
	SkipReason string
}

// RunTests boots a VM running this test binary's tests with -test.v,
// -test.count=1 and args, logs its console, and fails t unless they
// exited 0 after the guest printed want.Ready, every test in want.Tests
// passed, and nothing failed or skipped (but for want.SkipReason).
func RunTests(t testing.TB, args []string, opts Options, want Expect) {
	t.Helper()
	r, err := Run(context.Background(), append([]string{"-test.v", "-test.count=1"}, args...), opts)
	if r != nil {
		t.Logf("VM console (%v):\n%s", r.Elapsed.Round(time.Millisecond), r.Console)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != 0 {
		t.Errorf("the tests inside the VM exited %d", r.Code)
	}
	if !strings.Contains(r.Console, want.Ready) {
		t.Errorf("the VM's set-up did not report %q", want.Ready)
	}
	for _, name := range want.Tests {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + regexp.QuoteMeta(name) + ` `).MatchString(r.Console) {
			t.Errorf("%s did not pass inside the VM", name)
		}
	}
	// go test -v prints a test's skip reason after its "=== RUN" line.
	allowed := map[string]bool{}
	var running string
	for _, l := range strings.Split(r.Console, "\n") {
		l = strings.TrimSpace(l)
		if name, ok := strings.CutPrefix(l, "=== RUN   "); ok {
			running = name
		} else if want.SkipReason != "" && strings.Contains(l, want.SkipReason) {
			allowed[running] = true
		}
		if strings.HasPrefix(l, "--- FAIL: ") {
			t.Errorf("inside the VM: %s", l)
		}
		if name, ok := strings.CutPrefix(l, "--- SKIP: "); ok {
			if name, _, _ = strings.Cut(name, " ("); !allowed[name] {
				t.Errorf("inside the VM: %s", l)
			}
		}
	}
}
