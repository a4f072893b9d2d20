package gvisor_test

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier/gvisor"
)

func newSession(t *testing.T, e *engine.Engine, files ...engine.File) *engine.Session {
	t.Helper()
	m := manifest.Default()
	m.Tier = gvisor.Name
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
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

func wantResult(t *testing.T, res *result.Result, term result.Termination, exit int) {
	t.Helper()
	if res.Termination != term || res.ExitCode != exit {
		t.Errorf("termination %s exit %d, want %s %d (stderr %q)", res.Termination, res.ExitCode, term, exit, res.Stderr.Data)
	}
}

// TestSession runs commands one after another in one gVisor sandbox: state
// carries over (files, the same Sentry), each result is the command's own,
// and each command is confined like a one-shot run's program.
func TestSession(t *testing.T) {
	e := newEngine(t, need(t))
	s := newSession(t, e, engine.File{Path: "in/data.txt", Data: strings.NewReader("uploaded\n")})
	id := s.ID()
	steps := []struct {
		name  string
		req   engine.ExecRequest
		check func(t *testing.T, res *result.Result)
	}{
		{"reads an uploaded file", engine.ExecRequest{Argv: []string{"cat", "in/data.txt"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 0)
			if res.Stdout.Data != "uploaded\n" || len(res.Files) != 0 {
				t.Errorf("stdout %q, files %v", res.Stdout.Data, res.Files)
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
			if res.Stdout.Data != "one\n" || len(res.Files) != 1 || res.Files[0].Change != result.Deleted {
				t.Errorf("stdout %q, files %+v, want one and a.txt deleted", res.Stdout.Data, res.Files)
			}
		}},
		{"exit status", engine.ExecRequest{Argv: []string{"sh", "-c", "exit 7"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 7)
		}},
		{"exit 137 is an exit, not a kill", engine.ExecRequest{Argv: []string{"sh", "-c", "exit 137"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 137)
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
		{"missing command", engine.ExecRequest{Argv: []string{"no-such-command"}}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Exited, 127)
			if !strings.Contains(res.Stderr.Data, "not found") {
				t.Errorf("stderr %q", res.Stderr.Data)
			}
		}},
		{"per-command timeout", engine.ExecRequest{Argv: []string{"sleep", "30"}, Timeout: 300 * time.Millisecond}, func(t *testing.T, res *result.Result) {
			wantResult(t, res, result.Timeout, 124)
		}},
		{"output is capped", engine.ExecRequest{Argv: []string{"sh", "-c", "head -c 5000000 /dev/zero | tr '\\0' x"}}, func(t *testing.T, res *result.Result) {
			if !res.Stdout.Truncated || len(res.Stdout.Data) >= 5000000 {
				t.Errorf("stdout of %d bytes, truncated=%v: not capped", len(res.Stdout.Data), res.Stdout.Truncated)
			}
		}},
		{"confined like a one-shot run: uid 1000, no capabilities, no_new_privs, rlimits", engine.ExecRequest{Argv: []string{"sh", "-c", "id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'; ulimit -n; ulimit -c"}}, func(t *testing.T, res *result.Result) {
			// prctl(PR_GET_NO_NEW_PRIVS): gVisor's /proc/self/status
			// has no NoNewPrivs line.
			want := "1000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\n1\n" + manifestOpenFiles() + "\n0\n"
			if res.Stdout.Data != want {
				t.Errorf("stdout %q, want %q", res.Stdout.Data, want)
			}
		}},
		{"init cannot be signalled by the program and holds no host file", engine.ExecRequest{Argv: []string{"sh", "-c", "kill -9 1; kill -TERM 1; ls -l /proc/1/fd/; sleep 0.2; echo alive"}}, func(t *testing.T, res *result.Result) {
			if !strings.Contains(res.Stdout.Data, "alive") || strings.Count(res.Stderr.Data, "Operation not permitted") != 2 || strings.Contains(res.Stdout.Data, "host:") {
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
			if res.Tier != gvisor.Name {
				t.Errorf("tier %q", res.Tier)
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

func manifestOpenFiles() string {
	m := manifest.Default()
	return strconv.Itoa(m.Resources.OpenFiles)
}

// TestSessionConcurrentAndSignals runs commands at once, talks to one
// through an open stdin, signals another's whole process group, and
// destroys the session under a running one.
func TestSessionConcurrentAndSignals(t *testing.T) {
	e := newEngine(t, need(t))
	s := newSession(t, e)
	id := s.ID()

	var live syncbuf.Buffer
	cat, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"cat"}, StdinOpen: true, Stdout: &live})
	if err != nil {
		t.Fatal(err)
	}
	// The shell waits for its background child: only a signal to the
	// whole group ends both.
	group, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sh", "-c", "trap '' TERM; sleep 60 & wait"}})
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(cat.Stdin(), "ping\n")
	cat.Stdin().Close()
	<-cat.Done()
	if got := cat.Result().Stdout.Data; got != "ping\n" {
		t.Errorf("cat stdout %q", got)
	}
	time.Sleep(200 * time.Millisecond) // let sh start sleep
	if err := group.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-group.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGKILL to the group did not end the command")
	}
	if r := group.Result(); r.Termination != result.Signaled || r.Signal != int(unix.SIGKILL) {
		t.Errorf("group: %s signal %d", r.Termination, r.Signal)
	}
	// Nothing of that group is left: the sandbox's only processes are
	// init and the probe.
	ps := execWait(t, s, &engine.ExecRequest{Argv: []string{"python3", "-c", "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))"}})
	if strings.TrimSpace(ps.Stdout.Data) != "2" {
		t.Errorf("processes in the sandbox after the group kill: %q, want 2 (init and the probe)", ps.Stdout.Data)
	}

	sleeper, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
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
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bg.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("command outlived its session")
	}
	if r := bg.Result(); r.Termination != result.Signaled {
		t.Errorf("destroyed command: %s", r.Termination)
	}
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("session %s left: %v", id, left)
	}
}
