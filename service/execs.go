package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// execution is one command of a sandbox, running or ended.
type execution struct {
	id        string // "e-N", unique within the sandbox
	auditID   string // "<sandbox>-e-N", unique in the audit log
	sb        *sandbox
	proc      Process
	argv      []string
	stdinOpen bool
	// kernel: the code interpreter's kernel, whose stdin is its own.
	kernel  bool
	pid     int      // in the sandbox (PidReporter); 0: not known
	tty     *TTYSize // guarded by mu once started
	started time.Time
	// untrack stops accruing the command's usage (before Finish).
	untrack func()
	log     *eventLog
	// done is closed once the result is recorded and the exit event is in
	// the log.
	done chan struct{}
	// stdinTurn serialises writes to stdin, so two uploads never
	// interleave.
	stdinTurn chan struct{}

	mu          sync.Mutex
	res         *result.Result
	ended       time.Time
	failed      bool
	interrupted string // Exec.Interrupted
	stdinClosed bool
}

func (ex *execution) view() Exec {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	v := Exec{ID: ex.id, SandboxID: ex.sb.id, State: ExecRunning, Argv: ex.argv, StdinOpen: ex.stdinOpen, Pid: ex.pid, StartedAt: ex.started, Result: ex.res, Interrupted: ex.interrupted}
	if ex.tty != nil {
		tty := *ex.tty
		v.TTY = &tty
	}
	if ex.res != nil {
		v.State = ExecExited
		if ex.failed {
			v.State = ExecFailed
		}
		ended := ex.ended
		v.EndedAt = &ended
	}
	return v
}

// programEnded reports whether the program has ended: its process's Done is
// closed before the server has recorded the end (ex.done), and a signal in
// between must be a conflict, not a failure.
func (ex *execution) programEnded() bool {
	select {
	case <-ex.proc.Done():
		return true
	default:
		return ex.isDone()
	}
}

func (ex *execution) isDone() bool {
	select {
	case <-ex.done:
		return true
	default:
		return false
	}
}

// StartExec starts a command in key's sandbox id and returns at once; the
// command runs until it ends (Wait), whoever is watching. ctx bounds only
// the start. The command holds one of the server-wide MaxConcurrent slots
// until it ends.
func (s *Service) StartExec(ctx context.Context, key audit.Key, id string, args ExecArgs) (Exec, error) {
	ex, err := s.startExec(ctx, key, id, args)
	if err != nil {
		return Exec{}, err
	}
	return ex.view(), nil
}

// RunExec starts a command as StartExec does and waits for it to end. When
// ctx ends first it returns ctx's error, and the command goes on.
func (s *Service) RunExec(ctx context.Context, key audit.Key, id string, args ExecArgs) (Exec, error) {
	ex, err := s.startExec(ctx, key, id, args)
	if err != nil {
		return Exec{}, err
	}
	select {
	case <-ex.done:
		return ex.view(), nil
	case <-ctx.Done():
		return Exec{}, ctx.Err()
	}
}

func (s *Service) startExec(ctx context.Context, key audit.Key, id string, args ExecArgs) (*execution, error) {
	return s.startScreened(ctx, key, id, args, nil)
}

// startExecApproved starts a command a person approved: the sandbox's
// effects session is advanced with it (it did run), and with
// RememberApprovals: session the approved effects are not asked again.
func (s *Service) startExecApproved(ctx context.Context, key audit.Key, id string, args ExecArgs, approved []effects.Effect) (*execution, error) {
	return s.startScreened(ctx, key, id, args, approved)
}

