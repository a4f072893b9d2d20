package wasm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

var (
	shared     *WASM
	sharedErr  error
	sharedOnce sync.Once
)

// testTier returns the tier, or skips when the guests are not built here.
func testTier(t testing.TB) *WASM {
	t.Helper()
	sharedOnce.Do(func() { shared, sharedErr = New(Options{}) })
	if errors.Is(sharedErr, tier.ErrUnavailable) && os.Getenv("MOAT_REQUIRE_WASM") == "" {
		t.Skipf("wasm tier unavailable: %v", sharedErr)
	}
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return shared
}

type run struct {
	out    *tier.Outcome
	stdout string
	stderr string
	ws     string
}

func defaultLimits() tier.Limits {
	return tier.Limits{MemoryBytes: 256 << 20, Timeout: 20 * time.Second, FileSizeBytes: 64 << 20, WorkspaceBytes: 64 << 20, WorkspaceFiles: 1000, OpenFiles: 256}
}

// exec prepares a sandbox, lets setup fill the workspace, runs argv and
// destroys the sandbox, checking that nothing is left.
func exec(t *testing.T, lim tier.Limits, setup func(ws string), argv ...string) run {
	t.Helper()
	w := testTier(t)
	state := filepath.Join(t.TempDir(), "run")
	sb, err := w.Prepare(context.Background(), &tier.Spec{ID: "t", Limits: lim, StateDir: state, ImageEnv: []string{"PATH=/usr/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	ws := sb.Workspace().Dir
	if setup != nil {
		setup(ws)
	}
	var so, se bytes.Buffer
	out, err := sb.Exec(context.Background(), &tier.Command{Argv: argv, Env: []string{"PATH=/usr/bin", "GREETING=hello"}, Dir: "/workspace", Stdout: &so, Stderr: &se})
	if err != nil {
		t.Fatalf("exec %q: %v", argv, err)
	}
	r := run{out: out, stdout: so.String(), stderr: se.String(), ws: ws}
	t.Cleanup(func() {
		if err := sb.Destroy(); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(ws); !os.IsNotExist(err) {
			t.Errorf("workspace %s left after Destroy (%v)", ws, err)
		}
	})
	return r
}

func wantExit(t *testing.T, r run, code int) {
	t.Helper()
	if r.out.Termination != result.Exited || r.out.ExitCode != code {
		t.Errorf("termination=%s exit=%d, want exited %d; stdout=%q stderr=%q", r.out.Termination, r.out.ExitCode, code, clip(r.stdout), clip(r.stderr))
	}
}

func clip(s string) string {
	if len(s) > 1500 {
		return s[:1500] + "..."
	}
	return s
}

func TestJS(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		exit int
		out  string
	}{
		{"console.log", []string{"node", "-e", "console.log(1 + 2, 'x')"}, 0, "3 x\n"},
		{"eval long form", []string{"node", "--eval", "print([1,2].map(x => x * 2).join())"}, 0, "2,4\n"},
		{"scriptArgs", []string{"qjs", "-e", "console.log(scriptArgs.join('|'))", "a", "b c"}, 0, "a|b c\n"},
		{"uncaught error exits 1", []string{"node", "-e", "throw new Error('boom')"}, 1, ""},
		{"environment is not visible to JS", []string{"node", "-e", "console.log(typeof process, typeof require)"}, 0, "undefined undefined\n"},
		{"promise jobs run", []string{"node", "-e", "Promise.resolve(5).then(v => console.log(v))"}, 0, "5\n"},
		{"option refused", []string{"node", "--inspect", "x.js"}, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := exec(t, defaultLimits(), nil, tc.argv...)
			wantExit(t, r, tc.exit)
			if tc.out != "" && r.stdout != tc.out {
				t.Errorf("stdout = %q, want %q", r.stdout, tc.out)
			}
		})
	}
}

func TestPython(t *testing.T) {
	tests := []struct {
		name string
		argv []string
		exit int
		out  string
	}{
		{"print", []string{"python3", "-c", "print(6*7)"}, 0, "42\n"},
		{"stdlib imports", []string{"python3", "-c", "import json, re, hashlib, datetime, decimal; print(json.dumps({'a': re.sub('b', 'c', 'ab')}), hashlib.sha256(b'').hexdigest()[:8])"}, 0, "{\"a\": \"ac\"} e3b0c442\n"},
		{"argv", []string{"python3", "-c", "import sys; print(sys.argv[1:])", "x", "y z"}, 0, "['x', 'y z']\n"},
		{"exit code", []string{"python3", "-c", "raise SystemExit(7)"}, 7, ""},
		{"exception exits 1", []string{"python3", "-c", "1/0"}, 1, ""},
		{"granted environment only", []string{"python3", "-c", "import os; print(os.environ.get('GREETING'), 'PATH' in os.environ)"}, 0, "hello False\n"},
		{"script file in the workspace", []string{"python3", "/workspace/s.py"}, 0, "from a file\n"},
		{"relative paths are the workspace", []string{"python3", "-c", "open('rel.txt','w').write('r'); print(open('/workspace/rel.txt').read())"}, 0, "r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := exec(t, defaultLimits(), func(ws string) {
				os.WriteFile(filepath.Join(ws, "s.py"), []byte("print('from a file')\n"), 0o644)
			}, tc.argv...)
			wantExit(t, r, tc.exit)
			if tc.out != "" && r.stdout != tc.out {
				t.Errorf("stdout = %q, want %q (stderr %q)", r.stdout, tc.out, clip(r.stderr))
			}
		})
	}
}

