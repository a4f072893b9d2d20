package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
)

// execution is one command of a sandbox, running or ended.
type execution struct {
	id        string // "e-N", unique within the sandbox
	auditID   string // "<sandbox>-e-N", unique in the audit log
	sb        *sandbox
	proc      Process
	argv      []string
	stdinOpen bool
	started   time.Time
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
	stdinClosed bool
}

func (ex *execution) view() Exec {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	v := Exec{ID: ex.id, SandboxID: ex.sb.id, State: ExecRunning, Argv: ex.argv, StdinOpen: ex.stdinOpen, StartedAt: ex.started, Result: ex.res}
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

func (s *Server) createExec(w http.ResponseWriter, r *http.Request) error {
	key := keyOf(r)
	sb, e := s.lookup(r)
	if e != nil {
		return e
	}
	if e := requireJSON(r); e != nil {
		return e
	}
	data, e := readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	spec, e := decodeExec(data, sb.manifest)
	if e != nil {
		return e
	}
	leave, e := s.enter()
	if e != nil {
		return e
	}
	defer leave()
	s.mu.Lock()
	state := sb.state
	s.mu.Unlock()
	if state != StateRunning {
		return conflict("sandbox %s is being deleted", sb.id)
	}
	if e := s.checkCPU(key); e != nil {
		return e
	}
	slot, e := s.acquire(r.Context())
	if e != nil {
		return e
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
		argv:      spec.argv,
		stdinOpen: spec.stdinOpen,
		log:       newEventLog(int64(m.Resources.StdoutBytes), int64(m.Resources.StderrBytes)),
		done:      make(chan struct{}),
		stdinTurn: make(chan struct{}, 1),
	}
	ex.auditID = sb.id + "-" + ex.id
	rec := auditRecord(ex.auditID, audit.KindExec, key.ID, sb.id, m, spec.argv)
	rec.Tier, rec.Image, rec.ImageDigest, rec.Pooled = sb.info.Tier, sb.info.Image.Name, sb.info.Image.Digest, sb.info.Pooled
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		return internal(fmt.Errorf("audit: begin exec %s: %w", ex.auditID, err))
	}
	req := &engine.ExecRequest{
		Argv:      spec.argv,
		Env:       spec.env,
		Dir:       spec.dir,
		Timeout:   spec.timeout,
		StdinOpen: spec.stdinOpen,
		Stdout:    streamWriter{ex.log, stdoutStream},
		Stderr:    streamWriter{ex.log, stderrStream},
	}
	if len(spec.stdin) > 0 {
		req.Stdin = bytes.NewReader(spec.stdin)
	}
	ctx, cancel := context.WithCancel(r.Context())
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
			return &Error{Status: http.StatusConflict, Code: CodeConflict, Err: err,
				Message: fmt.Sprintf("sandbox %s has ended: its init process exited (did a command kill PID 1?), so it can run nothing more; it was destroyed: create a new sandbox", sb.id)}
		}
		return requestError(err, "command", "")
	}
	ex.proc = proc
	started = true
	sb.mu.Lock()
	sb.count++
	sb.execs = append(sb.execs, ex)
	sb.trimLocked(s.cfg.KeepExecs)
	sb.mu.Unlock()
	s.goSafe("exec watcher", func() { s.watch(ex, slot) })
	leave()

	if !spec.wait {
		return writeJSON(w, http.StatusAccepted, ex.view())
	}
	select {
	case <-ex.done:
		return writeJSON(w, http.StatusOK, ex.view())
	case <-r.Context().Done():
		// The client left; the command goes on (docs/API.md).
		return nil
	}
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
func (s *Server) watch(ex *execution, slot func()) {
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
	ex.mu.Lock()
	ex.res, ex.ended, ex.failed = res, time.Now().UTC(), failed
	ex.mu.Unlock()
	ex.untrack()
	finishRes := res
	if runErr != nil {
		finishRes = nil
	}
	if err := s.cfg.Auditor.Finish(ex.auditID, finishRes, runErr); err != nil {
		s.log.Error("audit: finish exec", "exec", ex.auditID, "err", err)
	}
	s.metrics.observe(res)
	if failed {
		// A command that took the sandbox's init with it (kill 1) ends
		// the sandbox: destroy it rather than report it running while
		// every later command fails.
		s.goSafe("check an ended sandbox", func() { s.checkEnded(ex.sb, nil) })
	}
}

