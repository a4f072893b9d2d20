package gvisor_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/gvisor"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

var (
	// gv is the tier under test, nil when skipReason is set.
	gv *gvisor.GVisor
	// newErr is why gvisor.New failed on a host that has runsc: a failure
	// of every test, not a skip.
	newErr error
	// skipReason is set when the host cannot run these tests at all.
	skipReason string
	// moatBin is a moat binary for the native tier's init (benchmarks).
	moatBin string
)

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv(childEnv) != "" {
		return killedChild()
	}
	switch {
	case os.Geteuid() != 0:
		skipReason = "needs root: runsc creates namespaces and cgroups"
	case !runscInstalled():
		skipReason = "runsc is not installed ($MOAT_RUNSC unset, nothing at " + gvisor.DefaultRunsc + " or on PATH): run scripts/setup to build it"
	}
	if skipReason != "" {
		fmt.Fprintln(os.Stderr, "gvisor tests skipped:", skipReason)
		return m.Run()
	}
	// The tier's guest (and the native tier's init, for the
	// benchmarks) is a real, static moat binary.
	bin, cleanup, err := testbin.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	moatBin = bin
	gv, newErr = gvisor.New(gvisor.Options{Guest: moatBin})
	if newErr != nil {
		fmt.Fprintln(os.Stderr, "gvisor tier unavailable:", newErr)
		return m.Run()
	}
	fmt.Fprintf(os.Stderr, "gvisor tests use %s: %s\n", gv.Runsc(), gv.Version())
	code := m.Run()
	// Every test checks its own runs; check the whole host once more for
	// anything of this tier that persists (other packages' tests may run
	// native sandboxes meanwhile, which are not counted here).
	left := residue()
	for i := 0; i < 5 && len(left) > 0; i++ {
		time.Sleep(time.Second)
		left = residue()
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "residual state after the gvisor tier tests: %v\n", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func runscInstalled() bool {
	if os.Getenv("MOAT_RUNSC") != "" {
		return true
	}
	if _, err := os.Stat(gvisor.DefaultRunsc); err == nil {
		return true
	}
	_, err := exec.LookPath("runsc")
	return err == nil
}

// need skips a test the host cannot run and fails it when the tier is
// unavailable although runsc is installed.
func need(t testing.TB) *gvisor.GVisor {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if newErr != nil {
		t.Fatalf("gvisor.New: %v", newErr)
	}
	return gv
}

func newEngine(t testing.TB, g *gvisor.GVisor) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Options{NoAutoBuild: true, Exe: moatBin, Tiers: map[string]tier.Tier{gvisor.Name: g}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	return e
}

// leftovers lists what run id left on the host: cgroups in any hierarchy,
// its run directory, mounts, and processes naming it (runsc, the Sentry
// and the gofer all carry the id or the run's directory in their argv).
func leftovers(home string) tiertest.Leftovers {
	return func(id string) []string {
		var left []string
		for _, pat := range []string{"/sys/fs/cgroup/*/moat/" + id, "/sys/fs/cgroup/moat/" + id} {
			m, _ := filepath.Glob(pat)
			for _, p := range m {
				left = append(left, "cgroup "+p)
			}
		}
		if _, err := os.Stat(filepath.Join(home, "runs", id)); err == nil {
			left = append(left, "run directory "+filepath.Join(home, "runs", id))
		}
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && bytes.Contains(mi, []byte(id)) {
			left = append(left, "a mount mentioning "+id)
		}
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(id)) {
				left = append(left, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
			}
		}
		return left
	}
}

