package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server"
)

// process.Process: each E2B process is a command of the Moat sandbox
// (POST /v1/sandboxes/{id}/execs); its pid is the command's number
// ("e-7" is pid 7), its output the command's event stream.

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type selector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type startRequest struct {
	Process processConfig   `json:"process"`
	Pty     json.RawMessage `json:"pty"`
	Tag     *string         `json:"tag"`
	Stdin   *bool           `json:"stdin"`
}

type processInput struct {
	Stdin []byte `json:"stdin,omitempty"`
	Pty   []byte `json:"pty,omitempty"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
}

type endEvent struct {
	ExitCode int    `json:"exitCode"`
	Exited   bool   `json:"exited"`
	Status   string `json:"status"`
	Error    string `json:"error,omitempty"`
}

type processEvent struct {
	Start *struct {
		Pid uint32 `json:"pid"`
	} `json:"start,omitempty"`
	Data      *dataEvent `json:"data,omitempty"`
	End       *endEvent  `json:"end,omitempty"`
	Keepalive *struct{}  `json:"keepalive,omitempty"`
}

func (c *envdCall) process(w http.ResponseWriter, r *http.Request, method string) {
	switch method {
	case "Start":
		c.start(w, r)
	case "Connect":
		var req struct {
			Process selector `json:"process"`
		}
		st := newStream(w)
		if e := readStreamRequest(r, &req); e != nil {
			st.end(e)
			return
		}
		pid, e := c.pid(req.Process)
		if e != nil {
			st.end(e)
			return
		}
		c.follow(r.Context(), st, pid)
	case "List":
		c.list(w, r)
	case "SendInput":
		var req struct {
			Process selector     `json:"process"`
			Input   processInput `json:"input"`
		}
		if e := readUnary(r, &req); e != nil {
			writeUnaryError(w, e)
			return
		}
		if e := c.input(r, req.Process, req.Input, false); e != nil {
			writeUnaryError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	case "StreamInput":
		c.streamInput(w, r)
	case "CloseStdin":
		var req struct {
			Process selector `json:"process"`
		}
		if e := readUnary(r, &req); e != nil {
			writeUnaryError(w, e)
			return
		}
		if e := c.input(r, req.Process, processInput{}, true); e != nil {
			writeUnaryError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	case "SendSignal":
		c.signal(w, r)
	case "Update":
		var req struct {
			Process selector        `json:"process"`
			Pty     json.RawMessage `json:"pty"`
		}
		if e := readUnary(r, &req); e != nil {
			writeUnaryError(w, e)
			return
		}
		if _, e := c.pid(req.Process); e != nil {
			writeUnaryError(w, e)
			return
		}
		if isSet(req.Pty) {
			writeUnaryError(w, rpcErr("unimplemented", "PTY sessions are not supported by Moat's tiers yet: start the process without pty"))
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	default:
		writeUnaryError(w, rpcErr("unimplemented", "process.Process/%s is not a method Moat serves", method))
	}
}

// moat sends one request to the sandbox's routes of Moat's API.
func (c *envdCall) moat(r *http.Request, method, sub string, body any) (int, []byte) {
	return c.h.moatCall(r, c.key, method, "/v1/sandboxes/"+url.PathEscape(c.b.id)+sub, body)
}

func (c *envdCall) pid(s selector) (uint32, *rpcError) {
	switch {
	case s.Pid != nil:
		return *s.Pid, nil
	case s.Tag != nil:
		c.b.mu.Lock()
		pid, ok := c.b.tags[*s.Tag]
		c.b.mu.Unlock()
		if !ok {
			return 0, rpcErr("not_found", "process with tag %q not found", *s.Tag)
		}
		return pid, nil
	}
	return 0, rpcErr("invalid_argument", "process: give a pid or a tag")
}

func pidOf(execID string) uint32 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(execID, "e-"), 10, 32)
	return uint32(n)
}

func (c *envdCall) start(w http.ResponseWriter, r *http.Request) {
	st := newStream(w)
	var req startRequest
	if e := readStreamRequest(r, &req); e != nil {
		st.end(e)
		return
	}
	if isSet(req.Pty) {
		st.end(rpcErr("unimplemented", "PTY sessions are not supported by Moat's tiers yet: start the process without pty"))
		return
	}
	if req.Process.Cmd == "" {
		st.end(rpcErr("invalid_argument", "process.cmd is empty"))
		return
	}
	ex := server.ExecRequest{
		Argv:      append([]string{req.Process.Cmd}, req.Process.Args...),
		Env:       req.Process.Envs,
		StdinOpen: req.Stdin != nil && *req.Stdin,
	}
	if req.Process.Cwd != nil && *req.Process.Cwd != "" {
		dir, e := workspacePath("process.cwd", *req.Process.Cwd)
		if e != nil {
			st.end(e)
			return
		}
		if dir != "." {
			ex.Dir = dir
		}
	}
	wait := false
	ex.Wait = &wait
	status, body := c.moat(r, http.MethodPost, "/execs", ex)
	if status != http.StatusAccepted {
		st.end(rpcErr(codeOf(status), "%s", moatMessage(body)))
		return
	}
	var view server.Exec
	if err := json.Unmarshal(body, &view); err != nil {
		st.end(rpcErr("internal", "decode Moat's command: %v", err))
		return
	}
	pid := pidOf(view.ID)
	if req.Tag != nil {
		c.b.mu.Lock()
		c.b.tags[*req.Tag] = pid
		c.b.mu.Unlock()
	}
	c.follow(r.Context(), st, pid)
}

// sseWriter carries the Moat event stream of a command into a pipe.
type sseWriter struct {
	h  http.Header
	pw *io.PipeWriter
	st int
}

func (s *sseWriter) Header() http.Header         { return s.h }
func (s *sseWriter) WriteHeader(code int)        { s.st = code }
func (s *sseWriter) Write(b []byte) (int, error) { return s.pw.Write(b) }
func (s *sseWriter) Flush()                      {}

// follow streams command pid's events as process events: start, output,
// end. A client that goes away ends the stream, not the command.
func (c *envdCall) follow(ctx context.Context, st *stream, pid uint32) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	sw := &sseWriter{h: http.Header{}, pw: pw}
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("/v1/sandboxes/%s/execs/e-%d/events", url.PathEscape(c.b.id), pid), nil)
	go func() {
		c.h.cfg.API.ServeAs(c.key, sw, req)
		pw.Close()
	}()
	defer pr.Close()
	br := bufio.NewReaderSize(pr, 64<<10)
	first := true
	var event string
	var data bytes.Buffer
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			if first {
				// The stream never began: Moat refused (unknown pid).
				st.end(rpcErr("not_found", "process with pid %d not found", pid))
			} else {
				st.end(rpcErr("unavailable", "the process's event stream ended early"))
			}
			return
		}
		if first {
			first = false
			if sw.st != 0 && sw.st != http.StatusOK {
				st.end(rpcErr(codeOf(sw.st), "process with pid %d: %s", pid, strings.TrimSpace(string(line))))
				return
			}
			if err := st.send(map[string]any{"event": processEvent{Start: &struct {
				Pid uint32 `json:"pid"`
			}{pid}}}); err != nil {
				return
			}
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if event == "" {
				continue
			}
			done, err := c.translate(st, event, data.Bytes())
			event = ""
			data.Reset()
			if err != nil || done {
				return
			}
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			data.Write(line[6:])
		case bytes.HasPrefix(line, []byte(": keepalive")):
			if st.send(map[string]any{"event": processEvent{Keepalive: &struct{}{}}}) != nil {
				return
			}
		}
	}
}

// translate sends one Moat event; done after the exit.
func (c *envdCall) translate(st *stream, event string, data []byte) (done bool, err error) {
	switch event {
	case "stdout", "stderr":
		var out server.OutputEvent
		if err := json.Unmarshal(data, &out); err != nil {
			return false, nil
		}
		b := []byte(out.Data)
		if out.Encoding == "base64" {
			if b, err = base64.StdEncoding.DecodeString(out.Data); err != nil {
				return false, nil
			}
		}
		d := &dataEvent{Stdout: b}
		if event == "stderr" {
			d = &dataEvent{Stderr: b}
		}
		return false, st.send(map[string]any{"event": processEvent{Data: d}})
	case "exit":
		var ex server.Exec
		json.Unmarshal(data, &ex)
		st.send(map[string]any{"event": processEvent{End: endOf(ex.Result)}})
		st.end(nil)
		return true, nil
	}
	return false, nil
}

// endOf is envd's end event for a Moat result: a signal is "signal: N"
// with exited false, as Go's os.ProcessState reports it in envd; Moat's
// own terminations (timeout, oom…) are in error.
func endOf(res *result.Result) *endEvent {
	if res == nil {
		return &endEvent{ExitCode: -1, Status: "unknown", Error: "Moat reported no result"}
	}
	e := &endEvent{ExitCode: res.ExitCode, Exited: true, Status: fmt.Sprintf("exit status %d", res.ExitCode)}
	switch res.Termination {
	case result.Exited:
	case result.Signaled:
		e.ExitCode, e.Exited, e.Status = -1, false, "signal: "+signalName(res.Signal)
	default:
		if e.ExitCode == 0 {
			e.ExitCode = -1
		}
		e.Exited = false
		e.Status = string(res.Termination)
		e.Error = fmt.Sprintf("the command ended by Moat's %s limit", res.Termination)
		if res.Error != "" {
			e.Error = res.Error
		}
	}
	return e
}

func signalName(n int) string {
	switch n {
	case 9:
		return "killed"
	case 15:
		return "terminated"
	case 2:
		return "interrupt"
	}
	return strconv.Itoa(n)
}

func (c *envdCall) list(w http.ResponseWriter, r *http.Request) {
	if e := readUnary(r, &struct{}{}); e != nil {
		writeUnaryError(w, e)
		return
	}
	status, body := c.moat(r, http.MethodGet, "/execs", nil)
	if status != http.StatusOK {
		writeUnaryError(w, rpcErr(codeOf(status), "%s", moatMessage(body)))
		return
	}
	var list server.ExecList
	json.Unmarshal(body, &list)
	tags := map[uint32]string{}
	c.b.mu.Lock()
	for t, p := range c.b.tags {
		tags[p] = t
	}
	c.b.mu.Unlock()
	type info struct {
		Config processConfig `json:"config"`
		Pid    uint32        `json:"pid"`
		Tag    *string       `json:"tag,omitempty"`
	}
	out := []info{}
	for _, ex := range list.Execs {
		if ex.State != server.ExecRunning || len(ex.Argv) == 0 {
			continue
		}
		i := info{Config: processConfig{Cmd: ex.Argv[0], Args: ex.Argv[1:], Envs: map[string]string{}}, Pid: pidOf(ex.ID)}
		if i.Config.Args == nil {
			i.Config.Args = []string{}
		}
		if t, ok := tags[i.Pid]; ok {
			i.Tag = &t
		}
		out = append(out, i)
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": out})
}

// input writes to a process's stdin, or closes it.
func (c *envdCall) input(r *http.Request, s selector, in processInput, eof bool) *rpcError {
	pid, e := c.pid(s)
	if e != nil {
		return e
	}
	if len(in.Pty) > 0 {
		return rpcErr("unimplemented", "PTY input: Moat's tiers have no PTY sessions yet")
	}
	sub := fmt.Sprintf("/v1/sandboxes/%s/execs/e-%d/stdin", url.PathEscape(c.b.id), pid)
	if eof {
		sub += "?eof=1"
	}
	req := httptest.NewRequestWithContext(r.Context(), http.MethodPost, sub, bytes.NewReader(in.Stdin))
	req.Header.Set("Content-Type", "application/octet-stream")
	rec := httptest.NewRecorder()
	c.h.cfg.API.ServeAs(c.key, rec, req)
	if rec.Code != http.StatusOK {
		if rec.Code == http.StatusNotFound {
			return rpcErr("not_found", "process with pid %d not found", pid)
		}
		return rpcErr(codeOf(rec.Code), "%s", moatMessage(rec.Body.Bytes()))
	}
	return nil
}

// streamInput is the client stream StreamInput: a start message naming
// the process, then data and keepalive messages.
func (c *envdCall) streamInput(w http.ResponseWriter, r *http.Request) {
	st := newStream(w)
	var sel *selector
	for {
		flags, msg, err := readEnvelope(r.Body)
		if err == io.EOF || (err == nil && flags&flagEndStream != 0) {
			st.send(struct{}{})
			st.end(nil)
			return
		}
		if err != nil {
			st.end(rpcErr("invalid_argument", "read input stream: %v", err))
			return
		}
		var m struct {
			Start *struct {
				Process selector `json:"process"`
			} `json:"start"`
			Data *struct {
				Input processInput `json:"input"`
			} `json:"data"`
		}
		if err := json.Unmarshal(msg, &m); err != nil {
			st.end(rpcErr("invalid_argument", "decode input message: %v", err))
			return
		}
		switch {
		case m.Start != nil:
			s := m.Start.Process
			sel = &s
		case m.Data != nil:
			if sel == nil {
				st.end(rpcErr("failed_precondition", "the first message of StreamInput must be start"))
				return
			}
			if e := c.input(r, *sel, m.Data.Input, false); e != nil {
				st.end(e)
				return
			}
		}
	}
}

func (c *envdCall) signal(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Process selector `json:"process"`
		Signal  string   `json:"signal"`
	}
	if e := readUnary(r, &req); e != nil {
		writeUnaryError(w, e)
		return
	}
	pid, e := c.pid(req.Process)
	if e != nil {
		writeUnaryError(w, e)
		return
	}
	var sig string
	switch req.Signal {
	case "SIGNAL_SIGKILL", "9":
		sig = "SIGKILL"
	case "SIGNAL_SIGTERM", "15":
		sig = "SIGTERM"
	default:
		writeUnaryError(w, rpcErr("invalid_argument", "signal %q: give SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Signal))
		return
	}
	status, body := c.moat(r, http.MethodPost, fmt.Sprintf("/execs/e-%d/signal", pid), server.SignalRequest{Signal: json.RawMessage(strconv.Quote(sig))})
	switch status {
	case http.StatusOK, http.StatusAccepted, http.StatusNoContent:
		writeJSON(w, http.StatusOK, struct{}{})
	case http.StatusNotFound, http.StatusConflict:
		// E2B: a process that has ended is not found.
		writeUnaryError(w, rpcErr("not_found", "process with pid %d not found", pid))
	default:
		writeUnaryError(w, rpcErr(codeOf(status), "%s", moatMessage(body)))
	}
}
