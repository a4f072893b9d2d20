package ociruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

// ExecOptions are exec's flags.
type ExecOptions struct {
	// ProcessFile is a runtime-spec process JSON (--process); without
	// it the container's own process is the base, changed by the flags.
	ProcessFile   string
	Detach        bool
	PidFile       string
	ConsoleSocket string
	TTY           bool
	Cwd           string
	Env           []string
	Args          []string
}

// ProxyArg is the hidden argument under which the moat binary is an
// exec's proxy: the process whose pid the engine holds for an exec (it
// waits for and signals that pid), which carries the signals to the
// command in the container and exits with its status.
const ProxyArg = "__oci-exec-proxy"

// execRequest is what exec hands its proxy (on fd 4).
type execRequest struct {
	Socket string `json:"socket"`
	// Console is the engine's console socket, for a terminal's master.
	Console string         `json:"console,omitempty"`
	Request nswire.Request `json:"request"`
}

// Exec runs a process in a running container. Detached, it returns once
// the process started, its proxy's pid in PidFile; otherwise it returns
// the process's exit status.
func (r *Runtime) Exec(id string, o ExecOptions) (int, error) {
	rec, err := r.load(id)
	if err != nil {
		return 0, err
	}
	if st := r.status(rec); st != StatusRunning {
		return 0, fmt.Errorf("cannot exec in container %s (%s): %w", id, st, ErrNotRunning)
	}
	p, err := execProcess(rec, o)
	if err != nil {
		return 0, err
	}
	if o.TTY {
		p.Terminal = true
	}
	switch {
	case p.Terminal && o.ConsoleSocket == "":
		return 0, refuse("process.terminal", "true", "exec with a terminal needs --console-socket (Moat's runtime does not attach a terminal to its own stdio)")
	case !p.Terminal && o.ConsoleSocket != "":
		return 0, refuse("process.terminal", "false", "--console-socket was given for a process without a terminal; set process.terminal or drop the flag")
	}
	// Checked like the container's process: the same refusals.
	c := &Container{}
	if err := mapProcess(c, p, r.Policy, func(field, value, what string) error {
		if r.Policy != nil && r.Policy.AcceptPrivileged {
			r.Log.Warnf("exec in %s: %s = %s not granted: %s", id, field, value, what)
			return nil
		}
		return refuse(field, value, what+"; remove it, or set accept_privileged: true in the runtime policy")
	}); err != nil {
		return 0, err
	}
	if c.UID != rec.UID || c.GID != rec.GID {
		return 0, refuse("process.user", fmt.Sprintf("uid %d gid %d", c.UID, c.GID), fmt.Sprintf("every process of a Moat container runs as its user (uid %d gid %d); exec as that user", rec.UID, rec.GID))
	}
	if rec.Egress.Proxied() {
		// As the container's process: the engine's exec carries the
		// spec's environment, without the proxy's.
		c.Env = withProxyEnv(c.Env)
	}
	req := execRequest{Socket: execSocket(id), Console: o.ConsoleSocket, Request: nswire.Request{Op: nswire.OpExec, Argv: c.Argv, Env: c.Env, Dir: c.Cwd, TTY: c.Terminal}}
	for _, f := range []*os.File{os.Stdin, os.Stdout, os.Stderr} {
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO {
			unix.Fchown(int(f.Fd()), rec.UIDBase+rec.UID, rec.UIDBase+rec.GID)
		}
	}
	if !o.Detach {
		return proxy(req, nil), nil
	}
	return 0, r.startProxy(req, o.PidFile)
}

// execProcess is the exec's process: --process, or the container's own
// process with the flags' changes (as runc does).
func execProcess(rec *record, o ExecOptions) (*Process, error) {
	if o.ProcessFile != "" {
		f, err := os.Open(o.ProcessFile)
		if err != nil {
			return nil, fmt.Errorf("--process: %w", err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, MaxSpecBytes+1))
		if err != nil || len(b) > MaxSpecBytes {
			return nil, fmt.Errorf("--process %s: unreadable or larger than %d bytes", o.ProcessFile, MaxSpecBytes)
		}
		var p Process
		if err := json.Unmarshal(b, &p); err != nil {
			return nil, fmt.Errorf("--process %s: %w", o.ProcessFile, err)
		}
		return &p, nil
	}
	spec, err := readSpec(rec.Bundle)
	if err != nil {
		return nil, err
	}
	if spec.Process == nil {
		return nil, errors.New("the container's config.json has no process")
	}
	p := *spec.Process
	p.Args = o.Args
	p.Env = append(append([]string(nil), p.Env...), o.Env...)
	if o.Cwd != "" {
		p.Cwd = o.Cwd
	}
	p.Terminal = false
	return &p, nil
}

