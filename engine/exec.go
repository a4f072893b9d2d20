package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

// One exec path: a one-shot run (Engine.Run), a one-shot run served by a
// session sandbox (Request.Session) and a session's command
// (Session.Start) all run their program through start and
// (*execution).wait, which build the result's header, the two output
// captures and the command, and collect the outcome, the network log and
// the workspace diff. What differs between them is execSpec, not a copy.

// execMode is how a command runs in its sandbox, what a cancelled context
// does to it, and who receives Moat's own failures after it started.
type execMode int

const (
	// execOnce is a single-use sandbox's only command (tier.Sandbox.Exec):
	// the tier itself answers a cancelled ctx (SIGTERM, then after
	// tier.CancelGrace it kills everything).
	execOnce execMode = iota
	// execSessionOnce is the only command of a session sandbox with a
	// one-shot run's semantics: a cancelled ctx forwards SIGTERM, then
	// after tier.CancelGrace the sandbox is destroyed (and the result says
	// so). The red-team suite attacks the session machinery this way.
	execSessionOnce
	// execSession is one of a session's commands. ctx bounds only its
	// start: it runs until it exits, its timeout passes, it is signalled
	// or the session is closed. Its network log is its share of a proxy
	// that keeps serving the session's other commands, and Moat's own
	// failures after the start go into its result (infra-error), because
	// no caller waits for an error.
	execSession
)

// execSpec is one command and what differs between the modes.
type execSpec struct {
	mode execMode
	// id names the result.
	id   string
	argv []string
	// env is added to the manifest's environment.
	env map[string]string
	// dir is the working directory inside the sandbox.
	dir string
	// timeout bounds a session's command (0: Limits.Timeout); a
	// single-use sandbox always uses Limits.Timeout.
	timeout time.Duration
	// stdin is the program's input (nil: empty), unless stdinOpen makes
	// it a pipe whose writing end is execution.stdin.
	stdin     io.Reader
	stdinOpen bool
	// tty starts the command on a terminal (tier.Command.TTY).
	tty *tier.WindowSize
	// stdout and stderr, when set, receive the captured output as it
	// arrives (never more than the manifest's caps).
	stdout, stderr io.Writer
	// rawStdout receives all of stdout, uncapped (ExecRequest.RawStdout).
	rawStdout io.Writer
	// baseline is the workspace the diff compares with: the inputs as
	// copied in for a one-shot run, the workspace as the command found it
	// for a session's.
	baseline *workspace.Snapshot
	// gone, when set, reports that the workspace no longer exists (a
	// closed session): the result then has no diff.
	gone func() bool
}

// execution is one started command.
type execution struct {
	p              *prepared
	m              *manifest.Manifest
	mode           execMode
	res            *result.Result // the header, filled at start
	cmd            *tier.Command
	stdout, stderr *output.Capture
	wsDir          string
	baseline       *workspace.Snapshot
	gone           func() bool
	// netFrom and netBefore mark where a session command's share of the
	// proxy's log and summary begins.
	netFrom   int
	netBefore egress.Summary
	// eg is the session's proxy as the command started: its log stays
	// readable after a Close stops it, so a command ended by Close still
	// reports what it attempted.
	eg *egressRun
	// proc is the command in a session sandbox; nil for execOnce, whose
	// Exec runs the command to completion in wait.
	proc tier.Process
	// stdin is the writing end of the program's input when
	// execSpec.stdinOpen was set, else nil.
	stdin *io.PipeWriter
	// unwithheld is the result as it was before its output was withheld
	// (a flagged run with output.withhold_flagged): the incident's
	// evidence, never the caller's.
	unwithheld *result.Result
}

// evidence is res as an incident bundle keeps it: with the output and
// files withheld from the caller, if any were.
func (x *execution) evidence(res *result.Result) *result.Result {
	if x.unwithheld == nil {
		return res
	}
	full := *x.unwithheld
	full.Violations, full.Degradations, full.CopyOut = res.Violations, res.Degradations, res.CopyOut
	return &full
}

