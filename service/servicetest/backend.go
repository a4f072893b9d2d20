package servicetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

var (
	_ service.Backend       = (*Backend)(nil)
	_ service.PoolReporter  = (*Backend)(nil)
	_ service.Session       = (*Session)(nil)
	_ service.Process       = (*Process)(nil)
	_ service.CPUReporter   = (*Session)(nil)
	_ service.Ender         = (*Session)(nil)
	_ service.StartReporter = (*Backend)(nil)
)

// Backend is a service.Backend whose sandboxes are directories under Dir
// (the default temporary directory when empty) and whose programs are the
// interpreter of the package doc. Its zero value is ready to use.
type Backend struct {
	Dir string // parent of the sessions' workspaces
	// Images are the image names the fake has; a manifest naming another
	// is refused as the engine refuses it (a FieldError on image naming
	// them). Nil accepts every image.
	Images []string
	// Commands are images' Entrypoint followed by Cmd: what a run with
	// no argv runs, as the engine does; a run with no argv on an image
	// without one is refused in the engine's terms.
	Commands map[string][]string
	// PoolHits makes ObserveStarts' function hear that every sandbox came
	// from a warm pool; false: that each was prepared on demand.
	PoolHits bool

	mu        sync.Mutex
	live      int // sessions not yet closed
	created   int // sessions ever created
	runs      int // Run calls that reached the program
	inflight  int // Run calls not yet returned
	lastRun   map[string]string
	lastMode  map[string]fs.FileMode
	lastReq   *engine.Request
	sessions  []*Session
	pools     []service.PoolStat
	startObs  func(tier string, poolHit bool, d time.Duration)
	closeGate chan struct{}  // when set, holds every Close until closed
	ports     map[int]string // Listen: port inside -> host address
}

// Counts returns how many sessions are live (not yet closed) and were
// ever created, how many Run calls reached their program, and how many
// Run calls have not returned yet.
func (b *Backend) Counts() (live, created, runs, inflight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live, b.created, b.runs, b.inflight
}

// SetPools sets what PoolStats reports.
func (b *Backend) SetPools(pools []service.PoolStat) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pools = pools
}

// LastRun returns the files (contents and modes) and the request of the
// last Run call that reached its program.
func (b *Backend) LastRun() (files map[string]string, modes map[string]fs.FileMode, req *engine.Request) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastRun, b.lastMode, b.lastReq
}

// Sessions returns every session NewSession made, in order, closed or not.
func (b *Backend) Sessions() []*Session {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sessions)
}

// HoldClose makes every Session.Close from now on wait until release is
// called, so that a test can look at a sandbox while it is being deleted.
func (b *Backend) HoldClose() (release func()) {
	gate := make(chan struct{})
	b.mu.Lock()
	b.closeGate = gate
	b.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// ObserveStarts sets the function told of every sandbox made ready
// (service.StartReporter): tier "fake", PoolHits, and the time NewSession
// or Run took to get there.
func (b *Backend) ObserveStarts(fn func(tier string, poolHit bool, d time.Duration)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startObs = fn
}

func (b *Backend) observeStart(start time.Time) {
	b.mu.Lock()
	fn, hit := b.startObs, b.PoolHits
	b.mu.Unlock()
	if fn != nil {
		fn("fake", hit, time.Since(start))
	}
}

// PoolStats reports the pools SetPools set (service.PoolReporter).
func (b *Backend) PoolStats() []service.PoolStat {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pools
}

// Run runs req's program to its end (service.Backend).
func (b *Backend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	start := time.Now()
	b.mu.Lock()
	b.inflight++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inflight--
		b.mu.Unlock()
	}()
	if req.Manifest == nil {
		return nil, fmt.Errorf("%w: no manifest", engine.ErrUsage)
	}
	if err := b.checkImage(req.Manifest); err != nil {
		return nil, err
	}
	argv := req.Argv
	if len(argv) == 0 {
		if argv = b.Commands[req.Manifest.Image]; len(argv) == 0 {
			return nil, fmt.Errorf("%w: no command given, and image %q has no Entrypoint or Cmd to run instead", engine.ErrUsage, req.Manifest.Image)
		}
	}
	switch argv[0] {
	case "fail-usage":
		return nil, fmt.Errorf("%w: no command given", engine.ErrUsage)
	case "fail-field":
		return nil, &manifest.FieldError{Field: "tier", Value: "gvisor", Problem: "is not implemented yet; available: native"}
	case "fail-internal":
		return nil, errors.New("mount /var/lib/moat/secret: permission denied")
	case "fail-unavailable":
		return nil, fmt.Errorf("tier gvisor: %w", service.ErrUnavailable)
	case "panic":
		panic("the fake backend panics")
	}
	files := map[string]string{}
	modes := map[string]fs.FileMode{}
	for _, f := range req.Files {
		data, err := io.ReadAll(f.Data)
		if err != nil {
			return nil, err
		}
		files[f.Path] = string(data)
		modes[f.Path] = f.Mode
	}
	b.mu.Lock()
	b.runs++
	b.lastRun, b.lastMode, b.lastReq = files, modes, req
	b.mu.Unlock()
	b.observeStart(start)
	if req.OnStart != nil {
		// The fake's "sandbox" is the test process itself.
		req.OnStart(req.ID, func() ([]int, error) { return []int{os.Getpid()}, nil })
	}
	p := &program{argv: argv, stdin: req.Stdin, sig: make(chan unix.Signal), kill: ctx.Done(), manifest: req.Manifest}
	return p.run(), nil
}

