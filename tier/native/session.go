package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// session is the host's state of a session-mode sandbox (Spec.Session).
type session struct {
	sock     *os.File      // host end of nswire.SessionFD
	initDone chan struct{} // closed when init has been reaped
	ready    chan string   // init's first report: "" when serving, else its error

	mu        sync.Mutex
	next      int
	procs     map[int]*process
	dead      bool
	destroyed bool
	waiting   bool // the init waiter goroutine owns init.Wait
}

var _ tier.Sessioner = (*sandbox)(nil)

// newSessionSocket returns the host and child ends of SessionFD.
func newSessionSocket() (host, child *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("session socket: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "session"), os.NewFile(uintptr(fds[1]), "session-init"), nil
}

// serveSession waits until init, told to serve, says it is confined and
// waiting for commands.
func (s *sandbox) serveSession(ctx context.Context) error {
	ss := s.sess
	ss.mu.Lock()
	ss.waiting = true
	ss.mu.Unlock()
	go func() {
		s.init.Wait()
		close(ss.initDone)
	}()
	go s.readSessionStatus()
	// A stuck setup must not hold a pool or a request forever, and one
	// that cannot finish fails at once with its reason.
	timer := time.NewTimer(min(s.spec.Limits.Timeout, SetupTimeout))
	defer timer.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case msg := <-ss.ready:
			if msg != "" {
				return fmt.Errorf("sandbox setup: %s", msg)
			}
			return nil
		case <-ss.initDone:
			return errors.New("sandbox setup: init exited before serving")
		case <-timer.C:
			return errors.New("sandbox setup: init did not become ready in time")
		case <-tick.C:
			if why := setupStuck(s.init.Process.Pid); why != "" {
				return fmt.Errorf("sandbox setup: %s", why)
			}
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// readSessionStatus dispatches init's messages to the commands they name.
// Init is inside the sandbox: each message is bounded and checked, and a
// message about an unknown command is dropped.
func (s *sandbox) readSessionStatus() {
	ss := s.sess
	readyOnce := sync.Once{}
	sendReady := func(msg string) { readyOnce.Do(func() { ss.ready <- msg }) }
	sc := bufio.NewScanner(s.statusR)
	sc.Buffer(make([]byte, 4096), 8192)
	for sc.Scan() {
		var st nswire.Status
		if json.Unmarshal(sc.Bytes(), &st) != nil || !plausible(&st) {
			continue
		}
		if st.Proc == 0 {
			switch {
			case st.Error != "":
				sendReady(st.Error)
			case st.Started:
				for _, d := range st.Degraded {
					if !contains(s.spec.AllowMissing, d) {
						s.cg.Kill()
						sendReady("init reported an unaccepted degradation: " + d)
					}
				}
				s.degraded = append([]string{}, st.Degraded...)
				sendReady("")
			}
			continue
		}
		ss.mu.Lock()
		p := ss.procs[st.Proc]
		ss.mu.Unlock()
		if p == nil {
			continue
		}
		switch {
		case st.Exited:
			p.exit(&st)
		case st.Started:
			p.markStarted(st.Pid)
		}
	}
	sendReady("init closed its status pipe")
	// Init is gone (or hostile): every command still running ends now.
	<-ss.initDone
	ss.mu.Lock()
	ss.dead = true
	procs := ss.procs
	ss.procs = map[int]*process{}
	ss.mu.Unlock()
	for _, p := range procs {
		p.exit(nil)
	}
}

func plausible(st *nswire.Status) bool {
	// A command's pid is never init's (1) and at most PID_MAX_LIMIT.
	return st.Proc >= 0 && st.Exit >= 0 && st.Exit <= 255 && st.Signal >= 0 && st.Signal <= 64 &&
		(st.Pid == 0 || (st.Pid > 1 && st.Pid <= 1<<22)) &&
		len(st.Error) <= 4096 && len(st.Degraded) <= 8
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Start implements tier.Sessioner.
func (s *sandbox) Start(ctx context.Context, c *tier.Command) (tier.Process, error) {
	ss := s.sess
	if ss == nil {
		return nil, errors.New("sandbox was not prepared as a session")
	}
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return nil, errors.New("empty command")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	timeout := s.spec.Limits.Timeout
	if c.Timeout > 0 && c.Timeout < timeout {
		timeout = c.Timeout
	}
	before, err := s.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	pipe := func() (r, w *os.File) {
		if err != nil {
			return nil, nil
		}
		r, w, err = os.Pipe()
		files = append(files, r, w)
		return r, w
	}
	stdinR, stdinW := pipe()
	stdoutR, stdoutW := pipe()
	stderrR, stderrW := pipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("create pipes: %w", err)
	}
	if err := ownStdio(s.ids, stdinR, stdoutW, stderrW); err != nil {
		closeAll()
		return nil, err
	}

	ss.mu.Lock()
	if ss.dead || ss.destroyed {
		ss.mu.Unlock()
		closeAll()
		return nil, errors.New("the sandbox has ended")
	}
	ss.next++
	p := &process{s: s, n: ss.next, lim: s.spec.Limits, before: before, exited: make(chan struct{}), startedCh: make(chan struct{}), start: time.Now()}
	p.lim.Timeout = timeout
	ss.procs[p.n] = p
	ss.mu.Unlock()

	req := &nswire.Request{Op: nswire.OpExec, Proc: p.n, Argv: c.Argv, Env: c.Env, Dir: c.Dir}
	if c.TTY != nil {
		req.TTY = &nswire.Winsize{Rows: c.TTY.Rows, Cols: c.TTY.Cols}
		p.tty = true
	}
	msg, _ := json.Marshal(req)
	err = unix.Sendmsg(int(ss.sock.Fd()), msg, unix.UnixRights(int(stdinR.Fd()), int(stdoutW.Fd()), int(stderrW.Fd())), nil, 0)
	// Init has its copies now (or never will): ours must go, so that EOF
	// on stdout and stderr means every writer is gone.
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		ss.mu.Lock()
		delete(ss.procs, p.n)
		ss.mu.Unlock()
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, fmt.Errorf("send command to init: %w", err)
	}
	p.outputs = []*os.File{stdoutR, stderrR}
	copyOut := func(dst io.Writer, src *os.File) {
		p.copiers.Add(1)
		go func() {
			defer p.copiers.Done()
			if dst == nil {
				dst = io.Discard
			}
			io.Copy(dst, src)
		}()
	}
	copyOut(c.Stdout, stdoutR)
	copyOut(c.Stderr, stderrR)
	go func() {
		if c.Stdin != nil {
			io.Copy(stdinW, c.Stdin)
		}
		stdinW.Close()
	}()
	p.timer = time.AfterFunc(timeout, func() {
		p.mu.Lock()
		p.timedOut = true
		p.mu.Unlock()
		p.Signal(unix.SIGKILL)
	})
	return p, nil
}

// process is one command of a session.
type process struct {
	s      *sandbox
	n      int
	lim    tier.Limits
	before cgroup.Stats
	start  time.Time

	timer   *time.Timer
	tty     bool // started with a terminal (Resizer)
	copiers sync.WaitGroup
	outputs []*os.File

	mu        sync.Mutex
	started   time.Time
	pid       int           // in the sandbox's PID namespace; 0: not known
	startedCh chan struct{} // closed when init reported the start
	ended     time.Time
	final     *nswire.Status
	timedOut  bool
	exited    chan struct{}
	once      sync.Once

	waitOnce sync.Once
	outcome  *tier.Outcome
	err      error
}

func (p *process) markStarted(pid int) {
	p.mu.Lock()
	if p.started.IsZero() {
		p.started = time.Now()
		p.pid = pid
		close(p.startedCh)
	}
	p.mu.Unlock()
}

// pidWait bounds how long Pid waits for init's report of the start.
const pidWait = 10 * time.Second

// Pid implements tier.PidReporter: the command's pid in the sandbox's
// PID namespace, once init reported it started; 0 if it ended first or
// never started.
func (p *process) Pid() int {
	t := time.NewTimer(pidWait)
	defer t.Stop()
	select {
	case <-p.startedCh:
	case <-p.exited:
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid
}

// exit records the command's end; st nil means init died first.
func (p *process) exit(st *nswire.Status) {
	p.once.Do(func() {
		p.mu.Lock()
		p.final = st
		p.ended = time.Now()
		p.mu.Unlock()
		ss := p.s.sess
		ss.mu.Lock()
		delete(ss.procs, p.n)
		ss.mu.Unlock()
		close(p.exited)
	})
}

// Signal implements tier.Process.
func (p *process) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return errors.New("the command has ended")
	default:
	}
	msg, _ := json.Marshal(&nswire.Request{Op: nswire.OpSignal, Proc: p.n, Signal: int(sig)})
	if err := p.s.sess.send(msg); err != nil {
		return fmt.Errorf("signal command: %w", err)
	}
	return nil
}

