package microvm

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// This file is the sandbox: Prepare, Exec and Destroy of one VM that runs
// one command (vm.go boots it, transfer.go moves its workspace).

// timeoutGrace is how long past the wall timeout the host waits for the
// agent's own timeout report before it kills the VMM.
const timeoutGrace = 5 * time.Second

// guestUID is the unprivileged user the command runs as inside the VM.
const guestUID = 1000

// Sandbox is one VM, booting from Prepare and used for one command.
type Sandbox struct {
	m      *MicroVM
	spec   *tier.Spec
	cg     *cgroup.Cgroup // the run's cgroup: the VMM's
	limits cgroup.Limits  // its limits
	dir    string         // our files under the run's StateDir
	ws     string         // host workspace directory
	disk   *os.File       // holds the image disk while the sandbox lives (disks.go)
	accel  string
	vm     *vm
	ready  chan struct{}
	hello  *vmwire.Hello
	bootE  error
	booted time.Time
	start  time.Time
	how    string // how the VM started: restored, or cold boot and why

	mu   sync.Mutex // guards vm and gone while the VM starts
	gone bool       // Destroy was called

	destroyOnce sync.Once
}

var _ tier.Readier = (*Sandbox)(nil)

// Prepare starts the VM; it boots while the engine copies inputs into the
// host workspace (WaitReady waits for the agent's hello).
func (m *MicroVM) Prepare(ctx context.Context, spec *tier.Spec) (tier.Sandbox, error) {
	if err := tier.CheckNoBuild(Name, spec); err != nil {
		return nil, err
	}
	if spec.Session {
		return nil, fmt.Errorf("microvm: sessions are not supported by this tier")
	}
	if spec.StateDir == "" {
		return nil, errors.New("microvm: Spec.StateDir is required")
	}
	acc, err := m.Accel(ctx)
	if err != nil {
		return nil, err
	}
	disk, held, err := buildRootDisk(m.cache, spec.ImageDigest, spec.ImageRoot)
	if err != nil {
		return nil, fmt.Errorf("image disk: %w", err)
	}
	s := &Sandbox{m: m, spec: spec, dir: filepath.Join(spec.StateDir, "microvm"), disk: held, accel: acc.Accel, ready: make(chan struct{}), start: time.Now()}
	s.ws = filepath.Join(s.dir, "workspace")
	mem := int64(512)
	if spec.Limits.MemoryBytes > 0 {
		mem = (spec.Limits.MemoryBytes + (1<<20 - 1)) >> 20
	}
	vcpus := max(1, min(int(spec.Limits.CPUs+0.999), runtime.NumCPU()))
	// The run's cgroup holds the VMM: named after the run, so the engine's
	// GC removes it when a killed moat left it.
	s.limits = m.vmmLimits(mem+vmOverheadMiB, vcpus)
	if s.cg, err = m.cg.Create(spec.ID, s.limits); err != nil {
		held.Close()
		return nil, fmt.Errorf("microvm: the VMM's cgroup: %w", err)
	}
	if err := os.MkdirAll(s.ws, 0o700); err != nil {
		s.cg.Destroy()
		held.Close()
		return nil, err
	}
	cfg, err := m.config(s.dir, disk, acc.Accel, mem+vmOverheadMiB, vcpus)
	if err != nil {
		os.RemoveAll(s.dir)
		s.cg.Destroy()
		held.Close()
		return nil, err
	}
	if spec.EgressSocket != "" {
		// The only way out: a second port to the host, whose end leads
		// to the run's egress proxy. Still no network device.
		cfg.Egress, cfg.EgressProxy = filepath.Join(cfg.RunDir, "egress.sock"), spec.EgressSocket
	}
	go s.startVM(cfg)
	return s, nil
}

