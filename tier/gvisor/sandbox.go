package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
)

// A run's StateDir (mode 0700, root) holds, beside the engine's lock:
//
//	bundle/config.json  the OCI bundle; its root is the image, read-only
//	runsc/              runsc's --root: container state, control socket
//	logs/run.log        `runsc run`'s own log (info level): the exit status
//	logs/errors.json    runsc's fatal errors (--log)
//	logs/panic.log      the Sentry's and the gofer's Go runtime messages
//	workspace/          the workspace tmpfs is mounted here
const (
	bundleDir    = "bundle"
	stateDir     = "runsc"
	logsDir      = "logs"
	workspaceDir = "workspace"
)

// sandboxTasks is how many host tasks gVisor needs beside the program's:
// the Sentry's Go threads (~14 idle), the gofer's (~5), and room for the
// Sentry to grow under load; each of the program's processes costs one or
// two more (its systrap stub process and thread). The run's cgroup allows
// the manifest's pids plus this, as the native tier's allows its init's
// few threads: at the limit the Sentry cannot create its next host task and
// exits, which Exec reports as a pids termination (the whole sandbox ends,
// where a native fork would fail with EAGAIN).
const sandboxTasks = 64

// runscTimeout bounds each short runsc command (kill).
const runscTimeout = 5 * time.Second

// killGrace is how long Exec waits, after killing the program through the
// Sentry, for runsc to report it, before it kills the Sentry too (through
// the cgroup), and then runsc itself.
const (
	killGrace = 500 * time.Millisecond
	killLimit = 3 * time.Second
)

// sandbox is one prepared gVisor sandbox.
type sandbox struct {
	g    *GVisor
	spec *tier.Spec
	oci  *ociSpec
	cg   *cgroup.Cgroup

	bundle, state, logs, ws string
	mounted                 bool
	counted                 bool // g.live counts this sandbox

	mu        sync.Mutex
	ran       bool
	destroyed bool
	run       *exec.Cmd     // `runsc run`, once Exec started it
	runDone   chan struct{} // closed once run is reaped

	destroyOnce sync.Once
	destroyErr  error
}

var _ tier.Sandbox = (*sandbox)(nil)