// start starts spec's command in p's sandbox; for execOnce it only gets it
// ready, since tier.Sandbox.Exec both starts and waits. The error is the
// tier's, unwrapped: callers say what failed.
func (p *prepared) start(ctx context.Context, m *manifest.Manifest, spec *execSpec) (*execution, error) {
	x := &execution{p: p, m: m, mode: spec.mode, wsDir: p.sb.Workspace().Dir, baseline: spec.baseline, gone: spec.gone}
	if eg := p.liveEgress(); spec.mode == execSession && eg != nil {
		// The sandbox's proxy serves every command: this command's share
		// is what was added after this point.
		// (Attempts less Unlogged is the length of the log at the same
		// instant.)
		x.eg = eg
		x.netBefore = eg.proxy.Summary()
		x.netFrom = x.netBefore.Attempts - x.netBefore.Unlogged
	}
	stdin := spec.stdin
	if spec.stdinOpen {
		r, w := io.Pipe()
		stdin, x.stdin = r, w
	}
	x.stdout = output.NewCapture(int64(m.Resources.StdoutBytes), spec.stdout)
	x.stderr = output.NewCapture(int64(m.Resources.StderrBytes), spec.stderr)
	x.res = &result.Result{
		Schema:   result.SchemaVersion,
		ID:       spec.id,
		Tier:     p.tier.Name(),
		Image:    result.Image{Name: p.img.Name, Digest: p.img.Digest, Source: p.img.Source, SourceDigest: p.img.SourceDigest},
		Manifest: m.Digest(),
		// A copy: the result outlives the request and is encoded while
		// nothing else may hold the manifest's map.
		Justifications: maps.Clone(m.Justifications),
		Command:        spec.argv,
		Pooled:         p.pooled,
		StartedAt:      time.Now().UTC(),
	}
	var stdout io.Writer = x.stdout
	if spec.rawStdout != nil {
		stdout = &rawTee{capture: x.stdout, raw: spec.rawStdout}
	}
	x.cmd = &tier.Command{
		Argv:    spec.argv,
		Env:     p.env(m, spec.env),
		Dir:     spec.dir,
		Stdin:   stdin,
		Stdout:  stdout,
		Stderr:  x.stderr,
		Timeout: spec.timeout,
		TTY:     spec.tty,
	}
	if spec.mode == execOnce {
		return x, nil
	}
	sess, ok := p.sb.(tier.Sessioner)
	if !ok {
		x.closeStdin(nil)
		return nil, errors.New("the tier prepared a sandbox without sessions")
	}
	proc, err := sess.Start(ctx, x.cmd)
	if err != nil {
		x.closeStdin(nil)
		return nil, err
	}
	x.proc = proc
	return x, nil
}

// wait waits for the command to end and collects its result: the
// outcome, the captured output, the network log and the workspace diff.
// Only the one-shot modes return an error (Moat failed); ctx matters only
// to them.
func (x *execution) wait(ctx context.Context) (*result.Result, error) {
	out, err := x.outcome(ctx)
	x.closeStdin(errors.New("the command has ended"))
	if err != nil {
		if x.mode != execSession {
			return nil, fmt.Errorf("run: %w", err)
		}
		out = &tier.Outcome{Termination: result.InfraError, ExitCode: 125, Error: err.Error()}
	}
	res := x.res
	res.Network, res.NetworkSummary, res.SecretsUsed = x.network()
	redacted := x.redact()
	fillOutcome(res, out, x.stdout, x.stderr, x.m)
	res.Violations = append(res.Violations, packageViolations(res.Network)...)
	if v := exfiltrationViolation(res.Network, res.NetworkSummary); v != nil {
		res.Violations = append(res.Violations, *v)
	}

	res.Files = []result.FileChange{}
	if x.gone != nil && x.gone() {
		x.report(res, redacted, x.p.egressCanarySeen())
		return res, nil
	}
	lim := x.p.lim
	files, err := workspace.Diff(x.wsDir, x.baseline, workspace.DiffLimits{MaxEntries: lim.WorkspaceFiles + 1, MaxHashBytes: lim.WorkspaceBytes})
	if files != nil {
		res.Files = files
	}
	v := workspace.Violations(err)
	if err != nil && len(v) == 0 && x.mode != execSession {
		return nil, fmt.Errorf("workspace diff: %w", err)
	}
	res.Violations = append(res.Violations, v...)
	x.report(res, redacted, x.p.egressCanarySeen())
	return res, nil
}

