package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// The event types of an exec's stream.
const (
	EventStdout = "stdout" // Data holds output bytes
	EventStderr = "stderr" // Data holds output bytes
	EventExit   = "exit"   // Exec holds the finished command; the stream ends
)

// Event is one Server-Sent Event of a command's stream.
type Event struct {
	// ID increases along the stream; pass the last one seen as after to
	// Events to continue from there.
	ID int64
	// Type is EventStdout, EventStderr, EventExit, or a type this client
	// does not know (then only Raw is set).
	Type string
	// Data is the output of a stdout or stderr event, decoded from text
	// or base64.
	Data []byte
	// Exec is the finished command of an exit event.
	Exec *Exec
	// Raw is the event's data field as sent.
	Raw json.RawMessage
}

// maxEventBytes bounds one event. Output events carry chunks of a stream
// that is itself capped by the manifest; the bound keeps a broken or
// hostile server from growing the client's memory without end.
const maxEventBytes = 32 << 20

// errEventTooLarge ends a stream: resuming would fetch the same event.
var errEventTooLarge = fmt.Errorf("an event is larger than %d bytes", maxEventBytes)

// EventStream is the live output of one command. Read it with Next and
// Event until Next returns false, then check Err:
//
//	for st.Next() {
//		ev := st.Event()
//		...
//	}
//	if err := st.Err(); err != nil { ... }
//
// When the connection drops before the exit event, the stream reconnects
// by itself with Last-Event-ID (see WithReconnect), so every event is
// delivered once, in order. Cancel the context given to Events, or call
// Close, to stop early.
type EventStream struct {
	c    *Client
	ctx  context.Context
	path string

	lastID int64
	ev     Event
	err    error
	done   bool
	fails  int // reconnections in a row without an event
	delay  time.Duration
	// dropped is why the last connection ended, for the error reported
	// when reconnecting fails.
	dropped error

	mu     sync.Mutex // guards body and closed against Close
	body   io.ReadCloser
	closed bool
	rd     *sseReader
}

// Events opens the event stream of command execID, starting after event
// after (0 for the beginning). The stream holds a connection until it
// ends; Close it if you stop before Next returns false. A command that
// already ended still yields its retained events and its exit.
func (s *Sandbox) Events(ctx context.Context, execID string, after int64) (*EventStream, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if after < 0 {
		return nil, fmt.Errorf("moat client: Events: after %d is negative", after)
	}
	st := &EventStream{c: s.c, ctx: ctx, path: s.execPath(execID) + "/events", lastID: after, delay: s.c.retryDelay}
	if err := st.connect(); err != nil {
		return nil, err
	}
	return st, nil
}

// Next advances to the next event, reconnecting if needed, and reports
// whether there is one. It returns false after the exit event, on Close,
// and on an error (see Err).
func (st *EventStream) Next() bool {
	for {
		if st.done || st.err != nil || st.isClosed() {
			return false
		}
		if st.rd == nil {
			if err := st.reconnect(); err != nil {
				st.fail(err)
				return false
			}
		}
		raw, err := st.rd.next()
		if err != nil {
			st.dropBody()
			switch {
			case st.isClosed():
				return false
			case st.ctx.Err() != nil:
				st.fail(fmt.Errorf("moat client: GET %s: %w", st.path, st.ctx.Err()))
				return false
			case errors.Is(err, errEventTooLarge):
				st.fail(fmt.Errorf("moat client: GET %s: %w", st.path, err))
				return false
			}
			// The connection dropped (or ended) before the exit event:
			// reconnect from lastID on the next turn.
			st.rd = nil
			st.dropped = err
			continue
		}
		if raw.retry > 0 {
			st.delay = raw.retry
		}
		if !raw.dispatch {
			// An id without data still moves the resume point (the SSE
			// "last event ID buffer").
			st.lastID = max(st.lastID, raw.id)
			continue
		}
		ev, err := decodeEvent(raw)
		if err != nil {
			st.fail(fmt.Errorf("moat client: GET %s: event %d: %w", st.path, raw.id, err))
			return false
		}
		if ev.ID > 0 {
			if ev.ID <= st.lastID {
				continue // already delivered before a reconnection
			}
			st.lastID = ev.ID
		}
		st.fails = 0
		st.ev = ev
		if ev.Type == EventExit {
			st.done = true
			st.dropBody()
		}
		return true
	}
}