// startScreened starts a command after the effects screening; approved
// non-nil means a person approved it, so it is recorded, not screened.
func (s *Service) startScreened(ctx context.Context, key audit.Key, id string, args ExecArgs, approved []effects.Effect) (*execution, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	if limit := sb.manifest.Resources.Timeout.D(); args.CapTimeout && args.Timeout > limit {
		args.Timeout = limit
	}
	if e := CheckExec(&args, sb.manifest); e != nil {
		return nil, e
	}
	if p := s.effectsPolicy(); p != nil && args.kernel == nil {
		// (The code kernel's driver is Moat's own code; its cells are
		// screened one by one, in StartCell.)
		// Analysed on a clone, kept only when the command may run: a
		// refused or held command's writes must not count for the next
		// ones. The analysis is bounded (effects.MaxSteps), so holding
		// sb.mu for it is short, and it orders the session's commands.
		sb.mu.Lock()
		clone := sb.fx.Clone()
		var held, denied []effects.Decided
		if approved != nil {
			clone.Exec(args.Argv)
			for _, ef := range approved {
				sb.remembered[effectKey(ef)] = true
			}
		} else {
			held, denied = screen(p, clone, args.Argv, sb.remembered)
		}
		if denied == nil && held == nil {
			sb.fx = clone
		}
		sb.mu.Unlock()
		if denied != nil {
			return nil, s.refuse(key, sb.id, sb.manifest, args.Argv, denied)
		}
		if held != nil {
			return nil, s.holdForApproval(key, sb.id, sb.manifest, args.Argv, held, nil, &args)
		}
	}
	leave, e := s.enter()
	if e != nil {
		return nil, e
	}
	defer leave()
	s.mu.Lock()
	state := sb.state
	s.mu.Unlock()
	if state != StateRunning {
		return nil, conflict("sandbox %s is being deleted", sb.id)
	}
	if e := s.checkCPU(key); e != nil {
		return nil, e
	}
	slot, e := s.acquire(ctx)
	if e != nil {
		return nil, e
	}
	started := false
	defer func() {
		if !started {
			slot()
		}
	}()

	sb.mu.Lock()
	sb.seq++
	n := sb.seq
	sb.mu.Unlock()
	m := sb.manifest
	ex := &execution{
		id:        fmt.Sprintf("e-%d", n),
		sb:        sb,
		argv:      args.Argv,
		stdinOpen: args.StdinOpen,
		kernel:    args.kernel != nil,
		tty:       args.TTY,
		log:       newEventLog(int64(m.Resources.StdoutBytes), int64(m.Resources.StderrBytes)),
		done:      make(chan struct{}),
		stdinTurn: make(chan struct{}, 1),
	}
	ex.auditID = sb.id + "-" + ex.id
	rec := auditRecord(ex.auditID, audit.KindExec, key.ID, sb.id, m, args.Argv)
	rec.Tier, rec.Image, rec.ImageDigest, rec.Pooled = sb.info.Tier, sb.info.Image.Name, sb.info.Image.Digest, sb.info.Pooled
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		return nil, InternalError(fmt.Errorf("audit: begin exec %s: %w", ex.auditID, err))
	}
	req := &engine.ExecRequest{
		Argv:      args.Argv,
		Env:       args.Env,
		Dir:       args.Dir,
		Timeout:   args.Timeout,
		StdinOpen: args.StdinOpen,
		Stdin:     args.Stdin,
		Stdout:    streamWriter{ex.log, stdoutStream},
		Stderr:    streamWriter{ex.log, stderrStream},
		Evidence:  evidence(key, rec),
	}
	if args.kernel != nil {
		// The kernel's stdout is its protocol: all of it to the decoder,
		// which bounds what it keeps per cell; none to the event log.
		req.Stdout, req.RawStdout = nil, args.kernel
	}
	if args.TTY != nil {
		req.TTY = &tier.WindowSize{Rows: uint16(args.TTY.Rows), Cols: uint16(args.TTY.Cols)}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	ex.started = time.Now().UTC()
	usage, untrack := s.track(ex.auditID, rec.Started)
	if cr, ok := sb.sess.(CPUReporter); ok {
		// The sandbox's CPU since the command started: what commands
		// running at once use is charged to each, as their results do.
		if base, err := cr.CPU(); err == nil {
			usage.setCPU(cr.CPU, base)
		}
	}
	ex.untrack = untrack
	proc, err := guard("session Start", "a process", func() (Process, error) { return sb.sess.Start(ctx, req) })
	if err != nil {
		untrack()
		if ferr := s.cfg.Auditor.Finish(ex.auditID, nil, err); ferr != nil {
			s.log.Error("audit: finish exec", "exec", ex.auditID, "err", ferr)
		}
		if s.checkEnded(sb, err) {
			return nil, &Error{Kind: Conflict, Err: err,
				Message: fmt.Sprintf("sandbox %s has ended: its init process exited (did a command kill PID 1?), so it can run nothing more; it was destroyed: create a new sandbox", sb.id)}
		}
		return nil, requestError(err, "command", "")
	}
	ex.proc = proc
	if pr, ok := proc.(PidReporter); ok {
		// Waits (bounded) for the tier's report of the start.
		pid := pr.Pid()
		ex.mu.Lock()
		ex.pid = pid
		ex.mu.Unlock()
	}
	started = true
	sb.mu.Lock()
	sb.count++
	sb.execs = append(sb.execs, ex)
	sb.trimLocked(s.cfg.KeepExecs)
	sb.mu.Unlock()
	s.goSafe("exec watcher", func() { s.watch(ex, slot) })
	return ex, nil
}