// outcome waits for the program, as its mode says.
func (x *execution) outcome(ctx context.Context) (*tier.Outcome, error) {
	switch x.mode {
	case execOnce:
		return x.p.sb.Exec(ctx, x.cmd)
	case execSession:
		return x.proc.Wait()
	}
	// execSessionOnce: a cancelled ctx forwards SIGTERM, then after the
	// grace period the sandbox is destroyed (and the outcome says so).
	type waited struct {
		out *tier.Outcome
		err error
	}
	done := make(chan waited, 1)
	go func() {
		out, err := x.proc.Wait()
		done <- waited{out, err}
	}()
	select {
	case w := <-done:
		return w.out, w.err
	case <-ctx.Done():
	}
	x.proc.Signal(unix.SIGTERM)
	select {
	case w := <-done:
		if w.out != nil {
			w.out.Violations = append(w.out.Violations, tier.Cancelled("the caller cancelled the run; SIGTERM was sent to the program"))
		}
		return w.out, w.err
	case <-time.After(tier.CancelGrace):
	}
	x.p.sb.Destroy()
	w := <-done
	if w.err == nil && w.out != nil {
		w.out.Violations = append(w.out.Violations, tier.Cancelled("the caller cancelled the run; SIGTERM was sent to the program, then the sandbox was destroyed after "+tier.CancelGrace.String()))
	}
	return w.out, w.err
}

// network is the command's network log and summary (an empty log and no
// summary without a proxy), and the secrets the proxy put into its
// requests.
func (x *execution) network() ([]result.NetworkAttempt, *result.NetworkSummary, []result.SecretUse) {
	if x.mode != execSession {
		// The program is gone and the sandbox serves no other: close the
		// proxy (and every connection through it) and take its log.
		return x.p.stopEgressSecrets()
	}
	eg := x.eg
	if eg == nil {
		return []result.NetworkAttempt{}, nil, nil
	}
	now := eg.proxy.Summary()
	return eg.attempts(x.netFrom), networkSummary(now.Since(x.netBefore)), secretUses(now.SecretsUsed, x.netBefore.SecretsUsed)
}

// closeStdin closes the writing end of an open stdin (writers then get
// err, or io.ErrClosedPipe when err is nil).
func (x *execution) closeStdin(err error) {
	if x.stdin != nil {
		x.stdin.CloseWithError(err)
	}
}

// fillOutcome copies what the tier observed, and the captured output, into
// the result.
func fillOutcome(res *result.Result, out *tier.Outcome, stdout, stderr *output.Capture, m *manifest.Manifest) {
	res.Termination = out.Termination
	res.Error = out.Error
	res.ExitCode = out.ExitCode
	res.Signal = out.Signal
	if out.Signal != 0 {
		res.SignalName = unix.SignalName(unix.Signal(out.Signal))
	}
	res.TimedOut = out.Termination == result.Timeout
	res.OOMKilled = out.Termination == result.OOM
	res.DurationMS = float64(out.Duration.Microseconds()) / 1000
	res.CPUMS = float64(out.CPU.Microseconds()) / 1000
	res.PeakMemoryBytes = out.PeakMemory
	res.Stdout = stdout.Stream()
	res.Stderr = stderr.Stream()
	res.Violations = append([]result.Violation{}, out.Violations...)
	res.Degradations = append([]string{}, out.Degradations...)
	res.Runtime = out.Runtime
	for _, s := range []struct {
		name string
		c    *output.Capture
		lim  manifest.Size
	}{{"stdout", stdout, m.Resources.StdoutBytes}, {"stderr", stderr, m.Resources.StderrBytes}} {
		if s.c.Truncated() {
			res.Violations = append(res.Violations, result.Violation{Kind: "output", Detail: fmt.Sprintf("%s truncated: %d bytes written, %d kept", s.name, s.c.Total(), len(s.c.Bytes())), Limit: fmt.Sprint(int64(s.lim))})
		}
	}
}

// rawTee is a command's stdout when its caller takes the whole stream
// (ExecRequest.RawStdout): the capture keeps the capped copy for the
// result, raw gets every byte. Write never fails, as Capture's never does,
// so the copier keeps draining the pipe; a failing raw writer is dropped.
type rawTee struct {
	capture *output.Capture
	mu      sync.Mutex
	raw     io.Writer
}

func (t *rawTee) Write(p []byte) (int, error) {
	t.capture.Write(p)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.raw != nil {
		if _, err := t.raw.Write(p); err != nil {
			t.raw = nil
		}
	}
	return len(p), nil
}