// Prepare implements tier.Tier: cgroup, workspace and bundle, waiting for a
// command. Nothing runs yet: gVisor boots in Exec, in ~0.3 s. On any
// failure everything created so far is undone.
func (g *GVisor) Prepare(ctx context.Context, spec *tier.Spec) (_ tier.Sandbox, err error) {
	if !validID(spec.ID) {
		return nil, fmt.Errorf("sandbox id %q: want lower-case letters, digits and dashes", spec.ID)
	}
	if spec.Session {
		return nil, errSession
	}
	if spec.EgressSocket != "" {
		return nil, errors.New("network.mode: allowlist is not supported by the gvisor tier (it has no bridge to Moat's egress proxy yet); use network.mode: none, or tier: native")
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	s := &sandbox{
		g:      g,
		spec:   spec,
		bundle: filepath.Join(spec.StateDir, bundleDir),
		state:  filepath.Join(spec.StateDir, stateDir),
		logs:   filepath.Join(spec.StateDir, logsDir),
		ws:     filepath.Join(spec.StateDir, workspaceDir),
	}
	g.mu.Lock()
	g.live++
	g.mu.Unlock()
	s.counted = true
	defer func() {
		if err != nil {
			s.Destroy()
		}
	}()

	for _, d := range []string{s.bundle, s.state, s.logs, s.ws} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	lim := spec.Limits
	hostPids := lim.Pids + sandboxTasks
	s.cg, err = g.cg.Create(spec.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: hostPids, CPUs: lim.CPUs})
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	cgPath, err := cgroupsPath(g.cg, s.cg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	if err := mountWorkspace(s.ws, lim.WorkspaceBytes, lim.WorkspaceFiles); err != nil {
		return nil, err
	}
	s.mounted = true
	s.oci = bundleSpec(spec, s.ws, cgPath, hostPids)
	if err := writeBundle(s.bundle, s.oci); err != nil {
		return nil, err
	}
	return s, nil
}

// checkSpec refuses what the tier cannot enforce. Every limit is applied
// (a zero would mean "unlimited" to the cgroup or to the Sentry), and the
// only protection a manifest may go without, Landlock, is not one this
// tier uses.
func checkSpec(spec *tier.Spec) error {
	lim := spec.Limits
	for _, c := range []struct {
		field string
		ok    bool
	}{
		{"resources.cpus", lim.CPUs > 0},
		{"resources.memory", lim.MemoryBytes > 0},
		{"resources.pids", lim.Pids > 0},
		{"resources.timeout", lim.Timeout > 0},
		{"resources.cpu_time", lim.CPUTime > 0},
		{"resources.open_files", lim.OpenFiles > 0},
		{"resources.file_size", lim.FileSizeBytes > 0},
		{"workspace.size", lim.WorkspaceBytes > 0},
		{"workspace.files", lim.WorkspaceFiles > 0},
		{"resources.memory (which sizes /tmp)", lim.TmpBytes > 0},
	} {
		if !c.ok {
			return fmt.Errorf("%s: the gvisor tier enforces every limit and needs a positive value", c.field)
		}
	}
	for _, m := range spec.AllowMissing {
		if m != "landlock" {
			return fmt.Errorf("security.allow_missing: %q is not a protection the gvisor tier can go without", m)
		}
	}
	if !filepath.IsAbs(spec.ImageRoot) {
		return fmt.Errorf("image root %q is not an absolute path", spec.ImageRoot)
	}
	if !filepath.IsAbs(spec.StateDir) {
		return fmt.Errorf("the gvisor tier needs the run's state directory (Spec.StateDir), got %q", spec.StateDir)
	}
	// runsc's control socket lives in its --root: a Unix socket path.
	if sock := filepath.Join(spec.StateDir, stateDir, "runsc-"+spec.ID+".sock"); len(sock) >= len(unix.RawSockaddrUnix{}.Path) {
		return fmt.Errorf("the run's state directory %s is too deep for runsc's control socket %s (at most %d bytes); set MOAT_HOME to a shorter path", spec.StateDir, sock, len(unix.RawSockaddrUnix{}.Path)-1)
	}
	return nil
}

// mountWorkspace mounts the workspace tmpfs at dir. gVisor's gofer can bind
// only an attached mount (a detached fsmount, as the native tier uses,
// makes its bind fail with EINVAL), so it lives below the run's private
// directory, where the engine's GC unmounts it if moat dies.
func mountWorkspace(dir string, bytes int64, files int) error {
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", bytes, files, SandboxUID, SandboxGID)
	if err := unix.Mount("moat-workspace", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("workspace: mount tmpfs (%s) at %s: %w", data, dir, err)
	}
	// Private: nothing mounted below it propagates to other mount
	// namespaces, and nothing from them to it.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("workspace: make %s private: %w", dir, err)
	}
	return nil
}

// Workspace implements tier.Sandbox.
func (s *sandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: s.ws, UID: SandboxUID, GID: SandboxGID}
}

// flags are runsc's global flags for this sandbox. Each choice that
// matters for isolation is explicit rather than runsc's default.
func (s *sandbox) flags() []string {
	return []string{
		"--root", s.state,
		"--log", filepath.Join(s.logs, "errors.json"),
		// Only `runsc run`, which is trusted and writes little, logs; the
		// Sentry and the gofer (which the program can make talk) do not.
		"--debug-log", filepath.Join(s.logs, "run.log"),
		"--debug-command", "run",
		"--panic-log", filepath.Join(s.logs, "panic.log"),
		"--platform", platform,
		// Loopback only, inside the Sentry's own network stack.
		"--network", "none",
		// No overlay on any mount: the root is read-only, the workspace
		// is the host tmpfs the engine reads back.
		"--overlay2", "none",
		// No host Unix sockets or FIFOs through the gofer.
		"--host-uds", "none",
		"--host-fifo", "none",
	}
}

// runscEnv is runsc's whole environment: nothing of moat's.
var runscEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// runsc runs a short runsc command (kill) and returns its combined output.
func (s *sandbox) runsc(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runscTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.g.runsc, append(s.flags(), args...)...)
	cmd.Env = runscEnv
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	return cmd.CombinedOutput()
}