// startVM gets the sandbox a VM whose agent waits for the request:
// restored from the configuration's snapshot when there is a valid one,
// else booted (and, when there is no snapshot yet, saved as the
// snapshot before it serves its own request). Why it was booted is kept
// in s.how and reported in the outcome's Runtime.
func (s *Sandbox) startVM(cfg *VMConfig) {
	defer close(s.ready)
	m := s.m
	ctx, cancel := context.WithTimeout(context.Background(), m.opts.BootTimeout)
	defer cancel()
	key, why := m.snapshotKey(cfg)
	if key != "" {
		f, meta, err := m.openSnapshot(key)
		switch {
		case err == nil:
			rc := *cfg
			rc.QMP = filepath.Join(cfg.RunDir, "qmp.sock")
			if _, err = m.restore(ctx, &rc, s.cg, f, s.track); err == nil {
				s.hello, s.how, s.booted = &vmwire.Hello{Kernel: meta.Kernel}, "restored", time.Now()
				return
			}
			if s.destroyed() {
				// Not the snapshot's fault: keep it.
				s.bootE = errors.New("the sandbox was destroyed while its VM started")
				return
			}
			if lim := s.vmmLimitHit(); lim != "" {
				// Nor is a VMM killed at its cgroup's limit: keep it, and
				// say why this sandbox failed.
				s.bootE = fmt.Errorf("%s (restoring the snapshot: %v)", lim, err)
				return
			}
			why = "restore failed: " + err.Error()
			m.dropSnapshot(key)
		case errors.Is(err, os.ErrNotExist):
			why = "no snapshot yet"
		default:
			why = "snapshot rejected: " + err.Error()
			m.dropSnapshot(key)
		}
	}
	if s.destroyed() {
		s.bootE = errors.New("the sandbox was destroyed while its VM started")
		return
	}
	s.how = "cold boot (" + why + ")"
	save := key != "" && m.claimSave(key)
	if save {
		defer m.releaseSave(key)
		cfg.QMP = filepath.Join(cfg.RunDir, "qmp.sock")
	}
	v, err := m.startVMM(cfg, s.cg)
	if err != nil {
		s.bootE = err
		return
	}
	if !s.track(v) {
		s.bootE = errors.New("the sandbox was destroyed while its VM started")
		return
	}
	s.hello, s.bootE = v.waitHello(ctx)
	s.booted = time.Now()
	if s.bootE != nil {
		if lim := s.vmmLimitHit(); lim != "" {
			s.bootE = fmt.Errorf("%s (%v)", lim, s.bootE)
		}
	}
	if s.bootE == nil && save {
		if err := m.save(ctx, v, cfg, key, s.hello); err != nil {
			s.how += "; snapshot not saved: " + err.Error()
			if errors.Is(err, errPaused) {
				v.kill()
				s.bootE = err
			}
		} else {
			s.how += "; saved as the snapshot"
		}
	}
}

// track makes v the sandbox's VM; false (and v killed) when the sandbox
// was destroyed meanwhile.
func (s *Sandbox) track(v *vm) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		v.kill()
		return false
	}
	s.vm = v
	return true
}

func (s *Sandbox) destroyed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gone
}

func (m *MicroVM) claimSave(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.saving[key] {
		return false
	}
	m.saving[key] = true
	return true
}

func (m *MicroVM) releaseSave(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.saving, key)
}

func (s *Sandbox) Workspace() tier.Workspace { return tier.Workspace{Dir: s.ws, UID: 0, GID: 0} }

