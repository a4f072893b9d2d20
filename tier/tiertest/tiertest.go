// Package tiertest is the conformance suite every isolation tier runs: one
// table of isolation and result cases, each checked from the host side
// (a canary the host planted, a host listener that must see nothing, the
// Result's fields), never by trusting what the program prints about itself.
//
// A tier's test calls Run with an engine configured for it. Each case also
// asserts that the run left nothing behind.
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// Case is one row of the conformance table.
type Case struct {
	Name string
	// Setup runs on the host before the run and returns values the
	// command and check use (canary paths, ports).
	Setup func(t *testing.T) map[string]string
	// Manifest adjusts the default manifest.
	Manifest func(m *manifest.Manifest, env map[string]string)
	// Argv is the command; "{key}" is replaced by Setup's values.
	Argv []string
	// Stdin is the program's standard input (empty: none).
	Stdin string
	// Check inspects the result (and host state).
	Check func(t *testing.T, res *result.Result, env map[string]string)
	// Needs names the tier capabilities the case checks (see needs): a
	// tier without one of them does not run the case and says so.
	Needs []string
}

// NotApplicable begins the skip reason of a case a tier's capabilities
// rule out (Case.Needs).
const NotApplicable = "not applicable on "

// needs maps the names used in Case.Needs to the capability they require.
var needs = map[string]func(tier.Capabilities) bool{
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

// Leftovers reports residual state of run id on the host, empty when clean.
type Leftovers func(id string) []string

// Run executes every case against e with the given tier name.
func Run(t *testing.T, e *engine.Engine, tierName string, leftovers Leftovers) {
	t.Helper()
	tr, err := e.Tier(tierName)
	if err != nil {
		t.Fatalf("tier %s: %v", tierName, err)
	}
	caps := tr.Capabilities()
	for _, tc := range Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			for _, n := range tc.Needs {
				has, ok := needs[n]
				if !ok {
					t.Fatalf("case needs unknown capability %q", n)
				}
				if !has(caps) {
					t.Skipf(NotApplicable+"%s: the case checks %s, which the tier does not provide (capability %q)", tierName, n, n)
				}
			}
			env := map[string]string{}
			if tc.Setup != nil {
				env = tc.Setup(t)
			}
			m := manifest.Default()
			m.Tier = tierName
			m.Resources.Timeout = manifest.Duration(20 * time.Second)
			m.Resources.CPUTime = m.Resources.Timeout
			if tc.Manifest != nil {
				tc.Manifest(m, env)
			}
			if err := m.Validate(); err != nil {
				t.Fatalf("test manifest invalid: %v", err)
			}
			argv := make([]string, len(tc.Argv))
			for i, a := range tc.Argv {
				for k, v := range env {
					a = strings.ReplaceAll(a, "{"+k+"}", v)
				}
				argv[i] = a
			}
			req := &engine.Request{Manifest: m, Argv: argv}
			if tc.Stdin != "" {
				req.Stdin = strings.NewReader(tc.Stdin)
			}
			res, err := e.Run(context.Background(), req)
			if err != nil {
				t.Fatalf("run %q: %v", argv, err)
			}
			if res.Tier != tierName {
				t.Errorf("result tier = %q, want %q", res.Tier, tierName)
			}
			tc.Check(t, res, env)
			if left := leftovers(res.ID); len(left) > 0 {
				t.Errorf("run %s left residual state: %s", res.ID, strings.Join(left, "; "))
			}
			if t.Failed() {
				t.Logf("result: termination=%s exit=%d signal=%d stdout=%q stderr=%q violations=%v",
					res.Termination, res.ExitCode, res.Signal, clip(res.Stdout.Data), clip(res.Stderr.Data), res.Violations)
			}
		})
	}
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

func wantExit(t *testing.T, res *result.Result, code int) {
	t.Helper()
	if res.Termination != result.Exited || res.ExitCode != code {
		t.Errorf("termination=%s exit=%d, want exited with %d", res.Termination, res.ExitCode, code)
	}
}