// CheckExec refuses a command the sandbox's manifest m cannot run, naming
// the field: an empty argv, NUL bytes, bad variable names, a relative
// working directory, a timeout above the manifest's.
func CheckExec(args *ExecArgs, m *manifest.Manifest) *Error {
	if len(args.Argv) == 0 {
		return InvalidField("argv", "is missing: give argv, e.g. [\"python3\", \"main.py\"], or code with language")
	}
	for i, a := range args.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return InvalidField(fmt.Sprintf("argv[%d]", i), "contains a NUL byte, which no program can receive")
		}
	}
	if args.Argv[0] == "" {
		return InvalidField("argv[0]", "is empty; it names the program, e.g. \"python3\"")
	}
	if len(args.Env) > maxEnv {
		return InvalidField("env", "has %d variables; at most %d are accepted", len(args.Env), maxEnv)
	}
	for k, v := range args.Env {
		field := strictjson.JoinField("env", k)
		if !ValidEnvName(k) {
			return InvalidField(field, "%s is not a variable name (letters, digits and _, not starting with a digit)", Quote(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return InvalidField(field, "contains a NUL byte")
		}
	}
	if args.Dir != "" {
		switch {
		case !strings.HasPrefix(args.Dir, "/"):
			return InvalidField("dir", "%s is not absolute; give a directory such as \"/workspace/src\"", Quote(args.Dir))
		case len(args.Dir) > MaxPathLen || strings.IndexByte(args.Dir, 0) >= 0 || !utf8.ValidString(args.Dir):
			return InvalidField("dir", "%s is not a usable directory", Quote(args.Dir))
		}
	}
	switch limit := m.Resources.Timeout.D(); {
	case args.Timeout < 0:
		return InvalidField("timeout", "%s is not positive", Quote(args.Timeout.String()))
	case args.Timeout > limit:
		return InvalidField("timeout", "%s is above the sandbox's resources.timeout %s", Quote(args.Timeout.String()), limit)
	}
	if args.StdinOpen && args.Stdin != nil {
		return InvalidField("stdin", "cannot be combined with stdin_open; send the input with POST …/stdin instead")
	}
	if args.TTY != nil {
		if e := checkTTYSize("tty", *args.TTY); e != nil {
			return e
		}
	}
	return nil
}

// MaxTTYSide bounds a terminal's rows and columns.
const MaxTTYSide = 1000

// checkTTYSize refuses a terminal size a terminal cannot have.
func checkTTYSize(field string, ws TTYSize) *Error {
	if ws.Rows < 1 || ws.Rows > MaxTTYSide || ws.Cols < 1 || ws.Cols > MaxTTYSide {
		return InvalidField(field, "%d rows by %d columns is not a terminal size: give rows and cols from 1 to %d, e.g. {\"rows\": 24, \"cols\": 80}", ws.Rows, ws.Cols, MaxTTYSide)
	}
	return nil
}

// maxEnv bounds a command's environment variables.
const maxEnv = 1024

// ValidEnvName reports whether s can name an environment variable:
// letters, digits and _, not starting with a digit, at most 256 bytes.
func ValidEnvName(s string) bool {
	if s == "" || len(s) > 256 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// trimLocked drops the oldest ended commands beyond keep; sb.mu is held.
func (sb *sandbox) trimLocked(keep int) {
	ended := 0
	for _, ex := range sb.execs {
		if ex.isDone() {
			ended++
		}
	}
	if ended <= keep {
		return
	}
	drop := ended - keep
	kept := sb.execs[:0]
	for _, ex := range sb.execs {
		if drop > 0 && ex.isDone() {
			drop--
			continue
		}
		kept = append(kept, ex)
	}
	clear(sb.execs[len(kept):])
	sb.execs = kept
}

// watch waits for a command to end, then records its result: audit,
// metrics, the exit event. It holds the command's server-wide slot until
// then.
func (s *Service) watch(ex *execution, slot func()) {
	defer slot()
	// Whatever happens below, waiters and streams must be released.
	defer close(ex.done)
	defer ex.log.end()
	<-ex.proc.Done()
	res := ex.proc.Result()
	var runErr error
	failed := false
	if res == nil {
		runErr = errors.New("the engine reported no result for this command")
		failed = true
		res = &result.Result{
			Schema:      result.SchemaVersion,
			ID:          ex.proc.ID(),
			Tier:        ex.sb.info.Tier,
			Image:       ex.sb.info.Image,
			Manifest:    ex.sb.info.ManifestDigest,
			Command:     ex.argv,
			Termination: result.InfraError,
			StartedAt:   ex.started,
			Files:       []result.FileChange{},
			Network:     []result.NetworkAttempt{},
			Violations:  []result.Violation{},
			Error:       runErr.Error(),
		}
	}
	failed = failed || res.Termination == result.InfraError
	interrupted := ex.sb.interrupted(res)
	ex.mu.Lock()
	ex.res, ex.ended, ex.failed, ex.interrupted = res, time.Now().UTC(), failed, interrupted
	ex.mu.Unlock()
	ex.untrack()
	finishRes := res
	if runErr != nil {
		finishRes = nil
	}
	if err := s.cfg.Auditor.Finish(ex.auditID, finishRes, runErr); err != nil {
		s.log.Error("audit: finish exec", "exec", ex.auditID, "err", err)
	}
	s.observe(res)
	if failed {
		// A command that took the sandbox's init with it (kill 1) ends
		// the sandbox: destroy it rather than report it running while
		// every later command fails.
		s.goSafe("check an ended sandbox", func() { s.checkEnded(ex.sb, nil) })
	}
}

// Resize sets the terminal size of command eid of key's sandbox id, which
// was started with a TTY; the command gets SIGWINCH.
func (s *Service) Resize(ctx context.Context, key audit.Key, id, eid string, ws TTYSize) (Exec, error) {
	if e := checkTTYSize("size", ws); e != nil {
		return Exec{}, e
	}
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return Exec{}, e
	}
	ex.mu.Lock()
	hasTTY := ex.tty != nil
	ex.mu.Unlock()
	if !hasTTY {
		return Exec{}, conflict("command %s was not started with a terminal (\"tty\"), so it has no size to change", ex.id)
	}
	r, ok := ex.proc.(Resizer)
	if ex.programEnded() || !ok {
		return Exec{}, conflict("command %s has already ended", ex.id)
	}
	if err := r.Resize(tier.WindowSize{Rows: uint16(ws.Rows), Cols: uint16(ws.Cols)}); err != nil {
		if ex.programEnded() {
			return Exec{}, conflict("command %s has already ended", ex.id)
		}
		return Exec{}, backendError(err, "size")
	}
	ex.mu.Lock()
	ex.tty = &ws
	ex.mu.Unlock()
	return ex.view(), nil
}

// lookupExec finds command eid in key's sandbox id.
func (s *Service) lookupExec(key audit.Key, id, eid string) (*execution, *Error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, ex := range sb.execs {
		if ex.id == eid {
			return ex, nil
		}
	}
	return nil, notFound("command " + Quote(eid) + " in sandbox " + sb.id)
}

// ListExecs is the commands of key's sandbox id that it remembers: the
// running ones and the last KeepExecs ended ones, in start order.
func (s *Service) ListExecs(ctx context.Context, key audit.Key, id string) ([]Exec, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	sb.mu.Lock()
	execs := append([]*execution(nil), sb.execs...)
	sb.mu.Unlock()
	list := make([]Exec, 0, len(execs))
	for _, ex := range execs {
		list = append(list, ex.view())
	}
	return list, nil
}

// GetExec describes command eid of key's sandbox id.
func (s *Service) GetExec(ctx context.Context, key audit.Key, id, eid string) (Exec, error) {
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return Exec{}, e
	}
	return ex.view(), nil
}

