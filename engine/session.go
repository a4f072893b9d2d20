package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

// File is one file a caller hands a sandbox (an API upload): written into
// /workspace, owned by the sandbox's user.
type File struct {
	// Path is relative to /workspace: no "..", no leading "/", no NUL.
	Path string
	// Mode is the permission bits; 0 means 0644.
	Mode fs.FileMode
	Data io.Reader
	// Metadata, when set, becomes the file's user extended attributes
	// (Session.SetMetadata): what a snapshot kept of a file written with
	// metadata.
	Metadata map[string]string
}

// SessionRequest creates a sandbox that runs many commands.
type SessionRequest struct {
	Manifest *manifest.Manifest
	// Files are written into the workspace before the first command.
	Files []File
}

// SessionInfo describes a session.
type SessionInfo struct {
	ID             string
	Tier           string
	Image          result.Image
	ManifestDigest string
	Created        time.Time
	Pooled         bool
}

// ExecRequest is one command in a session.
type ExecRequest struct {
	Argv []string
	// Env is added to the manifest's environment.
	Env map[string]string
	// Dir is the working directory; default the image config's
	// WorkingDir (an imported image's), else /workspace, as for a run.
	Dir string
	// Timeout bounds this command; 0 or more than the manifest's
	// resources.timeout means the manifest's.
	Timeout time.Duration
	// Stdin is the program's input when StdinOpen is false (nil: empty).
	Stdin io.Reader
	// StdinOpen keeps stdin open for Process.Stdin writes.
	StdinOpen bool
	// Stdout and Stderr, when set, receive the captured output as it
	// arrives (never more than the manifest's caps).
	Stdout, Stderr io.Writer
	// RawStdout, when set, receives every byte the program writes to its
	// stdout, past the manifest's resources.stdout_bytes: a long-lived
	// program that speaks a protocol on its stdout (the service's code
	// kernel) would otherwise go deaf once its lifetime's output reached
	// the cap. The caller takes over the cap: it must bound what it keeps
	// of these bytes. The result's stdout is still the capped capture.
	// Moat's own code sets it, never a request field.
	RawStdout io.Writer
	// Evidence says who asked for the command, for its incident bundle
	// when it ends flagged.
	Evidence Evidence
	// TTY starts the command on a terminal of this size (tier.Command.TTY):
	// all it shows arrives on Stdout, Stdin is typed into it, and
	// Process.Resize changes its size. Tiers without
	// Capabilities.Terminals refuse it (ErrUsage).
	TTY *tier.WindowSize
}

// FileInfo describes one workspace entry.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"` // relative to /workspace
	Type    string    `json:"type"` // file, dir, symlink, other
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // octal permission bits, "0644"
	ModTime time.Time `json:"modified"`
	Target  string    `json:"target,omitempty"` // a symlink's target, never followed
	// Metadata is the entry's user extended attributes (SetMetadata).
	Metadata map[string]string `json:"metadata,omitempty"`
}

// ErrSessionClosed is returned by a session's methods after Close.
var ErrSessionClosed = errors.New("sandbox is closed")

// ErrSandboxEnded is returned (wrapped) by a session's Start when its
// sandbox can run nothing more: its init has exited, killed by one of its
// own programs (a "kill 1" inside) or dead. The session only needs Close.
var ErrSandboxEnded = errors.New("the sandbox has ended: its init process exited")

// ErrNotFound is returned (wrapped) for a workspace path that does not exist.
var ErrNotFound = fs.ErrNotExist

// Session is a sandbox that runs many commands until Close: one task's
// workspace, namespaces and cgroup, never handed to another.
type Session struct {
	e     *Engine
	p     *prepared
	m     *manifest.Manifest
	files *workspace.Files
	info  SessionInfo

	mu     sync.Mutex
	closed bool
	next   int
	wg     sync.WaitGroup
}

