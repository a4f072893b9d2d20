package gvisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/gvinit/gvwire"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

var _ tier.Sessioner = (*sandbox)(nil)

// process is one command started in the sandbox by `runsc exec`: runsc
// asks the Sentry to create it (the guest, which execs the program in
// place) with runsc's own stdio, waits for it and logs its wait status.
type process struct {
	s       *sandbox
	n       int
	cmd     *exec.Cmd
	log     string // runsc exec's log: the wait status
	errLog  string // runsc exec's fatal errors
	pidFile string // the command's pid in the sandbox
	lim     tier.Limits
	before  cgroup.Stats
	start   time.Time

	done    chan struct{} // runsc exec has been reaped
	ended   time.Time
	timer   *time.Timer
	copiers sync.WaitGroup
	killers sync.WaitGroup // kill's runsc commands
	outputs []*os.File

	mu       sync.Mutex
	timedOut bool
	killing  bool

	waitOnce sync.Once
	outcome  *tier.Outcome
	err      error
}

// ociProcessFile is runsc exec's --process file.
type ociProcessFile struct {
	Terminal        bool     `json:"terminal"`
	User            ociUser  `json:"user"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Cwd             string   `json:"cwd"`
	Capabilities    ociCaps  `json:"capabilities"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
}

// start starts c in the sandbox with the given timeout.
func (s *sandbox) start(c *tier.Command, timeout time.Duration) (*process, error) {
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return nil, errors.New("no command")
	}
	select {
	case <-s.ready:
		if s.readyErr != nil {
			return nil, s.readyErr
		}
	default:
		return nil, errors.New("the sandbox is not ready")
	}
	select {
	case <-s.bootDone:
		return nil, errors.New("the sandbox has ended")
	default:
	}
	before, err := s.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	s.mu.Lock()
	if s.destroyed {
		s.mu.Unlock()
		return nil, errors.New("sandbox destroyed")
	}
	s.next++
	n := s.next
	s.mu.Unlock()

	dir := c.Dir
	if dir == "" {
		dir = "/workspace"
	}
	empty := []string{}
	procFile := filepath.Join(s.logs, fmt.Sprintf("exec-%d.json", n))
	b, _ := json.Marshal(&ociProcessFile{
		User:            ociUser{UID: SandboxUID, GID: SandboxGID, AdditionalGids: []uint32{}},
		Args:            gvwire.ExecArgs(guestPath, commandRlimits(s.spec.Limits, s.hostPids), c.Argv),
		Env:             append([]string{}, c.Env...),
		Cwd:             dir,
		Capabilities:    ociCaps{Bounding: empty, Effective: empty, Inheritable: empty, Permitted: empty, Ambient: empty},
		NoNewPrivileges: true,
	})
	if err := os.WriteFile(procFile, b, 0o600); err != nil {
		return nil, fmt.Errorf("write process file: %w", err)
	}
	p := &process{
		s: s, n: n, lim: s.spec.Limits, before: before, done: make(chan struct{}),
		log:     fmt.Sprintf("exec-%d.log", n),
		errLog:  fmt.Sprintf("exec-%d.err", n),
		pidFile: filepath.Join(s.logs, fmt.Sprintf("exec-%d.pid", n)),
	}
	p.lim.Timeout = timeout

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
	// runsc hands its standard descriptors to the command (its errors,
	// too, go to the command's stderr), so they are pipes Moat reads,
	// never the caller's.
	p.cmd = &exec.Cmd{
		Path: s.g.runsc,
		Args: append(append([]string{"runsc"}, s.flags(p.log, "exec", p.errLog)...),
			"exec", "--process", procFile, "--internal-pid-file", p.pidFile, s.spec.ID),
		Env:         runscEnv,
		Stdin:       stdinR,
		Stdout:      stdoutW,
		Stderr:      stderrW,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL},
	}
	// Started under the lock, so that Destroy either sees it or has
	// already run (and start refuses).
	s.mu.Lock()
	err = errors.New("sandbox destroyed")
	if !s.destroyed {
		err = p.cmd.Start()
	}
	p.start = time.Now()
	if err == nil {
		s.procs[n] = p
	}
	s.mu.Unlock()
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return nil, fmt.Errorf("start runsc exec: %w", err)
	}
	go func() {
		p.cmd.Wait()
		p.ended = time.Now()
		s.mu.Lock()
		delete(s.procs, n)
		s.mu.Unlock()
		close(p.done)
	}()
	p.outputs = []*os.File{stdoutR, stderrR}
	copyOut := func(dst io.Writer, src *os.File) {
		p.copiers.Add(1)
		go func() {
			defer p.copiers.Done()
			drain(dst, src)
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
		p.kill()
	})
	return p, nil
}

