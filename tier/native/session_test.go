package native_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

func newSession(t *testing.T, e *engine.Engine, adjust func(*manifest.Manifest), files ...engine.File) *engine.Session {
	t.Helper()
	m := manifest.Default()
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if adjust != nil {
		adjust(m)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := e.NewSession(context.Background(), &engine.SessionRequest{Manifest: m, Files: files})
	if err != nil {
		t.Fatalf("new session: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func execWait(t *testing.T, s *engine.Session, req *engine.ExecRequest) *result.Result {
	t.Helper()
	p, err := s.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("start %q: %v", req.Argv, err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("%q did not end", req.Argv)
	}
	return p.Result()
}

// TestSession runs a table of commands one after another in one session:
// state carries over between them (files, the same cgroup), and each
// command's result is its own.
func TestSession(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, nil, engine.File{Path: "in/data.txt", Data: strings.NewReader("uploaded\n")})
	id := s.ID()
	steps := []struct {
		name  string
		req   engine.ExecRequest
		check func(t *testing.T, res *result.Result)
	}{
		{"reads an uploaded file", engine.ExecRequest{Argv: []string{"cat", "in/data.txt"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if res.Stdout.Data != "uploaded\n" {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
			if len(res.Files) != 0 {
				t.Errorf("files changed by cat: %v", res.Files)
			}
		}},
		{"writes a file: the diff is this command's", engine.ExecRequest{Argv: []string{"sh", "-c", "echo one > a.txt"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if len(res.Files) != 1 || res.Files[0].Path != "a.txt" || res.Files[0].Change != result.Added {
				t.Errorf("files = %+v, want a.txt added", res.Files)
			}
		}},
		{"sees the previous command's file", engine.ExecRequest{Argv: []string{"sh", "-c", "cat a.txt; rm a.txt"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if res.Stdout.Data != "one\n" {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
			if len(res.Files) != 1 || res.Files[0].Change != result.Deleted {
				t.Errorf("files = %+v, want a.txt deleted", res.Files)
			}
		}},
		{"exit status", engine.ExecRequest{Argv: []string{"sh", "-c", "exit 7"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 7)
		}},
		{"env and dir", engine.ExecRequest{Argv: []string{"sh", "-c", "echo $GREETING; pwd"}, Env: map[string]string{"GREETING": "hi"}, Dir: "/tmp"}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if res.Stdout.Data != "hi\n/tmp\n" {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
		}},
		{"stdin", engine.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: strings.NewReader("12345")}, func(t *testing.T, res *result.Result) {
			if strings.TrimSpace(res.Stdout.Data) != "5" {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
		}},
		{"standard streams reopened by path", engine.ExecRequest{Argv: []string{"sh", "-c", "echo out > /dev/stdout && echo err > /dev/stderr && head -c 3 /dev/stdin"}, Stdin: strings.NewReader("abc")}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if res.Stdout.Data != "out\nabc" || res.Stderr.Data != "err\n" {
				t.Errorf("stdout %q stderr %q", res.Stdout.Data, res.Stderr.Data)
			}
		}},
		{"missing command", engine.ExecRequest{Argv: []string{"no-such-command"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 127)
			if !strings.Contains(res.Stderr.Data, "not found") {
				t.Errorf("stderr %q", res.Stderr.Data)
			}
		}},
		{"per-command timeout", engine.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 300 * time.Millisecond}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Timeout, 124)
		}},
		{"same confinement as a one-shot run: no capabilities, uid 1000", engine.ExecRequest{Argv: []string{"sh", "-c", "id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; grep NoNewPrivs /proc/self/status; grep Seccomp: /proc/self/status"}}, func(t *testing.T, res *result.Result) {
			want := "1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n"
			if res.Stdout.Data != want {
				t.Errorf("stdout %q, want %q", res.Stdout.Data, want)
			}
		}},
		{"init cannot be signalled or read by the program", engine.ExecRequest{Argv: []string{"sh", "-c", "kill -9 1; ls /proc/1/fd 2>&1 | head -1; echo alive"}}, func(t *testing.T, res *result.Result) {
			if !strings.Contains(res.Stdout.Data, "alive") || strings.Contains(res.Stdout.Data, "\n0\n") {
				t.Errorf("stdout %q", res.Stdout.Data)
			}
		}},
		{"the session survived all that", engine.ExecRequest{Argv: []string{"echo", "still here"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := execWait(t, s, &st.req)
			if !strings.HasPrefix(res.ID, id+"-e") {
				t.Errorf("result id %q not of session %s", res.ID, id)
			}
			st.check(t, res)
			if t.Failed() {
				t.Logf("result: %+v", res)
			}
		})
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("session %s left: %v", id, left)
	}
	if _, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, engine.ErrSessionClosed) {
		t.Errorf("start after close: %v, want ErrSessionClosed", err)
	}
}

func wantResult(t *testing.T, res *result.Result, term result.Termination, exit int) {
	t.Helper()
	if res.Termination != term || res.ExitCode != exit {
		t.Errorf("termination %s exit %d, want %s %d (stderr %q)", res.Termination, res.ExitCode, term, exit, res.Stderr.Data)
	}
}

// TestSessionConcurrentAndSignals runs commands at once, talks to one
// through an open stdin, signals another, and destroys the session under a
// running one.
func TestSessionConcurrentAndSignals(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, nil)
	id := s.ID()

	var live syncbuf.Buffer
	cat, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"cat"}, StdinOpen: true, Stdout: &live})
	if err != nil {
		t.Fatal(err)
	}
	sleeper, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(cat.Stdin(), "ping\n")
	cat.Stdin().Close()
	<-cat.Done()
	if got := cat.Result().Stdout.Data; got != "ping\n" {
		t.Errorf("cat stdout %q", got)
	}
	if err := sleeper.Signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sleeper.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGTERM did not end sleep")
	}
	if r := sleeper.Result(); r.Termination != result.Signaled || r.Signal != int(unix.SIGTERM) {
		t.Errorf("sleeper: %s signal %d", r.Termination, r.Signal)
	}

	// A command still running when the session is destroyed ends too.
	bg, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bg.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("command outlived its session")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("close took %v", d)
	}
	if r := bg.Result(); r.Termination != result.Signaled {
		t.Errorf("destroyed command: %s", r.Termination)
	}
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("session %s left: %v", id, left)
	}
}

// TestSessionInitSurvivesKill: a command that signals PID 1 (Moat's init,
// which runs as the same user) must not end the sandbox: later commands
// still run. Their signal dispositions are the defaults, not init's.
func TestSessionInitSurvivesKill(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, nil)
	for _, sig := range []string{"TERM", "HUP", "INT", "QUIT", "ABRT", "USR1", "ALRM"} {
		res := execWait(t, s, &engine.ExecRequest{Argv: []string{"sh", "-c", "kill -" + sig + " 1; sleep 0.2; echo sent"}})
		wantResult(t, res, result.Exited, 0)
		res = execWait(t, s, &engine.ExecRequest{Argv: []string{"echo", "alive"}})
		if res.Termination != result.Exited || res.Stdout.Data != "alive\n" {
			t.Fatalf("after kill -%s 1: %s exit %d stdout %q stderr %q; want the sandbox alive", sig, res.Termination, res.ExitCode, res.Stdout.Data, res.Stderr.Data)
		}
	}
	res := execWait(t, s, &engine.ExecRequest{Argv: []string{"grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"}})
	if want := "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n"; res.Stdout.Data != want {
		t.Errorf("a command's signal state:\n%s\nwant nothing blocked or ignored:\n%s", res.Stdout.Data, want)
	}
}
