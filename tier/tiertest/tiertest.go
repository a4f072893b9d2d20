// Package tiertest is the conformance suite every isolation tier runs: one
// table of isolation and result cases, each checked from the host side
// (a canary the host planted, a host listener that must see nothing, the
// Outcome's fields), never by trusting what the program prints about
// itself.
//
// It tests tiers at the tier.Tier abstraction (Prepare, Exec, Destroy),
// as wazero's internal/testing/enginetest tests engines without the store
// above them: it must never import the engine, so that a failure here is
// the tier's. What only exists above the tier (manifests, output caps and
// their violations, inputs and the workspace diff, the egress proxy) is
// tested end to end in the engine's tests, on every tier.
//
// A tier's test calls Run with the tier and the image to run in. Each
// case also asserts that the run left nothing behind.
package tiertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// Case is one row of the conformance table.
type Case struct {
	Name string
	// Setup runs on the host before the run and returns values the
	// command and check use (canary paths, ports).
	Setup func(t *testing.T) map[string]string
	// Limits adjusts the default limits (DefaultLimits).
	Limits func(l *tier.Limits)
	// Env adds variables to the program's environment (Environment).
	Env map[string]string
	// Argv is the command; "{key}" is replaced by Setup's values.
	Argv []string
	// Stdin is the program's standard input (empty: none).
	Stdin string
	// Check inspects what the tier reported (and host state).
	Check func(t *testing.T, r *Result, env map[string]string)
	// Needs names the tier capabilities the case checks (see Needs): a
	// tier without one of them does not run the case and says so.
	Needs []string
}

// Result is what one case's run produced: the tier's Outcome and the
// output it wrote, as the host received it.
type Result struct {
	*tier.Outcome
	// ID is the run's id (tier.Spec.ID).
	ID             string
	Stdout, Stderr string
}

// NotApplicable begins the skip reason of a case a tier's capabilities
// rule out (Case.Needs).
const NotApplicable = "not applicable on "

// Needs maps the names used in Case.Needs to the capability they require.
// The engine's end-to-end conformance cases use the same names.
var Needs = map[string]func(tier.Capabilities) bool{
	"seccomp":        func(c tier.Capabilities) bool { return c.Seccomp },
	"landlock":       func(c tier.Capabilities) bool { return c.Landlock },
	"network-egress": func(c tier.Capabilities) bool { return c.NetworkEgress },
	"sessions":       func(c tier.Capabilities) bool { return c.Sessions },
	// The case runs Linux programs (a shell, coreutils) or reads /proc:
	// not applicable to a tier that runs only its WebAssembly guests.
	"linux-programs": func(c tier.Capabilities) bool { return !c.OnlyGuests },
	// The case expects the kernel's CPU-time accounting (RLIMIT_CPU); a
	// WebAssembly guest's CPU time is not measured (its limit is enforced
	// as wall time).
	"cpu-time": func(c tier.Capabilities) bool { return !c.OnlyGuests },
}

// SkipUnless skips t, naming the capability, when caps lacks one of needs.
func SkipUnless(t *testing.T, tierName string, caps tier.Capabilities, needs []string) {
	t.Helper()
	for _, n := range needs {
		has, ok := Needs[n]
		if !ok {
			t.Fatalf("case needs unknown capability %q", n)
		}
		if !has(caps) {
			t.Skipf(NotApplicable+"%s: the case checks %s, which the tier does not provide (capability %q)", tierName, n, n)
		}
	}
}

// Leftovers reports residual state of run id on the host, empty when clean.
type Leftovers func(id string) []string

// Target is the tier under test and what its sandboxes are made of.
type Target struct {
	Tier tier.Tier
	// ImageRoot, ImageEnv and ImageDigest are the image every case runs
	// in (Moat's python image; tier.Spec has the meaning of each).
	ImageRoot   string
	ImageEnv    []string
	ImageDigest string
	// Leftovers lists what a run left; nil checks nothing beyond the
	// StateDir.
	Leftovers Leftovers
}