// WaitExec waits for command eid of key's sandbox id to end and describes
// it, or returns ctx's error when ctx ends first (the command goes on).
func (s *Service) WaitExec(ctx context.Context, key audit.Key, id, eid string) (Exec, error) {
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return Exec{}, e
	}
	select {
	case <-ex.done:
		return ex.view(), nil
	case <-ctx.Done():
		return Exec{}, ctx.Err()
	}
}

// Event is one output event of a command: a range of its stdout or
// stderr. Ids count from 1; the exit event follows the last.
type Event struct {
	ID     int
	Stream string // "stdout" or "stderr"
	Data   []byte
}

// Feed reads a command's events; see Events.
type Feed struct {
	ex *execution
}

// Events opens the event log of command eid of key's sandbox id. The log
// keeps the command's output up to the manifest's caps, so a reader may
// start from any event id (resume after a reconnect).
func (s *Service) Events(ctx context.Context, key audit.Key, id, eid string) (*Feed, error) {
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return nil, e
	}
	return &Feed{ex: ex}, nil
}

// Read returns the events after id after, the exit event's id once the
// command has ended (else 0), and a channel closed on the next change.
// An event, once returned, never changes.
func (f *Feed) Read(after int) (events []Event, exitID int, notify <-chan struct{}) {
	evs, exitID, notify := f.ex.log.read(after)
	out := make([]Event, len(evs))
	for i, ev := range evs {
		out[i] = Event{ID: ev.id, Stream: ev.stream.String(), Data: ev.data}
	}
	return out, exitID, notify
}

