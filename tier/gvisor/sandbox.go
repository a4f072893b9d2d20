package gvisor

import (
	"bufio"
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
	"github.com/moat-sandbox/moat/guest/gvinit/gvwire"
	"github.com/moat-sandbox/moat/internal/runid"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// A run's StateDir (mode 0700, root) holds, beside the engine's lock:
//
//	bundle/config.json  the OCI bundle; its root is the image, read-only
//	runsc/              runsc's --root: container state, control socket
//	logs/run.log        `runsc run`'s own log (info level): the exit status
//	logs/errors.json    runsc's fatal errors (--log)
//	logs/panic.log      the Sentry's and the gofer's Go runtime messages
//	workspace/          the workspace tmpfs is mounted here
//	tmp/                the sandbox's /tmp, a host tmpfs too
const (
	bundleDir    = "bundle"
	stateDir     = "runsc"
	logsDir      = "logs"
	workspaceDir = "workspace"
	tmpDir       = "tmp"
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

// sandbox is one prepared gVisor sandbox: a booted Sentry whose init (the
// guest) waits for commands, which `runsc exec` starts.
type sandbox struct {
	g    *GVisor
	spec *tier.Spec
	oci  *ociSpec
	cg   *cgroup.Cgroup
	// foreignFD holds the parents lock of the hierarchies only runsc
	// uses (holdForeign), or is -1.
	foreignFD int

	bundle, state, logs, ws, tmp string
	hostPids                     int
	mounted, tmpMounted          bool

	boot     *exec.Cmd     // `runsc run` of the guest's init
	bootDone chan struct{} // closed once boot is reaped
	ready    chan struct{} // closed once init serves, or failed to
	readyErr error         // why not, once ready is closed

	mu        sync.Mutex
	used      bool // a single-use sandbox's Exec ran
	destroyed bool
	next      int
	procs     map[int]*process

	destroyOnce sync.Once
	destroyErr  error
}

var (
	_ tier.Sandbox       = (*sandbox)(nil)
	_ tier.RuntimeLister = (*sandbox)(nil)
)

// RuntimeProcs implements tier.RuntimeLister: the host processes in the
// run's cgroup, which runsc puts there (the Sentry, its systrap stub
// processes, where the program's instructions execute, and the gofer).
// The runsc commands Moat starts (run, exec) are Moat's children outside
// the cgroup and run no program code. Until the guest has reported ready it
// lists nothing: runsc is still setting the Sentry and gofer up (they
// install their seccomp filters at the end of it) and no program has
// started.
func (s *sandbox) RuntimeProcs() ([]int, error) {
	select {
	case <-s.ready:
	default:
		return nil, nil
	}
	if s.readyErr != nil {
		return nil, s.readyErr
	}
	return s.cg.Procs()
}

// Prepare implements tier.Tier: cgroup, workspace and bundle, then it boots
// the sandbox (`runsc run` of the guest's init, ~0.15 s) and returns while
// it boots; WaitReady, Exec and Start wait for init to serve. On any
// failure everything created so far is undone.
func (g *GVisor) Prepare(ctx context.Context, spec *tier.Spec) (_ tier.Sandbox, err error) {
	if err := tier.CheckNoBuild(Name, spec); err != nil {
		return nil, err
	}
	if err := runid.Check(spec.ID); err != nil {
		return nil, fmt.Errorf("sandbox id: %w", err)
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	s := &sandbox{
		foreignFD: -1,
		g:         g,
		spec:      spec,
		bundle:    filepath.Join(spec.StateDir, bundleDir),
		state:     filepath.Join(spec.StateDir, stateDir),
		logs:      filepath.Join(spec.StateDir, logsDir),
		ws:        filepath.Join(spec.StateDir, workspaceDir),
		tmp:       filepath.Join(spec.StateDir, tmpDir),
		procs:     map[int]*process{},
	}
	defer func() {
		if err != nil {
			if derr := s.Destroy(); derr != nil {
				err = fmt.Errorf("%w (%w: %v)", err, tier.ErrLeftovers, derr)
			}
		}
	}()

	for _, d := range []string{s.bundle, s.state, s.logs, s.ws, s.tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	lim := spec.Limits
	s.hostPids = lim.Pids + sandboxTasks
	s.cg, err = g.cg.Create(spec.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: s.hostPids, CPUs: lim.CPUs})
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if s.foreignFD, err = holdForeign(cgroupRoot, g.cg.Version); err != nil {
		return nil, err
	}
	cgPath, err := cgroupsPath(g.cg, s.cg)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	if err := mountWorkspace(s.ws, lim.WorkspaceBytes, lim.WorkspaceFiles); err != nil {
		return nil, err
	}
	s.mounted = true
	// /tmp is a host tmpfs as well, not the Sentry's: the Sentry's tmpfs
	// lets an unprivileged program mknod device nodes despite nodev (and
	// has no inode limit); through the gofer, mknod fails as on the host.
	if err := mountTmpfs(s.tmp, fmt.Sprintf("size=%d,nr_inodes=%d,mode=1777", lim.TmpBytes, tmpFiles)); err != nil {
		return nil, fmt.Errorf("/tmp: %w", err)
	}
	s.tmpMounted = true
	s.oci = bundleSpec(spec, g.guest, s.ws, s.tmp, cgPath, s.hostPids)
	if spec.EgressSocket != "" {
		s.oci.Mounts = append(s.oci.Mounts, egressMount(spec.EgressSocket))
	}
	// After /tmp in the mount list: the trust file lies in it.
	trust, err := trustMounts(spec, s.tmp)
	if err != nil {
		return nil, err
	}
	s.oci.Mounts = append(s.oci.Mounts, trust...)
	if err := writeBundle(s.bundle, s.oci); err != nil {
		return nil, err
	}
	if err := s.startBoot(); err != nil {
		return nil, err
	}
	return s, nil
}

// startBoot runs `runsc run` of the guest's init and watches its stdout for
// init's ready line.
func (s *sandbox) startBoot() error {
	out, outW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("create pipe: %w", err)
	}
	errLog, err := os.OpenFile(filepath.Join(s.logs, "boot.stderr"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		out.Close()
		outW.Close()
		return fmt.Errorf("create boot log: %w", err)
	}
	// runsc hands its standard descriptors to init: stdin /dev/null,
	// stdout the ready pipe, stderr (runsc's own errors, too) a log.
	s.boot = &exec.Cmd{
		Path:   s.g.runsc,
		Args:   append(append([]string{"runsc"}, s.flags("run.log", "run", "errors.json")...), "run", "--bundle", s.bundle, s.spec.ID),
		Env:    runscEnv,
		Stdout: outW,
		Stderr: errLog,
		// A killed moat takes runsc with it; runsc's sandbox is attached
		// to runsc (the Sentry dies with it), and the engine's GC removes
		// the cgroup, the mount and the directory.
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL},
	}
	s.mu.Lock()
	err = s.boot.Start()
	s.mu.Unlock()
	outW.Close()
	errLog.Close()
	if err != nil {
		out.Close()
		s.boot = nil
		return fmt.Errorf("start runsc %s: %w", s.g.runsc, err)
	}
	s.bootDone = make(chan struct{})
	s.ready = make(chan struct{})
	go func() {
		s.boot.Wait()
		close(s.bootDone)
	}()
	go func() {
		defer out.Close()
		// Init is inside the sandbox: one bounded line, nothing else.
		line, _ := bufio.NewReaderSize(io.LimitReader(out, 64), 64).ReadString('\n')
		if line != gvwire.Ready+"\n" {
			msg := runscError(filepath.Join(s.logs, "errors.json"))
			if msg == "" {
				msg = clean(string(readTail(filepath.Join(s.logs, "boot.stderr"), 4096)))
			}
			if msg == "" {
				msg = "runsc ended before the sandbox's init was ready"
			}
			s.readyErr = errors.New("gvisor sandbox boot: " + msg)
		}
		close(s.ready)
	}()
	return nil
}

// bootTimeout bounds the boot, so a stuck one cannot hold a pool or a run.
func (s *sandbox) bootTimeout() time.Duration {
	return min(s.spec.Limits.Timeout, 30*time.Second)
}

// WaitReady implements tier.Readier: it returns once init serves.
func (s *sandbox) WaitReady(ctx context.Context) error {
	timer := time.NewTimer(s.bootTimeout())
	defer timer.Stop()
	select {
	case <-s.ready:
		return s.readyErr
	case <-timer.C:
		return fmt.Errorf("gvisor sandbox boot: init not ready after %s", s.bootTimeout())
	case <-ctx.Done():
		return context.Cause(ctx)
	}
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

// tmpFiles bounds /tmp's inodes, as on the native tier.
const tmpFiles = 4096

// mountWorkspace mounts the workspace tmpfs at dir. gVisor's gofer can bind
// only an attached mount (a detached fsmount, as the native tier uses,
// makes its bind fail with EINVAL), so it lives below the run's private
// directory, where the engine's GC unmounts it if moat dies.
func mountWorkspace(dir string, bytes int64, files int) error {
	data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755,uid=%d,gid=%d", bytes, files, SandboxUID, SandboxGID)
	if err := mountTmpfs(dir, data); err != nil {
		return fmt.Errorf("workspace: %w", err)
	}
	return nil
}

// mountTmpfs mounts a private tmpfs with the given options at dir.
func mountTmpfs(dir, data string) error {
	if err := unix.Mount("moat-workspace", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		return fmt.Errorf("mount tmpfs (%s) at %s: %w", data, dir, err)
	}
	// Private: nothing mounted below it propagates to other mount
	// namespaces, and nothing from them to it.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s private: %w", dir, err)
	}
	return nil
}

// Workspace implements tier.Sandbox.
func (s *sandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: s.ws, UID: SandboxUID, GID: SandboxGID}
}

// flags are runsc's global flags for this sandbox. Each choice that
// matters for isolation is explicit rather than runsc's default. debugLog
// (under logs/, "" for none) receives runsc's own log for the command
// named debugCmd; errLog its fatal errors.
func (s *sandbox) flags(debugLog, debugCmd, errLog string) []string {
	f := []string{
		"--root", s.state,
		"--log", filepath.Join(s.logs, errLog),
		"--panic-log", filepath.Join(s.logs, "panic.log"),
		"--platform", platform,
		// Loopback only, inside the Sentry's own network stack.
		"--network", "none",
		// No overlay on any mount: the root is read-only, the workspace
		// is the host tmpfs the engine reads back.
		"--overlay2", "none",
		// No host FIFOs through the gofer.
		"--host-fifo", "none",
	}
	// Only `runsc run` and `runsc exec`, which are trusted and write
	// little, log; the Sentry and the gofer (which the program can make
	// talk) do not.
	if debugLog != "" {
		f = append(f, "--debug-log", filepath.Join(s.logs, debugLog), "--debug-command", debugCmd)
	}
	// Host Unix sockets: none, except that with an egress grant the
	// Sentry may connect to (never create) the one host socket bound into
	// the sandbox, the egress proxy's.
	if s.spec.EgressSocket != "" {
		f = append(f, "--host-uds", "open")
	} else {
		f = append(f, "--host-uds", "none")
	}
	return f
}

// runscEnv is runsc's whole environment: nothing of moat's.
var runscEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// runsc runs a short runsc command (kill, a guest kill) and returns its
// combined output.
func (s *sandbox) runsc(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runscTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.g.runsc, append(s.flags("", "", "errors.json"), args...)...)
	cmd.Env = runscEnv
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL}
	return cmd.CombinedOutput()
}