// DefaultLimits are the limits every case starts from: those the engine
// derives from the default manifest, with a 20 s timeout.
func DefaultLimits() tier.Limits {
	return tier.Limits{
		CPUs:           1,
		MemoryBytes:    512 << 20,
		Pids:           128,
		Timeout:        20 * time.Second,
		CPUTime:        20 * time.Second,
		OpenFiles:      256,
		FileSizeBytes:  64 << 20,
		WorkspaceBytes: 256 << 20,
		WorkspaceFiles: 10000,
		TmpBytes:       64 << 20,
	}
}

// maxOutput is what a case keeps of each stream (the default manifest's
// cap); the writer accepts the rest and drops it, so that the program is
// never blocked by the host.
const maxOutput = 1 << 20

type capture struct {
	mu  sync.Mutex
	buf []byte
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := maxOutput - len(c.buf); room > 0 {
		c.buf = append(c.buf, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf)
}

// Run executes every case against the target tier.
func Run(t *testing.T, tg Target) {
	t.Helper()
	caps := tg.Tier.Capabilities()
	name := tg.Tier.Name()
	for _, tc := range Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			SkipUnless(t, name, caps, tc.Needs)
			env := map[string]string{}
			if tc.Setup != nil {
				env = tc.Setup(t)
			}
			lim := DefaultLimits()
			if tc.Limits != nil {
				tc.Limits(&lim)
			}
			argv := make([]string, len(tc.Argv))
			for i, a := range tc.Argv {
				for k, v := range env {
					a = strings.ReplaceAll(a, "{"+k+"}", v)
				}
				argv[i] = a
			}
			r := runOne(t, tg, lim, argv, tc.Env, tc.Stdin)
			tc.Check(t, r, env)
			if tg.Leftovers != nil {
				if left := tg.Leftovers(r.ID); len(left) > 0 {
					t.Errorf("run %s left residual state: %s", r.ID, strings.Join(left, "; "))
				}
			}
			if t.Failed() {
				t.Logf("outcome: termination=%s exit=%d signal=%d error=%q stdout=%q stderr=%q violations=%v",
					r.Termination, r.ExitCode, r.Signal, r.Error, clip(r.Stdout), clip(r.Stderr), r.Violations)
			}
		})
	}
}

// runOne prepares a sandbox, runs argv in it and destroys it, as the
// engine would, and returns what the tier reported.
func runOne(t *testing.T, tg Target, lim tier.Limits, argv []string, extra map[string]string, stdin string) *Result {
	t.Helper()
	// The run's private directory (mode 0700, removed after Destroy, as
	// the engine's runs/<id>), in a temporary directory: never below a
	// Moat home, whose GC would take a directory without the engine's run
	// lock for a dead run's. A short path: runsc's control socket lives
	// below it and Unix socket paths have at most 107 bytes (t.TempDir's
	// names carry the test's name).
	id := newID()
	root, err := os.MkdirTemp("", "moat-tt-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(root)
	state := filepath.Join(root, id)
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	spec := &tier.Spec{ID: id, ImageRoot: tg.ImageRoot, ImageEnv: tg.ImageEnv, ImageDigest: tg.ImageDigest, Limits: lim, StateDir: state}
	sb, err := tg.Tier.Prepare(context.Background(), spec)
	if err != nil {
		t.Fatalf("prepare %s: %v", id, err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			sb.Destroy()
		}
	}()
	stdout, stderr := &capture{}, &capture{}
	cmd := &tier.Command{Argv: argv, Env: tier.Environment(tg.ImageEnv, extra), Dir: "/workspace", Stdout: stdout, Stderr: stderr}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := sb.Exec(context.Background(), cmd)
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	destroyed = true
	if err := sb.Destroy(); err != nil {
		t.Errorf("destroy %s: %v", id, err)
	}
	if err := os.RemoveAll(state); err != nil {
		t.Errorf("remove the state directory of %s: %v", id, err)
	}
	return &Result{Outcome: out, ID: id, Stdout: stdout.String(), Stderr: stderr.String()}
}

// newID is a run id as the engine makes them (package runid's rule).
func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

func secret() string {
	var b [12]byte
	rand.Read(b[:])
	return "moat-canary-" + hex.EncodeToString(b[:])
}

// py runs a Python snippet.
func py(code string) []string { return []string{"python3", "-c", code} }

func wantExit(t *testing.T, res *Result, code int) {
	t.Helper()
	if res.Termination != result.Exited || res.ExitCode != code {
		t.Errorf("termination=%s exit=%d, want exited with %d", res.Termination, res.ExitCode, code)
	}
}

func wantNotContains(t *testing.T, res *Result, s string) {
	t.Helper()
	if strings.Contains(res.Stdout, s) || strings.Contains(res.Stderr, s) {
		t.Errorf("the program's output contains the host canary %q", s)
	}
}

// listener starts a host TCP listener on loopback that counts connections.
func listener(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = &atomic.Int64{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return l.Addr().String(), accepted
}

// syscallProbe is a Python snippet that calls a raw syscall through ctypes
// and prints "NAME errno" (0 when it succeeded).
const syscallProbe = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])
    print(name, 0 if r >= 0 else ctypes.get_errno(), flush=True)