// Exec implements tier.Sandbox: it writes the command into the bundle and
// runs `runsc run`, which boots the Sentry in the run's cgroup, starts the
// program and reports its exit status.
func (s *sandbox) Exec(ctx context.Context, c *tier.Command) (*tier.Outcome, error) {
	s.mu.Lock()
	ran, destroyed := s.ran, s.destroyed
	s.ran = true
	s.mu.Unlock()
	switch {
	case destroyed:
		return nil, errors.New("sandbox destroyed")
	case ran:
		return nil, errors.New("sandbox already used: sandboxes are single-use")
	}
	if len(c.Argv) == 0 || c.Argv[0] == "" {
		return nil, errors.New("no command")
	}
	lim := s.spec.Limits
	s.oci.Process.Args = c.Argv
	s.oci.Process.Env = append([]string{}, c.Env...)
	if c.Dir != "" {
		s.oci.Process.Cwd = c.Dir
	}
	if err := writeBundle(s.bundle, s.oci); err != nil {
		return nil, err
	}

	var ends []*os.File
	closeAll := func() {
		for _, f := range ends {
			f.Close()
		}
		ends = nil
	}
	pipe := func() (r, w *os.File, err error) {
		if r, w, err = os.Pipe(); err == nil {
			ends = append(ends, r, w)
		}
		return r, w, err
	}
	stdinR, stdinW, err1 := pipe()
	stdoutR, stdoutW, err2 := pipe()
	stderrR, stderrW, err3 := pipe()
	if err := errors.Join(err1, err2, err3); err != nil {
		closeAll()
		return nil, fmt.Errorf("create pipes: %w", err)
	}
	defer stdoutR.Close()
	defer stderrR.Close()

	// runsc hands its own standard descriptors to the program (its
	// errors, too, go to the program's stderr), so they are pipes Moat
	// reads, never the caller's.
	cmd := &exec.Cmd{
		Path:   s.g.runsc,
		Args:   append(append([]string{"runsc"}, s.flags()...), "run", "--bundle", s.bundle, s.spec.ID),
		Env:    runscEnv,
		Stdin:  stdinR,
		Stdout: stdoutW,
		Stderr: stderrW,
		// A killed moat takes runsc with it; runsc's sandbox is attached
		// to runsc (the Sentry dies with it), and the engine's GC removes
		// the cgroup, the mount and the directory.
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL},
	}
	// Started under the lock, so that Destroy either sees the runsc it
	// must stop or has already run (and Exec refuses).
	s.mu.Lock()
	err := errors.New("sandbox destroyed")
	if !s.destroyed {
		err = cmd.Start()
	}
	start := time.Now()
	if err == nil {
		s.run = cmd
		s.runDone = make(chan struct{})
	}
	s.mu.Unlock()
	stdinR.Close()
	stdoutW.Close()
	stderrW.Close()
	if err != nil {
		stdinW.Close()
		return nil, fmt.Errorf("start runsc %s: %w", s.g.runsc, err)
	}
	waited := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		close(s.runDone)
		waited <- err
	}()

	var copiers sync.WaitGroup
	copyOut := func(dst io.Writer, src *os.File) {
		copiers.Add(1)
		go func() {
			defer copiers.Done()
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

	var (
		timedOut, cancelled bool
		grace               <-chan time.Time
		ticker              *time.Ticker
		tick                <-chan time.Time
		killedAt            time.Time
	)
	// killProgram kills every process of the program through the Sentry,
	// which then reports it as killed; when Sentry is stuck, the cgroup
	// kill (now, or from the ticker) ends the Sentry itself.
	killProgram := func(cgroupNow bool) {
		s.runsc("kill", "--all", s.spec.ID, "KILL")
		if cgroupNow {
			s.cg.Kill()
		}
		if ticker == nil {
			ticker = time.NewTicker(killGrace)
			tick = ticker.C
			killedAt = time.Now()
		}
	}
	// The wall clock starts now: gVisor's boot counts against the
	// timeout too, so a stuck boot cannot hold a run forever.
	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	done := ctx.Done()
loop:
	for {
		select {
		case <-timer.C:
			timedOut = true
			killProgram(true)
		case <-done:
			// The caller gave up: the program gets SIGTERM and a grace
			// period to end cleanly, then everything is killed. (Before
			// the container exists this kill fails; the grace still runs.)
			done = nil
			cancelled = true
			s.runsc("kill", s.spec.ID, "TERM")
			grace = time.After(native.CancelGrace)
		case <-grace:
			grace = nil
			killProgram(false)
		case <-tick:
			// Whatever runsc started after the first kill, or a Sentry
			// that does not end: the cgroup kill ends everything in it. A
			// runsc that still does not return is killed itself.
			s.cg.Kill()
			if time.Since(killedAt) > killLimit {
				cmd.Process.Kill()
			}
		case <-waited:
			break loop
		}
	}
	ended := time.Now()
	if ticker != nil {
		ticker.Stop()
	}
	// runsc is gone; its sandbox was attached to it. Kill the cgroup anyway
	// (a gofer or stub still exiting holds the output pipes) and let the
	// copiers drain.
	s.cg.Kill()
	copiers.Wait()

	st, err := s.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	out := &tier.Outcome{
		Duration:   ended.Sub(start),
		CPU:        st.CPU,
		PeakMemory: st.PeakMemory,
		Runtime:    s.g.version,
	}
	obs := s.observe(timedOut)
	obs.TimedOut, obs.Stats = timedOut, st
	if cancelled && obs.Exit == nil && !timedOut {
		return nil, fmt.Errorf("run cancelled before the program reported: %w", context.Cause(ctx))
	}
	tier.Classify(out, obs, lim)
	switch {
	case st.OOMKills > 0 && (out.Termination == result.Signaled || out.Termination == result.Exited && out.ExitCode != 0):
		// The host's OOM killer picks a host process: the Sentry (then
		// the status is lost) or the systrap stub holding the program's
		// address space, which the Sentry reports as the program exiting
		// with status 1 ("systrap corrupted memory: subprocess died").
		// Either way the memory limit ended the program.
		out.Termination, out.ExitCode, out.Signal = result.OOM, 128+9, 9
	case out.Termination == result.InfraError && st.PidsMaxHits > 0:
		// The Sentry could not create a host task at the cgroup's pids
		// limit (its stubs count there) and exited: the limit ended the
		// run, as a fork bomb's EAGAIN ends it on the native tier.
		out.Termination, out.ExitCode, out.Signal, out.Error = result.Pids, 128+9, 9, ""
	}
	if cancelled {
		out.Violations = append(out.Violations, result.Violation{Kind: "cancelled", Detail: "the caller cancelled the run; SIGTERM was sent to the program, then everything was killed after " + native.CancelGrace.String()})
	}
	if full := workspaceFull(s.ws); full != "" {
		v := result.Violation{Kind: full, Detail: "the workspace is full", Limit: fmt.Sprint(lim.WorkspaceBytes)}
		if full == "files" {
			v.Limit = fmt.Sprint(lim.WorkspaceFiles)
		}
		out.Violations = append(out.Violations, v)
		if out.Termination == result.Exited && out.ExitCode != 0 {
			out.Termination = result.DiskLimit
		}
	}
	return out, nil
}

// drain copies src to dst, then discards what dst does not take, so the
// program never blocks on a full pipe.
func drain(dst io.Writer, src io.Reader) {
	if dst != nil {
		if _, err := io.Copy(dst, src); err == nil {
			return
		}
	}
	io.Copy(io.Discard, src)
}

// workspaceFull reports "disk" or "files" when the workspace ran out.
func workspaceFull(dir string) string {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return ""
	}
	switch {
	case sfs.Bavail == 0:
		return "disk"
	case sfs.Ffree == 0:
		return "files"
	}
	return ""
}

