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

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server"
	pb "github.com/moat-sandbox/moat/server/e2b/envdpb/process"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/process/processconnect"
)

// process.Process: each E2B process is a command of the Moat sandbox
// (POST /v1/sandboxes/{id}/execs); its pid is the command's number
// ("e-7" is pid 7), its output the command's event stream.

type processService struct{}

var _ processconnect.ProcessHandler = processService{}

var errNoPTY = rpcErr(connect.CodeUnimplemented, "PTY sessions are not supported by Moat's tiers yet: start the process without pty")

// moat sends one request to the sandbox's routes of Moat's API.
func (c *envdCall) moat(ctx context.Context, method, sub string, body any) (int, []byte) {
	return c.h.moatCall(ctx, c.key, method, "/v1/sandboxes/"+url.PathEscape(c.b.id)+sub, body)
}

func (c *envdCall) pid(s *pb.ProcessSelector) (uint32, *connect.Error) {
	switch sel := s.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		return sel.Pid, nil
	case *pb.ProcessSelector_Tag:
		c.b.mu.Lock()
		pid, ok := c.b.tags[sel.Tag]
		c.b.mu.Unlock()
		if !ok {
			return 0, rpcErr(connect.CodeNotFound, "process with tag %q not found", sel.Tag)
		}
		return pid, nil
	}
	return 0, rpcErr(connect.CodeInvalidArgument, "process: give a pid or a tag")
}

func pidOf(execID string) uint32 {
	n, _ := strconv.ParseUint(strings.TrimPrefix(execID, "e-"), 10, 32)
	return uint32(n)
}

func (processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], st *connect.ServerStream[pb.StartResponse]) error {
	c, m := callOf(ctx), req.Msg
	if m.Pty != nil {
		return errNoPTY
	}
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return rpcErr(connect.CodeInvalidArgument, "process.cmd is empty")
	}
	ex := server.ExecRequest{
		Argv:      append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:       cfg.GetEnvs(),
		StdinOpen: m.GetStdin(),
	}
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		dir, e := workspacePath("process.cwd", *cfg.Cwd)
		if e != nil {
			return e
		}
		if dir != "." {
			ex.Dir = dir
		}
	}
	wait := false
	ex.Wait = &wait
	status, body := c.moat(ctx, http.MethodPost, "/execs", ex)
	if status != http.StatusAccepted {
		return rpcErr(codeOf(status), "%s", moatMessage(body))
	}
	var view server.Exec
	if err := json.Unmarshal(body, &view); err != nil {
		return rpcErr(connect.CodeInternal, "decode Moat's command: %v", err)
	}
	pid := pidOf(view.ID)
	if m.Tag != nil {
		c.b.mu.Lock()
		c.b.tags[*m.Tag] = pid
		c.b.mu.Unlock()
	}
	return c.follow(ctx, pid, func(ev *pb.ProcessEvent) error { return st.Send(&pb.StartResponse{Event: ev}) })
}

func (processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], st *connect.ServerStream[pb.ConnectResponse]) error {
	c := callOf(ctx)
	pid, e := c.pid(req.Msg.GetProcess())
	if e != nil {
		return e
	}
	return c.follow(ctx, pid, func(ev *pb.ProcessEvent) error { return st.Send(&pb.ConnectResponse{Event: ev}) })
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

// follow sends command pid's events as process events: start, output,
// end. A client that goes away ends the stream, not the command. The
// events are read from Moat's own event stream (GET …/events), from the
// command's first event: a Connect to a running process replays what it
// has printed so far.
func (c *envdCall) follow(ctx context.Context, pid uint32, send func(*pb.ProcessEvent) error) error {
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
				return rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return rpcErr(connect.CodeUnavailable, "the process's event stream ended early (the sandbox was destroyed?)")
		}
		if first {
			first = false
			if sw.st != 0 && sw.st != http.StatusOK {
				return rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
				return err
			}
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if event == "" {
				continue
			}
			done, err := translate(send, event, data.Bytes())
			event = ""
			data.Reset()
			if err != nil || done {
				return err
			}
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			data.Write(line[6:])
		case bytes.HasPrefix(line, []byte(": keepalive")):
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// translate sends one Moat event; done after the exit.
func translate(send func(*pb.ProcessEvent) error, event string, data []byte) (done bool, err error) {
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
		d := &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		if event == "stderr" {
			d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
		}
		return false, send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}})
	case "exit":
		var ex server.Exec
		json.Unmarshal(data, &ex)
		return true, send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endOf(ex.Result)}})
	}
	return false, nil
}