// residue lists runsc processes and this tier's cgroup leftovers on the
// whole host: cgroups in the hierarchies only runsc uses, and runsc
// processes of any run.
func residue() []string {
	var left []string
	for _, ctl := range []string{"blkio", "cpuset", "devices", "systemd", "hugetlb", "net_cls", "net_prio", "perf_event", "rdma"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctl, "moat")); err == nil {
			left = append(left, "cgroup parent /sys/fs/cgroup/"+ctl+"/moat")
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && (bytes.HasPrefix(b, []byte("runsc")) || bytes.Contains(b, []byte("/runsc\x00"))) {
			left = append(left, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return left
}

func TestConformance(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	tiertest.Run(t, tiertest.Target{Tier: g, ImageRoot: img.Root, ImageEnv: img.Env, ImageDigest: img.Digest, Leftovers: leftovers(e.Home())})
}

// run runs argv on the gvisor tier with the default manifest, adjusted by
// adjust, and checks that nothing was left behind.
func runGV(t *testing.T, e *engine.Engine, adjust func(*manifest.Manifest), stdin string, argv ...string) *result.Result {
	t.Helper()
	m := manifest.Default()
	m.Tier = gvisor.Name
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if adjust != nil {
		adjust(m)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("test manifest invalid: %v", err)
	}
	req := &engine.Request{Manifest: m, Argv: argv}
	if stdin != "" {
		req.Stdin = strings.NewReader(stdin)
	}
	res, err := e.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	if left := leftovers(e.Home())(res.ID); len(left) > 0 {
		t.Errorf("run %s left residual state: %s", res.ID, strings.Join(left, "; "))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("result: termination=%s exit=%d signal=%d error=%q stdout=%.2000q stderr=%.2000q violations=%v",
				res.Termination, res.ExitCode, res.Signal, res.Error, res.Stdout.Data, res.Stderr.Data, res.Violations)
		}
	})
	return res
}

func TestKernelIsGVisor(t *testing.T) {
	e := newEngine(t, need(t))
	var host unix.Utsname
	if err := unix.Uname(&host); err != nil {
		t.Fatal(err)
	}
	hostVersion, err := os.ReadFile("/proc/version")
	if err != nil {
		t.Fatal(err)
	}
	res := runGV(t, e, nil, "", "sh", "-c", "uname -r; cat /proc/version")
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination=%s exit=%d", res.Termination, res.ExitCode)
	}
	release, version, _ := strings.Cut(res.Stdout.Data, "\n")
	if release == "" || release == unix.ByteSliceToString(host.Release[:]) {
		t.Errorf("uname -r in the sandbox is %q, the host's is %q: want gVisor's own", release, unix.ByteSliceToString(host.Release[:]))
	}
	if strings.TrimSpace(version) == strings.TrimSpace(string(hostVersion)) {
		t.Errorf("/proc/version in the sandbox is the host's: %q", version)
	}
	if !strings.HasPrefix(res.Runtime, "gvisor.dev/gvisor ") && !strings.HasPrefix(res.Runtime, "runsc ") {
		t.Errorf("result runtime = %q, want gVisor's version", res.Runtime)
	}
}

