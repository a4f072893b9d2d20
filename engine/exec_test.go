package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

// The fakes: a tier whose sandbox's workspace is a directory and whose
// programs are steps, so that the exec path is tested without root.
//
//	out:TEXT    write TEXT and a newline to stdout
//	err:TEXT    the same to stderr
//	write:NAME  create the file NAME in the workspace
//	cat         copy stdin to stdout until end-of-file
//	exit:N      end with status N (else 0)
//	term        wait until SIGTERM (ends signalled 15), the sandbox is
//	            destroyed (killed, "cancelled") or a one-shot ctx ends
//	term:D      the same, going on after D without any of them
//	deaf        as term, ignoring SIGTERM
//	lost        the tier loses the program: Exec or Wait fail
//
// A program whose first step is "refuse" cannot be started.

type fakeTier struct{}

func (fakeTier) Name() string                    { return "fake" }
func (fakeTier) Capabilities() tier.Capabilities { return tier.Capabilities{Sessions: true} }
func (fakeTier) Prepare(context.Context, *tier.Spec) (tier.Sandbox, error) {
	return nil, errors.New("the fake tier prepares nothing: tests build its sandboxes")
}

type fakeSandbox struct {
	dir       string
	destroyed chan struct{}
	once      sync.Once

	mu   sync.Mutex
	cmds []*tier.Command // every command started, in order
}

var (
	_ tier.Sandbox   = (*fakeSandbox)(nil)
	_ tier.Sessioner = (*fakeSandbox)(nil)
)

func newFakeSandbox(t *testing.T) *fakeSandbox {
	t.Helper()
	return &fakeSandbox{dir: t.TempDir(), destroyed: make(chan struct{})}
}

func (s *fakeSandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: s.dir, UID: os.Getuid(), GID: os.Getgid()}
}

func (s *fakeSandbox) Destroy() error {
	s.once.Do(func() { close(s.destroyed) })
	return nil
}

func (s *fakeSandbox) record(cmd *tier.Command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cmds = append(s.cmds, cmd)
}

func (s *fakeSandbox) Exec(ctx context.Context, cmd *tier.Command) (*tier.Outcome, error) {
	s.record(cmd)
	return s.run(cmd, nil, ctx.Done())
}

func (s *fakeSandbox) Start(ctx context.Context, cmd *tier.Command) (tier.Process, error) {
	if len(cmd.Argv) > 0 && cmd.Argv[0] == "refuse" {
		return nil, errors.New("fake: cannot start refuse")
	}
	s.record(cmd)
	p := &fakeProc{sig: make(chan syscall.Signal, 1), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.out, p.err = s.run(cmd, p.sig, nil)
	}()
	return p, nil
}

// run runs a fake program; sig receives its signals (nil for a
// single-use sandbox's), cancel is a one-shot run's ctx.Done.
func (s *fakeSandbox) run(cmd *tier.Command, sig <-chan syscall.Signal, cancel <-chan struct{}) (*tier.Outcome, error) {
	out := &tier.Outcome{Termination: result.Exited, Duration: time.Millisecond}
	for _, step := range cmd.Argv {
		op, arg, _ := strings.Cut(step, ":")
		switch op {
		case "out":
			fmt.Fprintln(cmd.Stdout, arg)
		case "err":
			fmt.Fprintln(cmd.Stderr, arg)
		case "write":
			if err := os.WriteFile(filepath.Join(s.dir, arg), []byte(arg), 0o644); err != nil {
				return nil, err
			}
		case "cat":
			if cmd.Stdin != nil {
				io.Copy(cmd.Stdout, cmd.Stdin)
			}
		case "exit":
			fmt.Sscan(arg, &out.ExitCode)
		case "term", "deaf":
			var after <-chan time.Time
			if arg != "" {
				d, err := time.ParseDuration(arg)
				if err != nil {
					return nil, err
				}
				after = time.After(d)
			}
			for waiting := true; waiting; {
				select {
				case <-after:
					waiting = false
				case got := <-sig:
					if op == "term" && got == syscall.SIGTERM {
						out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+15, 15
						waiting = false
					}
				case <-s.destroyed:
					out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+9, 9
					out.Violations = append(out.Violations, tier.Cancelled("the sandbox was destroyed while the command ran"))
					waiting = false
				case <-cancel:
					out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+9, 9
					out.Violations = append(out.Violations, tier.Cancelled("fake: the tier ended the cancelled run"))
					waiting = false
				}
			}
		case "lost":
			return nil, errors.New("fake: lost the program")
		}
	}
	return out, nil
}

