package nsinit

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"golang.org/x/sys/unix"
)

// serve is session mode: init, already as confined as any program it will
// start, runs the commands the host sends on SessionFD, reports each one's
// start and end on StatusFD, reaps every process that ends up as its child,
// and returns (ending the whole PID namespace) when the host closes the
// socket. It runs on the main goroutine, locked to the thread whose
// bounding set was emptied: every command is forked from that thread.
func serve(st *reporter, degraded []string) (int, error) {
	s := &server{st: st, pids: map[int]int{}, procs: map[int]int{}, forked: map[int]time.Time{}}
	sigchld := make(chan os.Signal, 64)
	signal.Notify(sigchld, unix.SIGCHLD)
	go s.reap(sigchld)
	st.send(nswire.Status{Started: true, Degraded: degraded})

	buf := make([]byte, nswire.MaxRequestBytes)
	oob := make([]byte, unix.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(nswire.SessionFD, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			// The host closed its end (or died): returning ends PID 1,
			// and the kernel kills everything left in the namespace.
			return 0, nil
		}
		fds := rights(oob[:oobn])
		var req nswire.Request
		if json.Unmarshal(buf[:n], &req) == nil {
			s.handle(&req, fds)
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

type server struct {
	st *reporter
	// mu is held across fork so that the reaper, which takes it after
	// wait4, always finds a command's pid registered.
	mu    sync.Mutex
	pids  map[int]int // host-assigned command number -> pid, while running
	procs map[int]int // pid -> command number
	// forked is when each running command's fork began (its duration).
	forked map[int]time.Time
	ttys   terminals
}

func (s *server) handle(req *nswire.Request, fds []int) {
	switch req.Op {
	case nswire.OpExec:
		s.exec(req, fds)
	case nswire.OpSignal:
		s.mu.Lock()
		pid, ok := s.pids[req.Proc]
		s.mu.Unlock()
		if ok && req.Signal > 0 && req.Signal < 65 {
			// The command's whole process group: what it started in
			// the foreground goes too.
			unix.Kill(-pid, unix.Signal(req.Signal))
		}
	case nswire.OpResize:
		// A command that has no terminal, or has ended: nothing to do.
		if t := s.ttys.get(req.Proc); t != nil && req.TTY != nil && req.TTY.Rows > 0 && req.TTY.Cols > 0 {
			t.resize(*req.TTY)
		}
	}
}

func (s *server) exec(req *nswire.Request, fds []int) {
	if len(fds) != 3 || req.Proc <= 0 || len(req.Argv) == 0 || req.Argv[0] == "" {
		s.st.send(nswire.Status{Proc: req.Proc, Exited: true, Exit: 125, Error: "malformed exec request"})
		return
	}
	// The descriptors belong to serve, which closes them after this
	// returns: write to stderr through the bare fd. An os.File around it
	// would close the same number again from its GC cleanup, at any later
	// moment, when the number belongs to something else: the relay's
	// pooled splice pipe lost its read end that way, and every later
	// egress connection was closed unread (the proxy logged bad-request).
	fail := func(exit int, notFound bool, format string, a ...any) {
		writeAll(fds[2], fmt.Sprintf("moat: "+format+"\n", a...))
		s.st.send(nswire.Status{Proc: req.Proc, Started: true})
		s.st.send(nswire.Status{Proc: req.Proc, Exited: true, Exit: exit, NotFound: notFound, NotExecutable: !notFound})
	}
	path, err := lookPath(req.Argv[0], req.Dir, req.Env)
	if err != nil {
		nf, _ := err.(*notFoundError)
		if nf != nil && nf.exists {
			fail(126, false, "%v", err)
		} else {
			fail(127, true, "%v", err)
		}
		return
	}
	attr := &syscall.ProcAttr{
		Dir:   req.Dir,
		Env:   req.Env,
		Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	var tty *terminal
	var in, out *os.File
	if req.TTY != nil {
		var slave int
		tty, slave, in, out, err = s.terminal(*req.TTY, fds)
		if err != nil {
			fail(126, false, "cannot give %s a terminal: %v", req.Argv[0], err)
			return
		}
		defer unix.Close(slave)
		// Its own session, the terminal its controlling one (fd 0 in the
		// child), so that job control and ^C reach its process group.
		attr.Files = []uintptr{uintptr(slave), uintptr(slave), uintptr(slave)}
		attr.Sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	s.mu.Lock()
	forked := time.Now()
	pid, err := syscall.ForkExec(path, req.Argv, attr)
	if err == nil && tty != nil {
		s.ttys.put(req.Proc, tty)
		tty.relay(in, out)
	}
	if err == nil {
		s.pids[req.Proc] = pid
		s.procs[pid] = req.Proc
		s.forked[pid] = forked
		// ForkExec's pid is in init's PID namespace, the sandbox's.
		s.st.send(nswire.Status{Proc: req.Proc, Started: true, Pid: pid})
	}
	s.mu.Unlock()
	if err != nil {
		if tty != nil {
			tty.master.Close()
			in.Close()
			out.Close()
		}
		fail(126, false, "cannot execute %s: %v", req.Argv[0], err)
	}
}

// terminal opens a terminal of size ws for an exec whose descriptors are
// fds, and init's own copies of the exec's stdin and stdout for the
// relay. The slave is the caller's to close once the command is forked.
func (s *server) terminal(ws nswire.Winsize, fds []int) (t *terminal, slave int, in, out *os.File, err error) {
	if ws.Rows == 0 || ws.Cols == 0 {
		return nil, -1, nil, nil, errBadSize
	}
	master, slave, err := openTerminal(ws)
	if err != nil {
		return nil, -1, nil, nil, err
	}
	if in, err = dupFile(fds[0], "tty-in"); err == nil {
		if out, err = dupFile(fds[1], "tty-out"); err != nil {
			in.Close()
		}
	}
	if err != nil {
		master.Close()
		unix.Close(slave)
		return nil, -1, nil, nil, err
	}
	return &terminal{master: master, done: make(chan struct{})}, slave, in, out, nil
}

// reap collects every child that ends: commands (reported) and orphans
// re-parented to PID 1 (dropped).
func (s *server) reap(sigchld <-chan os.Signal) {
	for range sigchld {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			s.mu.Lock()
			proc, ok := s.procs[pid]
			if ok {
				delete(s.procs, pid)
				delete(s.pids, proc)
			}
			forked := s.forked[pid]
			delete(s.forked, pid)
			s.mu.Unlock()
			if !ok {
				continue
			}
			st := nswire.Status{Proc: proc, Exited: true, DurationNS: time.Since(forked).Nanoseconds()}
			switch {
			case ws.Exited():
				st.Exit = ws.ExitStatus()
			case ws.Signaled():
				st.Signal = int(ws.Signal())
				st.Exit = 128 + st.Signal
			}
			if t := s.ttys.take(proc); t != nil {
				// The end is reported once the terminal's last output
				// is on its way to the host, not before.
				go func() {
					t.finish()
					s.st.send(st)
				}()
				continue
			}
			s.st.send(st)
		}
	}
}

// writeAll writes msg to fd, a descriptor init does not own (a command's
// stderr), retrying short writes and EINTR, and waiting up to a second for
// room if the host's end is non-blocking; an error drops the rest, as
// nobody is left to tell.
func writeAll(fd int, msg string) {
	b := []byte(msg)
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err == unix.EAGAIN {
			if p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}; pollOnce(p, 1000) {
				continue
			}
			return
		}
		if err != nil || n <= 0 {
			return
		}
		b = b[n:]
	}
}

// pollOnce waits up to ms milliseconds for p's events; false on timeout
// or error.
func pollOnce(p []unix.PollFd, ms int) bool {
	for {
		n, err := unix.Poll(p, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && p[0].Revents&unix.POLLOUT != 0
	}
}

// rights extracts the descriptors of an SCM_RIGHTS control message.
func rights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}
