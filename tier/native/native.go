// Package native is the native Linux isolation tier: the untrusted program
// shares the host kernel, behind user, mount, PID, network, IPC, UTS and
// cgroup namespaces, a read-only image root (an image build step's tree
// alone is writable: buildroot.go), an emptied capability set,
// no_new_privs, rlimits, Landlock, a seccomp-bpf filter and a cgroup.
//
// This file is the host half: it creates the cgroup and the workspace,
// starts Moat's init (package guest/nsinit, a re-exec of the moat binary)
// inside the new namespaces, and watches it. It must never run untrusted
// code itself, and never leave a process, mount or cgroup behind.
package native

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/internal/runid"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/seccomp"
	"github.com/moat-sandbox/moat/tier"
)

// ownStdio gives the pipes that become a program's standard streams to
// the sandbox user. A program may reopen them by path (/dev/stdout,
// /dev/stderr, /proc/self/fd/N; shell scripts often write to /dev/stderr),
// and the kernel checks such an open against the pipe's owner and mode
// (0600): owned by the host's root, which is unmapped in the sandbox, the
// open fails with EACCES. Owning them lets the program reach only its own
// streams, which it holds already.
func ownStdio(ids *idSlot, files ...*os.File) error {
	for _, f := range files {
		if err := f.Chown(ids.base()+SandboxUID, ids.base()+SandboxGID); err != nil {
			return fmt.Errorf("give the program's standard streams to its user: %w", err)
		}
	}
	return nil
}

// Name is the tier's manifest name.
const Name = "native"

var _ tier.Tier = (*Native)(nil)

// Native prepares native-tier sandboxes.
type Native struct {
	exe    string
	cg     *cgroup.Host
	caps   tier.Capabilities
	filter []unix.SockFilter // the compiled seccomp policy, sent to every init
}

// Options configure the tier. The zero value is ready to use.
type Options struct {
	// Exe is the moat binary to re-exec as init. Default: /proc/self/exe.
	Exe string
}

// New checks that this host can run the tier and returns it. The error
// explains what is missing and wraps tier.ErrUnavailable.
func New(opts Options) (*Native, error) {
	if opts.Exe == "" {
		opts.Exe = "/proc/self/exe"
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the native tier needs root to create cgroups and map the sandbox's user namespace (run moat as root, e.g. with sudo)", tier.ErrUnavailable)
	}
	if b, err := os.ReadFile("/proc/sys/user/max_user_namespaces"); err == nil && string(b) == "0\n" {
		return nil, fmt.Errorf("%w: user namespaces are disabled (/proc/sys/user/max_user_namespaces is 0); enable them with: sysctl -w user.max_user_namespaces=15000", tier.ErrUnavailable)
	}
	cg, err := cgroup.Detect()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	if err := ensureSigpending(); err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	filter, err := seccomp.Default().Compile()
	if err != nil {
		return nil, fmt.Errorf("compile the seccomp policy: %w", err)
	}
	return &Native{exe: opts.Exe, cg: cg, filter: filter, caps: tier.Capabilities{
		MemoryLimit: true, PidsLimit: true, CPULimit: true, NetworkNone: true, NetworkEgress: true,
		Seccomp: true, Landlock: landlockABI() > 0, WorkspaceCap: true, Sessions: true, Terminals: true, BuildSteps: true, TrustStore: true,
	}}, nil
}

// Name implements tier.Tier.
func (n *Native) Name() string { return Name }

// Capabilities implements tier.Tier.
func (n *Native) Capabilities() tier.Capabilities { return n.caps }

// Cgroups exposes the cgroup host for garbage collection of orphans.
func (n *Native) Cgroups() *cgroup.Host { return n.cg }

// sandbox is one prepared native sandbox.
type sandbox struct {
	spec    *tier.Spec
	host    *cgroup.Host
	cg      *cgroup.Cgroup
	ws      *os.File // the detached workspace mount
	init    *exec.Cmd
	cfgW    *os.File
	statusR *os.File
	stdinW  *os.File
	stdoutR *os.File
	stderrR *os.File
	ran     bool
	// statuses carries init's reports in one-shot mode; ready is closed
	// when init is confined and waits for the command (or is gone).
	statuses chan nswire.Status
	ready    chan struct{}
	notReady string // why ready was closed without init being ready
	// sess is set in session mode (Spec.Session).
	sess     *session
	degraded []string
	ids      *idSlot // the run's host id range
	// shifted: the build step's tree (spec.Build) is owned by the run's
	// id range until Destroy shifts it back.
	shifted bool

	destroyOnce sync.Once
	destroyErr  error
}

