package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// The fakes: a Backend whose sandboxes are directories and whose programs
// are a tiny interpreter, and an Auditor in memory.
//
// A program named "fake" runs its arguments as steps:
//
//	out:TEXT  write TEXT and a newline to stdout
//	err:TEXT  the same to stderr
//	raw:HEX   write the bytes HEX to stdout
//	cat       copy stdin to stdout until end-of-file
//	block     wait until signalled (or killed)
//	sleep:D   wait for the duration D
//	exit:N    exit with status N
//	cpu:MS    report MS milliseconds of CPU
//	deny:HOST record a refused network attempt
//	violate:K record a violation of kind K
//	kill-init end as infra-error and take the session's init with it
//
// Any other program echoes its argv, space-separated, to stdout. One-shot
// programs named fail-usage, fail-field, fail-internal, fail-unavailable
// and panic make Run fail that way.

var (
	_ Backend      = (*fakeBackend)(nil)
	_ PoolReporter = (*fakeBackend)(nil)
	_ Session      = (*fakeSession)(nil)
	_ Process      = (*fakeProcess)(nil)
	_ Auditor      = (*fakeAuditor)(nil)
	_ CPUReporter  = (*fakeSession)(nil)
	_ Ender        = (*fakeSession)(nil)
)

type fakeBackend struct {
	dir string // parent of the sessions' workspaces

	mu       sync.Mutex
	live     int // sessions not yet closed
	created  int // sessions ever created
	runs     int // Run calls that reached the program
	inflight int // Run calls not yet returned
	lastRun  map[string]string
	lastMode map[string]fs.FileMode
	lastReq  *engine.Request
	sessions []*fakeSession
	pools    []PoolStat
	// newDelay delays NewSession (shutdown tests); closeGate, when set,
	// holds every Close until it is closed.
	newDelay  time.Duration
	closeGate chan struct{}
}

func (b *fakeBackend) counts() (live, created, runs, inflight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live, b.created, b.runs, b.inflight
}

func (b *fakeBackend) PoolStats() []PoolStat {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pools
}

func (b *fakeBackend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	b.mu.Lock()
	b.inflight++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		b.inflight--
		b.mu.Unlock()
	}()
	if req.Manifest == nil || len(req.Argv) == 0 {
		return nil, fmt.Errorf("%w: no manifest or argv", engine.ErrUsage)
	}
	switch req.Argv[0] {
	case "fail-usage":
		return nil, fmt.Errorf("%w: no command given", engine.ErrUsage)
	case "fail-field":
		return nil, &manifest.FieldError{Field: "tier", Value: "gvisor", Problem: "is not implemented yet; available: native"}
	case "fail-internal":
		return nil, errors.New("mount /var/lib/moat/secret: permission denied")
	case "fail-unavailable":
		return nil, fmt.Errorf("tier gvisor: %w", ErrUnavailable)
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
	if req.OnStart != nil {
		// The fake's "sandbox" is the test process itself.
		req.OnStart(req.ID, func() ([]int, error) { return []int{os.Getpid()}, nil })
	}
	p := &program{argv: req.Argv, stdin: req.Stdin, sig: make(chan unix.Signal), kill: ctx.Done(), manifest: req.Manifest}
	return p.run(), nil
}

func (b *fakeBackend) NewSession(ctx context.Context, req *engine.SessionRequest) (Session, error) {
	if req.Manifest == nil {
		return nil, fmt.Errorf("%w: no manifest", engine.ErrUsage)
	}
	if b.newDelay > 0 {
		select {
		case <-time.After(b.newDelay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.mu.Lock()
	b.created++
	n := b.created
	b.mu.Unlock()
	dir, err := os.MkdirTemp(b.dir, "sb-")
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	s := &fakeSession{b: b, id: fmt.Sprintf("sb-%04d", n), dir: dir, root: root, manifest: req.Manifest, created: time.Now()}
	for _, f := range req.Files {
		if _, err := s.WriteFile(f.Path, f.Data, f.Mode); err != nil {
			root.Close()
			return nil, err
		}
	}
	b.mu.Lock()
	b.live++
	b.sessions = append(b.sessions, s)
	b.mu.Unlock()
	return s, nil
}

type fakeSession struct {
	b        *fakeBackend
	id       string
	dir      string
	root     *os.Root
	manifest *manifest.Manifest
	created  time.Time

	mu     sync.Mutex
	closed bool
	dead   bool // a command killed its init
	procs  []*fakeProcess
	nproc  int
}

func (s *fakeSession) ID() string { return s.id }

func (s *fakeSession) Info() engine.SessionInfo {
	return engine.SessionInfo{ID: s.id, Tier: "fake", Image: result.Image{Name: "python", Digest: "sha256:fake"}, ManifestDigest: s.manifest.Digest(), Created: s.created}
}

// Ended reports whether a command killed the fake's init (Ender).
func (s *fakeSession) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead || s.closed
}

// CPU pretends the sandbox keeps one CPU busy (CPUReporter).
func (s *fakeSession) CPU() (time.Duration, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	return time.Since(s.created), nil
}

func (s *fakeSession) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return engine.ErrSessionClosed
	}
	return nil
}