// lookupExec finds {eid} in the caller's sandbox {id}.
func (s *Server) lookupExec(r *http.Request) (*execution, *Error) {
	sb, e := s.lookup(r)
	if e != nil {
		return nil, e
	}
	eid := r.PathValue("eid")
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, ex := range sb.execs {
		if ex.id == eid {
			return ex, nil
		}
	}
	return nil, notFound("command " + quote(eid) + " in sandbox " + sb.id)
}

func (s *Server) listExecs(w http.ResponseWriter, r *http.Request) error {
	sb, e := s.lookup(r)
	if e != nil {
		return e
	}
	sb.mu.Lock()
	execs := append([]*execution(nil), sb.execs...)
	sb.mu.Unlock()
	list := ExecList{Execs: make([]Exec, 0, len(execs))}
	for _, ex := range execs {
		list.Execs = append(list.Execs, ex.view())
	}
	return writeJSON(w, http.StatusOK, list)
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request) error {
	ex, e := s.lookupExec(r)
	if e != nil {
		return e
	}
	return writeJSON(w, http.StatusOK, ex.view())
}

// keepaliveEvery is how often an idle event stream sends a comment, so
// proxies keep it open and a vanished client is noticed.
var keepaliveEvery = 15 * time.Second

// execEvents serves the command's events as Server-Sent Events, from
// after the client's Last-Event-ID (or ?after=). A client that goes away
// ends only this stream.
func (s *Server) execEvents(w http.ResponseWriter, r *http.Request) error {
	ex, e := s.lookupExec(r)
	if e != nil {
		return e
	}
	after, e := lastEventID(r)
	if e != nil {
		return e
	}
	s.streams.Add(1)
	defer s.streams.Add(-1)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would otherwise hold events back
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// A client that stops reading must not pin this goroutine: every
	// flush has a deadline. The deadline is lifted at the end because the
	// connection may serve further requests.
	defer rc.SetWriteDeadline(time.Time{})
	var buf bytes.Buffer
	flush := func() bool {
		rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false
		}
		buf.Reset()
		return rc.Flush() == nil
	}
	keepalive := time.NewTicker(keepaliveEvery)
	defer keepalive.Stop()
	buf.WriteString(": moat event stream\n\n")
	for {
		evs, exitID, notify := ex.log.read(after)
		for _, ev := range evs {
			writeEvent(&buf, ev.id, ev.stream.String(), outputEvent(ev.data))
			after = ev.id
		}
		if exitID > 0 && after < exitID {
			writeEvent(&buf, exitID, "exit", ex.view())
		}
		if !flush() || exitID > 0 {
			return nil
		}
		select {
		case <-notify:
		case <-keepalive.C:
			buf.WriteString(": keepalive\n\n")
		case <-r.Context().Done():
			return nil
		case <-s.stopCtx.Done():
			return nil
		}
	}
}

func writeEvent(buf *bytes.Buffer, id int, name string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		data = []byte(`{}`)
	}
	// json.Marshal never writes a newline, so data is one SSE data line.
	fmt.Fprintf(buf, "id: %d\nevent: %s\ndata: %s\n\n", id, name, data)
}

func outputEvent(b []byte) OutputEvent {
	if utf8.Valid(b) {
		return OutputEvent{Data: string(b), Encoding: "utf-8"}
	}
	return OutputEvent{Data: base64.StdEncoding.EncodeToString(b), Encoding: "base64"}
}

// lastEventID is where a stream resumes: the Last-Event-ID header (what an
// EventSource sends when it reconnects), else ?after=, else 0.
func lastEventID(r *http.Request) (int, *Error) {
	field, v := "Last-Event-ID", r.Header.Get("Last-Event-ID")
	if v == "" {
		field, v = "after", r.URL.Query().Get("after")
	}
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, invalid(field, "%s is not an event id (a non-negative integer)", quote(v))
	}
	return n, nil
}