buf = ctypes.create_string_buffer(256)
call("ptrace", 101, 0, 0, 0, 0)                 # PTRACE_TRACEME
call("mount", 165, 0, ctypes.addressof(buf), 0, 0, 0)
call("unshare_user", 272, 0x10000000)          # CLONE_NEWUSER
call("unshare_ns", 272, 0x00020000)            # CLONE_NEWNS
call("bpf", 321, 0, 0, 0)
call("io_uring_setup", 425, 1, ctypes.addressof(buf))
call("keyctl", 250, 0, 0, 0)
call("perf_event_open", 298, 0, 0, 0, 0, 0)
call("userfaultfd", 323, 0)
call("getpid", 39)
`

// prctlProbe prints the no_new_privs flag and whether any ambient
// capability is raised, as the kernel reports them. (No single quotes: it
// runs inside sh -c '...'.)
const prctlProbe = `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("prctl no_new_privs", libc.prctl(39, 0, 0, 0, 0))
print("prctl ambient", int(any(libc.prctl(47, 1, c, 0, 0) == 1 for c in range(64))))
`

// Cases is the conformance table.
func Cases() []Case {
	return []Case{
		{
			Name:  "exit code and output",
			Needs: []string{"linux-programs"},
			Argv:  []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 3)
				if res.Stdout != "out\n" || res.Stderr != "err\n" {
					t.Errorf("stdout=%q stderr=%q", res.Stdout, res.Stderr)
				}
			},
		},
		{
			Name: "command not found is 127",
			Argv: []string{"no-such-command-xyz"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 127)
				if !strings.Contains(res.Stderr, "no-such-command-xyz") {
					t.Errorf("stderr %q does not name the command", res.Stderr)
				}
			},
		},
		{
			Name:  "host file canary is unreachable",
			Needs: []string{"linux-programs"},
			Setup: func(t *testing.T) map[string]string {
				dir := t.TempDir()
				os.Chmod(dir, 0o755)
				s := secret()
				p := filepath.Join(dir, "canary")
				if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
				return map[string]string{"path": p, "secret": s}
			},
			Argv: []string{"sh", "-c", "cat {path}; cat /proc/1/root{path}; ls -la /proc/1/root/ 2>&1 | head -3; cat /etc/passwd; exit 0"},
			Check: func(t *testing.T, res *Result, env map[string]string) {
				wantNotContains(t, res, env["secret"])
				// The image has its own passwd, not the host's.
				if !regexp.MustCompile(`(?m)^sandbox:[^:]*:1000:1000:`).MatchString(res.Stdout) {
					t.Errorf("the image's own /etc/passwd is not what the sandbox sees: %q", res.Stdout)
				}
			},
		},
		{
			Name:  "host environment is absent",
			Needs: []string{"linux-programs"},
			Setup: func(t *testing.T) map[string]string {
				s := secret()
				t.Setenv("MOAT_TEST_HOST_SECRET", s)
				return map[string]string{"secret": s}
			},
			Env:  map[string]string{"GRANTED": "yes"},
			Argv: []string{"env"},
			Check: func(t *testing.T, res *Result, env map[string]string) {
				wantExit(t, res, 0)
				wantNotContains(t, res, env["secret"])
				got := map[string]bool{}
				for _, kv := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
					k, _, _ := strings.Cut(kv, "=")
					got[k] = true
				}
				for _, k := range []string{"GRANTED", "HOME", "PATH", "LANG"} {
					if !got[k] {
						t.Errorf("variable %s missing from %q", k, res.Stdout)
					}
				}
				// The manifest's grant, Moat's fixed variables, the image's
				// defaults (PYTHONDONTWRITEBYTECODE) and what the shell adds.
				allowed := map[string]bool{"GRANTED": true, "HOME": true, "PATH": true, "LANG": true, "USER": true,
					"PYTHONDONTWRITEBYTECODE": true, "PWD": true, "SHLVL": true, "_": true}
				for k := range got {
					if !allowed[k] {
						t.Errorf("unexpected variable %s in the sandbox", k)
					}
				}
			},
		},
		{
			Name: "host loopback and metadata service are unreachable",
			Setup: func(t *testing.T) map[string]string {
				addr, n := listener(t)
				host, port, _ := net.SplitHostPort(addr)
				t.Cleanup(func() {
					if n.Load() != 0 {
						t.Errorf("the host listener on %s accepted %d connection(s) from the sandbox", addr, n.Load())
					}
				})
				return map[string]string{"host": host, "port": port}
			},
			Argv: py(`