// Destroy implements tier.Sandbox: kill everything, remove the cgroups,
// unmount the workspace, remove the bundle and runsc's state. Idempotent.
//
// It never runs `runsc delete`: that kills the sandbox by the pid in its
// state file, which, once the Sentry has died, may belong to another
// process. Everything runsc started is in the run's cgroup, and killing
// that is all `runsc delete --force` would do besides removing its files
// and cgroups, which Destroy removes itself.
func (s *sandbox) Destroy() error {
	s.destroyOnce.Do(func() {
		var errs []error
		s.mu.Lock()
		s.destroyed = true
		run, runDone := s.run, s.runDone
		s.mu.Unlock()
		if run != nil {
			select {
			case <-runDone:
			default:
				// Exec still runs (the caller gave up on it): the live
				// Sentry kills the program, runsc goes, Exec returns.
				s.runsc("kill", "--all", s.spec.ID, "KILL")
				run.Process.Kill()
			}
		}
		if s.cg != nil {
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("destroy cgroup: %w", err))
			}
			s.g.cg.Prune()
			if err := removeForeign(s.g.cg, s.spec.ID); err != nil {
				errs = append(errs, err)
			}
		}
		if run != nil {
			<-runDone
		}
		if s.mounted {
			if err := unix.Unmount(s.ws, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && err != unix.EINVAL && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("unmount workspace %s: %w", s.ws, err))
			} else {
				s.mounted = false
			}
		}
		for _, d := range []string{s.bundle, s.state, s.logs, s.ws} {
			if d == s.ws && s.mounted {
				continue // never descend into a workspace still mounted
			}
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
			}
		}
		if s.counted {
			s.g.mu.Lock()
			s.g.live--
			s.g.mu.Unlock()
			s.g.pruneForeign()
		}
		s.destroyErr = errors.Join(errs...)
	})
	return s.destroyErr
}
