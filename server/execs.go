package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The command routes: decode, call the service, encode; the event stream
// is framed here as Server-Sent Events.

// sandboxJSON reads the JSON body of a request about one sandbox (a
// command, a cell) and that sandbox's manifest, which the body is checked
// against (its timeout); an unknown sandbox is answered before the body
// is read.
func (s *Server) sandboxJSON(w http.ResponseWriter, r *http.Request) (*manifest.Manifest, []byte, error) {
	m, err := s.svc.SandboxManifest(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return nil, nil, err
	}
	if e := requireJSON(r); e != nil {
		return nil, nil, e
	}
	data, e := readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return nil, nil, e
	}
	return m, data, nil
}

func (s *Server) createExec(w http.ResponseWriter, r *http.Request) error {
	key, id := keyOf(r), r.PathValue("id")
	m, data, err := s.sandboxJSON(w, r)
	if err != nil {
		return err
	}
	spec, e := decodeExec(data, m)
	if e != nil {
		return e
	}
	args := service.ExecArgs{Argv: spec.argv, Env: spec.env, Dir: spec.dir, Timeout: spec.timeout, StdinOpen: spec.stdinOpen, TTY: spec.tty}
	if len(spec.stdin) > 0 {
		args.Stdin = bytes.NewReader(spec.stdin)
	}
	if !spec.wait {
		ex, err := s.svc.StartExec(r.Context(), key, id, args)
		if held, werr := writeHeld(w, err); held {
			return werr
		}
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusAccepted, ex)
	}
	ex, err := s.svc.RunExec(r.Context(), key, id, args)
	if held, werr := writeHeld(w, err); held {
		return werr
	}
	if err != nil {
		if errors.Is(err, r.Context().Err()) {
			// The client left; the command goes on (docs/API.md).
			return nil
		}
		return err
	}
	return writeJSON(w, http.StatusOK, ex)
}

func (s *Server) listExecs(w http.ResponseWriter, r *http.Request) error {
	list, err := s.svc.ListExecs(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ExecList{Execs: list})
}

func (s *Server) getExec(w http.ResponseWriter, r *http.Request) error {
	ex, err := s.svc.GetExec(r.Context(), keyOf(r), r.PathValue("id"), r.PathValue("eid"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ex)
}

// keepaliveEvery is how often an idle event stream sends a comment, so
// proxies keep it open and a vanished client is noticed.
var keepaliveEvery = 15 * time.Second

// execEvents serves the command's events as Server-Sent Events, from
// after the client's Last-Event-ID (or ?after=). A client that goes away
// ends only this stream.
func (s *Server) execEvents(w http.ResponseWriter, r *http.Request) error {
	feed, err := s.svc.Events(r.Context(), keyOf(r), r.PathValue("id"), r.PathValue("eid"))
	if err != nil {
		return err
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
		evs, exitID, notify := feed.Read(after)
		for _, ev := range evs {
			writeEvent(&buf, ev.ID, ev.Stream, outputEvent(ev.Data))
			after = ev.ID
		}
		if exitID > 0 && after < exitID {
			writeEvent(&buf, exitID, "exit", feed.Exec())
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
		case <-s.svc.Stopped():
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
	key, id, eid := keyOf(r), r.PathValue("id"), r.PathValue("eid")
	if _, err := s.svc.GetExec(r.Context(), key, id, eid); err != nil {
		return err
	}
	eof := false
	switch v := r.URL.Query().Get("eof"); v {
	case "", "0", "false":
	case "1", "true":
		eof = true
	default:
		return invalid("eof", "%s is not 1 or 0", quote(v))
	}
	n, err := s.svc.WriteStdin(r.Context(), key, id, eid, http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes), eof)
	if err != nil {
		if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
			return nil // the client left while waiting for its turn
		}
		var se *service.Error
		if errors.As(err, &se) && se.Kind == service.BadRequest {
			return bodyError(se.Err, s.cfg.MaxBodyBytes)
		}
		return err
	}
	return writeJSON(w, http.StatusOK, StdinResult{Written: n, Closed: eof})
}

func (s *Server) execSignal(w http.ResponseWriter, r *http.Request) error {
	key, id, eid := keyOf(r), r.PathValue("id"), r.PathValue("eid")
	if _, err := s.svc.GetExec(r.Context(), key, id, eid); err != nil {
		return err
	}
	var req SignalRequest
	if e := readJSON(w, r, s.cfg.MaxBodyBytes, &req); e != nil {
		return e
	}
	sig, e := parseSignal(req.Signal)
	if e != nil {
		return e
	}
	ex, err := s.svc.Signal(r.Context(), key, id, eid, sig)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ex)
}

func (s *Server) execResize(w http.ResponseWriter, r *http.Request) error {
	key, id, eid := keyOf(r), r.PathValue("id"), r.PathValue("eid")
	if _, err := s.svc.GetExec(r.Context(), key, id, eid); err != nil {
		return err
	}
	var req service.TTYSize
	if e := readJSON(w, r, s.cfg.MaxBodyBytes, &req); e != nil {
		return e
	}
	ex, err := s.svc.Resize(r.Context(), key, id, eid, req)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ex)
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