// WaitReady waits until the guest agent has said hello.
func (s *Sandbox) WaitReady(ctx context.Context) error {
	select {
	case <-s.ready:
		return s.bootE
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Runtime names the VMM, the accelerator and the guest kernel.
func (s *Sandbox) runtime() string {
	r := s.m.vmm.Name() + " accel=" + s.accel
	if s.hello != nil {
		r += " guest-kernel=" + sanitize([]byte(s.hello.Kernel))
	}
	if s.how != "" {
		r += " start=" + s.how
	}
	return r
}

func (s *Sandbox) infra(start time.Time, format string, args ...any) *tier.Outcome {
	s.vm.kill()
	return &tier.Outcome{Termination: result.InfraError, Error: fmt.Sprintf(format, args...), Duration: time.Since(start), Runtime: s.runtime()}
}

// vmmLimitHit says, when the VMM was killed or stopped by its cgroup's
// limits, which one: the kernel's OOM killer at the memory limit, or a
// failed thread creation at the pids limit (QEMU aborts then). "" when
// neither happened (or the cgroup cannot be read).
func (s *Sandbox) vmmLimitHit() string {
	if s.cg == nil {
		return ""
	}
	st, err := s.cg.Stats()
	if err != nil {
		return ""
	}
	switch {
	case st.OOMKills > 0:
		return fmt.Sprintf("the VMM was killed by the kernel's OOM killer at its cgroup's memory limit of %d MiB (the VM's RAM plus %d MiB for QEMU)", s.limits.MemoryBytes>>20, s.m.vmmOverheadMiB)
	case st.PidsMaxHits > 0:
		return fmt.Sprintf("the VMM reached its cgroup's limit of %d tasks", s.limits.Pids)
	}
	return ""
}

// Exec sends the command and the workspace to the agent and collects the
// outcome. The wall timeout kills the VMM.
func (s *Sandbox) Exec(ctx context.Context, c *tier.Command) (*tier.Outcome, error) {
	if err := s.WaitReady(ctx); err != nil {
		return s.infra(time.Now(), "microvm boot: %v", err), nil
	}
	// Duration is the command's: a cold sandbox's boot is not in it.
	start := time.Now()
	lim := s.spec.Limits
	// From here on the VM runs the program: its VMM gets the CPU bandwidth
	// the manifest grants (the boot before was Moat's work, not charged).
	if lim.CPUs > 0 {
		if err := s.cg.SetCPUs(lim.CPUs); err != nil {
			return s.infra(start, "the VMM's CPU limit: %v", err), nil
		}
	}
	req := vmwire.Request{
		Argv: c.Argv, Env: c.Env, Dir: c.Dir, UID: guestUID,
		MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUTime: int64(lim.CPUTime), OpenFiles: lim.OpenFiles,
		FileSizeBytes: lim.FileSizeBytes, WorkspaceBytes: lim.WorkspaceBytes, WorkspaceFiles: lim.WorkspaceFiles, TmpBytes: lim.TmpBytes,
		Timeout: int64(lim.Timeout),
		// Every VM's own randomness and the current time: a restored VM
		// has its snapshot's RNG state and clock.
		Entropy: make([]byte, 64), Time: time.Now().UnixNano(),
		Seccomp:         s.m.filter,
		AllowNoLandlock: slices.Contains(s.spec.AllowMissing, "landlock"),
	}
	if _, err := rand.Read(req.Entropy); err != nil {
		return s.infra(start, "entropy for the guest: %v", err), nil
	}
	if req.Dir == "" {
		req.Dir = "/workspace"
	}
	if s.spec.EgressSocket != "" {
		req.EgressPort = tier.EgressPort
	}
	if len(s.spec.TrustPEM) > 0 {
		req.TrustPEM, req.TrustFile, req.TrustBundle = s.spec.TrustPEM, tier.TrustFile, tier.TrustBundle
	}
	rb, _ := json.Marshal(req)
	conn := s.vm.conn
	var wmu sync.Mutex
	send := func(typ byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return vmwire.WriteFrame(conn, typ, p)
	}
	if err := send(vmwire.FrameRequest, rb); err != nil {
		return s.infra(start, "send request: %v", err), nil
	}
	if err := sendWorkspace(s.ws, &vmwire.FrameWriter{W: send, Typ: vmwire.FrameWorkspace}); err != nil {
		return s.infra(start, "send workspace: %v", err), nil
	}
	if err := send(vmwire.FrameWorkspaceEnd, nil); err != nil {
		return s.infra(start, "send workspace: %v", err), nil
	}
	go func() {
		if c.Stdin != nil {
			io.Copy(&vmwire.FrameWriter{W: send, Typ: vmwire.FrameStdin}, c.Stdin)
		}
		send(vmwire.FrameStdinEnd, nil)
	}()

	type collected struct {
		out  *tier.Outcome
		res  *vmwire.Result
		disk bool
	}
	done := make(chan collected, 1)
	go func() {
		o, r, disk := s.collect(c)
		done <- collected{o, r, disk}
	}()
	timeout := lim.Timeout
	if timeout <= 0 {
		timeout = 24 * time.Hour
	}
	// The agent enforces the timeout itself (so the guest's counters
	// survive it); this backstop kills the VMM when the agent does not.
	timer := time.NewTimer(timeout + timeoutGrace)
	defer timer.Stop()
	var got collected
	select {
	case got = <-done:
	case <-timer.C:
		s.vm.kill()
		<-done
		out := &tier.Outcome{Duration: time.Since(start), Runtime: s.runtime()}
		s.classify(out, nil, true, nil)
		return out, nil
	case <-ctx.Done():
		s.vm.kill()
		<-done
		return &tier.Outcome{Termination: result.Timeout, Duration: time.Since(start), Runtime: s.runtime(), Error: "cancelled: " + ctx.Err().Error()}, nil
	}
	s.vm.kill()
	if got.out != nil {
		got.out.Duration = time.Since(start)
		got.out.Runtime = s.runtime()
		if lim := s.vmmLimitHit(); lim != "" && got.out.Termination == result.InfraError {
			got.out.Error = lim + ": " + got.out.Error
		}
		return got.out, nil
	}
	r := got.res
	out := &tier.Outcome{Duration: time.Since(start), Runtime: s.runtime()}
	if r.Error != "" {
		out.Termination, out.ExitCode, out.Error = result.InfraError, 125, "guest agent: "+sanitize([]byte(r.Error))
		return out, nil
	}
	deg, err := accepted(r.Degraded, req.AllowNoLandlock)
	if err != nil {
		out.Termination, out.ExitCode, out.Error = result.InfraError, 125, "guest agent: "+err.Error()
		return out, nil
	}
	out.Degradations = deg
	var exit *tier.Exit
	if !r.TimedOut {
		exit = &tier.Exit{Code: r.ExitCode, Signal: r.Signal}
	}
	s.classify(out, exit, r.TimedOut, r)
	if got.disk && r.WorkspaceFull == "" {
		r.WorkspaceFull = "files"
	}
	if full := r.WorkspaceFull; full == "disk" || full == "files" {
		limit := fmt.Sprint(lim.WorkspaceBytes)
		if full == "files" {
			limit = fmt.Sprint(lim.WorkspaceFiles)
		}
		out.Violations = append(out.Violations, result.Violation{Kind: full, Detail: "the workspace is full", Limit: limit})
		if out.Termination == result.Exited && out.ExitCode != 0 {
			out.Termination = result.DiskLimit
		}
	}
	return out, nil
}

// accepted checks the protections the guest agent says the command ran
// without: only Landlock, only once, and only when the request accepted
// going without it. Anything else is an agent that cannot be trusted.
func accepted(degraded []string, allowNoLandlock bool) ([]string, error) {
	if len(degraded) == 0 {
		return nil, nil
	}
	if len(degraded) > 1 || degraded[0] != "landlock" || !allowNoLandlock {
		return nil, fmt.Errorf("reported unaccepted degradations %q", sanitize([]byte(strings.Join(degraded, ","))))
	}
	return []string{"landlock"}, nil
}

// classify fills out from what the guest reported (nil when it was
// killed first), through the taxonomy all tiers share.
func (s *Sandbox) classify(out *tier.Outcome, exit *tier.Exit, timedOut bool, r *vmwire.Result) {
	obs := tier.Observed{Exit: exit, TimedOut: timedOut, Lost: "the guest agent did not report the program's status"}
	if r != nil {
		// The guest's counters are its own word: bounded to sane values.
		obs.Stats = cgroup.Stats{CPU: max(0, r.CPUDuration()), PeakMemory: max(0, r.PeakMemory), OOMKills: max(0, min(r.OOMKills, 1<<20)), PidsMaxHits: max(0, min(r.PidsMax, 1<<30))}
		if exit != nil && (exit.Signal < 0 || exit.Signal > 64 || exit.Code < 0 || exit.Code > 255) {
			obs.Exit = nil
			obs.Lost = "the guest agent reported an impossible exit status"
		}
	}
	tier.Classify(out, obs, s.spec.Limits)
	out.CPU, out.PeakMemory = obs.Stats.CPU, obs.Stats.PeakMemory
}

// collect reads the guest's frames until its result. Every frame is
// hostile: sizes are bounded by ReadFrame, totals here, and anything out
// of protocol ends the VM.
func (s *Sandbox) collect(c *tier.Command) (*tier.Outcome, *vmwire.Result, bool) {
	fail := func(term result.Termination, format string, args ...any) (*tier.Outcome, *vmwire.Result, bool) {
		s.vm.kill()
		return &tier.Outcome{Termination: term, Error: fmt.Sprintf(format, args...)}, nil, false
	}
	var outBytes int64
	var tarPipe *io.PipeWriter
	var tarDone chan error
	var diskHit bool
	lim := s.spec.Limits
	for {
		typ, p, err := vmwire.ReadFrame(s.vm.r)
		if err != nil {
			if tarPipe != nil {
				tarPipe.CloseWithError(err)
				<-tarDone
			}
			select {
			case <-s.vm.exited:
				return fail(result.InfraError, "the VM ended before the agent's result: %v", err)
			default:
			}
			return fail(result.InfraError, "guest agent channel: %v", err)
		}
		switch typ {
		case vmwire.FrameStdout, vmwire.FrameStderr:
			outBytes += int64(len(p))
			if outBytes > s.m.opts.MaxOutputBytes {
				return fail(result.OutputLimit, "the guest sent more than %d bytes of output; the VM was killed", s.m.opts.MaxOutputBytes)
			}
			w := c.Stdout
			if typ == vmwire.FrameStderr {
				w = c.Stderr
			}
			if w != nil {
				w.Write(p)
			}
		case vmwire.FrameTar:
			if tarPipe == nil {
				var pr *io.PipeReader
				pr, tarPipe = io.Pipe()
				tarDone = make(chan error, 1)
				go func() {
					err := extractWorkspace(pr, s.ws, lim)
					io.Copy(io.Discard, pr)
					tarDone <- err
				}()
			}
			tarPipe.Write(p)
		case vmwire.FrameTarEnd:
			if tarPipe != nil {
				tarPipe.Close()
				err := <-tarDone
				tarPipe = nil
				if errors.Is(err, errWorkspaceLimit) {
					diskHit = true
				} else if err != nil {
					return fail(result.InfraError, "workspace from the guest: %v", err)
				}
			}
		case vmwire.FrameResult:
			var r vmwire.Result
			if err := json.Unmarshal(p, &r); err != nil {
				return fail(result.InfraError, "guest result: %v", err)
			}
			return nil, &r, diskHit
		case vmwire.FrameFail:
			return fail(result.InfraError, "guest agent failed: %s", sanitize(p))
		default:
			return fail(result.InfraError, "guest agent sent an unknown frame %q", typ)
		}
	}
}

// Destroy kills the VMM and removes the socket and the workspace copy.
func (s *Sandbox) Destroy() error {
	var err error
	s.destroyOnce.Do(func() {
		s.mu.Lock()
		s.gone = true
		v := s.vm
		s.mu.Unlock()
		if v != nil {
			v.kill()
		}
		// The starter sees the VM die (or the sandbox gone) and ends.
		<-s.ready
		s.mu.Lock()
		v = s.vm
		s.mu.Unlock()
		if v != nil {
			v.kill()
		}
		var errs []error
		if s.cg != nil {
			// Kills anything left in it (nothing, once the VMM is reaped),
			// and the moat/ parents when no other run uses them, so an
			// idle host has no trace of Moat in its cgroup tree.
			errs = append(errs, s.cg.Destroy())
		}
		errs = append(errs, os.RemoveAll(s.dir))
		// The VMM is gone: `moat image gc` may take the disk now.
		s.disk.Close()
		err = errors.Join(errs...)
	})
	return err
}

// Pid is the VMM's host pid (tests check it is gone after Destroy), or 0.
func (s *Sandbox) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil || s.vm.cmd == nil {
		return 0
	}
	return s.vm.cmd.Process.Pid
}

// Started says how the sandbox's VM started: "restored", or "cold boot
// (why)" (tests and benchmarks check it).
func (s *Sandbox) Started() string { return s.how }

// RuntimeProcs implements tier.RuntimeLister: the program runs inside the
// VM, so the host processes that stand for it are the VMM's (QEMU). The
// red-team suite judges their confinement from the host's /proc.
func (s *Sandbox) RuntimeProcs() ([]int, error) {
	pid := s.Pid()
	if pid == 0 {
		return nil, nil
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || strings.Contains(string(b), ") Z ") {
		return nil, nil // exited
	}
	return []int{pid}, nil
}