// NewSession prepares a session sandbox (from a warm pool when one
// matches), copies the manifest's inputs and the request's files in, and
// returns it ready for commands. The caller must Close it.
func (e *Engine) NewSession(ctx context.Context, req *SessionRequest) (_ *Session, err error) {
	if req == nil || req.Manifest == nil {
		return nil, fmt.Errorf("%w: no manifest", ErrUsage)
	}
	m := req.Manifest
	if m.Output.Canaries {
		// Each command's findings would need the canaries of the whole
		// session and a verdict per command; not built yet.
		return nil, &manifest.FieldError{Field: "output.canaries", Value: "true", Problem: "is supported for one-shot runs only, not for sessions of many commands; drop it or use `moat run`"}
	}
	t, img, err := e.resolve(ctx, m, true)
	if err != nil {
		return nil, err
	}
	p, err := e.take(ctx, t, img, m, true, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if _, ok := p.sb.(tier.Sessioner); !ok {
		return nil, fmt.Errorf("tier %s prepared a sandbox without sessions", t.Name())
	}
	ws := p.sb.Workspace()
	owner := workspace.Owner{UID: ws.UID, GID: ws.GID}
	wsLim := workspace.Limits{Bytes: p.lim.WorkspaceBytes, Files: p.lim.WorkspaceFiles, FileBytes: p.lim.FileSizeBytes}
	if _, err := workspace.CopyIn(ws.Dir, m.Inputs, owner, wsLim); err != nil {
		return nil, fmt.Errorf("%w: copy inputs: %w", ErrUsage, err)
	}
	if err := p.plantSecretFiles(ws.Dir, owner, wsLim); err != nil {
		return nil, err
	}
	if len(req.Files) > 0 {
		if _, err := writeFiles(ws.Dir, owner, wsLim, req.Files); err != nil {
			return nil, err
		}
	}
	files, err := workspace.OpenFiles(ws.Dir, owner, wsLim)
	if err != nil {
		return nil, err
	}
	for _, f := range req.Files {
		if len(f.Metadata) == 0 {
			continue
		}
		if err := files.SetMetadata(f.Path, f.Metadata); err != nil {
			files.Close()
			return nil, fmt.Errorf("set the metadata of %s: %w", f.Path, usage(err))
		}
	}
	return &Session{e: e, p: p, m: m, files: files, info: SessionInfo{
		ID: p.id, Tier: t.Name(), Image: result.Image{Name: img.Name, Digest: img.Digest},
		ManifestDigest: m.Digest(), Created: time.Now().UTC(), Pooled: p.pooled,
	}}, nil
}

// ID is the session's id (also its sandbox's).
func (s *Session) ID() string { return s.info.ID }

// Info describes the session.
func (s *Session) Info() SessionInfo { return s.info }

// Manifest is the session's manifest.
func (s *Session) Manifest() *manifest.Manifest { return s.m }

func (s *Session) open() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrSessionClosed
	}
	return nil
}

// Start starts one command; ctx bounds only the start.
func (s *Session) Start(ctx context.Context, req *ExecRequest) (*Process, error) {
	if req == nil || len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, fmt.Errorf("%w: no command given", ErrUsage)
	}
	for k := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, &manifest.FieldError{Field: "env", Value: k, Problem: "is not a valid variable name"}
		}
	}
	if req.TTY != nil {
		if !s.p.tier.Capabilities().Terminals {
			return nil, fmt.Errorf("%w: tty: the %s tier does not give commands a terminal; use the native tier, or run the command without tty", ErrUsage, s.p.tier.Name())
		}
		if req.TTY.Rows == 0 || req.TTY.Cols == 0 {
			return nil, &manifest.FieldError{Field: "tty", Value: fmt.Sprintf("%dx%d", req.TTY.Cols, req.TTY.Rows), Problem: "needs at least one row and one column, e.g. 80 columns by 24 rows"}
		}
	}
	dir := req.Dir
	if dir != "" && (!strings.HasPrefix(dir, "/") || strings.IndexByte(dir, 0) >= 0) {
		return nil, &manifest.FieldError{Field: "dir", Value: dir, Problem: "must be an absolute path inside the sandbox, e.g. /workspace"}
	}
	if dir == "" {
		// The image's WorkingDir, checked now (a command may have made
		// a WorkingDir under /workspace, or removed it), by the same
		// rule as a run's: every command of a session starts where a
		// run on the image would.
		var err error
		if dir, err = workDir(s.p.img, s.p.sb.Workspace().Dir); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrSessionClosed
	}
	s.next++
	n := s.next
	s.wg.Add(1)
	s.mu.Unlock()

	lim := s.p.lim
	ws := s.p.sb.Workspace()
	before, err := workspace.Scan(ws.Dir, workspace.DiffLimits{MaxEntries: lim.WorkspaceFiles + 1, MaxHashBytes: lim.WorkspaceBytes})
	if err != nil && len(workspace.Violations(err)) == 0 {
		s.wg.Done()
		return nil, fmt.Errorf("scan workspace: %w", err)
	}
	pr := &Process{id: fmt.Sprintf("e%d", n), argv: slices.Clone(req.Argv), done: make(chan struct{}), tty: req.TTY != nil}
	x, err := s.p.start(ctx, s.m, &execSpec{
		mode:      execSession,
		id:        s.info.ID + "-" + pr.id,
		argv:      pr.argv,
		env:       req.Env,
		dir:       dir,
		timeout:   req.Timeout,
		stdin:     req.Stdin,
		stdinOpen: req.StdinOpen,
		tty:       req.TTY,
		stdout:    req.Stdout,
		rawStdout: req.RawStdout,
		stderr:    req.Stderr,
		baseline:  before,
		gone:      func() bool { return s.open() != nil },
	})
	if err != nil {
		s.wg.Done()
		if s.Ended() {
			return nil, fmt.Errorf("start command: %w (%v)", ErrSandboxEnded, err)
		}
		return nil, fmt.Errorf("start command: %w", err)
	}
	pr.tp, pr.stdin = x.proc, x.stdin
	go func() {
		defer s.wg.Done()
		defer close(pr.done)
		// A session's command never fails: Moat's own failures are in its
		// result (execSession).
		res, _ := x.wait(context.Background())
		wsDir := ws.Dir
		if s.open() != nil {
			wsDir = "" // closed: the workspace is being destroyed
		}
		s.e.keepEvidence(x, res, req.Evidence, wsDir)
		pr.res.Store(res)
	}()
	return pr, nil
}