func (s *fakeSession) Start(ctx context.Context, req *engine.ExecRequest) (Process, error) {
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
	p := &fakeProcess{id: fmt.Sprintf("%s-p%d", s.id, s.nproc), argv: req.Argv, sig: make(chan unix.Signal, 8), done: make(chan struct{}), kill: make(chan struct{})}
	stdin := req.Stdin
	if req.StdinOpen {
		r, w := io.Pipe()
		p.stdinW, p.stdinR, stdin = w, r, r
	}
	s.procs = append(s.procs, p)
	prog := &program{argv: req.Argv, stdin: stdin, stdout: req.Stdout, stderr: req.Stderr, sig: p.sig, kill: p.kill, manifest: s.manifest}
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

func (s *fakeSession) WriteFile(p string, r io.Reader, mode fs.FileMode) (int64, error) {
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

func (s *fakeSession) info(p string, fi fs.FileInfo) engine.FileInfo {
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
	return info
}

func (s *fakeSession) Open(p string) (*os.File, engine.FileInfo, error) {
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

func (s *fakeSession) ReadDir(p string) ([]engine.FileInfo, error) {
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

func (s *fakeSession) Stat(p string) (engine.FileInfo, error) {
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

func (s *fakeSession) MakeDir(p string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.root.MkdirAll(p, 0o755)
}

func (s *fakeSession) Rename(from, to string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.root.Rename(from, to)
}

func (s *fakeSession) Remove(p string) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, err := s.root.Lstat(p); err != nil {
		return err
	}
	return s.root.RemoveAll(p)
}

func (s *fakeSession) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	procs := s.procs
	s.mu.Unlock()
	if g := s.b.closeGate; g != nil {
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

type fakeProcess struct {
	id       string
	argv     []string
	sig      chan unix.Signal
	kill     chan struct{}
	killOnce sync.Once
	done     chan struct{}
	res      atomic.Pointer[result.Result]
	stdinW   *io.PipeWriter
	stdinR   *io.PipeReader
}

func (p *fakeProcess) ID() string     { return p.id }
func (p *fakeProcess) Argv() []string { return p.argv }
func (p *fakeProcess) Stdin() io.WriteCloser {
	if p.stdinW == nil {
		return nil
	}
	return p.stdinW
}

func (p *fakeProcess) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return errors.New("the process has ended")
	case p.sig <- sig:
		return nil
	default:
		return errors.New("signal queue full")
	}
}

func (p *fakeProcess) Done() <-chan struct{} { return p.done }
func (p *fakeProcess) Result() *result.Result {
	select {
	case <-p.done:
		return p.res.Load()
	default:
		return nil
	}
}

// program is the fake interpreter.
type program struct {
	argv           []string
	stdin          io.Reader
	stdout, stderr io.Writer
	sig            <-chan unix.Signal
	kill           <-chan struct{}
	manifest       *manifest.Manifest
}

func (p *program) run() *result.Result {
	start := time.Now()
	var out, errb bytes.Buffer
	stdout := io.Writer(&out)
	if p.stdout != nil {
		stdout = io.MultiWriter(&out, p.stdout)
	}
	stderr := io.Writer(&errb)
	if p.stderr != nil {
		stderr = io.MultiWriter(&errb, p.stderr)
	}
	res := &result.Result{
		Schema: result.SchemaVersion, ID: "fake-" + NewID(4), Tier: "fake",
		Image: result.Image{Name: "python", Digest: "sha256:fake"}, Manifest: p.manifest.Digest(),
		Command: p.argv, Termination: result.Exited, StartedAt: start.UTC(),
		Files: []result.FileChange{}, Network: []result.NetworkAttempt{}, Violations: []result.Violation{}, Degradations: []string{},
	}
	killed := func(sig unix.Signal) {
		res.Termination, res.Signal, res.SignalName, res.ExitCode = result.Signaled, int(sig), unix.SignalName(sig), 128+int(sig)
	}
	finish := func() *result.Result {
		res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		res.Stdout = result.Stream{Data: out.String(), Encoding: "utf-8", Bytes: int64(out.Len())}
		res.Stderr = result.Stream{Data: errb.String(), Encoding: "utf-8", Bytes: int64(errb.Len())}
		return res
	}
	if p.argv[0] != "fake" {
		fmt.Fprintln(stdout, strings.Join(p.argv, " "))
		return finish()
	}
	for _, step := range p.argv[1:] {
		op, arg, _ := strings.Cut(step, ":")
		switch op {
		case "out":
			fmt.Fprintln(stdout, arg)
		case "err":
			fmt.Fprintln(stderr, arg)
		case "raw":
			var b []byte
			fmt.Sscanf(arg, "%x", &b)
			stdout.Write(b)
		case "cat":
			if p.stdin != nil {
				io.Copy(stdout, p.stdin)
			}
		case "block":
			select {
			case sig := <-p.sig:
				killed(sig)
				return finish()
			case <-p.kill:
				killed(unix.SIGKILL)
				return finish()
			}
		case "sleep":
			d, _ := time.ParseDuration(arg)
			select {
			case <-time.After(d):
			case <-p.kill:
				killed(unix.SIGKILL)
				return finish()
			}
		case "exit":
			res.ExitCode, _ = strconv.Atoi(arg)
		case "kill-init":
			// The engine's view when init dies under a command.
			res.Termination, res.ExitCode, res.Error = result.InfraError, 125, "the sandbox's init exited"
			return finish()
		case "cpu":
			res.CPUMS, _ = strconv.ParseFloat(arg, 64)
		case "deny":
			res.Network = append(res.Network, result.NetworkAttempt{Host: arg, Port: 443, Reason: "not-allowlisted"})
		case "violate":
			res.Violations = append(res.Violations, result.Violation{Kind: arg, Detail: "fake"})
		}
	}
	return finish()
}

// fakeAuditor keeps keys and records in memory.
type fakeAuditor struct {
	mu       sync.Mutex
	keys     map[string]audit.Key // by token
	records  map[string]*audit.Record
	cpu      map[string]float64
	failNext error
}

func newFakeAuditor() *fakeAuditor {
	return &fakeAuditor{keys: map[string]audit.Key{}, records: map[string]*audit.Record{}, cpu: map[string]float64{}}
}

func (a *fakeAuditor) addKey(token string, k audit.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys[token] = k
}

func (a *fakeAuditor) Authenticate(token string) (audit.Key, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[token]
	if !ok || k.Revoked != nil {
		return audit.Key{}, audit.ErrBadKey
	}
	return k, nil
}

func (a *fakeAuditor) Begin(r audit.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failNext != nil {
		err := a.failNext
		a.failNext = nil
		return err
	}
	if _, dup := a.records[r.ID]; dup {
		return fmt.Errorf("record %s exists", r.ID)
	}
	a.records[r.ID] = &r
	return nil
}

func (a *fakeAuditor) Finish(id string, res *result.Result, runErr error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.records[id]
	if !ok {
		return fmt.Errorf("no record %s", id)
	}
	if r.Status != audit.Running {
		return fmt.Errorf("record %s finished twice", id)
	}
	r.Ended = time.Now()
	r.Status = audit.Done
	if runErr != nil {
		r.Status, r.Error = audit.Failed, runErr.Error()
	}
	if res != nil {
		r.Termination, r.ExitCode, r.CPUMS = res.Termination, res.ExitCode, res.CPUMS
		a.cpu[r.KeyID] += res.CPUMS / 1000
	}
	return nil
}

func (a *fakeAuditor) CPUSecondsToday(keyID string) (float64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cpu[keyID], nil
}

// record returns a copy of record id.
func (a *fakeAuditor) record(id string) (audit.Record, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.records[id]
	if !ok {
		return audit.Record{}, false
	}
	return *r, true
}

// unfinished lists records still running.
func (a *fakeAuditor) unfinished() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, r := range a.records {
		if r.Status == audit.Running {
			ids = append(ids, id)
		}
	}
	return ids
}