import socket
for host, port in [("{host}", {port}), ("169.254.169.254", 80), ("10.0.2.2", 80), ("8.8.8.8", 53)]:
    try:
        # Inside the try: where there are no sockets at all (the wasm
        # tier), creating one fails, which is just as unreachable.
        s = socket.socket(); s.settimeout(2)
        s.connect((host, port)); print("CONNECTED", host, port)
    except OSError as e:
        print("refused", host, port, e.errno)
try:
    socket.getaddrinfo("example.com", 80); print("RESOLVED")
except (OSError, AttributeError) as e:  # CPython for WASI has no getaddrinfo
    print("no dns", e)
`),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout, "CONNECTED") || strings.Contains(res.Stdout, "RESOLVED") {
					t.Errorf("the sandbox reached the network: %s", res.Stdout)
				}
			},
		},
		{
			Name:  "privileges are gone",
			Needs: []string{"linux-programs"},
			// gVisor's /proc/self/status has no CapAmb and NoNewPrivs
			// lines: prctl asks the kernel (the Sentry) on every tier, and
			// a line that exists must agree.
			Argv: []string{"sh", "-c", "id -u; id -g; grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|CapInh|NoNewPrivs):' /proc/self/status; python3 -c '" + prctlProbe + "'"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				for _, want := range []string{"1000\n1000\n", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "CapInh:\t0000000000000000", "prctl no_new_privs 1\n", "prctl ambient 0\n"} {
					if !strings.Contains(res.Stdout, want) {
						t.Errorf("missing %q in %q", want, res.Stdout)
					}
				}
				for key, want := range map[string]string{"CapAmb:\t": "CapAmb:\t0000000000000000", "NoNewPrivs:\t": "NoNewPrivs:\t1"} {
					if strings.Contains(res.Stdout, key) && !strings.Contains(res.Stdout, want) {
						t.Errorf("/proc/self/status says %q is not %q: %q", key, want, res.Stdout)
					}
				}
			},
		},
		{
			// The run is the command: when it exits, what it left running
			// in the background is killed, not waited for (it holds the
			// output pipes open, which must not keep the run alive).
			Name:  "the run ends with the command, not with its background processes",
			Needs: []string{"linux-programs"},
			Argv:  []string{"sh", "-c", "sleep 60 & echo started"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout != "started\n" {
					t.Errorf("stdout %q", res.Stdout)
				}
				// The case's timeout is 20 s: a run that waited for the
				// background sleep ends there, as a timeout.
				if res.Duration > 15*time.Second {
					t.Errorf("the run took %v: it waited for the background sleep", res.Duration)
				}
			},
		},
		{
			Name:  "the hostname is the sandbox's own",
			Needs: []string{"linux-programs"},
			Argv:  []string{"hostname"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout != "moat\n" {
					t.Errorf("hostname %q, want moat (never the host's)", res.Stdout)
				}
			},
		},
		{
			// multiprocessing's locks are POSIX semaphores and its
			// shared_memory POSIX shm: both live in /dev/shm, which must
			// exist and be writable by the program.
			Name:  "POSIX semaphores and shared memory work (Python multiprocessing)",
			Needs: []string{"linux-programs"},
			Argv: py(`import multiprocessing as mp