func (s *Server) execStdin(w http.ResponseWriter, r *http.Request) error {
	ex, e := s.lookupExec(r)
	if e != nil {
		return e
	}
	eof := false
	switch v := r.URL.Query().Get("eof"); v {
	case "", "0", "false":
	case "1", "true":
		eof = true
	default:
		return invalid("eof", "%s is not 1 or 0", quote(v))
	}
	stdin := ex.proc.Stdin()
	if !ex.stdinOpen || stdin == nil {
		return conflict("command %s was not started with \"stdin_open\": true", ex.id)
	}
	select {
	case ex.stdinTurn <- struct{}{}:
		defer func() { <-ex.stdinTurn }()
	case <-r.Context().Done():
		return nil
	}
	ex.mu.Lock()
	closed := ex.stdinClosed
	ex.mu.Unlock()
	switch {
	case closed:
		return conflict("stdin of command %s is already closed", ex.id)
	case ex.isDone():
		return conflict("command %s has already ended", ex.id)
	}
	// A program that does not read fills the pipe and blocks the write;
	// when the client gives up, a pipe's write deadline unblocks it.
	if d, ok := stdin.(interface{ SetWriteDeadline(time.Time) error }); ok {
		d.SetWriteDeadline(time.Time{})
		stop := context.AfterFunc(r.Context(), func() { d.SetWriteDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	n, rerr, werr := copyStdin(stdin, http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	switch {
	case rerr != nil:
		return bodyError(rerr, s.cfg.MaxBodyBytes)
	case werr != nil:
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Err: werr,
			Message: fmt.Sprintf("stdin of command %s took %d bytes and then refused more: the program has ended or closed its stdin", ex.id, n)}
	}
	if eof {
		ex.mu.Lock()
		ex.stdinClosed = true
		ex.mu.Unlock()
		if err := stdin.Close(); err != nil && !ex.isDone() {
			return backendError(err, "stdin")
		}
	}
	return writeJSON(w, http.StatusOK, StdinResult{Written: n, Closed: eof})
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

func (s *Server) execSignal(w http.ResponseWriter, r *http.Request) error {
	ex, e := s.lookupExec(r)
	if e != nil {
		return e
	}
	var req SignalRequest
	if e := readJSON(w, r, s.cfg.MaxBodyBytes, &req); e != nil {
		return e
	}
	sig, e := parseSignal(req.Signal)
	if e != nil {
		return e
	}
	if ex.programEnded() {
		return conflict("command %s has already ended", ex.id)
	}
	if err := ex.proc.Signal(sig); err != nil {
		if ex.programEnded() {
			return conflict("command %s has already ended", ex.id)
		}
		return backendError(err, "command")
	}
	return writeJSON(w, http.StatusOK, ex.view())
}

// parseSignal reads "SIGTERM", "TERM", "sigterm", 15 or "15".
func parseSignal(raw json.RawMessage) (unix.Signal, *Error) {
	const accepted = "give a name such as \"SIGTERM\", \"TERM\" or \"SIGKILL\", or a number such as 15"
	if len(raw) == 0 || string(raw) == "null" {
		return 0, invalid("signal", "is missing; %s", accepted)
	}
	var text string
	if err := json.Unmarshal(raw, &text); err != nil {
		var num json.Number
		if err := json.Unmarshal(raw, &num); err != nil {
			return 0, invalid("signal", "is neither a string nor a number; %s", accepted)
		}
		text = num.String()
	}
	if n, err := strconv.Atoi(text); err == nil {
		// 32 and 33 are the C library's own; 0 sends nothing.
		if n < 1 || n > 64 || n == 32 || n == 33 {
			return 0, invalid("signal", "%d is not a signal number (1-31, 34-64)", n)
		}
		return unix.Signal(n), nil
	}
	name := strings.ToUpper(strings.TrimSpace(text))
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig := unix.SignalNum(name)
	if sig == 0 {
		return 0, invalid("signal", "%s is not a signal; %s", quote(text), accepted)
	}
	return sig, nil
}

// The two output streams of a command.
type stream uint8

const (
	stdoutStream stream = iota
	stderrStream
)

func (s stream) String() string {
	if s == stderrStream {
		return "stderr"
	}
	return "stdout"
}

// maxEvents bounds the output events of one command. Writes are merged
// into the last event until a reader has seen it, so only a program that
// alternates stdout and stderr in tiny writes while a client reads gets
// near it; past it, the live stream skips output (the exit event's result
// still has all of it, up to the caps).
const maxEvents = 1 << 16

// eventLog is a command's output as ordered events with ids 1, 2, …, then
// the exit event. It keeps at most the stdout and stderr caps of bytes
// (one buffer per stream; an event is a range of one), so its memory is
// bounded by the manifest. An event is sealed, and never changes again,
// once a reader has seen it: that is what makes resuming exact.
type eventLog struct {
	mu     sync.Mutex
	bufs   [2][]byte
	caps   [2]int64
	events []outEvent
	sealed int // events[:sealed] are visible and frozen
	ended  bool
	// notify is closed and replaced on every change, waking readers.
	notify chan struct{}
}

type outEvent struct {
	stream   stream
	off, end int
}

// streamEvent is a sealed event as a reader gets it.
type streamEvent struct {
	id     int
	stream stream
	data   []byte
}

func newEventLog(stdoutCap, stderrCap int64) *eventLog {
	return &eventLog{caps: [2]int64{stdoutCap, stderrCap}, notify: make(chan struct{})}
}

// streamWriter is the ExecRequest's Stdout or Stderr. The engine calls it
// with its capture's lock held, so it must not block: it only appends.
type streamWriter struct {
	l *eventLog
	s stream
}

func (w streamWriter) Write(p []byte) (int, error) {
	w.l.write(w.s, p)
	return len(p), nil
}

func (l *eventLog) write(s stream, p []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	buf := l.bufs[s]
	room := l.caps[s] - int64(len(buf))
	if room <= 0 || len(p) == 0 {
		return
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n := len(l.events)
	if n == l.sealed || l.events[n-1].stream != s {
		if n >= maxEvents {
			return
		}
		l.events = append(l.events, outEvent{stream: s, off: len(buf), end: len(buf)})
	}
	// Written bytes are never modified, so a reader may keep a slice of
	// an old backing array after this append moves the buffer.
	l.bufs[s] = append(buf, p...)
	l.events[len(l.events)-1].end = len(l.bufs[s])
	l.broadcast()
}

func (l *eventLog) broadcast() {
	close(l.notify)
	l.notify = make(chan struct{})
}

// end marks the command ended: no more output, and the exit event (id
// len(events)+1) follows the last output event.
func (l *eventLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		l.broadcast()
	}
}

// read seals what is pending and returns the events after id after, the
// exit event's id once the command has ended (else 0), and a channel
// closed on the next change.
func (l *eventLog) read(after int) ([]streamEvent, int, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seal()
	var out []streamEvent
	for i := max(after, 0); i < l.sealed; i++ {
		ev := l.events[i]
		out = append(out, streamEvent{id: i + 1, stream: ev.stream, data: l.bufs[ev.stream][ev.off:ev.end:ev.end]})
	}
	exitID := 0
	if l.ended {
		exitID = len(l.events) + 1
	}
	return out, exitID, l.notify
}

// seal freezes every event, except that while the command runs an
// incomplete UTF-8 sequence at the very end is held back for the next
// write, so that text split across writes still arrives as text.
func (l *eventLog) seal() {
	n := len(l.events)
	if l.ended || n == l.sealed {
		l.sealed = n
		return
	}
	last := &l.events[n-1]
	data := l.bufs[last.stream][last.off:last.end]
	cut := completeUTF8(data)
	switch {
	case cut == len(data):
		l.sealed = n
	case cut == 0:
		l.sealed = n - 1
	default:
		rest := outEvent{stream: last.stream, off: last.off + cut, end: last.end}
		last.end = last.off + cut
		l.events = append(l.events, rest)
		l.sealed = n
	}
}

// completeUTF8 is the length of b without a trailing incomplete UTF-8
// sequence.
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		c := b[i]
		if c < utf8.RuneSelf {
			return len(b)
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}