// WriteFile writes r to path in the workspace (see workspace.Files).
func (s *Session) WriteFile(path string, r io.Reader, mode fs.FileMode) (int64, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	n, err := s.files.WriteFile(path, r, mode)
	return n, usage(err)
}

// Open opens a regular file of the workspace for reading.
func (s *Session) Open(path string) (*os.File, FileInfo, error) {
	if err := s.open(); err != nil {
		return nil, FileInfo{}, err
	}
	f, in, err := s.files.Open(path)
	return f, fileInfo(in), usage(err)
}

// ReadDir lists a workspace directory.
func (s *Session) ReadDir(path string) ([]FileInfo, error) {
	if err := s.open(); err != nil {
		return nil, err
	}
	ins, err := s.files.ReadDir(path)
	out := make([]FileInfo, 0, len(ins))
	for _, in := range ins {
		out = append(out, fileInfo(in))
	}
	return out, usage(err)
}

// Stat describes a workspace path without following a final symlink.
func (s *Session) Stat(path string) (FileInfo, error) {
	if err := s.open(); err != nil {
		return FileInfo{}, err
	}
	in, err := s.files.Stat(path)
	return fileInfo(in), usage(err)
}

// MakeDir creates a workspace directory and its parents.
func (s *Session) MakeDir(path string) error {
	if err := s.open(); err != nil {
		return err
	}
	return usage(s.files.MakeDir(path))
}

// Rename moves a workspace path.
func (s *Session) Rename(from, to string) error {
	if err := s.open(); err != nil {
		return err
	}
	return usage(s.files.Rename(from, to))
}

// SetMetadata sets md as the metadata (user xattrs) of a workspace file
// or directory; see workspace.Files.SetMetadata.
func (s *Session) SetMetadata(path string, md map[string]string) error {
	if err := s.open(); err != nil {
		return err
	}
	return usage(s.files.SetMetadata(path, md))
}

// Remove removes a workspace path (a directory recursively).
func (s *Session) Remove(path string) error {
	if err := s.open(); err != nil {
		return err
	}
	return usage(s.files.Remove(path))
}

// Close destroys the sandbox: every command still running is killed. It is
// safe to call more than once.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.p.close()
	}
	s.closed = true
	s.mu.Unlock()
	s.files.Close()
	err := s.p.close()
	s.wg.Wait()
	return err
}

// usage marks the caller's mistakes (bad paths, limits) as ErrUsage.
func usage(err error) error {
	var le *workspace.LimitError
	if errors.Is(err, workspace.ErrBadPath) || errors.Is(err, workspace.ErrNoMetadata) || errors.As(err, &le) {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	return err
}

func fileInfo(in workspace.Info) FileInfo {
	return FileInfo{Name: in.Name, Path: in.Path, Type: in.Type, Size: in.Size, Mode: fmt.Sprintf("%04o", uint32(in.Mode)),
		ModTime: time.Unix(0, in.ModTime).UTC(), Target: in.Target, Metadata: in.Metadata}
}

// Process is one command of a session.
type Process struct {
	id    string
	argv  []string
	tp    tier.Process
	stdin *io.PipeWriter
	tty   bool
	done  chan struct{}
	res   atomic.Pointer[result.Result]
}

// ID names the command within its session ("e1", "e2", ...).
func (p *Process) ID() string { return p.id }

// Argv is the command.
func (p *Process) Argv() []string { return p.argv }

// Stdin is the command's standard input when ExecRequest.StdinOpen was
// set, else nil. Close it to send EOF.
func (p *Process) Stdin() io.WriteCloser {
	if p.stdin == nil {
		return nil
	}
	return p.stdin
}

// Signal sends sig to the command's process group.
func (p *Process) Signal(sig unix.Signal) error {
	select {
	case <-p.done:
		return errors.New("the command has ended")
	default:
	}
	return p.tp.Signal(sig)
}

// Pid is the command's pid in the sandbox's PID namespace, what its own
// programs see (tier.PidReporter); it waits, bounded, for the command to
// have started, and is 0 when the tier cannot tell.
func (p *Process) Pid() int {
	if pr, ok := p.tp.(tier.PidReporter); ok {
		return pr.Pid()
	}
	return 0
}

// Resize sets the window size of a command started with ExecRequest.TTY.
func (p *Process) Resize(ws tier.WindowSize) error {
	select {
	case <-p.done:
		return errors.New("the command has ended")
	default:
	}
	r, ok := p.tp.(tier.Resizer)
	if !ok || !p.tty {
		return fmt.Errorf("%w: the command has no terminal to resize: start it with tty", ErrUsage)
	}
	return r.Resize(ws)
}

// Done is closed when the command has ended and its Result is ready.
func (p *Process) Done() <-chan struct{} { return p.done }

// Result is the command's outcome, nil until Done is closed.
func (p *Process) Result() *result.Result { return p.res.Load() }