from multiprocessing import shared_memory
def square(x): return x * x
if __name__ == "__main__":
    with mp.Pool(2) as pool: print(pool.map(square, range(4)))
    s = shared_memory.SharedMemory(create=True, size=64)
    s.buf[0] = 7
    print(s.buf[0])
    s.close(); s.unlink()`),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout != "[0, 1, 4, 9]\n7\n" {
					t.Errorf("stdout %q stderr %q", res.Stdout, clip(res.Stderr))
				}
			},
		},
		{
			// Shell scripts write diagnostics to /dev/stderr; reopening a
			// pipe by path is checked against the pipe's owner, so the
			// streams must be the program's user's, not the host's root's.
			Name:  "the program reopens its standard streams by path",
			Needs: []string{"linux-programs"},
			Argv:  []string{"sh", "-c", "echo to-stdout > /dev/stdout && echo to-stderr > /dev/stderr && echo via-fd > /proc/self/fd/1 && head -c 5 /dev/stdin"},
			Stdin: "input",
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout != "to-stdout\nvia-fd\ninput" || res.Stderr != "to-stderr\n" {
					t.Errorf("stdout %q stderr %q, want to-stdout, via-fd and the input on stdout, to-stderr on stderr", res.Stdout, res.Stderr)
				}
			},
		},
		{
			// /proc/self/comm is the program's own file, writable by its
			// owner whatever the mounts: only Landlock's read-only rule on
			// / refuses the write, so the case fails without Landlock.
			Name:  "Landlock refuses writes outside the workspace, /tmp and the devices",
			Needs: []string{"linux-programs", "landlock"},
			Argv:  []string{"sh", "-c", "echo probe > /proc/self/comm && echo comm-written; echo ok > /workspace/ll && echo ok > /tmp/ll && echo x > /dev/null && echo allowed-written"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout, "comm-written") || !strings.Contains(res.Stderr, "Permission denied") {
					t.Errorf("writing /proc/self/comm was not refused by Landlock: stdout %q stderr %q", res.Stdout, res.Stderr)
				}
				if !strings.Contains(res.Stdout, "allowed-written") {
					t.Errorf("a write Landlock allows (workspace, /tmp, /dev/null) failed: stdout %q stderr %q", res.Stdout, res.Stderr)
				}
			},
		},
		{
			Name:  "seccomp filter is installed",
			Needs: []string{"seccomp"},
			Argv:  []string{"grep", "^Seccomp:", "/proc/self/status"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if !strings.Contains(res.Stdout, "Seccomp:\t2") {
					t.Errorf("missing %q in %q", "Seccomp:\t2", res.Stdout)
				}
			},
		},
		{
			Name:  "root is read-only, /sys absent, /proc masked",
			Needs: []string{"linux-programs"},
			// /var/tmp is world-writable in the image: only the read-only
			// mount stops that write (gVisor checks permissions first, so
			// /usr and /etc fail there with EACCES).
			Argv: []string{"sh", "-c", "touch /usr/x 2>&1; touch /etc/x 2>&1; touch /var/tmp/x 2>&1; echo sys $(ls -A /sys | wc -l); " +
				"for f in /proc/kcore /proc/keys /proc/timer_list /proc/kallsyms /proc/sched_debug; do if [ -e $f ]; then echo masked $f $(head -c 100 $f | wc -c); else echo absent $f; fi; done; " +
				"echo c > /proc/sysrq-trigger 2>/dev/null && echo SYSRQ; echo 1 > /proc/sys/kernel/core_pattern 2>/dev/null && echo SYSCTL; " +
				"touch /workspace/ok /tmp/ok && echo writable"},
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				out := res.Stdout + res.Stderr
				for _, f := range []string{"/usr/x", "/etc/x", "/var/tmp/x"} {
					if !strings.Contains(out, "cannot touch '"+f+"'") {
						t.Errorf("writing %s did not fail: %q", f, out)
					}
				}
				if !strings.Contains(out, "cannot touch '/var/tmp/x': Read-only file system") {
					t.Errorf("image writes did not fail read-only: %q", out)
				}
				if !strings.Contains(res.Stdout, "sys 0\n") {
					t.Errorf("/sys is not empty: %q", res.Stdout)
				}
				for _, l := range strings.Split(res.Stdout, "\n") {
					if strings.HasPrefix(l, "masked ") && !strings.HasSuffix(l, " 0") {
						t.Errorf("not masked: %s", l)
					}
				}
				if !strings.Contains(res.Stdout, "masked /proc/keys 0") && !strings.Contains(res.Stdout, "absent /proc/keys") {
					t.Errorf("/proc/keys not checked: %q", res.Stdout)
				}
				if strings.Contains(res.Stdout, "SYSRQ") || strings.Contains(res.Stdout, "SYSCTL") {
					t.Errorf("a /proc write succeeded: %q", res.Stdout)
				}
				if !strings.Contains(res.Stdout, "writable") {
					t.Errorf("/workspace or /tmp not writable: %q", out)
				}
			},
		},
		{
			Name: "dangerous syscalls are denied",
			// The denials are the seccomp filter's: on gVisor these calls
			// reach the Sentry's own implementation (ptrace, unshare work
			// there), never the host kernel.
			Needs: []string{"seccomp"},
			Argv:  py(syscallProbe),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				lines := map[string]string{}
				for _, l := range strings.Split(strings.TrimSpace(res.Stdout), "\n") {
					if k, v, ok := strings.Cut(l, " "); ok {
						lines[k] = v
					}
				}
				for _, name := range []string{"ptrace", "mount", "unshare_user", "unshare_ns", "bpf", "io_uring_setup", "keyctl", "perf_event_open", "userfaultfd"} {
					if v, ok := lines[name]; !ok || v == "0" {
						t.Errorf("%s was not denied (errno %q)", name, v)
					}
				}
				if lines["getpid"] != "0" {
					t.Errorf("getpid failed: the probe itself is broken: %q", res.Stdout)
				}
			},
		},
		{
			Name: "host binary is not writable through /proc/1/exe or /proc/self/exe",
			Argv: py(`
