package e2b

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/result"
	pb "github.com/moat-sandbox/moat/server/e2b/envdpb/process"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/process/processconnect"
	"github.com/moat-sandbox/moat/service"
)

// process.Process: each E2B process is a command of the Moat sandbox
// (service.StartExec); its pid is the command's pid in the sandbox
// (pids.go), its output the command's event log.

type processService struct{}

var _ processconnect.ProcessHandler = processService{}

// commandTimeout is how long a command may run, from its request's
// Connect-Timeout-Ms (the SDKs' timeoutMs), as E2B's envd reads it: that
// long, or (0, absent) until the sandbox's own limit. The stream's end
// does not end the command; only this does, or a signal.
func commandTimeout(h http.Header) (time.Duration, *connect.Error) {
	v := h.Get("Connect-Timeout-Ms")
	if v == "" {
		return 0, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > int64(maxCommandLimit/time.Millisecond) {
		return 0, rpcErr(connect.CodeInvalidArgument, "Connect-Timeout-Ms %q is not a number of milliseconds from 0 to %d (the SDKs' timeoutMs)", truncate(v, 32), int64(maxCommandLimit/time.Millisecond))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// ttyOf is the terminal size of a pty request: E2B's size in Moat's
// terms, refused with the field when no terminal can have it.
func ttyOf(field string, size *pb.PTY_Size) (*service.TTYSize, *connect.Error) {
	if size == nil {
		return nil, rpcErr(connect.CodeInvalidArgument, "%s is missing: give the terminal's cols and rows, e.g. {cols: 80, rows: 24}", field)
	}
	if size.GetCols() < 1 || size.GetRows() < 1 || size.GetCols() > service.MaxTTYSide || size.GetRows() > service.MaxTTYSide {
		return nil, rpcErr(connect.CodeInvalidArgument, "%s is %d cols by %d rows: give cols and rows from 1 to %d", field, size.GetCols(), size.GetRows(), service.MaxTTYSide)
	}
	return &service.TTYSize{Rows: int(size.GetRows()), Cols: int(size.GetCols())}, nil
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

func (processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], st *connect.ServerStream[pb.StartResponse]) error {
	c, m := callOf(ctx), req.Msg
	cfg := m.GetProcess()
	if cfg.GetCmd() == "" {
		return rpcErr(connect.CodeInvalidArgument, "process.cmd is empty")
	}
	timeout, e := commandTimeout(req.Header())
	if e != nil {
		return e
	}
	ex := service.ExecArgs{
		Argv:       append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:        cfg.GetEnvs(),
		StdinOpen:  m.GetStdin(),
		Timeout:    timeout,
		CapTimeout: true,
	}
	if m.Pty != nil {
		// sandbox.pty.create: a terminal of the sandbox's own devpts;
		// its input (SendInput's pty) is the command's stdin.
		tty, e := ttyOf("pty.size", m.Pty.GetSize())
		if e != nil {
			return e
		}
		ex.TTY, ex.StdinOpen = tty, true
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
	view, err := c.svc.StartExec(ctx, c.key, c.b.id, ex)
	if err != nil {
		return rpcFromService(err)
	}
	pid := c.b.pidOf(view)
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

// keepaliveEvery is how often an idle process stream sends a keepalive
// event, so that proxies keep it open.
const keepaliveEvery = 15 * time.Second

// follow sends command pid's events as process events: start, output,
// end. A client that goes away ends the stream, not the command. The
// events are the command's event log from its first event: a Connect to a
// running process replays what it has printed so far.
func (c *envdCall) follow(ctx context.Context, pid uint32, send func(*pb.ProcessEvent) error) error {
	feed, err := c.svc.Events(ctx, c.key, c.b.id, c.b.execOf(pid))
	if err != nil {
		return rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
	}
	if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	keepalive := time.NewTicker(keepaliveEvery)
	defer keepalive.Stop()
	// A terminal's output is all on stdout: it is the pty's data.
	tty := feed.Exec().TTY != nil
	after := 0
	for {
		evs, exitID, notify := feed.Read(after)
		for _, ev := range evs {
			d := &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: ev.Data}}
			switch {
			case tty:
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: ev.Data}}
			case ev.Stream == "stderr":
				d = &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: ev.Data}}
			}
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}); err != nil {
				return err
			}
			after = ev.ID
		}
		if exitID > 0 {
			ex := feed.Exec()
			if e := interruptedErr(c.b.id, ex.Interrupted); e != nil {
				// No end event: the SDKs would make an exit code -1 of it
				// (CommandExitError with no message); an error is what
				// E2B's own envd gives when the sandbox goes under a
				// command (its connection drops).
				return e
			}
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: endOf(ex.Result)}})
		}
		select {
		case <-notify:
		case <-keepalive.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-c.svc.Stopped():
			return rpcErr(connect.CodeUnavailable, "the process's event stream ended early (the sandbox was destroyed?)")
		}
	}
}