func wantNotContains(t *testing.T, res *result.Result, s string) {
	t.Helper()
	if strings.Contains(res.Stdout.Data, s) || strings.Contains(res.Stderr.Data, s) {
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
	return append([]Case{
		{
			Name:  "exit code and output",
			Needs: []string{"linux-programs"},
			Argv:  []string{"sh", "-c", "echo out; echo err >&2; exit 3"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 3)
				if res.Stdout.Data != "out\n" || res.Stderr.Data != "err\n" {
					t.Errorf("stdout=%q stderr=%q", res.Stdout.Data, res.Stderr.Data)
				}
			},
		},
		{
			Name: "command not found is 127",
			Argv: []string{"no-such-command-xyz"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 127)
				if !strings.Contains(res.Stderr.Data, "no-such-command-xyz") {
					t.Errorf("stderr %q does not name the command", res.Stderr.Data)
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
			Check: func(t *testing.T, res *result.Result, env map[string]string) {
				wantNotContains(t, res, env["secret"])
				// The image has its own passwd, not the host's.
				if !regexp.MustCompile(`(?m)^sandbox:[^:]*:1000:1000:`).MatchString(res.Stdout.Data) {
					t.Errorf("the image's own /etc/passwd is not what the sandbox sees: %q", res.Stdout.Data)
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
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Env = map[string]string{"GRANTED": "yes"}
			},
			Argv: []string{"env"},
			Check: func(t *testing.T, res *result.Result, env map[string]string) {
				wantExit(t, res, 0)
				wantNotContains(t, res, env["secret"])
				got := map[string]bool{}
				for _, kv := range strings.Split(strings.TrimSpace(res.Stdout.Data), "\n") {
					k, _, _ := strings.Cut(kv, "=")
					got[k] = true
				}
				for _, k := range []string{"GRANTED", "HOME", "PATH", "LANG"} {
					if !got[k] {
						t.Errorf("variable %s missing from %q", k, res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout.Data, "CONNECTED") || strings.Contains(res.Stdout.Data, "RESOLVED") {
					t.Errorf("the sandbox reached the network: %s", res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				for _, want := range []string{"1000\n1000\n", "CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "CapInh:\t0000000000000000", "prctl no_new_privs 1\n", "prctl ambient 0\n"} {
					if !strings.Contains(res.Stdout.Data, want) {
						t.Errorf("missing %q in %q", want, res.Stdout.Data)
					}
				}
				for key, want := range map[string]string{"CapAmb:\t": "CapAmb:\t0000000000000000", "NoNewPrivs:\t": "NoNewPrivs:\t1"} {
					if strings.Contains(res.Stdout.Data, key) && !strings.Contains(res.Stdout.Data, want) {
						t.Errorf("/proc/self/status says %q is not %q: %q", key, want, res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "started\n" {
					t.Errorf("stdout %q", res.Stdout.Data)
				}
				// The case's timeout is 20 s: a run that waited for the
				// background sleep ends there, as a timeout.
				if res.DurationMS > 15000 {
					t.Errorf("the run took %.0f ms: it waited for the background sleep", res.DurationMS)
				}
			},
		},
		{
			Name:  "the hostname is the sandbox's own",
			Needs: []string{"linux-programs"},
			Argv:  []string{"hostname"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "moat\n" {
					t.Errorf("hostname %q, want moat (never the host's)", res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "[0, 1, 4, 9]\n7\n" {
					t.Errorf("stdout %q stderr %q", res.Stdout.Data, clip(res.Stderr.Data))
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "to-stdout\nvia-fd\ninput" || res.Stderr.Data != "to-stderr\n" {
					t.Errorf("stdout %q stderr %q, want to-stdout, via-fd and the input on stdout, to-stderr on stderr", res.Stdout.Data, res.Stderr.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout.Data, "comm-written") || !strings.Contains(res.Stderr.Data, "Permission denied") {
					t.Errorf("writing /proc/self/comm was not refused by Landlock: stdout %q stderr %q", res.Stdout.Data, res.Stderr.Data)
				}
				if !strings.Contains(res.Stdout.Data, "allowed-written") {
					t.Errorf("a write Landlock allows (workspace, /tmp, /dev/null) failed: stdout %q stderr %q", res.Stdout.Data, res.Stderr.Data)
				}
			},
		},
		{
			Name:  "seccomp filter is installed",
			Needs: []string{"seccomp"},
			Argv:  []string{"grep", "^Seccomp:", "/proc/self/status"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if !strings.Contains(res.Stdout.Data, "Seccomp:\t2") {
					t.Errorf("missing %q in %q", "Seccomp:\t2", res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				out := res.Stdout.Data + res.Stderr.Data
				for _, f := range []string{"/usr/x", "/etc/x", "/var/tmp/x"} {
					if !strings.Contains(out, "cannot touch '"+f+"'") {
						t.Errorf("writing %s did not fail: %q", f, out)
					}
				}
				if !strings.Contains(out, "cannot touch '/var/tmp/x': Read-only file system") {
					t.Errorf("image writes did not fail read-only: %q", out)
				}
				if !strings.Contains(res.Stdout.Data, "sys 0\n") {
					t.Errorf("/sys is not empty: %q", res.Stdout.Data)
				}
				for _, l := range strings.Split(res.Stdout.Data, "\n") {
					if strings.HasPrefix(l, "masked ") && !strings.HasSuffix(l, " 0") {
						t.Errorf("not masked: %s", l)
					}
				}
				if !strings.Contains(res.Stdout.Data, "masked /proc/keys 0") && !strings.Contains(res.Stdout.Data, "absent /proc/keys") {
					t.Errorf("/proc/keys not checked: %q", res.Stdout.Data)
				}
				if strings.Contains(res.Stdout.Data, "SYSRQ") || strings.Contains(res.Stdout.Data, "SYSCTL") {
					t.Errorf("a /proc write succeeded: %q", res.Stdout.Data)
				}
				if !strings.Contains(res.Stdout.Data, "writable") {
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				lines := map[string]string{}
				for _, l := range strings.Split(strings.TrimSpace(res.Stdout.Data), "\n") {
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
					t.Errorf("getpid failed: the probe itself is broken: %q", res.Stdout.Data)
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
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if strings.Contains(res.Stdout.Data, "WROTE") {
					t.Errorf("a write through /proc/*/exe succeeded: %s", res.Stdout.Data)
				}
				// Readable only where pid 1 is the program itself (gVisor):
				// its binary is in the read-only image, not on the host.
				for _, l := range strings.Split(res.Stdout.Data, "\n") {
					if f := strings.Fields(l); len(f) > 0 && f[0] == "READLINK" && (len(f) != 3 || f[1] != f[2]) {
						t.Errorf("init's /proc/1/exe is readable: %s", l)
					}
				}
			},
		},
		{
			Name:  "fork bomb is contained by the pids limit",
			Needs: []string{"linux-programs"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.Pids = 64
				m.Resources.Timeout = manifest.Duration(3 * time.Second)
				m.Resources.CPUTime = m.Resources.Timeout
			},
			Argv: []string{"bash", "-c", "bomb() { bomb | bomb & }; bomb; sleep 30"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if !hasViolation(res, "pids") {
					t.Errorf("no pids violation recorded: %v", res.Violations)
				}
				// The host must still fork freely right after.
				if err := hostTrue(); err != nil {
					t.Errorf("host could not run /bin/true after the bomb: %v", err)
				}
			},
		},
		{
			Name: "memory bomb is OOM-killed and reported",
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.Memory = 64 * manifest.MiB
			},
			Argv: py("b = []\nwhile True: b.append(bytearray(16 << 20))"),
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if res.Termination != result.OOM || !res.OOMKilled {
					t.Errorf("termination=%s oom_killed=%v, want oom", res.Termination, res.OOMKilled)
				}
				if res.PeakMemoryBytes > 80<<20 {
					t.Errorf("peak memory %d exceeds the 64 MiB limit by far", res.PeakMemoryBytes)
				}
			},
		},
		{
			Name: "infinite loop is killed at the timeout",
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.Timeout = manifest.Duration(1 * time.Second)
				m.Resources.CPUTime = manifest.Duration(10 * time.Second)
			},
			Argv: py("while True: pass"),
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if res.Termination != result.Timeout || !res.TimedOut || res.ExitCode != 124 {
					t.Errorf("termination=%s timed_out=%v exit=%d, want timeout/124", res.Termination, res.TimedOut, res.ExitCode)
				}
				if res.DurationMS > 5000 {
					t.Errorf("duration %.0f ms: the kill came far too late", res.DurationMS)
				}
			},
		},
		{
			Name:  "CPU-time limit kills a spinner",
			Needs: []string{"cpu-time"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.CPUTime = manifest.Duration(1 * time.Second)
			},
			Argv: py("while True: pass"),
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if res.Termination != result.CPUTime {
					t.Errorf("termination=%s signal=%s, want cpu-time", res.Termination, res.SignalName)
				}
			},
		},
		{
			Name:  "stdout flood is capped and counted",
			Needs: []string{"linux-programs"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.StdoutBytes = 1 * manifest.MiB
			},
			Argv: []string{"head", "-c", "100000000", "/dev/zero"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if !res.Stdout.Truncated || res.Stdout.Bytes != 100000000 {
					t.Errorf("stdout truncated=%v bytes=%d, want truncated, 100000000", res.Stdout.Truncated, res.Stdout.Bytes)
				}
				if len(res.Stdout.Data) > 2<<20 { // base64 of 1 MiB is 1.33 MiB
					t.Errorf("captured %d bytes, cap is 1 MiB", len(res.Stdout.Data))
				}
				if !hasViolation(res, "output") {
					t.Errorf("no output violation: %v", res.Violations)
				}
			},
		},
		{
			Name:  "filling the disk stops at the workspace limit",
			Needs: []string{"linux-programs"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Workspace.Size = 8 * manifest.MiB
			},
			Argv: []string{"sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; ls -l /workspace/big"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if !strings.Contains(res.Stdout.Data, "No space left on device") {
					t.Errorf("dd did not hit ENOSPC: %q", res.Stdout.Data)
				}
				if !hasViolation(res, "disk") {
					t.Errorf("no disk violation: %v", res.Violations)
				}
				for _, f := range res.Files {
					if f.Path == "big" && f.Size > 8<<20 {
						t.Errorf("file grew to %d bytes past the 8 MiB workspace", f.Size)
					}
				}
			},
		},
		{
			Name:  "workspace diff and inputs",
			Needs: []string{"linux-programs"},
			Setup: func(t *testing.T) map[string]string {
				dir := t.TempDir()
				os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("keep"), 0o644)
				os.WriteFile(filepath.Join(dir, "change.txt"), []byte("old"), 0o644)
				os.WriteFile(filepath.Join(dir, "gone.txt"), []byte("bye"), 0o644)
				return map[string]string{"dir": dir}
			},
			Manifest: func(m *manifest.Manifest, env map[string]string) {
				m.Inputs = []manifest.Input{{Src: env["dir"], Dst: "task"}}
			},
			Argv: []string{"sh", "-c", "cat task/keep.txt; echo new > task/change.txt; rm task/gone.txt; echo hi > made.txt"},
			Check: func(t *testing.T, res *result.Result, env map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "keep" {
					t.Errorf("input not copied in: stdout %q", res.Stdout.Data)
				}
				want := map[string]result.Change{"task/change.txt": result.Modified, "task/gone.txt": result.Deleted, "made.txt": result.Added}
				got := map[string]result.Change{}
				for _, f := range res.Files {
					got[f.Path] = f.Change
				}
				for p, c := range want {
					if got[p] != c {
						t.Errorf("diff[%s] = %q, want %q (diff %v)", p, got[p], c, res.Files)
					}
				}
				if _, ok := got["task/keep.txt"]; ok {
					t.Errorf("unchanged file reported in the diff")
				}
				// Copied, never mounted: the host original is untouched.
				if b, _ := os.ReadFile(filepath.Join(env["dir"], "change.txt")); string(b) != "old" {
					t.Errorf("host input was modified: %q", b)
				}
				if _, err := os.Stat(filepath.Join(env["dir"], "gone.txt")); err != nil {
					t.Errorf("host input was deleted: %v", err)
				}
			},
		},
	}, egressCases()...)
}

func hasViolation(res *result.Result, kind string) bool {
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