// endOf is envd's end event for a Moat result: a signal is "signal: …"
// with exited false, as Go's os.ProcessState reports it in envd; Moat's
// own terminations (timeout, oom…) are in error.
func endOf(res *result.Result) *pb.ProcessEvent_EndEvent {
	if res == nil {
		msg := "Moat reported no result"
		return &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: "unknown", Error: &msg}
	}
	e := &pb.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: true, Status: fmt.Sprintf("exit status %d", res.ExitCode)}
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
		msg := fmt.Sprintf("the command ended by Moat's %s limit", res.Termination)
		if res.Error != "" {
			msg = res.Error
		}
		e.Error = &msg
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

func (processService) List(ctx context.Context, _ *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	c := callOf(ctx)
	status, body := c.moat(ctx, http.MethodGet, "/execs", nil)
	if status != http.StatusOK {
		return nil, rpcErr(codeOf(status), "%s", moatMessage(body))
	}
	var list server.ExecList
	json.Unmarshal(body, &list)
	tags := map[uint32]string{}
	c.b.mu.Lock()
	for t, p := range c.b.tags {
		tags[p] = t
	}
	c.b.mu.Unlock()
	out := &pb.ListResponse{Processes: []*pb.ProcessInfo{}}
	for _, ex := range list.Execs {
		if ex.State != server.ExecRunning || len(ex.Argv) == 0 {
			continue
		}
		i := &pb.ProcessInfo{Config: &pb.ProcessConfig{Cmd: ex.Argv[0], Args: ex.Argv[1:]}, Pid: pidOf(ex.ID)}
		if t, ok := tags[i.Pid]; ok {
			i.Tag = &t
		}
		out.Processes = append(out.Processes, i)
	}
	return connect.NewResponse(out), nil
}

// input writes to a process's stdin, or closes it.
func (c *envdCall) input(ctx context.Context, s *pb.ProcessSelector, in *pb.ProcessInput, eof bool) error {
	pid, e := c.pid(s)
	if e != nil {
		return e
	}
	if in.GetPty() != nil {
		return errNoPTY
	}
	sub := fmt.Sprintf("/v1/sandboxes/%s/execs/e-%d/stdin", url.PathEscape(c.b.id), pid)
	if eof {
		sub += "?eof=1"
	}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, sub, bytes.NewReader(in.GetStdin()))
	req.Header.Set("Content-Type", "application/octet-stream")
	rec := httptest.NewRecorder()
	c.h.cfg.API.ServeAs(c.key, rec, req)
	if rec.Code != http.StatusOK {
		if rec.Code == http.StatusNotFound {
			return rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
		}
		return rpcErr(codeOf(rec.Code), "%s", moatMessage(rec.Body.Bytes()))
	}
	return nil
}

func (processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	if err := callOf(ctx).input(ctx, req.Msg.GetProcess(), req.Msg.GetInput(), false); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	if err := callOf(ctx).input(ctx, req.Msg.GetProcess(), &pb.ProcessInput{}, true); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// StreamInput is a start message naming the process, then data and
// keepalive messages.
func (processService) StreamInput(ctx context.Context, st *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	c := callOf(ctx)
	var sel *pb.ProcessSelector
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
		case *pb.StreamInputRequest_Data:
			if sel == nil {
				return nil, rpcErr(connect.CodeFailedPrecondition, "the first message of StreamInput must be start")
			}
			if err := c.input(ctx, sel, ev.Data.GetInput(), false); err != nil {
				return nil, err
			}
		}
	}
	if err := st.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	c := callOf(ctx)
	pid, e := c.pid(req.Msg.GetProcess())
	if e != nil {
		return nil, e
	}
	var sig string
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = "SIGKILL"
	case pb.Signal_SIGNAL_SIGTERM:
		sig = "SIGTERM"
	default:
		return nil, rpcErr(connect.CodeInvalidArgument, "signal %s: give SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal())
	}
	status, body := c.moat(ctx, http.MethodPost, fmt.Sprintf("/execs/e-%d/signal", pid), server.SignalRequest{Signal: json.RawMessage(strconv.Quote(sig))})
	switch status {
	case http.StatusOK, http.StatusAccepted, http.StatusNoContent:
		return connect.NewResponse(&pb.SendSignalResponse{}), nil
	case http.StatusNotFound, http.StatusConflict:
		// E2B: a process that has ended is not found.
		return nil, rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
	}
	return nil, rpcErr(codeOf(status), "%s", moatMessage(body))
}

func (processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	if _, e := callOf(ctx).pid(req.Msg.GetProcess()); e != nil {
		return nil, e
	}
	if req.Msg.Pty != nil {
		return nil, errNoPTY
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}