// pid is the command's pid in the sandbox, which runsc writes once the
// Sentry created it; 0 when it is not known (yet).
func (p *process) pid() int {
	for i := 0; i < 100; i++ {
		if b, err := os.ReadFile(p.pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				return pid
			}
		}
		select {
		case <-p.done:
			return 0
		case <-time.After(20 * time.Millisecond):
		}
	}
	return 0
}

// Pid implements tier.PidReporter: the pid runsc wrote for the command.
func (p *process) Pid() int { return p.pid() }

// Signal implements tier.Process: sig goes to the command's process group
// (the command leads its own session in the sandbox), sent from inside by
// the guest; if that fails, runsc signals the command's process itself.
func (p *process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return errors.New("the command has ended")
	default:
	}
	pid := p.pid()
	if pid == 0 {
		select {
		case <-p.done:
			return errors.New("the command has ended")
		default:
			return errors.New("the command's process is not known yet")
		}
	}
	args := append([]string{"exec", "--user", fmt.Sprintf("%d:%d", SandboxUID, SandboxGID), "--cwd", "/", p.s.spec.ID},
		gvwire.KillArgs(guestPath, int(sig), pid)...)
	out, err := p.s.runsc(args...)
	if err == nil {
		return nil
	}
	if out2, err2 := p.s.runsc("kill", "--pid", strconv.Itoa(pid), p.s.spec.ID, strconv.Itoa(int(sig))); err2 != nil {
		select {
		case <-p.done:
			return errors.New("the command has ended")
		default:
		}
		return fmt.Errorf("signal command: %s; %s", clean(string(out)), clean(string(out2)))
	}
	return nil
}

// kill ends the command: SIGKILL to its process group, and to its process
// through runsc. A runsc exec that still has not returned after killLimit
// (a stuck Sentry) is killed itself; the sandbox's cgroup kill on Exec's
// or Destroy's way out ends the rest.
func (p *process) kill() {
	p.mu.Lock()
	if p.killing {
		p.mu.Unlock()
		return
	}
	p.killing = true
	p.killers.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.killers.Done()
		if pid := p.pid(); pid != 0 {
			p.s.runsc("kill", "--pid", strconv.Itoa(pid), p.s.spec.ID, "KILL")
			p.Signal(unix.SIGKILL)
		}
		select {
		case <-p.done:
		case <-time.After(killLimit):
			p.cmd.Process.Kill()
		}
	}()
}

// finish drains the command's output (for a session, as tier.DrainAfterExit
// allows) and reads how it ended from runsc exec's log.
func (p *process) finish(session bool) (*tier.Outcome, tier.Observed) {
	<-p.done
	p.timer.Stop()
	// A kill in flight finishes (its runsc commands return) first.
	p.killers.Wait()
	drained := make(chan struct{})
	go func() { p.copiers.Wait(); close(drained) }()
	if session {
		tier.DrainAfterExit(drained, p.outputs, tier.DrainGrace)
	} else {
		<-drained
	}
	for _, f := range p.outputs {
		f.Close()
	}
	p.mu.Lock()
	timedOut := p.timedOut
	p.mu.Unlock()
	out := &tier.Outcome{Duration: p.ended.Sub(p.start), Runtime: p.s.g.version}
	obs := p.s.observe(p.log, p.errLog)
	obs.TimedOut = timedOut
	return out, obs
}

// Start implements tier.Sessioner.
func (s *sandbox) Start(ctx context.Context, c *tier.Command) (tier.Process, error) {
	if !s.spec.Session {
		return nil, errors.New("sandbox was not prepared as a session")
	}
	if err := s.WaitReady(ctx); err != nil {
		return nil, err
	}
	timeout := s.spec.Limits.Timeout
	if c.Timeout > 0 && c.Timeout < timeout {
		timeout = c.Timeout
	}
	return s.start(c, timeout)
}

// Wait implements tier.Process.
func (p *process) Wait() (*tier.Outcome, error) {
	p.waitOnce.Do(func() { p.outcome, p.err = p.wait() })
	return p.outcome, p.err
}

func (p *process) wait() (*tier.Outcome, error) {
	out, obs := p.finish(true)
	now, err := p.s.cg.Stats()
	if err != nil {
		// The sandbox was destroyed under the command.
		now = p.before
	}
	delta := now
	delta.CPU = now.CPU - p.before.CPU
	delta.OOMKills = now.OOMKills - p.before.OOMKills
	delta.PidsMaxHits = now.PidsMaxHits - p.before.PidsMaxHits
	out.CPU, out.PeakMemory = delta.CPU, now.PeakMemory
	p.s.mu.Lock()
	destroyed := p.s.destroyed
	p.s.mu.Unlock()
	if obs.Exit == nil && destroyed {
		out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+9, 9
		out.Violations = append(out.Violations, tier.Cancelled("the sandbox was destroyed while the command ran"))
		return out, nil
	}
	obs.Stats = delta
	p.s.classify(out, obs, p.lim)
	return out, nil
}

var _ tier.PidReporter = (*process)(nil)