// Event returns the event Next advanced to.
func (st *EventStream) Event() Event { return st.ev }

// Err returns the error that stopped the stream, or nil when it ended
// with the exit event or by Close.
func (st *EventStream) Err() error { return st.err }

// LastID returns the ID of the last event delivered (or the after given to
// Events): where a later Events call would resume.
func (st *EventStream) LastID() int64 { return st.lastID }

// Close ends the stream and its connection. It may be called from another
// goroutine to stop a Next that is waiting for an event, and more than
// once.
func (st *EventStream) Close() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	if st.body != nil {
		st.body.Close()
		st.body = nil
	}
	return nil
}

func (st *EventStream) isClosed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.closed
}

func (st *EventStream) fail(err error) {
	st.err = err
	st.dropBody()
}

func (st *EventStream) dropBody() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.body != nil {
		st.body.Close()
		st.body = nil
	}
}

// connect opens the stream after st.lastID.
func (st *EventStream) connect() error {
	r := request{method: http.MethodGet, path: st.path, header: http.Header{
		"Accept":        {"text/event-stream"},
		"Cache-Control": {"no-cache"},
	}}
	if st.lastID > 0 {
		id := strconv.FormatInt(st.lastID, 10)
		// Both forms of docs/API.md, with the same value, so a server
		// that prefers either resumes at the same place.
		r.header.Set("Last-Event-ID", id)
		r.query = url.Values{"after": {id}}
	}
	resp, err := st.c.do(st.ctx, r)
	if err != nil {
		return err
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		if mt, _, _ := mime.ParseMediaType(ct); mt != "text/event-stream" {
			resp.Body.Close()
			return &Error{Status: resp.StatusCode, Method: r.method, Path: r.path,
				Message: fmt.Sprintf("the answer is %s, not an event stream (text/event-stream)", ct)}
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		resp.Body.Close()
		return errors.New("moat client: the event stream is closed")
	}
	st.body = resp.Body
	st.rd = newSSEReader(resp.Body)
	return nil
}

// reconnect waits and connects again, up to the Client's attempts.
func (st *EventStream) reconnect() error {
	for {
		if st.fails >= st.c.retries {
			cause := st.dropped
			if cause == nil {
				cause = io.ErrUnexpectedEOF
			}
			tried := "reconnecting is disabled"
			if st.fails > 0 {
				tried = fmt.Sprintf("%d reconnection(s) failed", st.fails)
			}
			return fmt.Errorf("moat client: GET %s: the stream ended before the exit event (after event %d; %s): %w",
				st.path, st.lastID, tried, cause)
		}
		delay := st.delay
		for i := 0; i < st.fails && delay < maxRetryDelay; i++ {
			delay *= 2
		}
		t := time.NewTimer(min(delay, maxRetryDelay))
		select {
		case <-st.ctx.Done():
			t.Stop()
			return fmt.Errorf("moat client: GET %s: %w", st.path, st.ctx.Err())
		case <-t.C:
		}
		st.fails++
		err := st.connect()
		if err == nil {
			return nil
		}
		var apiErr *Error
		if errors.As(err, &apiErr) && !retryable(apiErr.Status) {
			return err
		}
		if st.ctx.Err() != nil || st.isClosed() {
			return err
		}
		st.dropped = err
	}
}

// retryable reports whether a stream may be reopened after this status: a
// gateway's or the server's passing unavailability, not a refusal.
func retryable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// decodeEvent interprets one dispatched SSE event.
func decodeEvent(raw rawEvent) (Event, error) {
	ev := Event{ID: raw.id, Type: raw.typ, Raw: json.RawMessage(raw.data)}
	switch raw.typ {
	case EventStdout, EventStderr:
		var chunk struct {
			Data     string `json:"data"`
			Encoding string `json:"encoding"`
		}
		if err := json.Unmarshal(raw.data, &chunk); err != nil {
			return ev, fmt.Errorf("decode %s data: %w", raw.typ, err)
		}
		switch chunk.Encoding {
		case "", "utf-8":
			ev.Data = []byte(chunk.Data)
		case "base64":
			b, err := base64.StdEncoding.DecodeString(chunk.Data)
			if err != nil {
				return ev, fmt.Errorf("decode %s data: %w", raw.typ, err)
			}
			ev.Data = b
		default:
			return ev, fmt.Errorf("%s data has unknown encoding %q", raw.typ, chunk.Encoding)
		}
	case EventExit:
		var e Exec
		if err := json.Unmarshal(raw.data, &e); err != nil {
			return ev, fmt.Errorf("decode the exit event: %w", err)
		}
		ev.Exec = &e
	}
	return ev, nil
}

// Stream copies the output of command execID to stdout and stderr (either
// may be nil to drop it) as it arrives, resuming after dropped
// connections, and returns the finished Exec.
func (s *Sandbox) Stream(ctx context.Context, execID string, stdout, stderr io.Writer) (*Exec, error) {
	st, err := s.Events(ctx, execID, 0)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for st.Next() {
		ev := st.Event()
		var w io.Writer
		switch ev.Type {
		case EventStdout:
			w = stdout
		case EventStderr:
			w = stderr
		case EventExit:
			return ev.Exec, nil
		}
		if w != nil {
			if _, err := w.Write(ev.Data); err != nil {
				return nil, fmt.Errorf("moat client: copy %s of exec %s: %w", ev.Type, execID, err)
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("moat client: the event stream of exec %s was closed before its exit", execID)
}

// rawEvent is one parsed block of an SSE stream.
type rawEvent struct {
	dispatch bool // false for a block without data (only id or retry)
	id       int64
	typ      string
	data     []byte
	retry    time.Duration
}

// sseReader parses text/event-stream (the WHATWG HTML "server-sent
// events" format): lines end with LF, CRLF or CR; "field: value"; data
// lines join with LF; a blank line dispatches; ':' starts a comment.
type sseReader struct {
	r      *bufio.Reader
	skipLF bool // the last line ended with CR: a following LF belongs to it
	first  bool
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 64<<10), first: true}
}

// line reads one line without its terminator, at most maxEventBytes.
func (p *sseReader) line() ([]byte, error) {
	var buf []byte
	for {
		c, err := p.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(buf) > 0 {
				// A last line without its terminator is incomplete: the
				// spec discards it, and so does a resume.
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if p.skipLF {
			p.skipLF = false
			if c == '\n' {
				continue
			}
		}
		switch c {
		case '\n':
			return buf, nil
		case '\r':
			p.skipLF = true
			return buf, nil
		}
		if len(buf) >= maxEventBytes {
			return nil, errEventTooLarge
		}
		buf = append(buf, c)
	}
}

// next reads up to the next blank line and returns the block.
func (p *sseReader) next() (rawEvent, error) {
	var ev rawEvent
	var data bytes.Buffer
	hasData := false
	for {
		line, err := p.line()
		if err != nil {
			return rawEvent{}, err
		}
		if p.first {
			p.first = false
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if len(line) == 0 {
			if !hasData {
				if ev.retry > 0 || ev.id > 0 {
					return ev, nil
				}
				ev = rawEvent{}
				continue
			}
			ev.dispatch = true
			if ev.typ == "" {
				ev.typ = "message"
			}
			ev.data = bytes.TrimSuffix(data.Bytes(), []byte("\n"))
			return ev, nil
		}
		if line[0] == ':' {
			continue // comment, e.g. a keep-alive
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			value = bytes.TrimPrefix(value, []byte(" "))
		}
		switch string(field) {
		case "event":
			ev.typ = string(value)
		case "data":
			if data.Len()+len(value) > maxEventBytes {
				return rawEvent{}, errEventTooLarge
			}
			data.Write(value)
			data.WriteByte('\n')
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				if n, err := strconv.ParseInt(string(value), 10, 64); err == nil && n >= 0 {
					ev.id = n
				}
			}
		case "retry":
			if n, err := strconv.ParseInt(string(value), 10, 64); err == nil && n > 0 {
				ev.retry = time.Duration(n) * time.Millisecond
			}
		}
	}
}