import os
for p in ["/proc/1/exe", "/proc/self/exe"]:
    for mode in ["r+b", "wb", "ab"]:
        try:
            open(p, mode).write(b"x"); print("WROTE", p, mode)
        except OSError as e:
            print("denied", p, mode, e.errno)
try:
    print("READLINK", os.readlink("/proc/1/exe"), os.readlink("/proc/self/exe"))
except OSError as e:
    print("denied readlink", e.errno)
`),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout, "WROTE") {
					t.Errorf("a write through /proc/*/exe succeeded: %s", res.Stdout)
				}
				// Readable only where pid 1 is the program itself (gVisor):
				// its binary is in the read-only image, not on the host.
				for _, l := range strings.Split(res.Stdout, "\n") {
					if f := strings.Fields(l); len(f) > 0 && f[0] == "READLINK" && (len(f) != 3 || f[1] != f[2]) {
						t.Errorf("init's /proc/1/exe is readable: %s", l)
					}
				}
			},
		},
		{
			// Forks until the kernel refuses, then ends: a bash bomb that
			// runs until the timeout (the red team's res-fork-bomb) made
			// this case a race between the bomb and a short timeout on
			// a loaded host's TCG guest, and burnt the CPU all along.
			Name:  "forking past the pids limit fails and is reported",
			Needs: []string{"linux-programs"},
			Limits: func(l *tier.Limits) {
				l.Pids = 64
				l.Timeout = time.Minute
				l.CPUTime = l.Timeout
			},
			Argv: py(`import os, signal