// Prepare implements tier.Tier: cgroup, workspace and init, waiting for a
// command. On any failure everything created so far is undone.
func (n *Native) Prepare(ctx context.Context, spec *tier.Spec) (_ tier.Sandbox, err error) {
	if err := runid.Check(spec.ID); err != nil {
		return nil, fmt.Errorf("sandbox id: %w", err)
	}
	if !n.caps.Landlock && !slices.Contains(spec.AllowMissing, "landlock") {
		return nil, fmt.Errorf("%w: landlock is not available on this kernel; the manifest can accept running without it with security.allow_missing: [landlock]", tier.ErrUnavailable)
	}
	s := &sandbox{spec: spec, host: n.cg}
	defer func() {
		if err != nil {
			if derr := s.Destroy(); derr != nil {
				err = fmt.Errorf("%w (%w: %v)", err, tier.ErrLeftovers, derr)
			}
		}
	}()

	lim := spec.Limits
	s.cg, err = n.cg.Create(spec.ID, cgroup.Limits{MemoryBytes: lim.MemoryBytes, Pids: lim.Pids, CPUs: lim.CPUs})
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if s.ids, err = allocIDSlot(); err != nil {
		return nil, err
	}
	if spec.Build != nil {
		if err = s.shiftRoot(); err != nil {
			return nil, err
		}
	}
	s.ws, err = newWorkspace(lim.WorkspaceBytes, lim.WorkspaceFiles, s.ids)
	if err != nil {
		return nil, err
	}

	var childEnds []*os.File
	defer func() {
		for _, f := range childEnds {
			f.Close()
		}
	}()
	pipe := func() (r, w *os.File) {
		if err != nil {
			return nil, nil
		}
		r, w, err = os.Pipe()
		return r, w
	}
	cfgR, cfgW := pipe()
	statusR, statusW := pipe()
	stdinR, stdinW := pipe()
	stdoutR, stdoutW := pipe()
	stderrR, stderrW := pipe()
	if err != nil {
		for _, f := range []*os.File{cfgR, cfgW, statusR, statusW, stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW} {
			if f != nil {
				f.Close()
			}
		}
		return nil, fmt.Errorf("create pipes: %w", err)
	}
	childEnds = []*os.File{cfgR, statusW, stdinR, stdoutW, stderrW}
	// Ours from here: Destroy closes them if Prepare fails below.
	s.cfgW, s.statusR, s.stdinW, s.stdoutR, s.stderrR = cfgW, statusR, stdinW, stdoutR, stderrR
	if err = ownStdio(s.ids, stdinR, stdoutW, stderrW); err != nil {
		return nil, err
	}
	extra := []*os.File{cfgR, statusW, s.ws} // fds 3, 4, 5: see nsinit
	if spec.EgressSocket != "" {
		// An O_PATH descriptor, not a path: init connects through
		// /proc/self/fd/6 and nothing of the host's tree is mounted in.
		fd, err := unix.Open(spec.EgressSocket, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("egress: open proxy socket %s: %w", spec.EgressSocket, err)
		}
		f := os.NewFile(uintptr(fd), "egress")
		childEnds = append(childEnds, f)
		extra = append(extra, f) // fd 6
	}
	if spec.Session {
		host, child, err := newSessionSocket()
		if err != nil {
			return nil, err
		}
		s.sess = &session{sock: host, initDone: make(chan struct{}), ready: make(chan string, 1), procs: map[int]*process{}}
		childEnds = append(childEnds, child)
		if len(extra) == 3 {
			extra = append(extra, nil) // fd 6 stays closed without egress
		}
		extra = append(extra, child) // fd 7
	}
	// cgroup v1: init moves itself in through the tasks files (fds 8...),
	// which costs no RCU grace period; see cgroup.JoinFiles.
	joins, err := s.cg.JoinFiles()
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	childEnds = append(childEnds, joins...)
	if len(joins) > 0 {
		for len(extra) < nswire.CgroupFD-3 {
			extra = append(extra, nil) // fds 6, 7 stay closed when unused
		}
		extra = append(extra, joins...)
	}
	idmap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: s.ids.base(), Size: idRange}}
	cmd := &exec.Cmd{
		Path: n.exe,
		Args: []string{"moat-init", nswire.Arg},
		// init's own environment: nothing from the host. It runs few
		// goroutines; one P keeps its thread count (which the pids limit
		// counts) low.
		Env:        []string{"GOMAXPROCS=1"},
		Stdin:      stdinR,
		Stdout:     stdoutW,
		Stderr:     stderrW,
		ExtraFiles: extra,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID |
				unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			UidMappings: idmap,
			GidMappings: idmap,
			// Become root of the new user namespace (the run's base id),
			// not the host's root.
			Credential: &syscall.Credential{Uid: 0, Gid: 0},
			Pdeathsig:  unix.SIGKILL,
		},
	}
	if fd, ok := s.cg.FD(); ok {
		// cgroup v2: born inside the run's cgroup, no window outside it.
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
	}
	// The run's base id owns the user namespace (startOwnedBy).
	if err = startOwnedBy(cmd, s.ids.base()); err != nil {
		return nil, fmt.Errorf("start init %s: %w", n.exe, err)
	}
	s.init = cmd
	// The sandbox's shape goes first: init builds its root while we move it
	// into the cgroup.
	setup := nswire.Setup{
		Root:            spec.ImageRoot,
		Hostname:        "moat",
		UID:             SandboxUID,
		GID:             SandboxGID,
		WritableRoot:    spec.Build != nil,
		TmpBytes:        lim.TmpBytes,
		TmpFiles:        4096,
		Seccomp:         n.filter,
		RequireLandlock: !slices.Contains(spec.AllowMissing, "landlock"),
		EgressPort:      egressPort(spec),
		TrustPEM:        spec.TrustPEM,
		TrustFile:       tier.TrustFile,
		TrustBundle:     tier.TrustBundle,
		Rlimits: nswire.Rlimits{
			NoFile:     uint64(lim.OpenFiles),
			FSize:      uint64(lim.FileSizeBytes),
			NProc:      uint64(lim.Pids) + 64,
			CPUSeconds: uint64((lim.CPUTime + time.Second - 1) / time.Second),
		},
	}
	setup.CgroupFDs = len(joins)
	if spec.Build != nil && spec.Build.AsRoot {
		setup.UID, setup.GID, setup.KeepCaps = 0, 0, nswire.BuildCaps
	}
	if err = nswire.WriteFrame(s.cfgW, &setup); err != nil {
		return nil, fmt.Errorf("send init setup: %w", err)
	}
	// Init is inside the cgroup before it reads this frame (born there on
	// v2, moved itself on v1 right after the Setup frame): it may confine
	// itself now, while the caller copies the inputs in (or while the
	// sandbox waits in a pool).
	if err = nswire.WriteFrame(s.cfgW, &nswire.Start{Serve: s.sess != nil}); err != nil {
		return nil, fmt.Errorf("send start to init: %w", err)
	}
	if s.sess == nil {
		// One-shot: init's reports are read from now on, so that a
		// pool can wait for it to be confined (WaitReady).
		raw := make(chan nswire.Status, 4)
		s.statuses = make(chan nswire.Status, 4)
		s.ready = make(chan struct{})
		go readStatus(s.statusR, raw)
		go func() {
			defer close(s.statuses)
			readyOnce := sync.Once{}
			defer readyOnce.Do(func() {
				s.notReady = "init ended before it was ready"
				close(s.ready)
			})
			for st := range raw {
				if st.Ready {
					readyOnce.Do(func() { close(s.ready) })
					continue
				}
				if st.Error != "" {
					readyOnce.Do(func() {
						s.notReady = st.Error
						close(s.ready)
					})
				}
				s.statuses <- st
			}
		}()
	}
	if s.sess != nil {
		// The session's program is init itself, serving commands.
		s.cfgW.Close()
		s.stdinW.Close()
		if err = s.serveSession(ctx); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func egressPort(spec *tier.Spec) int {
	if spec.EgressSocket == "" {
		return 0
	}
	return tier.EgressPort
}

// newWorkspace creates the workspace tmpfs as a detached mount: it exists
// only as this file descriptor until init attaches it inside the sandbox,
// and vanishes when the last reference goes, so a killed moat leaves no
// mount on the host.
func newWorkspace(bytes int64, files int, ids *idSlot) (*os.File, error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("workspace: fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	opts := [][2]string{
		{"size", fmt.Sprint(bytes)},
		{"nr_inodes", fmt.Sprint(files)},
		{"mode", "0755"},
		{"uid", fmt.Sprint(ids.base() + SandboxUID)},
		{"gid", fmt.Sprint(ids.base() + SandboxGID)},
	}
	for _, o := range opts {
		if err := unix.FsconfigSetString(fsfd, o[0], o[1]); err != nil {
			return nil, fmt.Errorf("workspace: tmpfs %s=%s: %w", o[0], o[1], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return nil, fmt.Errorf("workspace: create tmpfs: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return nil, fmt.Errorf("workspace: fsmount: %w", err)
	}
	return os.NewFile(uintptr(mfd), "workspace"), nil
}

// WaitReady implements tier.Readier: it returns once init has confined
// itself and waits for the command, so that a pool hands out sandboxes
// with nothing left to do but fork and exec.
func (s *sandbox) WaitReady(ctx context.Context) error {
	if s.sess != nil {
		return nil // Prepare waited already
	}
	select {
	case <-s.ready:
		if s.notReady != "" {
			return fmt.Errorf("sandbox setup: %s", s.notReady)
		}
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

var _ tier.Readier = (*sandbox)(nil)

// Workspace implements tier.Sandbox.
func (s *sandbox) Workspace() tier.Workspace {
	return tier.Workspace{
		Dir: fmt.Sprintf("/proc/self/fd/%d", s.ws.Fd()),
		UID: s.ids.base() + SandboxUID,
		GID: s.ids.base() + SandboxGID,
	}
}

// Procs implements tier.ProcessLister: every process in the run's cgroup,
// init included.
func (s *sandbox) Procs() ([]int, error) { return s.cg.Procs() }

var _ tier.ProcessLister = (*sandbox)(nil)

// forward asks init to pass sig on to the program's process group. A
// failure means init is gone or going, and the run ends anyway; the
// caller's grace period kills the cgroup regardless.
func (s *sandbox) forward(sig unix.Signal) {
	nswire.WriteFrame(s.cfgW, &nswire.Signal{Signal: int(sig)})
}

// Exec implements tier.Sandbox.
func (s *sandbox) Exec(ctx context.Context, c *tier.Command) (*tier.Outcome, error) {
	if s.ran || s.sess != nil {
		return nil, errors.New("sandbox already used: sandboxes are single-use (a session's commands go through Start)")
	}
	s.ran = true
	lim := s.spec.Limits
	var copiers sync.WaitGroup
	copyOut := func(dst io.Writer, src *os.File) {
		copiers.Add(1)
		go func() {
			defer copiers.Done()
			if dst == nil {
				dst = io.Discard
			}
			io.Copy(dst, src)
		}()
	}
	copyOut(c.Stdout, s.stdoutR)
	copyOut(c.Stderr, s.stderrR)
	go func() {
		if c.Stdin != nil {
			io.Copy(s.stdinW, c.Stdin)
		}
		s.stdinW.Close()
	}()

	statuses := s.statuses

	// Init confines itself before it reads the command. A setup that
	// never ends is Moat's failure, said with its reason, not a timeout
	// the program would be blamed for.
	if why := waitSetup(s.init.Process.Pid, s.ready, ctx.Done()); why != "" {
		return nil, fmt.Errorf("sandbox setup: %s", why)
	}

	start := time.Now()
	// The config pipe stays open after the command: a cancelled run's
	// SIGTERM goes to init through it (nswire.Signal). Destroy closes it.
	err := nswire.WriteFrame(s.cfgW, &nswire.Command{Argv: c.Argv, Env: c.Env, Dir: c.Dir})
	if err != nil {
		return nil, fmt.Errorf("send command to init: %w", err)
	}

	waited := make(chan error, 1)
	go func() { waited <- s.init.Wait() }()

	out := &tier.Outcome{}
	var (
		final     *nswire.Status
		started   time.Time
		ended     time.Time
		timedOut  bool
		cancelled bool
		graceOver bool // a cancelled program outlived tier.CancelGrace
		grace     <-chan time.Time
		setupErr  string
		initErr   error // how init ended, for a cancelled run's error
	)
	handle := func(st nswire.Status) {
		switch {
		case st.Error != "":
			setupErr = st.Error
		case st.Exited:
			final = &st
			ended = time.Now()

		case st.Started:
			started = time.Now()
			for _, d := range st.Degraded {
				if !slices.Contains(s.spec.AllowMissing, d) {
					// init must not weaken what was not accepted;
					// treat it as hostile and stop everything.
					s.cg.Kill()
					setupErr = "init reported an unaccepted degradation: " + d
				}
			}
			out.Degradations = append(out.Degradations, st.Degraded...)
		}
	}
	// The wall clock starts now: setup counts against the timeout too, so
	// a stuck setup cannot hold a run forever.
	timer := time.NewTimer(lim.Timeout)
	defer timer.Stop()
	done := ctx.Done()
loop:
	for {
		select {
		case st, ok := <-statuses:
			if !ok {
				statuses = nil
				continue
			}
			handle(st)
		case <-timer.C:
			timedOut = true
			s.cg.Kill()
		case <-done:
			// The caller gave up (an interrupted moat run, a server
			// shutting down). A started program gets SIGTERM, forwarded
			// by init to its process group, and a grace period to end
			// cleanly; then, or if it never started, everything is killed.
			done = nil
			cancelled = true
			// Forwarded at once, whether init's report of the start has
			// arrived or not (the program's own output can overtake it,
			// and a loaded host delays it by seconds): the Command frame
			// went first, so init reads this one only once it forked
			// the program, and sends it to the program's process group.
			// A program that never starts is killed with the cgroup when
			// the grace period ends.
			s.forward(unix.SIGTERM)
			grace = time.After(tier.CancelGrace)
		case <-grace:
			grace = nil
			graceOver = true
			s.cg.Kill()
		case initErr = <-waited:
			break loop
		}
	}
	// init may exit before its last message was read: the pipe closes
	// when it dies, so read to the end.
	if statuses != nil {
		for st := range statuses {
			handle(st)
		}
	}
	if ended.IsZero() {
		ended = time.Now()
	}

	// Init is gone, and with it every process of its PID namespace; the
	// pipes' last writers are dead. Kill the cgroup anyway (a process that
	// left the namespace is impossible, but cheap to be sure of) and let
	// the copiers drain.
	s.cg.Kill()
	copiers.Wait()

	out.Duration = programDuration(final, start, started, ended)
	st, err := s.cg.Stats()
	if err != nil {
		return nil, fmt.Errorf("read cgroup stats: %w", err)
	}
	out.CPU = st.CPU
	out.PeakMemory = st.PeakMemory

	if setupErr != "" && !timedOut {
		return nil, fmt.Errorf("sandbox setup: %s", setupErr)
	}
	if cancelled && final == nil && !timedOut {
		return nil, fmt.Errorf("run cancelled before the program reported (%s): %w", cancelledWhy(graceOver, !started.IsZero(), initErr), context.Cause(ctx))
	}
	classify(out, final, timedOut, st, lim)
	if cancelled {
		detail := "the caller cancelled the run; SIGTERM was forwarded to the program, which ended within the " + tier.CancelGrace.String() + " grace period"
		if graceOver {
			detail = "the caller cancelled the run; SIGTERM was forwarded to the program, which still ran " + tier.CancelGrace.String() + " later: everything was killed"
		}
		out.Violations = append(out.Violations, tier.Cancelled(detail))
	}
	if full := workspaceFull(s.ws); full != "" {
		out.Violations = append(out.Violations, result.Violation{Kind: full, Detail: "the workspace is full", Limit: limitFor(full, lim)})
		if out.Termination == result.Exited && out.ExitCode != 0 {
			out.Termination = result.DiskLimit
		}
	}
	return out, nil
}

// cancelledWhy says how a cancelled run ended without the program's
// status, so that a report names the step that did not happen.
func cancelledWhy(graceOver, started bool, initErr error) string {
	var why string
	switch {
	case graceOver:
		why = "the program had not ended " + tier.CancelGrace.String() + " after SIGTERM was forwarded; everything was killed"
	case initErr != nil:
		why = "init ended (" + initErr.Error() + ") without reporting the program's end"
	default:
		why = "init exited without reporting the program's end"
	}
	if !started {
		why += "; init had not reported the program's start"
	}
	return why
}

// classify turns what was observed into the closed termination taxonomy
// (tier.Classify, shared with the other tiers).
func classify(out *tier.Outcome, final *nswire.Status, timedOut bool, st cgroup.Stats, lim tier.Limits) {
	obs := tier.Observed{
		TimedOut: timedOut,
		Stats:    st,
		Lost:     "moat's init in the sandbox died without reporting the program's status",
	}
	if final != nil {
		obs.Exit = &tier.Exit{Code: final.Exit, Signal: final.Signal}
	}
	tier.Classify(out, obs, lim)
}

// programDuration is how long the program ran: init's own measurement
// when it reported one, but never longer than the host saw from sending
// the command (sent) to reading its end; otherwise the time between the
// host reading the start and the end reports (from sent when no start
// was read).
func programDuration(final *nswire.Status, sent, started, ended time.Time) time.Duration {
	if final != nil && final.DurationNS > 0 {
		if d := time.Duration(final.DurationNS); d <= ended.Sub(sent) {
			return d
		}
	}
	if started.IsZero() {
		started = sent
	}
	return ended.Sub(started)
}

// workspaceFull reports "disk" or "files" when the workspace ran out.
func workspaceFull(ws *os.File) string {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(int(ws.Fd()), &sfs); err != nil {
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

func limitFor(kind string, lim tier.Limits) string {
	if kind == "files" {
		return fmt.Sprint(lim.WorkspaceFiles)
	}
	return fmt.Sprint(lim.WorkspaceBytes)
}

// readStatus decodes init's messages, bounded in size: init runs in the
// sandbox, so its output is hostile until parsed.
func readStatus(r io.Reader, out chan<- nswire.Status) {
	defer close(out)
	sc := bufio.NewScanner(io.LimitReader(r, nswire.MaxStatusBytes))
	sc.Buffer(make([]byte, 4096), nswire.MaxStatusBytes)
	for sc.Scan() {
		var st nswire.Status
		if json.Unmarshal(sc.Bytes(), &st) != nil {
			continue
		}
		if st.Exit < 0 || st.Exit > 255 || st.Signal < 0 || st.Signal > 64 || len(st.Error) > 4096 || len(st.Degraded) > 8 {
			continue
		}
		out <- st
	}
}

// Destroy implements tier.Sandbox: kill, reap, remove the cgroup, release
// the workspace. Idempotent.
func (s *sandbox) Destroy() error {
	s.destroyOnce.Do(func() {
		var errs []error
		if s.sess != nil {
			s.sess.mu.Lock()
			s.sess.destroyed = true
			s.sess.mu.Unlock()
			// Closing our end makes a serving init return, which ends
			// its whole PID namespace; the cgroup kill below makes sure.
			s.sess.sock.Close()
		}
		if s.cg != nil {
			// Destroy also removes the moat/ parents when no other run
			// uses them, so an idle host has no trace of Moat there.
			if err := s.cg.Destroy(); err != nil {
				errs = append(errs, fmt.Errorf("destroy cgroup: %w", err))
			}
		}
		if s.init != nil && s.init.Process != nil {
			// Reached only when Exec never ran (or did not finish):
			// the cgroup kill above already ended init.
			s.init.Process.Kill()
			switch {
			case s.sess != nil && s.init.Process != nil && s.sess.started():
				<-s.sess.initDone // its waiter goroutine reaps it
			case s.init.ProcessState == nil:
				s.init.Wait()
			}
		}
		for _, f := range []*os.File{s.cfgW, s.statusR, s.stdinW, s.stdoutR, s.stderrR, s.ws} {
			if f != nil {
				f.Close()
			}
		}
		if s.shifted && len(errs) == 0 {
			// Every process of the sandbox is dead with its cgroup:
			// nothing can change the tree under the walk any more.
			// With a cgroup left the tree stays shifted, and recorded,
			// for GC (idshift.Restore) once the run is dead.
			if err := s.unshiftRoot(); err != nil {
				errs = append(errs, err)
			}
		}
		s.destroyErr = errors.Join(errs...)
		if s.destroyErr == nil {
			// Every process of the run is gone with its cgroup: its
			// ids own nothing now. After a failed destroy the slot stays
			// taken until this moat exits, never shared with a
			// straggler.
			s.ids.release()
		}
	})
	return s.destroyErr
}

func landlockABI() int {
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1) // LANDLOCK_CREATE_RULESET_VERSION
	if e != 0 {
		return 0
	}
	return int(v)
}