type fakeProc struct {
	sig  chan syscall.Signal
	done chan struct{}
	out  *tier.Outcome
	err  error
}

func (p *fakeProc) Signal(sig syscall.Signal) error {
	select {
	case p.sig <- sig:
	default:
	}
	return nil
}

func (p *fakeProc) Wait() (*tier.Outcome, error) {
	<-p.done
	return p.out, p.err
}

// fakePrepared is a prepared fake sandbox for m whose workspace holds
// "input" (the baseline every case diffs against).
func fakePrepared(t *testing.T, m *manifest.Manifest) (*prepared, *workspace.Snapshot) {
	t.Helper()
	sb := newFakeSandbox(t)
	if err := os.WriteFile(filepath.Join(sb.dir, "input"), []byte("in"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &prepared{id: "fake0001", tier: fakeTier{}, img: &image.Image{Name: "python", Digest: "sha256:" + strings.Repeat("1", 64)}, lim: limits(m), sb: sb}
	t.Cleanup(func() { p.close() })
	snap, err := workspace.Scan(sb.dir, workspace.DiffLimits{MaxEntries: 100, MaxHashBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return p, snap
}

func paths(files []result.FileChange) []string {
	out := []string{}
	for _, f := range files {
		out = append(out, string(f.Change)+" "+f.Path)
	}
	return out
}

// TestExec runs the one exec path's variants against the fake tier: the
// same program gives the same result whichever way it ran, and each mode
// keeps its own answer to a cancel and to Moat's own failures.
func TestExec(t *testing.T) {
	small := manifest.Default()
	small.Resources.StdoutBytes = 4
	modes := map[execMode]string{execOnce: "once", execSessionOnce: "session-once", execSession: "session"}
	tests := []struct {
		name   string
		modes  []execMode
		m      *manifest.Manifest
		argv   []string
		spec   func(*execSpec)
		cancel bool // cancel ctx once the command started
		stdin  string
		// want
		err        string // wait's error (start's when startErr)
		startErr   bool
		term       result.Termination
		exit       int
		stdout     string
		stderr     string
		files      []string
		violations []result.Violation
		minTime    time.Duration
	}{
		{
			name: "output and files", modes: []execMode{execOnce, execSessionOnce, execSession},
			argv: []string{"out:hi", "err:oops", "write:f", "exit:3"},
			term: result.Exited, exit: 3, stdout: "hi\n", stderr: "oops\n", files: []string{"added f"}, violations: []result.Violation{},
		},
		{
			name: "output over the cap", modes: []execMode{execOnce, execSessionOnce, execSession},
			m: small, argv: []string{"out:hello world"},
			term: result.Exited, stdout: "hell",
			files: []string{}, violations: []result.Violation{{Kind: "output", Detail: "stdout truncated: 12 bytes written, 4 kept", Limit: "4"}},
		},
		{
			name: "the tier loses a one-shot run", modes: []execMode{execOnce, execSessionOnce},
			argv: []string{"lost"}, err: "run: fake: lost the program",
		},
		{
			name: "the tier loses a session's command", modes: []execMode{execSession},
			argv: []string{"lost"},
			term: result.InfraError, exit: 125, files: []string{}, violations: []result.Violation{},
		},
		{
			name: "start refused", modes: []execMode{execSessionOnce, execSession},
			argv: []string{"refuse"}, spec: func(s *execSpec) { s.stdinOpen = true }, startErr: true, err: "fake: cannot start refuse",
		},
		{
			name: "one-shot cancel is the tier's", modes: []execMode{execOnce},
			argv: []string{"term"}, cancel: true,
			term: result.Signaled, exit: 137, files: []string{},
			violations: []result.Violation{tier.Cancelled("fake: the tier ended the cancelled run")},
		},
		{
			name: "cancel ends the program with SIGTERM", modes: []execMode{execSessionOnce},
			argv: []string{"term"}, cancel: true,
			term: result.Signaled, exit: 143, files: []string{},
			violations: []result.Violation{tier.Cancelled("the caller cancelled the run; SIGTERM was sent to the program")},
		},
		{
			name: "cancel destroys the sandbox after the grace", modes: []execMode{execSessionOnce},
			argv: []string{"deaf"}, cancel: true,
			term: result.Signaled, exit: 137, files: []string{}, minTime: tier.CancelGrace,
			violations: []result.Violation{
				tier.Cancelled("the sandbox was destroyed while the command ran"),
				tier.Cancelled("the caller cancelled the run; SIGTERM was sent to the program, then the sandbox was destroyed after 2s"),
			},
		},
		{
			name: "a session's ctx bounds only the start", modes: []execMode{execSession},
			argv: []string{"term:300ms", "write:g", "out:done"}, cancel: true, minTime: 300 * time.Millisecond,
			term: result.Exited, stdout: "done\n", files: []string{"added g"}, violations: []result.Violation{},
		},
		{
			name: "stdin kept open", modes: []execMode{execSession},
			argv: []string{"cat"}, spec: func(s *execSpec) { s.stdinOpen = true }, stdin: "ping",
			term: result.Exited, stdout: "ping", files: []string{}, violations: []result.Violation{},
		},
		{
			name: "stdin left open by the caller", modes: []execMode{execSession},
			argv: []string{"out:bye"}, spec: func(s *execSpec) { s.stdinOpen = true },
			term: result.Exited, stdout: "bye\n", files: []string{}, violations: []result.Violation{},
		},
		{
			name: "stdin given", modes: []execMode{execOnce, execSessionOnce, execSession},
			argv: []string{"cat"}, spec: func(s *execSpec) { s.stdin = strings.NewReader("pong") },
			term: result.Exited, stdout: "pong", files: []string{}, violations: []result.Violation{},
		},
		{
			name: "no diff once the workspace is gone", modes: []execMode{execSession},
			argv: []string{"write:h"}, spec: func(s *execSpec) { s.gone = func() bool { return true } },
			term: result.Exited, files: []string{}, violations: []result.Violation{},
		},
	}
	for _, tc := range tests {
		for _, mode := range tc.modes {
			t.Run(tc.name+"/"+modes[mode], func(t *testing.T) {
				m := tc.m
				if m == nil {
					m = manifest.Default()
				}
				p, snap := fakePrepared(t, m)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				spec := &execSpec{mode: mode, id: "run-1", argv: tc.argv, env: map[string]string{"EXTRA": "1"}, dir: "/workspace/sub", timeout: 7 * time.Second, baseline: snap}
				if tc.spec != nil {
					tc.spec(spec)
				}
				begin := time.Now()
				x, err := p.start(ctx, m, spec)
				if tc.startErr {
					if err == nil || err.Error() != tc.err {
						t.Fatalf("start error %v, want %q", err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatalf("start: %v", err)
				}
				if (x.stdin != nil) != spec.stdinOpen {
					t.Errorf("stdin pipe %v, want one only with stdinOpen", x.stdin)
				}
				if tc.stdin != "" {
					io.WriteString(x.stdin, tc.stdin)
					x.stdin.Close()
				}
				if tc.cancel {
					cancel()
				}
				res, err := x.wait(ctx)
				if tc.err != "" {
					if res != nil || err == nil || err.Error() != tc.err {
						t.Fatalf("wait = %+v, %v; want error %q", res, err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatalf("wait: %v", err)
				}
				if took := time.Since(begin); took < tc.minTime {
					t.Errorf("took %v, want at least %v", took, tc.minTime)
				}
				want := result.Result{Schema: result.SchemaVersion, ID: "run-1", Tier: "fake", Image: result.Image{Name: "python", Digest: p.img.Digest}, Manifest: m.Digest(), Command: tc.argv}
				got := result.Result{Schema: res.Schema, ID: res.ID, Tier: res.Tier, Image: res.Image, Manifest: res.Manifest, Command: res.Command}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("header %+v, want %+v", got, want)
				}
				if res.StartedAt.IsZero() || res.StartedAt.Before(begin.Add(-time.Second)) {
					t.Errorf("started_at %v, want about %v", res.StartedAt, begin)
				}
				if res.Termination != tc.term || res.ExitCode != tc.exit {
					t.Errorf("termination %s exit %d (%s), want %s exit %d", res.Termination, res.ExitCode, res.Error, tc.term, tc.exit)
				}
				if tc.term == result.InfraError && res.Error != "fake: lost the program" {
					t.Errorf("error %q, want the tier's", res.Error)
				}
				if res.Stdout.Data != tc.stdout || res.Stderr.Data != tc.stderr {
					t.Errorf("stdout %q stderr %q, want %q %q", res.Stdout.Data, res.Stderr.Data, tc.stdout, tc.stderr)
				}
				if got := paths(res.Files); !slices.Equal(got, tc.files) {
					t.Errorf("files %v, want %v", got, tc.files)
				}
				if !reflect.DeepEqual(res.Violations, tc.violations) {
					t.Errorf("violations %+v, want %+v", res.Violations, tc.violations)
				}
				if res.Network == nil || len(res.Network) != 0 || res.NetworkSummary != nil {
					t.Errorf("network %v %+v, want an empty log and no summary without a proxy", res.Network, res.NetworkSummary)
				}
				if x.stdin != nil {
					// The writer of a command's open stdin learns that the
					// command ended, rather than blocking.
					errc := make(chan error, 1)
					go func() { _, err := x.stdin.Write([]byte("late")); errc <- err }()
					select {
					case err := <-errc:
						if err == nil {
							t.Errorf("stdin still open after the command ended")
						}
					case <-time.After(time.Second):
						t.Errorf("a write to stdin still blocks 1s after the command ended")
						x.stdin.Close()
					}
				}
				// The command the tier saw: the manifest's environment
				// with the spec's, the spec's directory and timeout.
				sb := p.sb.(*fakeSandbox)
				if len(sb.cmds) != 1 {
					t.Fatalf("the tier saw %d commands, want 1", len(sb.cmds))
				}
				cmd := sb.cmds[0]
				if !slices.Equal(cmd.Argv, tc.argv) || cmd.Dir != "/workspace/sub" || cmd.Timeout != 7*time.Second ||
					!slices.Contains(cmd.Env, "EXTRA=1") || !slices.Contains(cmd.Env, "HOME=/workspace") {
					t.Errorf("tier command %+v, want argv %v, dir /workspace/sub, timeout 7s, env with EXTRA=1 and HOME", cmd, tc.argv)
				}
			})
		}
	}
}

// TestExecStartChecksSessions: the session modes refuse a sandbox that
// cannot run commands one by one.
func TestExecStartChecksSessions(t *testing.T) {
	m := manifest.Default()
	p, snap := fakePrepared(t, m)
	p.sb = onlyExec{p.sb}
	for _, mode := range []execMode{execSessionOnce, execSession} {
		if _, err := p.start(context.Background(), m, &execSpec{mode: mode, argv: []string{"true"}, baseline: snap}); err == nil || !strings.Contains(err.Error(), "without sessions") {
			t.Errorf("mode %d: start error %v, want one about a sandbox without sessions", mode, err)
		}
	}
}

// onlyExec hides a sandbox's Sessioner.
type onlyExec struct{ tier.Sandbox }

// TestSessionCommandAcrossClose: a session's Close stops its egress proxy
// while a command is starting and finishing; neither may race with it
// (go test -race checks), and the command ended by the Close still reports
// the proxy's log rather than losing it.
func TestSessionCommandAcrossClose(t *testing.T) {
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"example.com"}
	for i := range 20 {
		p, snap := fakePrepared(t, m)
		eg, err := (&Engine{}).startEgress(t.TempDir(), m.Network, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.egress = eg
		x, err := p.start(context.Background(), m, &execSpec{mode: execSession, id: fmt.Sprint("c", i), argv: []string{"term"}, baseline: snap})
		if err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- p.close() }()
		res, err := x.wait(context.Background())
		if err != nil {
			t.Fatalf("wait: %v", err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("close: %v", err)
		}
		if res.Network == nil || res.NetworkSummary == nil {
			t.Fatalf("run %d: network log %v, summary %v: a command ended by Close lost its proxy's account", i, res.Network, res.NetworkSummary)
		}
	}
}

// TestEgressSocketPathTooLong: a run directory too deep for a Unix
// socket's name gets an error that names the path, the limit and the fix,
// not bind's bare "invalid argument".
func TestEgressSocketPathTooLong(t *testing.T) {
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"example.com"}
	deep := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.MkdirAll(deep, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := (&Engine{}).startEgress(deep, m.Network, nil)
	if err == nil || !strings.Contains(err.Error(), "MOAT_HOME") || !strings.Contains(err.Error(), deep) {
		t.Fatalf("startEgress in a deep directory = %v, want an error naming the path and MOAT_HOME", err)
	}
	ok, err := (&Engine{}).startEgress(t.TempDir(), m.Network, nil)
	if err != nil {
		t.Fatal(err)
	}
	ok.stop()
}