// NewSession makes a session whose workspace is a new directory under Dir
// holding req's files (service.Backend).
func (b *Backend) NewSession(ctx context.Context, req *engine.SessionRequest) (service.Session, error) {
	start := time.Now()
	if req.Manifest == nil {
		return nil, fmt.Errorf("%w: no manifest", engine.ErrUsage)
	}
	if err := b.checkImage(req.Manifest); err != nil {
		return nil, err
	}
	b.mu.Lock()
	b.created++
	n := b.created
	b.mu.Unlock()
	dir, err := os.MkdirTemp(b.Dir, "sb-")
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	s := &Session{b: b, id: fmt.Sprintf("sb-%04d", n), dir: dir, root: root, manifest: req.Manifest, created: time.Now()}
	for _, f := range req.Files {
		if _, err := s.WriteFile(f.Path, f.Data, f.Mode); err != nil {
			root.Close()
			return nil, err
		}
		if len(f.Metadata) > 0 {
			if err := s.SetMetadata(f.Path, f.Metadata); err != nil {
				root.Close()
				return nil, err
			}
		}
	}
	b.mu.Lock()
	b.live++
	b.sessions = append(b.sessions, s)
	b.mu.Unlock()
	b.observeStart(start)
	return s, nil
}

// Session is one sandbox of a Backend: a directory and the commands
// started in it.
type Session struct {
	b        *Backend
	id       string
	dir      string
	root     *os.Root
	manifest *manifest.Manifest
	created  time.Time

	mu     sync.Mutex
	closed bool
	dead   bool // a command killed its init
	// network is what SetNetwork set.
	network *manifest.Network
	procs   []*Process
	nproc   int
}

// ID is the session's id, sb-NNNN.
func (s *Session) ID() string { return s.id }

// Processes are the commands started in the session, in start order.
func (s *Session) Processes() []*Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.procs)
}

// Dir is the directory that holds the session's workspace.
func (s *Session) Dir() string { return s.dir }

// Manifest is the manifest the session was made with.
func (s *Session) Manifest() *manifest.Manifest { return s.manifest }

// KillInit marks the session's init as dead without any command seeing
// it, as a sandbox whose init died on its own: the next Start fails with
// engine.ErrSandboxEnded and Ended reports true.
func (s *Session) KillInit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
}

// Info describes the session (image python, tier fake).
func (s *Session) Info() engine.SessionInfo {
	return engine.SessionInfo{ID: s.id, Tier: "fake", Image: result.Image{Name: "python", Digest: "sha256:fake"}, ManifestDigest: s.manifest.Digest(), Created: s.created}
}

// Ended reports whether a command killed the fake's init (Ender).
func (s *Session) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead || s.closed
}

// CPU pretends the sandbox keeps one CPU busy (CPUReporter).
func (s *Session) CPU() (time.Duration, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return time.Since(s.created), nil
}

func (s *Session) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return engine.ErrSessionClosed
	}
	return nil
}