func TestHostProcIsInvisible(t *testing.T) {
	e := newEngine(t, need(t))
	hostInit, err := os.ReadFile("/proc/1/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	res := runGV(t, e, nil, "", "python3", "-c", `
import os
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print(" ".join(map(str, pids)))
print(open("/proc/1/cmdline").read().split("\0")[0])
print(os.getpid(), os.getppid())
`)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination=%s exit=%d", res.Termination, res.ExitCode)
	}
	lines := strings.Split(res.Stdout.Data, "\n")
	if len(lines) < 3 {
		t.Fatalf("stdout %q", res.Stdout.Data)
	}
	// The sandbox's init (Moat's guest, pid 1) and the program, alone:
	// none of the host's processes, moat's included, exists in the
	// Sentry's /proc.
	pids := strings.Fields(lines[0])
	self := strings.Fields(lines[2])
	if len(pids) != 2 || pids[0] != "1" || len(self) != 2 || pids[1] != self[0] {
		t.Errorf("/proc in the sandbox lists pids %q, want only init (1) and the program (%q)", lines[0], lines[2])
	}
	if lines[1] != "/dev/.moat/guest" {
		t.Errorf("/proc/1/cmdline in the sandbox is %q, want Moat's guest", lines[1])
	}
	if h := strings.ReplaceAll(string(hostInit), "\x00", " "); strings.TrimSpace(lines[1]) == strings.TrimSpace(h) {
		t.Errorf("the host's pid 1 (%q) is visible in the sandbox", h)
	}
	// runsc exec starts the program from outside: it has no parent in
	// the sandbox.
	if len(self) != 2 || self[1] != "0" {
		t.Errorf("pid, ppid = %q, want ppid 0", lines[2])
	}
}

// TestUnimplementedSyscallFailsCleanly calls host kernel features gVisor
// does not implement: the program gets an error and carries on.
func TestUnimplementedSyscallFailsCleanly(t *testing.T) {
	e := newEngine(t, need(t))
	res := runGV(t, e, nil, "", "python3", "-c", `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(256)
for name, nr, args in [("io_uring_setup", 425, (1, ctypes.addressof(buf))), ("perf_event_open", 298, (ctypes.addressof(buf), 0, -1, -1, 0)), ("bpf", 321, (0, ctypes.addressof(buf), 48))]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    print(name, r, ctypes.get_errno())
print("still running")
`)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination=%s exit=%d: the program did not survive", res.Termination, res.ExitCode)
	}
	for _, want := range []string{
		fmt.Sprintf("io_uring_setup -1 %d", unix.ENOSYS),
		"perf_event_open -1 ",
		"bpf -1 ",
		"still running",
	} {
		if !strings.Contains(res.Stdout.Data, want) {
			t.Errorf("stdout %q lacks %q", res.Stdout.Data, want)
		}
	}
}

// TestOutcomes covers runsc's exit status mapping and the limits'
// classification; every run must leave nothing behind (runGV checks).
func TestOutcomes(t *testing.T) {
	e := newEngine(t, need(t))
	tests := []struct {
		name   string
		adjust func(*manifest.Manifest)
		stdin  string
		argv   []string
		check  func(t *testing.T, res *result.Result)
	}{
		{"exit 137 is an exit, not a signal", nil, "", []string{"sh", "-c", "exit 137"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 137, 0)
		}},
		{"exit 128 is the program's", nil, "", []string{"sh", "-c", "exit 128"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 128, 0)
		}},
		{"SIGKILL is a signal", nil, "", []string{"sh", "-c", "kill -KILL $$"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Signaled, 128+9, 9)
		}},
		{"SIGTERM is a signal", nil, "", []string{"sh", "-c", "kill -TERM $$"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Signaled, 128+15, 15)
		}},
		{"not executable is 126", nil, "", []string{"/etc/passwd"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 126, 0)
		}},
		{"stdin reaches the program", nil, "hello from the host\n", []string{"sh", "-c", "read l; echo got: $l"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 0, 0)
			if res.Stdout.Data != "got: hello from the host\n" {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
		}},
		{"files appear owned by the sandbox user", nil, "", []string{"sh", "-c", "echo x > made.txt; mkdir d; ls -ln"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 0, 0)
			if len(res.Files) != 2 {
				t.Errorf("files %v, want made.txt and d", res.Files)
			}
		}},
		{"timeout", func(m *manifest.Manifest) {
			m.Resources.Timeout = manifest.Duration(2 * time.Second)
		}, "", []string{"sleep", "60"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Timeout, 124, 9)
			if res.DurationMS > 6000 {
				t.Errorf("duration %.0f ms after a 2 s timeout", res.DurationMS)
			}
		}},
		{"timeout of a process ignoring signals", func(m *manifest.Manifest) {
			m.Resources.Timeout = manifest.Duration(2 * time.Second)
		}, "", []string{"python3", "-c", "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP): signal.signal(s, signal.SIG_IGN)\nwhile True: time.sleep(1)"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Timeout, 124, 9)
		}},
		{"oom", func(m *manifest.Manifest) {
			m.Resources.Memory = 96 * manifest.MiB
		}, "", []string{"python3", "-c", "b = []\nwhile True: b.append(bytearray(8 << 20))"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.OOM, 137, 9)
			if !cgroup.PeakWithin(res.PeakMemoryBytes, 96<<20) {
				t.Errorf("peak memory %d above the 96 MiB limit and the kernel's forced charges", res.PeakMemoryBytes)
			}
		}},
		{"cpu time", func(m *manifest.Manifest) {
			m.Resources.CPUTime = manifest.Duration(time.Second)
		}, "", []string{"python3", "-c", "while True: pass"}, func(t *testing.T, res *result.Result) {
			if res.Termination != result.CPUTime {
				t.Errorf("termination=%s signal=%s, want cpu-time", res.Termination, res.SignalName)
			}
		}},
		{"open files limit", func(m *manifest.Manifest) {
			m.Resources.OpenFiles = 32
		}, "", []string{"python3", "-c", "import resource, os\nprint(resource.getrlimit(resource.RLIMIT_NOFILE))\nfs = []\ntry:\n  while True: fs.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e: print('stopped', e.errno, len(fs))"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Exited, 0, 0)
			if !strings.Contains(res.Stdout.Data, "(32, 32)") || !strings.Contains(res.Stdout.Data, fmt.Sprintf("stopped %d", unix.EMFILE)) {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
		}},
		{"file size limit", func(m *manifest.Manifest) {
			m.Resources.FileSize = 1 * manifest.MiB
		}, "", []string{"sh", "-c", "dd if=/dev/zero of=big bs=64k count=64 2>&1; ls -l big"}, func(t *testing.T, res *result.Result) {
			for _, f := range res.Files {
				if f.Path == "big" && f.Size > 1<<20 {
					t.Errorf("big grew to %d bytes past the 1 MiB file size limit", f.Size)
				}
			}
		}},
		{"tmp is bounded", func(m *manifest.Manifest) {
			m.Resources.Memory = 64 * manifest.MiB // /tmp: 16 MiB
		}, "", []string{"sh", "-c", "dd if=/dev/zero of=/tmp/big bs=1M count=40 2>&1; ls -l /tmp/big"}, func(t *testing.T, res *result.Result) {
			if !strings.Contains(res.Stdout.Data, "No space left on device") {
				t.Errorf("filling /tmp did not hit ENOSPC: %q", res.Stdout.Data)
			}
		}},
		{"too many workspace files", func(m *manifest.Manifest) {
			m.Workspace.Files = 100
		}, "", []string{"sh", "-c", "for i in $(seq 200); do touch f$i || exit 1; done"}, func(t *testing.T, res *result.Result) {
			if res.Termination != result.DiskLimit {
				t.Errorf("termination=%s, want disk-limit", res.Termination)
			}
		}},
		{"a thread bomb meets RLIMIT_NPROC", func(m *manifest.Manifest) {
			m.Resources.Pids = 40
		}, "", []string{"python3", "-c", "import threading, time\nts = []\ntry:\n  for i in range(500):\n    t = threading.Thread(target=time.sleep, args=(3,)); t.start(); ts.append(t)\nexcept RuntimeError as e: print('stopped at', len(ts))\n"}, func(t *testing.T, res *result.Result) {
			// Waiting threads cost the host nothing: the Sentry's
			// RLIMIT_NPROC (pids + gVisor's allowance) stops them. The
			// guest's init (a few Go threads) runs as the same user and
			// counts too. Now and then (2 of 8 runs here) the Sentry
			// kills the program with SIGKILL at the limit instead of
			// failing its clone (nothing in its logs says why): either
			// way the bomb ends there.
			if res.Termination == result.Signaled && res.Signal == 9 {
				return
			}
			want(t, res, result.Exited, 0, 0)
			var n int
			if _, err := fmt.Sscanf(res.Stdout.Data, "stopped at %d", &n); err != nil || n < 80 || n > 40+64 {
				t.Errorf("thread creation did not stop near 40+64 tasks: %q", res.Stdout.Data)
			}
		}},
		{"a process bomb meets the host pids limit", func(m *manifest.Manifest) {
			m.Resources.Pids = 40
		}, "", []string{"sh", "-c", "for i in $(seq 200); do sleep 5 & done; wait"}, func(t *testing.T, res *result.Result) {
			want(t, res, result.Pids, 137, 9)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := runGV(t, e, tc.adjust, tc.stdin, tc.argv...)
			tc.check(t, res)
		})
	}
}

func want(t *testing.T, res *result.Result, term result.Termination, code, sig int) {
	t.Helper()
	if res.Termination != term || res.ExitCode != code || res.Signal != sig {
		t.Errorf("termination=%s exit=%d signal=%d, want %s/%d/%d", res.Termination, res.ExitCode, res.Signal, term, code, sig)
	}
}

func TestCancel(t *testing.T) {
	e := newEngine(t, need(t))
	m := manifest.Default()
	m.Tier = gvisor.Name
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(1500*time.Millisecond, cancel)
	// Short sleeps: Python runs a handler between bytecodes, and one
	// long sleep entered just after the signal would not (see the
	// native tier's TestCancelForwardsSIGTERM).
	res, err := e.Run(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: (print('got TERM', flush=True), sys.exit(3)))\nwhile True: time.sleep(0.05)"}})
	if err != nil {
		t.Fatal(err)
	}
	if left := leftovers(e.Home())(res.ID); len(left) > 0 {
		t.Errorf("run %s left residual state: %s", res.ID, strings.Join(left, "; "))
	}
	if res.Termination != result.Exited || res.ExitCode != 3 || !strings.Contains(res.Stdout.Data, "got TERM") {
		t.Errorf("termination=%s exit=%d stdout=%q: want the program's own exit after SIGTERM", res.Termination, res.ExitCode, res.Stdout.Data)
	}
	found := false
	for _, v := range res.Violations {
		found = found || v.Kind == "cancelled"
	}
	if !found {
		t.Errorf("no cancelled violation: %v", res.Violations)
	}
}

// spec builds a tier.Spec for direct use of the tier, with its own state
// directory.
func spec(t *testing.T, e *engine.Engine, id string) *tier.Spec {
	t.Helper()
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Skipf("the python image is not built: %v", err)
	}
	// Not below the engine's runs/: its GC (of any test package running
	// meanwhile) would collect a directory without a lock.
	dir, err := os.MkdirTemp("", "moat-gvt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &tier.Spec{
		ID: id, ImageRoot: img.Root, ImageEnv: img.Env, StateDir: dir,
		Limits: tier.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 64, Timeout: 10 * time.Second, CPUTime: 10 * time.Second,
			OpenFiles: 64, FileSizeBytes: 1 << 20, WorkspaceBytes: 8 << 20, WorkspaceFiles: 100, TmpBytes: 8 << 20},
	}
}

func testID(i int) string { return fmt.Sprintf("gvt-%x-%d", time.Now().UnixNano(), i) }

func TestDestroyWithoutExecLeavesNothing(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	id := testID(0)
	sp := spec(t, e, id)
	sb, err := g.Prepare(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	ws := sb.Workspace()
	if err := os.WriteFile(filepath.Join(ws.Dir, "input"), []byte("x"), 0o644); err != nil {
		t.Fatalf("workspace not writable by the host: %v", err)
	}
	if ws.UID != gvisor.SandboxUID || ws.GID != gvisor.SandboxGID {
		t.Errorf("workspace owner %d:%d", ws.UID, ws.GID)
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if _, err := sb.Exec(context.Background(), &tier.Command{Argv: []string{"true"}}); err == nil {
		t.Errorf("Exec after Destroy succeeded")
	}
	ents, _ := os.ReadDir(sp.StateDir)
	if len(ents) != 0 {
		t.Errorf("state directory still holds %v", ents)
	}
	os.Remove(sp.StateDir)
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("residual state: %s", strings.Join(left, "; "))
	}
}

func TestSingleUse(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	id := testID(0)
	sb, err := g.Prepare(context.Background(), spec(t, e, id))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	var out bytes.Buffer
	o, err := sb.Exec(context.Background(), &tier.Command{Argv: []string{"echo", "once"}, Env: []string{"PATH=/usr/bin:/bin"}, Dir: "/workspace", Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if o.Termination != result.Exited || out.String() != "once\n" {
		t.Errorf("termination=%s stdout=%q", o.Termination, out.String())
	}
	if o.Runtime != g.Version() {
		t.Errorf("outcome runtime %q, want %q", o.Runtime, g.Version())
	}
	if _, err := sb.Exec(context.Background(), &tier.Command{Argv: []string{"true"}}); err == nil {
		t.Errorf("second Exec succeeded")
	}
}

func TestRefusals(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	tests := []struct {
		name   string
		adjust func(*tier.Spec)
		want   string
	}{
		{"unlimited memory", func(s *tier.Spec) { s.Limits.MemoryBytes = 0 }, "resources.memory"},
		{"no open files limit", func(s *tier.Spec) { s.Limits.OpenFiles = 0 }, "resources.open_files"},
		{"unknown degradation", func(s *tier.Spec) { s.AllowMissing = []string{"seccomp"} }, "security.allow_missing"},
		{"bad id", func(s *tier.Spec) { s.ID = "../x" }, "sandbox id"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := testID(i)
			sp := spec(t, e, id)
			tc.adjust(sp)
			sb, err := g.Prepare(context.Background(), sp)
			if err == nil {
				sb.Destroy()
				t.Fatalf("Prepare accepted it")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
			if left := leftovers(e.Home())(id); len(left) > 0 {
				t.Errorf("residual state: %s", strings.Join(left, "; "))
			}
		})
	}
}

// childEnv makes the test binary a moat that starts one gvisor run, prints
// its id and waits to be killed (TestKilledMoatIsCollected).
const childEnv = "MOAT_GVISOR_TEST_KILLED_CHILD"

func killedChild() int {
	g, err := gvisor.New(gvisor.Options{Guest: os.Getenv(childEnv)})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{gvisor.Name: g}})
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	m := manifest.Default()
	m.Tier = gvisor.Name
	_, err = e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"sh", "-c", "echo started > /workspace/started; sleep 60"},
		OnStart: func(id string, _ func() ([]int, error)) { fmt.Println("id:", id) }})
	fmt.Println("error: the run ended:", err)
	return 1
}

// TestKilledMoatIsCollected kills a moat (this test binary, re-executed)
// while its gvisor run is alive: runsc, the Sentry and the gofer must die
// with it, and the engine's GC plus the tier's own sweep must then leave
// nothing (cgroups in every hierarchy, the workspace mount, the run
// directory).
func TestKilledMoatIsCollected(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+moatBin)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var id string
	buf := make([]byte, 4096)
	n, _ := stdout.Read(buf)
	line := strings.TrimSpace(string(buf[:n]))
	if !strings.HasPrefix(line, "id: ") {
		t.Fatalf("child: %q", line)
	}
	id = strings.TrimPrefix(line, "id: ")
	// Wait until the program runs: its file appears in the workspace.
	started := filepath.Join(e.Home(), "runs", id, "workspace", "started")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(started); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's program did not start")
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	// runsc dies of its parent-death signal, the Sentry and the gofer of
	// theirs: no process of the run may survive moat.
	var procs []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		procs = nil
		for _, l := range leftovers(e.Home())(id) {
			if strings.HasPrefix(l, "process ") {
				procs = append(procs, l)
			}
		}
		if len(procs) == 0 {
			break
		}
	}
	if len(procs) > 0 {
		t.Fatalf("processes of the run survived moat: %v", procs)
	}
	t.Logf("left by the killed moat, for GC: %s", strings.Join(leftovers(e.Home())(id), "; "))
	if _, err := e.GC(); err != nil {
		t.Errorf("gc: %v", err)
	}
	// The next use of the tier sweeps the cgroups only runsc creates.
	if _, err := gvisor.New(gvisor.Options{Guest: moatBin}); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("residual state after GC: %s", strings.Join(left, "; "))
	}
}

// TestConcurrentRuns runs sandboxes side by side: each keeps to its own
// cgroup, workspace and runsc state, and the shared cgroup parents are
// pruned only once the last one is gone.
func TestConcurrentRuns(t *testing.T) {
	e := newEngine(t, need(t))
	const workers, runs = 4, 3
	errs := make(chan error, workers*runs)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < runs; i++ {
				m := manifest.Default()
				m.Tier = gvisor.Name
				word := fmt.Sprintf("w%d-%d", w, i)
				res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"sh", "-c", "echo " + word + " > out; cat out; ls /workspace"}})
				switch {
				case err != nil:
					errs <- err
				case res.Termination != result.Exited || res.Stdout.Data != word+"\nout\n":
					errs <- fmt.Errorf("%s: termination=%s stdout=%q stderr=%q", word, res.Termination, res.Stdout.Data, res.Stderr.Data)
				default:
					if left := leftovers(e.Home())(res.ID); len(left) > 0 {
						errs <- fmt.Errorf("run %s left %v", res.ID, left)
					} else {
						errs <- nil
					}
				}
			}
		}()
	}
	for i := 0; i < workers*runs; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if left := residue(); len(left) > 0 {
		t.Errorf("after the last run: %v", left)
	}
}

// TestNoDeviceNodes: the program cannot create device nodes where it can
// write (the Sentry's own tmpfs would let it, despite nodev, and then open
// gVisor's tun and FUSE devices; /tmp and /workspace are host tmpfs
// through the gofer, which refuses).
func TestNoDeviceNodes(t *testing.T) {
	e := newEngine(t, need(t))
	res := runGV(t, e, nil, "", "python3", "-c", `
import os, stat
for d in ["/tmp", "/workspace", "/dev/shm"]:
    for name, dev in [("zero", (1, 5)), ("tun", (10, 200)), ("fuse", (10, 229))]:
        try:
            os.mknod(d + "/" + name, stat.S_IFCHR | 0o666, os.makedev(*dev)); print("CREATED", d, name)
        except OSError as e:
            print("denied", d, name, e.errno)
`)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination=%s exit=%d stderr=%q", res.Termination, res.ExitCode, res.Stderr.Data)
	}
	if strings.Contains(res.Stdout.Data, "CREATED") || strings.Count(res.Stdout.Data, "denied") != 9 {
		t.Errorf("device nodes: %q", res.Stdout.Data)
	}
}