// Resize implements tier.Resizer.
func (p *process) Resize(ws tier.WindowSize) error {
	if !p.tty {
		return errors.New("the command has no terminal")
	}
	if ws.Rows == 0 || ws.Cols == 0 {
		return fmt.Errorf("window size %dx%d: a terminal needs at least one row and one column", ws.Cols, ws.Rows)
	}
	select {
	case <-p.exited:
		return errors.New("the command has ended")
	default:
	}
	msg, _ := json.Marshal(&nswire.Request{Op: nswire.OpResize, Proc: p.n, TTY: &nswire.Winsize{Rows: ws.Rows, Cols: ws.Cols}})
	if err := p.s.sess.send(msg); err != nil {
		return fmt.Errorf("resize the terminal: %w", err)
	}
	return nil
}

var _ tier.Resizer = (*process)(nil)

// Wait implements tier.Process.
func (p *process) Wait() (*tier.Outcome, error) {
	p.waitOnce.Do(func() { p.outcome, p.err = p.wait() })
	return p.outcome, p.err
}

func (p *process) wait() (*tier.Outcome, error) {
	<-p.exited
	p.timer.Stop()
	drained := make(chan struct{})
	go func() { p.copiers.Wait(); close(drained) }()
	tier.DrainAfterExit(drained, p.outputs, tier.DrainGrace)
	for _, f := range p.outputs {
		f.Close()
	}
	p.mu.Lock()
	final, timedOut, started, ended := p.final, p.timedOut, p.started, p.ended
	p.mu.Unlock()
	out := &tier.Outcome{Duration: programDuration(final, p.start, started, ended), Degradations: append([]string{}, p.s.degraded...)}
	now, err := p.s.cg.Stats()
	if err != nil {
		// The sandbox was destroyed under the command.
		now = p.before
	}
	delta := now
	delta.CPU = now.CPU - p.before.CPU
	delta.OOMKills = now.OOMKills - p.before.OOMKills
	delta.PidsMaxHits = now.PidsMaxHits - p.before.PidsMaxHits
	out.CPU = delta.CPU
	out.PeakMemory = now.PeakMemory
	ss := p.s.sess
	ss.mu.Lock()
	destroyed := ss.destroyed
	ss.mu.Unlock()
	if final == nil && destroyed {
		out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+9, 9
		out.Violations = append(out.Violations, tier.Cancelled("the sandbox was destroyed while the command ran"))
		return out, nil
	}
	if final != nil && final.Error != "" {
		out.Termination, out.ExitCode, out.Error = result.InfraError, 125, "init: "+final.Error
		return out, nil
	}
	classify(out, final, timedOut, delta, p.lim)
	if full := workspaceFull(p.s.ws); full != "" {
		out.Violations = append(out.Violations, result.Violation{Kind: full, Detail: "the workspace is full", Limit: limitFor(full, p.lim)})
		if out.Termination == result.Exited && out.ExitCode != 0 {
			out.Termination = result.DiskLimit
		}
	}
	return out, nil
}

// started reports whether the session's init waiter runs (serveSession got
// as far as starting it).
func (ss *session) started() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.waiting
}

var _ tier.PidReporter = (*process)(nil)

// send writes one request without descriptors to init. Through
// SyscallConn, which holds a reference on the descriptor for the call: a
// Destroy closing the socket at the same time (a signal racing a delete)
// then fails the send instead of freeing the number mid-call, when the
// request could go to whatever file reused it (sock.Fd() holds nothing).
// The socket is already in blocking mode: Start's Sendmsg took Fd() before
// any process existed to signal.
func (ss *session) send(msg []byte) error {
	rc, err := ss.sock.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Sendmsg(int(fd), msg, nil, nil, 0) }); err != nil {
		return err
	}
	return serr
}