// Exec describes the command now (after the exit event: its result).
func (f *Feed) Exec() Exec { return f.ex.view() }

// WriteStdin copies r to the stdin of command eid of key's sandbox id, and
// closes it after when eof is set. It returns the bytes the program took.
// Writes are serialised. A program that does not read blocks the copy
// until ctx ends. An error reading r is a BadRequest wrapping it.
func (s *Service) WriteStdin(ctx context.Context, key audit.Key, id, eid string, r io.Reader, eof bool) (int64, error) {
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return 0, e
	}
	stdin := ex.proc.Stdin()
	if ex.kernel {
		return 0, conflict("command %s is the sandbox's code kernel: its stdin carries its protocol; send code with POST /v1/sandboxes/%s/cells", ex.id, ex.sb.id)
	}
	if !ex.stdinOpen || stdin == nil {
		return 0, conflict("command %s was not started with \"stdin_open\": true", ex.id)
	}
	select {
	case ex.stdinTurn <- struct{}{}:
		defer func() { <-ex.stdinTurn }()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	ex.mu.Lock()
	closed := ex.stdinClosed
	ex.mu.Unlock()
	switch {
	case closed:
		return 0, conflict("stdin of command %s is already closed", ex.id)
	case ex.isDone():
		return 0, conflict("command %s has already ended", ex.id)
	}
	// A program that does not read fills the pipe and blocks the write;
	// when the caller gives up, a pipe's write deadline unblocks it.
	if d, ok := stdin.(interface{ SetWriteDeadline(time.Time) error }); ok {
		d.SetWriteDeadline(time.Time{})
		stop := context.AfterFunc(ctx, func() { d.SetWriteDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	n, rerr, werr := copyStdin(stdin, r)
	switch {
	case rerr != nil:
		return n, &Error{Kind: BadRequest, Message: fmt.Sprintf("reading the request body: %v", rerr), Err: rerr}
	case werr != nil:
		return n, &Error{Kind: Conflict, Err: werr,
			Message: fmt.Sprintf("stdin of command %s took %d bytes and then refused more: the program has ended or closed its stdin", ex.id, n)}
	}
	if eof {
		ex.mu.Lock()
		ex.stdinClosed = true
		ex.mu.Unlock()
		if err := stdin.Close(); err != nil && !ex.isDone() {
			return n, backendError(err, "stdin")
		}
	}
	return n, nil
}

// copyStdin copies like io.Copy but says which side failed.
func copyStdin(dst io.Writer, src io.Reader) (n int64, rerr, werr error) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			m, err := dst.Write(buf[:k])
			n += int64(m)
			if err != nil {
				return n, nil, err
			}
		}
		if errors.Is(err, io.EOF) {
			return n, nil, nil
		}
		if err != nil {
			return n, err, nil
		}
	}
}

// Signal sends sig to command eid of key's sandbox id. A command that has
// ended is a Conflict.
func (s *Service) Signal(ctx context.Context, key audit.Key, id, eid string, sig unix.Signal) (Exec, error) {
	ex, e := s.lookupExec(key, id, eid)
	if e != nil {
		return Exec{}, e
	}
	if ex.programEnded() {
		return Exec{}, conflict("command %s has already ended", ex.id)
	}
	if err := ex.proc.Signal(sig); err != nil {
		if ex.programEnded() {
			return Exec{}, conflict("command %s has already ended", ex.id)
		}
		return Exec{}, backendError(err, "command")
	}
	return ex.view(), nil
}