// startProxy starts the exec's proxy, waits until the command started,
// and writes the proxy's pid to pidFile; the proxy outlives this process
// (the engine's shim adopts it).
func (r *Runtime) startProxy(req execRequest, pidFile string) error {
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	reqR, reqW, err := os.Pipe()
	if err != nil {
		readyW.Close()
		return err
	}
	cmd := exec.Command("/proc/self/exe", "oci", ProxyArg)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{readyW, reqR} // fds 3, 4
	cmd.Env = []string{}
	err = cmd.Start()
	readyW.Close()
	reqR.Close()
	if err != nil {
		reqW.Close()
		return fmt.Errorf("start the exec's proxy: %w", err)
	}
	json.NewEncoder(reqW).Encode(req)
	reqW.Close()
	msg, _ := io.ReadAll(io.LimitReader(readyR, 4096))
	if string(msg) != "ok" {
		cmd.Process.Kill()
		cmd.Wait()
		if len(msg) == 0 {
			msg = []byte("the exec's proxy ended before the process started")
		}
		return fmt.Errorf("exec: %s", msg)
	}
	if err := writePidFile(pidFile, cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		return err
	}
	cmd.Process.Release()
	return nil
}

// ProxyMain is the exec proxy's whole life (see ProxyArg): its request on
// fd 4, "ok" or an error on fd 3 once the command started, its exit
// status the command's.
func ProxyMain() int {
	ready := os.NewFile(3, "ready")
	reqf := os.NewFile(4, "request")
	var req execRequest
	err := json.NewDecoder(io.LimitReader(reqf, nswire.MaxRequestBytes)).Decode(&req)
	reqf.Close()
	if err != nil {
		ready.WriteString("bad request: " + err.Error())
		return 125
	}
	return proxy(req, ready)
}

// proxySignals are passed on to the command (its process group).
var proxySignals = []os.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGWINCH, unix.SIGALRM, unix.SIGCONT}

// proxy connects to the container's init, sends the request with this
// process's stdio, and relays signals until the command ends. ready, if
// not nil, gets "ok" once it started, or the reason it did not.
func proxy(req execRequest, ready *os.File) int {
	say := func(msg string) {
		if ready != nil {
			ready.WriteString(msg)
			ready.Close()
			ready = nil
		}
	}
	fail := func(err error) int {
		say(err.Error())
		fmt.Fprintf(os.Stderr, "moat-runtime exec: %v\n", err)
		return 125
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, proxySignals...)
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: req.Socket}); err != nil {
		return fail(fmt.Errorf("connect to the container's init (%s): %w", req.Socket, err))
	}
	b, err := json.Marshal(req.Request)
	if err != nil {
		return fail(err)
	}
	if err := unix.Sendmsg(fd, b, unix.UnixRights(0, 1, 2), nil, 0); err != nil {
		return fail(fmt.Errorf("send the exec: %w", err))
	}
	go func() {
		for s := range sigs {
			b, _ := json.Marshal(nswire.Request{Op: nswire.OpSignal, Signal: int(s.(unix.Signal))})
			unix.Write(fd, b)
		}
	}()
	buf := make([]byte, nswire.MaxStatusBytes)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n == 0 {
			// The container (its init) ended under the command.
			say("the container ended before the process started")
			return 128 + int(unix.SIGKILL)
		}
		var st nswire.Status
		if json.Unmarshal(buf[:n], &st) != nil {
			continue
		}
		if st.Error != "" {
			return fail(errors.New(st.Error))
		}
		if oobn > 0 {
			// The process's terminal: its master goes to the engine.
			var master = -1
			if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
				if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
					master = fds[0]
				}
			}
			if master < 0 || req.Console == "" {
				if master >= 0 {
					unix.Close(master)
				}
				return fail(errors.New("a terminal came from init unasked"))
			}
			err := sendConsole(req.Console, master)
			unix.Close(master)
			if err != nil {
				return fail(err)
			}
		}
		if st.Started {
			say("ok")
		}
		if st.Exited {
			say("ok")
			if st.Exit < 0 || st.Exit > 255 {
				return 255
			}
			return st.Exit
		}
	}
}