// Exec implements tier.Sandbox: it starts the command in the booted
// sandbox, waits for it (killing it at the timeout or, after a grace
// period, when ctx ends), then kills everything left in the sandbox and
// reports the outcome with the whole run's counters.
func (s *sandbox) Exec(ctx context.Context, c *tier.Command) (*tier.Outcome, error) {
	s.mu.Lock()
	used, destroyed := s.used, s.destroyed
	s.used = true
	s.mu.Unlock()
	switch {
	case destroyed:
		return nil, errors.New("sandbox destroyed")
	case used:
		return nil, errors.New("sandbox already used: sandboxes are single-use")
	case s.spec.Session:
		return nil, errors.New("a session sandbox runs commands through Start, not Exec")
	}
	if err := s.WaitReady(ctx); err != nil {
		return nil, err
	}
	lim := s.spec.Limits
	p, err := s.start(c, lim.Timeout)
	if err != nil {
		return nil, err
	}
	cancelled := false
	select {
	case <-p.done:
	case <-ctx.Done():
		// The caller gave up: the program gets SIGTERM and a grace
		// period to end cleanly, then everything is killed.
		cancelled = true
		p.Signal(unix.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(tier.CancelGrace):
			p.kill()
		}
	}
	<-p.done
	// The command is gone: whatever it left running is killed with the
	// rest of the sandbox, so its output pipes close and the counters are
	// final.
	s.cg.Kill()
	st, err := s.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	out, obs := p.finish(false)
	obs.Stats = st
	out.CPU, out.PeakMemory = st.CPU, st.PeakMemory
	if cancelled && obs.Exit == nil && !obs.TimedOut {
		return nil, fmt.Errorf("run cancelled before the program reported: %w", context.Cause(ctx))
	}
	s.classify(out, obs, lim)
	if cancelled {
		out.Violations = append(out.Violations, tier.Cancelled("the caller cancelled the run; SIGTERM was sent to the program, then everything was killed after "+tier.CancelGrace.String()))
	}
	return out, nil
}