func TestUnknownCommand(t *testing.T) {
	r := exec(t, defaultLimits(), nil, "sh", "-c", "true")
	wantExit(t, r, 127)
	if !strings.Contains(r.stderr, "sh: command not found") || !strings.Contains(r.stderr, "python3") {
		t.Errorf("stderr %q does not explain what the tier runs", r.stderr)
	}
}

// TestIsolation checks from the host side that the guest reaches no host
// file, no path outside /workspace through "..", absolute or relative
// symlinks, and no network.
func TestIsolation(t *testing.T) {
	canaryDir := t.TempDir()
	secret := fmt.Sprintf("moat-canary-%d", time.Now().UnixNano())
	canary := filepath.Join(canaryDir, "canary")
	if err := os.WriteFile(canary, []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOAT_TEST_HOST_SECRET", secret)
	// Escape attempts, each printing ESCAPED only if it read the canary or
	// wrote outside.
	probe := `
import os, sys
canary = sys.argv[1]
secret = sys.argv[2]
def attempt(name, f):
    try:
        v = f()
        print(name, "ESCAPED" if v and secret in v else "no-secret", flush=True)
    except Exception as e:
        print(name, "refused", type(e).__name__, flush=True)
attempt("absolute", lambda: open(canary).read())
attempt("dotdot", lambda: open("/workspace/../../../../.." + canary).read())
attempt("dotdot-rel", lambda: open("../../../../.." + canary).read())
attempt("lib-dotdot", lambda: open("/usr/local/lib/python3.11/../../../../.." + canary).read())
def symlink_abs():
    os.symlink(canary, "/workspace/abs")
    return open("/workspace/abs").read()
attempt("symlink-abs", symlink_abs)
def symlink_rel():
    os.symlink("../../../../../../../.." + canary, "/workspace/rel")
    return open("/workspace/rel").read()
attempt("symlink-rel", symlink_rel)
def symlink_dir():
    os.symlink("../../../../../../../..", "/workspace/up")
    return open("/workspace/up" + canary).read()
attempt("symlink-dir", symlink_dir)
def write_out():
    open("/workspace/../../../../../tmp/moat-wasm-escape-" + secret, "w").write("x")
    return None
attempt("write-dotdot", write_out)
attempt("lib-write", lambda: open("/usr/local/lib/python3.11/os.py", "a").write("x"))
attempt("environ", lambda: " ".join(os.environ.values()))
attempt("listdir-root", lambda: " ".join(os.listdir("/")))
import socket
def net():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", 22))
    return "CONNECTED " + secret
attempt("socket", net)
`
	r := exec(t, defaultLimits(), nil, "python3", "-c", probe, canary, secret)
	wantExit(t, r, 0)
	if strings.Contains(r.stdout, "ESCAPED") || strings.Contains(r.stdout, secret) || strings.Contains(r.stderr, secret) {
		t.Errorf("the guest reached outside:\n%s\n%s", r.stdout, r.stderr)
	}
	for _, name := range []string{"absolute", "dotdot", "dotdot-rel", "lib-dotdot", "symlink-abs", "symlink-rel", "symlink-dir", "write-dotdot", "lib-write", "socket"} {
		if !regexp.MustCompile(`(?m)^` + name + ` (refused|no-secret)`).MatchString(r.stdout) {
			t.Errorf("attempt %s did not report: %s", name, r.stdout)
		}
	}
	if m, _ := filepath.Glob("/tmp/moat-wasm-escape-*"); len(m) > 0 {
		t.Errorf("the guest wrote outside its workspace: %v", m)
	}
	if b, _ := os.ReadFile(filepath.Join(DefaultGuests, "python", "lib", "python3.11", "os.py")); bytes.HasSuffix(b, []byte("x")) {
		t.Errorf("the guest appended to the read-only library")
	}
}

func TestLimits(t *testing.T) {
	t.Run("memory growth past the limit is refused and reported", func(t *testing.T) {
		lim := defaultLimits()
		lim.MemoryBytes = 64 << 20
		r := exec(t, lim, nil, "python3", "-c", "b = []\nwhile True: b.append(bytearray(4 << 20))")
		if r.out.Termination != result.OOM {
			t.Errorf("termination=%s exit=%d, want oom; stderr %q", r.out.Termination, r.out.ExitCode, clip(r.stderr))
		}
		if r.out.PeakMemory > 64<<20 || r.out.PeakMemory < 32<<20 {
			t.Errorf("peak linear memory %d, want just under the 64 MiB limit", r.out.PeakMemory)
		}
	})
	t.Run("JS memory growth past the limit", func(t *testing.T) {
		lim := defaultLimits()
		lim.MemoryBytes = 32 << 20
		r := exec(t, lim, nil, "node", "-e", "let a = []; for (;;) a.push(new Array(1 << 20).fill(1))")
		if r.out.Termination != result.OOM {
			t.Errorf("termination=%s exit=%d, want oom; stderr %q", r.out.Termination, r.out.ExitCode, clip(r.stderr))
		}
	})
	t.Run("loop without system calls is killed at the timeout", func(t *testing.T) {
		lim := defaultLimits()
		lim.Timeout = time.Second
		for _, argv := range [][]string{{"python3", "-c", "while True: pass"}, {"node", "-e", "for (;;) {}"}} {
			r := exec(t, lim, nil, argv...)
			if r.out.Termination != result.Timeout || r.out.ExitCode != 124 {
				t.Errorf("%s: termination=%s exit=%d, want timeout/124", argv[0], r.out.Termination, r.out.ExitCode)
			}
		}
	})
	t.Run("deep recursion fails cleanly", func(t *testing.T) {
		r := exec(t, defaultLimits(), nil, "python3", "-c", "import sys\nsys.setrecursionlimit(200000)\ndef f(n): return f(n+1)\nf(0)")
		if r.out.Termination == result.Exited && r.out.ExitCode == 0 {
			t.Errorf("runaway recursion exited 0")
		}
		if r.out.Termination == result.InfraError {
			t.Errorf("recursion was an infra error: %s", r.out.Error)
		}
		// QuickJS reports a stack overflow as an InternalError.
		r = exec(t, defaultLimits(), nil, "node", "-e", "function f(n) { return f(n + 1) + 1 } try { f(0) } catch (e) { console.log(String(e)) }")
		wantExit(t, r, 0)
		if r.stdout != "InternalError: stack overflow\n" {
			t.Errorf("JS recursion: stdout %q, want a caught stack overflow", r.stdout)
		}
	})
	t.Run("file-size limit", func(t *testing.T) {
		lim := defaultLimits()
		lim.FileSizeBytes = 1 << 20
		r := exec(t, lim, nil, "python3", "-c", "f = open('big', 'wb')\ntry:\n  f.write(b'x' * (2 << 20)); f.flush()\nexcept OSError as e: print('refused', e.errno)")
		// EIO: wazero's WASI layer cannot return EFBIG (see errLimit).
		if !strings.Contains(r.stdout, "refused") {
			t.Errorf("stdout %q, want the write refused; stderr %q", r.stdout, clip(r.stderr))
		}
		if !hasViolation(r.out, "file-size") {
			t.Errorf("no file-size violation: %v", r.out.Violations)
		}
		if fi, err := os.Stat(filepath.Join(r.ws, "big")); err == nil && fi.Size() > 1<<20 {
			t.Errorf("file grew to %d bytes", fi.Size())
		}
	})
	t.Run("workspace size limit", func(t *testing.T) {
		lim := defaultLimits()
		lim.WorkspaceBytes = 4 << 20
		r := exec(t, lim, nil, "python3", "-c", "import os\nfor i in range(8):\n  try:\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n  except OSError as e: print('refused', i, e.errno); break")
		if !strings.Contains(r.stdout, "refused") {
			t.Errorf("stdout %q: the workspace limit was not enforced; stderr %q", r.stdout, clip(r.stderr))
		}
		var total int64
		filepath.Walk(r.ws, func(_ string, fi os.FileInfo, _ error) error {
			if fi != nil && fi.Mode().IsRegular() {
				total += fi.Size()
			}
			return nil
		})
		if total > 4<<20 {
			t.Errorf("workspace holds %d bytes, limit 4 MiB", total)
		}
		if !hasViolation(r.out, "disk") {
			t.Errorf("no disk violation: %v", r.out.Violations)
		}
	})
	t.Run("open-files limit", func(t *testing.T) {
		lim := defaultLimits()
		lim.OpenFiles = 20
		before, _ := os.ReadDir("/proc/self/fd")
		r := exec(t, lim, nil, "python3", "-c", "fs = []\ntry:\n  while True: fs.append(open('/workspace/x', 'w'))\nexcept OSError as e: print('refused after', len(fs))")
		if !strings.Contains(r.stdout, "refused after") || !hasViolation(r.out, "open-files") {
			t.Errorf("stdout %q violations %v: the open-files limit was not enforced; stderr %q", r.stdout, r.out.Violations, clip(r.stderr))
		}
		after, _ := os.ReadDir("/proc/self/fd")
		if len(after) > len(before)+2 {
			t.Errorf("%d descriptors open after the run, %d before", len(after), len(before))
		}
	})
	t.Run("file-count limit", func(t *testing.T) {
		lim := defaultLimits()
		lim.WorkspaceFiles = 10
		r := exec(t, lim, nil, "python3", "-c", "import os\nfor i in range(50):\n  try:\n    open(f'f{i}', 'w').close()\n  except OSError as e: print('refused', i); break")
		if !strings.Contains(r.stdout, "refused 10") {
			t.Errorf("stdout %q, want the 11th file refused; stderr %q", r.stdout, clip(r.stderr))
		}
		if !hasViolation(r.out, "files") {
			t.Errorf("no files violation: %v", r.out.Violations)
		}
	})
}

func hasViolation(o *tier.Outcome, kind string) bool {
	for _, v := range o.Violations {
		if v.Kind == kind {
			return true
		}
	}
	return false
}

func TestOutputFloodIsCapped(t *testing.T) {
	w := testTier(t)
	sb, err := w.Prepare(context.Background(), &tier.Spec{ID: "flood", Limits: defaultLimits(), StateDir: filepath.Join(t.TempDir(), "run")})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()
	for _, argv := range [][]string{
		{"python3", "-c", "import sys\nb = b'x' * (1 << 20)\nfor _ in range(100): sys.stdout.buffer.write(b)"},
		{"node", "-e", "const s = 'x'.repeat(1 << 20); for (let i = 0; i < 100; i++) print(s)"},
	} {
		so := output.NewCapture(1<<20, nil)
		out, err := sb.Exec(context.Background(), &tier.Command{Argv: argv, Stdout: so, Stderr: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		if out.Termination != result.Exited || out.ExitCode != 0 {
			t.Errorf("%s: termination=%s exit=%d", argv[0], out.Termination, out.ExitCode)
		}
		if !so.Truncated() || so.Total() < 100<<20 || len(so.Bytes()) != 1<<20 {
			t.Errorf("%s: truncated=%v total=%d kept=%d, want 1 MiB kept of >= 100 MiB", argv[0], so.Truncated(), so.Total(), len(so.Bytes()))
		}
	}
}

func TestPinnedWazero(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "github.com/tetratelabs/wazero "+pinnedWazero+"\n") {
		t.Errorf("go.mod does not pin github.com/tetratelabs/wazero %s: update pinnedWazero", pinnedWazero)
	}
}

// TestConcurrentRuns: runs share one runtime and compiled modules; each
// keeps its own memory limit, workspace and output.
func TestConcurrentRuns(t *testing.T) {
	testTier(t)
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lim := defaultLimits()
			argv := []string{"node", "-e", fmt.Sprintf("writeFile('n', '%d'); console.log(readFile('n'))", i)}
			if i%2 == 1 {
				lim.MemoryBytes = 32 << 20
				argv = []string{"python3", "-c", fmt.Sprintf("open('n','w').write('%d'); print(open('n').read())", i)}
			}
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				r := exec(t, lim, nil, argv...)
				wantExit(t, r, 0)
				if r.stdout != fmt.Sprintf("%d\n", i) {
					t.Errorf("run %d: stdout %q", i, r.stdout)
				}
				if lim.MemoryBytes == 32<<20 && r.out.PeakMemory > 32<<20 {
					t.Errorf("run %d: peak %d past its own limit", i, r.out.PeakMemory)
				}
			})
		}()
	}
	wg.Wait()
}