// Start starts req's program in the session (service.Session).
func (s *Session) Start(ctx context.Context, req *engine.ExecRequest) (service.Process, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, engine.ErrSessionClosed
	}
	if req.Argv[0] == "fail-start" {
		return nil, fmt.Errorf("%w: no such program", engine.ErrUsage)
	}
	if s.dead {
		return nil, fmt.Errorf("start command: %w (send command to init: broken pipe)", engine.ErrSandboxEnded)
	}
	if slices.Contains(req.Argv, "kill-init") {
		s.dead = true // as "kill 1" inside a real sandbox
	}
	s.nproc++
	p := &Process{id: fmt.Sprintf("%s-p%d", s.id, s.nproc), pid: FirstPid + s.nproc - 1, argv: req.Argv, timeout: req.Timeout, sig: make(chan unix.Signal, 8), done: make(chan struct{}), kill: make(chan struct{})}
	stdin := req.Stdin
	if req.StdinOpen {
		r, w := io.Pipe()
		p.stdinW, p.stdinR, stdin = w, r, r
	}
	s.procs = append(s.procs, p)
	prog := &program{argv: req.Argv, env: req.Env, stdin: stdin, stdout: req.Stdout, stderr: req.Stderr, sig: p.sig, kill: p.kill, manifest: s.manifest, dir: s.dir}
	if req.RawStdout != nil {
		// The fake caps nothing: the raw writer takes the place of the
		// capped one.
		prog.stdout = req.RawStdout
	}
	if req.TTY != nil {
		p.winch = make(chan tier.WindowSize, 8)
		prog.tty, prog.winch = req.TTY, p.winch
	}
	go func() {
		res := prog.run()
		if p.stdinR != nil {
			p.stdinR.CloseWithError(errors.New("the process has ended"))
		}
		p.res.Store(res)
		close(p.done)
	}()
	return p, nil
}

func (s *Session) WriteFile(p string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	if d := path.Dir(p); d != "." {
		if err := s.root.MkdirAll(d, 0o755); err != nil {
			return 0, err
		}
	}
	f, err := s.root.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return io.Copy(f, r)
}

func (s *Session) info(p string, fi fs.FileInfo) engine.FileInfo {
	t := "other"
	switch {
	case fi.Mode().IsRegular():
		t = "file"
	case fi.IsDir():
		t = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		t = "symlink"
	}
	info := engine.FileInfo{Name: fi.Name(), Path: p, Type: t, Size: fi.Size(), Mode: fmt.Sprintf("%04o", fi.Mode().Perm()), ModTime: fi.ModTime().UTC()}
	if t == "symlink" {
		info.Target, _ = s.root.Readlink(p)
	}
	if t == "file" || t == "dir" {
		if f, err := s.root.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0); err == nil {
			info.Metadata, _ = workspace.ReadMetadata(f)
			f.Close()
		}
	}
	return info
}

// SetMetadata keeps md as p's user xattrs, as engine.Session does.
func (s *Session) SetMetadata(p string, md map[string]string) error {
	if err := s.check(); err != nil {
		return err
	}
	// os.Root follows a final symlink (inside the root): look first.
	if fi, err := s.root.Lstat(p); err != nil {
		return err
	} else if !fi.Mode().IsRegular() && !fi.IsDir() {
		return fmt.Errorf("%s is not a file or directory: %w", p, engine.ErrUsage)
	}
	f, err := s.root.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := workspace.WriteMetadata(f, md); err != nil {
		return fmt.Errorf("%w: %w", engine.ErrUsage, err)
	}
	return nil
}

func (s *Session) Open(p string) (*os.File, engine.FileInfo, error) {
	if err := s.check(); err != nil {
		return nil, engine.FileInfo{}, err
	}
	fi, err := s.root.Lstat(p)
	if err != nil {
		return nil, engine.FileInfo{}, err
	}
	if !fi.Mode().IsRegular() {
		return nil, engine.FileInfo{}, fmt.Errorf("%s: %w", p, engine.ErrUsage)
	}
	f, err := s.root.Open(p)
	return f, s.info(p, fi), err
}

func (s *Session) ReadDir(p string) ([]engine.FileInfo, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	f, err := s.root.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	var out []engine.FileInfo
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		out = append(out, s.info(path.Join(p, e.Name()), fi))
	}
	return out, nil
}

func (s *Session) Stat(p string) (engine.FileInfo, error) {
	if p == "panic" {
		panic("the fake session panics on Stat")
	}
	if err := s.check(); err != nil {
		return engine.FileInfo{}, err
	}
	fi, err := s.root.Lstat(p)
	if err != nil {
		return engine.FileInfo{}, err
	}
	return s.info(p, fi), nil
}

