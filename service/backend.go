package service

import (
	"context"
	"io"
	"io/fs"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// Backend runs sandboxes: *engine.Engine, through a thin adapter, in
// production; an in-memory fake in the tests.
//
// Errors follow the engine's convention: an error wrapping engine.ErrUsage,
// a *manifest.FieldError or a *workspace.LimitError is the caller's fault;
// fs.ErrNotExist is a missing path; ErrUnavailable or tier.ErrUnavailable
// says this host cannot serve the request (a tier it lacks); anything else
// is Moat failing. Classify reads them.
type Backend interface {
	// Run executes one request in a fresh sandbox and destroys it before
	// returning. The program's fate is in the Result; the error is for
	// Moat's failures and refused requests. Cancelling ctx kills the run.
	Run(ctx context.Context, req *engine.Request) (*result.Result, error)
	// NewSession prepares a sandbox that runs many commands. ctx bounds the
	// preparation only.
	NewSession(ctx context.Context, req *engine.SessionRequest) (Session, error)
}

// Session is one long-lived sandbox. All methods are safe to call
// concurrently. After Close every method returns an error wrapping
// engine.ErrSessionClosed.
type Session interface {
	ID() string
	Info() engine.SessionInfo
	// Start starts a command; ctx bounds only the start. The engine writes
	// at most the manifest's caps to req.Stdout and req.Stderr, and has
	// finished writing to them before the Process's Done is closed.
	Start(ctx context.Context, req *engine.ExecRequest) (Process, error)
	// WriteFile writes r to path (relative to /workspace), creating missing
	// parent directories, and returns the bytes written.
	WriteFile(path string, r io.Reader, mode fs.FileMode) (int64, error)
	// Open opens a regular file for reading; anything else is an error.
	Open(path string) (*os.File, engine.FileInfo, error)
	ReadDir(path string) ([]engine.FileInfo, error)
	// Stat describes path without following a final symlink.
	Stat(path string) (engine.FileInfo, error)
	MakeDir(path string) error
	Rename(from, to string) error
	// Remove removes path, a directory recursively.
	Remove(path string) error
	// Close kills every process and destroys the sandbox. It is idempotent,
	// and every Process's Done is closed once it returns.
	Close() error
}

// Ender is implemented by a Session that can tell whether its sandbox has
// ended on its own (engine.Session: its init exited). The service destroys
// such a sandbox rather than keep reporting it running while every
// command fails. Start on it returns an error wrapping
// engine.ErrSandboxEnded.
type Ender interface {
	Ended() bool
}

// Process is one command started in a Session.
type Process interface {
	ID() string
	Argv() []string
	// Stdin is the program's standard input: nil unless the ExecRequest had
	// StdinOpen. Closing it sends end-of-file.
	Stdin() io.WriteCloser
	Signal(sig unix.Signal) error
	Done() <-chan struct{}
	// Result is nil until Done is closed.
	Result() *result.Result
}

// Resizer is implemented by a Process that may have a terminal
// (engine.Process): Resize sets its size, or fails when it has none.
type Resizer interface {
	Resize(ws tier.WindowSize) error
}

// PidReporter is implemented by a Process that knows its pid in the
// sandbox's PID namespace (engine.Process, on tiers that tell it).
type PidReporter interface {
	Pid() int
}

// Auditor authenticates API keys and records what ran. *audit.Store
// implements it.
type Auditor interface {
	// Authenticate returns the key a token belongs to, or an error wrapping
	// audit.ErrBadKey for a missing, unknown or revoked one.
	Authenticate(token string) (audit.Key, error)
	// Begin records the start of a run, a sandbox or an exec.
	Begin(r audit.Record) error
	// Finish records its end: res is nil for a sandbox and for a run that
	// failed with runErr.
	Finish(id string, res *result.Result, runErr error) error
	// CPUSecondsToday is the CPU time of the key's runs and execs since
	// 00:00 UTC.
	CPUSecondsToday(keyID string) (float64, error)
}

// PoolStat is the state of one warm pool, for the moat_pool_* metrics.
type PoolStat struct {
	Pool   string // the pool's name (its manifest digest or a configured name)
	Ready  int    // sandboxes prepared and waiting
	Taken  uint64 // sandboxes handed out since start
	Misses uint64 // requests the pool could not serve from ready sandboxes
}

// StartReporter is implemented by a Backend that can say how long each
// sandbox took to be ready (the engine): ObserveStarts sets the function
// it calls then, with the sandbox's tier and whether a warm pool had it
// ready (Config.ObserveStart; the moat_sandbox_start_seconds metric).
type StartReporter interface {
	ObserveStarts(fn func(tier string, poolHit bool, d time.Duration))
}

// PoolReporter is implemented by a Backend with warm pools; the server
// reads it when /metrics is scraped (Service.PoolStats).
type PoolReporter interface {
	PoolStats() []PoolStat
}