// interruptedErr is the error that ends the stream of a command its
// sandbox's end killed (service.Exec.Interrupted), or nil. The codes are
// those the SDKs map onto their actionable errors: unavailable is their
// TimeoutError ("likely due to sandbox timeout"), not_found their
// NotFoundError, aborted a SandboxError naming it.
func interruptedErr(id, why string) *connect.Error {
	switch why {
	case "":
		return nil
	case service.InterruptExpired:
		return rpcErr(connect.CodeUnavailable, "sandbox %s reached its timeout and was killed while this command ran, so the command did not finish: give the sandbox a longer timeout (timeoutMs, setTimeout) and run it again in a new sandbox", id)
	case service.InterruptAutoPaused:
		return rpcErr(connect.CodeUnavailable, "sandbox %s reached its timeout and was paused (lifecycle.onTimeout 'pause') while this command ran: a Moat pause keeps files only, so the command was stopped; Sandbox.connect resumes the sandbox with its files, then run the command again", id)
	case service.InterruptPaused:
		return rpcErr(connect.CodeAborted, "sandbox %s was paused while this command ran: a Moat pause keeps files only, so the command was stopped; Sandbox.connect resumes the sandbox with its files, then run the command again", id)
	case service.InterruptShutdown:
		return rpcErr(connect.CodeUnavailable, "the Moat server shut down while this command ran, destroying sandbox %s: create a new sandbox and run the command again", id)
	case service.InterruptEnded:
		return rpcErr(connect.CodeNotFound, "sandbox %s ended while this command ran: its init process exited (did a command kill PID 1?), so Moat destroyed it; create a new sandbox", id)
	}
	return rpcErr(connect.CodeNotFound, "sandbox %s was killed (Sandbox.kill) while this command ran, so the command did not finish: create a new sandbox to run it again", id)
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
	execs, err := c.svc.ListExecs(ctx, c.key, c.b.id)
	if err != nil {
		return nil, rpcFromService(err)
	}
	tags := map[uint32]string{}
	c.b.mu.Lock()
	for t, p := range c.b.tags {
		tags[p] = t
	}
	c.b.mu.Unlock()
	out := &pb.ListResponse{Processes: []*pb.ProcessInfo{}}
	for _, ex := range execs {
		if ex.State != service.ExecRunning || len(ex.Argv) == 0 {
			continue
		}
		i := &pb.ProcessInfo{Config: &pb.ProcessConfig{Cmd: ex.Argv[0], Args: ex.Argv[1:]}, Pid: c.b.pidOf(ex)}
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
	data := in.GetStdin()
	if pty, ok := in.GetInput().(*pb.ProcessInput_Pty); ok {
		// Typed into the terminal: what the command reads from it.
		data = pty.Pty
	}
	_, err := c.svc.WriteStdin(ctx, c.key, c.b.id, c.b.execOf(pid), bytes.NewReader(data), eof)
	switch {
	case err == nil:
		return nil
	case service.KindOf(err) == service.NotFound:
		return rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
	}
	return rpcFromService(err)
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
	var sig unix.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = unix.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = unix.SIGTERM
	default:
		return nil, rpcErr(connect.CodeInvalidArgument, "signal %s: give SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal())
	}
	_, err := c.svc.Signal(ctx, c.key, c.b.id, c.b.execOf(pid), sig)
	switch service.KindOf(err) {
	case service.NotFound, service.Conflict:
		// E2B: a process that has ended is not found.
		return nil, rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
	}
	if err != nil {
		return nil, rpcFromService(err)
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// Update resizes a process's terminal (sandbox.pty.resize); without a pty
// it changes nothing, as in envd.
func (processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	c := callOf(ctx)
	pid, e := c.pid(req.Msg.GetProcess())
	if e != nil {
		return nil, e
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&pb.UpdateResponse{}), nil
	}
	size, e := ttyOf("pty.size", req.Msg.Pty.GetSize())
	if e != nil {
		return nil, e
	}
	_, err := c.svc.Resize(ctx, c.key, c.b.id, c.b.execOf(pid), *size)
	switch {
	case err == nil:
		return connect.NewResponse(&pb.UpdateResponse{}), nil
	case service.KindOf(err) == service.NotFound:
		return nil, rpcErr(connect.CodeNotFound, "process with pid %d not found", pid)
	}
	return nil, rpcFromService(err)
}