func (s *Session) MakeDir(p string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.root.MkdirAll(p, 0o755)
}

func (s *Session) Rename(from, to string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.root.Rename(from, to)
}

func (s *Session) Remove(p string) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, err := s.root.Lstat(p); err != nil {
		return err
	}
	return s.root.RemoveAll(p)
}

// Close kills the session's commands, waits for them and removes its
// directory; see Backend.HoldClose.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	procs := s.procs
	s.mu.Unlock()
	s.b.mu.Lock()
	g := s.b.closeGate
	s.b.mu.Unlock()
	if g != nil {
		<-g
	}
	for _, p := range procs {
		p.killOnce.Do(func() { close(p.kill) })
	}
	for _, p := range procs {
		<-p.done
	}
	s.root.Close()
	os.RemoveAll(s.dir)
	s.b.mu.Lock()
	s.b.live--
	s.b.mu.Unlock()
	return nil
}

// Process is one command started in a Session.
// FirstPid is the pid the fake reports for a session's first command
// (service.PidReporter); the next get the numbers after it.
const FirstPid = 100

type Process struct {
	id       string
	pid      int
	argv     []string
	timeout  time.Duration // the ExecRequest's
	sig      chan unix.Signal
	kill     chan struct{}
	killOnce sync.Once
	done     chan struct{}
	res      atomic.Pointer[result.Result]
	stdinW   *io.PipeWriter
	stdinR   *io.PipeReader
	winch    chan tier.WindowSize // nil: started without a terminal
}

// Resize implements service.Resizer as engine.Process does.
func (p *Process) Resize(ws tier.WindowSize) error {
	select {
	case <-p.done:
		return errors.New("the command has ended")
	default:
	}
	if p.winch == nil {
		return fmt.Errorf("%w: the command has no terminal to resize: start it with tty", engine.ErrUsage)
	}
	select {
	case p.winch <- ws:
		return nil
	default:
		return errors.New("resize queue full")
	}
}

func (p *Process) ID() string { return p.id }

// Timeout is the command's ExecRequest.Timeout (0: the manifest's).
func (p *Process) Timeout() time.Duration { return p.timeout }
func (p *Process) Pid() int               { return p.pid }
func (p *Process) Argv() []string         { return p.argv }
func (p *Process) Stdin() io.WriteCloser {
	if p.stdinW == nil {
		return nil
	}
	return p.stdinW
}

func (p *Process) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return errors.New("the process has ended")
	case p.sig <- sig:
		return nil
	default:
		return errors.New("signal queue full")
	}
}

func (p *Process) Done() <-chan struct{} { return p.done }
func (p *Process) Result() *result.Result {
	select {
	case <-p.done:
		return p.res.Load()
	default:
		return nil
	}
}

// checkImage refuses an image the fake does not have, in the engine's terms.
func (b *Backend) checkImage(m *manifest.Manifest) error {
	if b.Images == nil || slices.Contains(b.Images, m.Image) {
		return nil
	}
	return &manifest.FieldError{Field: "image", Value: m.Image,
		Problem: "is an unknown image: this host has or can build " + strings.Join(b.Images, ", ")}
}

// Metrics reports the session's usage as engine.Session does: no CPU or
// memory (the fake runs no processes of its own), the workspace's file
// bytes as disk, and the manifest's limits.
func (s *Session) Metrics() (engine.Metrics, error) {
	if err := s.check(); err != nil {
		return engine.Metrics{}, err
	}
	var disk int64
	fs.WalkDir(s.root.FS(), ".", func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				disk += fi.Size()
			}
		}
		return nil
	})
	r := s.manifest.Resources
	return engine.Metrics{CPUs: r.CPUs, MemoryLimit: int64(r.Memory), DiskBytes: disk, DiskLimit: int64(s.manifest.Workspace.Size)}, nil
}

// SetNetwork replaces the session's allowlist as engine.Session does: only
// a sandbox made with network.mode allowlist has one. Network reports it.
func (s *Session) SetNetwork(n manifest.Network) error {
	if err := s.check(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.manifest.Network.Mode != "allowlist" {
		return fmt.Errorf("%w: this sandbox was created with network.mode none", engine.ErrUsage)
	}
	s.network = &n
	return nil
}

// Network is the allowlist the last SetNetwork gave, nil if none did.
func (s *Session) Network() *manifest.Network {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.network
}