// classify turns what the tier saw into the outcome, with gVisor's own
// ways of meeting the host's limits.
func (s *sandbox) classify(out *tier.Outcome, obs tier.Observed, lim tier.Limits) {
	st := obs.Stats
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
		procs := make([]*process, 0, len(s.procs))
		for _, p := range s.procs {
			procs = append(procs, p)
		}
		s.mu.Unlock()
		if s.cg != nil {
			// The Sentry, the gofer and every stub: then runsc run and
			// every runsc exec return.
			s.cg.Kill()
		}
		// Our own children only, each by its *exec.Cmd.
		if s.boot != nil {
			s.boot.Process.Kill()
		}
		for _, p := range procs {
			p.cmd.Process.Kill()
		}
		if s.boot != nil {
			<-s.bootDone
		}
		for _, p := range procs {
			<-p.done
		}
		if s.cg != nil {
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("destroy cgroup: %w", err))
			}
			if err := removeForeign(cgroupRoot, s.g.cg.Version, s.spec.ID); err != nil {
				errs = append(errs, err)
			}
		}
		if s.foreignFD >= 0 {
			unix.Close(s.foreignFD)
			s.foreignFD = -1
		}
		for _, m := range []struct {
			dir     string
			mounted *bool
		}{{s.ws, &s.mounted}, {s.tmp, &s.tmpMounted}} {
			if !*m.mounted {
				continue
			}
			if err := unix.Unmount(m.dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && err != unix.EINVAL && err != unix.ENOENT {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m.dir, err))
			} else {
				*m.mounted = false
			}
		}
		for _, d := range []string{s.bundle, s.state, s.logs, s.ws, s.tmp} {
			if d == s.ws && s.mounted || d == s.tmp && s.tmpMounted {
				continue // never descend into a tmpfs still mounted
			}
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
			}
		}
		s.g.pruneForeign()
		s.destroyErr = errors.Join(errs...)
	})
	return s.destroyErr
}