kids = []
try:
    while len(kids) < 1000:
        pid = os.fork()
        if pid == 0:
            signal.pause()
            os._exit(0)
        kids.append(pid)
    print("unlimited", len(kids))
except OSError as e:
    print("refused", len(kids), e.errno)
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
`),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				// Either the program saw fork fail and ended, or (gVisor,
				// whose every guest process costs host tasks too) the
				// sandbox was killed at the limit: contained either way.
				if res.Termination == result.Pids {
					t.Logf("the sandbox was killed at the limit: %s", res.Stderr)
				} else {
					wantExit(t, res, 0)
					var n, errno int
					if _, err := fmt.Sscanf(res.Stdout, "refused %d %d", &n, &errno); err != nil || n >= 64 || errno != int(syscall.EAGAIN) {
						t.Errorf("want fork refused with EAGAIN before 64 processes, got %q", res.Stdout)
					}
				}
				if !hasViolation(res, "pids") {
					t.Errorf("no pids violation recorded: %v", res.Violations)
				}
				// The host must still fork freely right after.
				if err := hostTrue(); err != nil {
					t.Errorf("host could not run /bin/true after the forks: %v", err)
				}
			},
		},
		{
			Name: "memory bomb is OOM-killed and reported",
			Limits: func(l *tier.Limits) {
				l.MemoryBytes = 64 << 20
				l.TmpBytes = 16 << 20 // the engine's quarter of the memory limit
			},
			Argv: py("b = []\nwhile True: b.append(bytearray(16 << 20))"),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				// (The engine's oom_killed is this termination.)
				if res.Termination != result.OOM {
					t.Errorf("termination=%s, want oom", res.Termination)
				}
				if res.PeakMemory > 80<<20 {
					t.Errorf("peak memory %d exceeds the 64 MiB limit by far", res.PeakMemory)
				}
			},
		},
		{
			Name: "infinite loop is killed at the timeout",
			Limits: func(l *tier.Limits) {
				l.Timeout = 1 * time.Second
				l.CPUTime = 10 * time.Second
			},
			Argv: py("while True: pass"),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				// (The engine's timed_out is this termination.)
				if res.Termination != result.Timeout || res.ExitCode != 124 {
					t.Errorf("termination=%s exit=%d, want timeout/124", res.Termination, res.ExitCode)
				}
				if res.Duration > 5*time.Second {
					t.Errorf("duration %v: the kill came far too late", res.Duration)
				}
			},
		},
		{
			Name:  "CPU-time limit kills a spinner",
			Needs: []string{"cpu-time"},
			Limits: func(l *tier.Limits) {
				l.CPUTime = 1 * time.Second
			},
			Argv: py("while True: pass"),
			Check: func(t *testing.T, res *Result, _ map[string]string) {
				if res.Termination != result.CPUTime {
					t.Errorf("termination=%s signal=%s, want cpu-time", res.Termination, unix.SignalName(unix.Signal(res.Signal)))
				}
			},
		},
	}
}

func hasViolation(res *Result, kind string) bool {
	for _, v := range res.Violations {
		if v.Kind == kind {
			return true
		}
	}
	return false
}

func hostTrue() error {
	p, err := os.StartProcess("/bin/true", []string{"true"}, &os.ProcAttr{})
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { _, err := p.Wait(); done <- err }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		p.Kill()
		return fmt.Errorf("/bin/true did not finish in 10s")
	}
}
