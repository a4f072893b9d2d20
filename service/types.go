package service

import (
	"io"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// The values the service takes and returns. The views (RunResponse,
// Sandbox, Exec) carry the JSON tags of docs/API.md: the HTTP API encodes
// them as they are.

// The engine's file types and its closed-sandbox error, under the names
// the front doors use: they speak to the service only.
type (
	// File is one file a request puts in a new sandbox's workspace.
	File = engine.File
	// FileInfo describes a file in a sandbox's workspace.
	FileInfo = engine.FileInfo
)

// ErrSessionClosed is wrapped in the errors of a sandbox that has been
// destroyed (service.Classify: Conflict).
var ErrSessionClosed = engine.ErrSessionClosed

// RunArgs is a one-shot run: a decoded, validated request.
type RunArgs struct {
	Manifest *manifest.Manifest
	Argv     []string
	Files    []engine.File
	// Stdin, when not nil, is the program's standard input.
	Stdin io.Reader
}

// RunResponse is a one-shot run's outcome.
type RunResponse struct {
	// ID names the run in the API and in the audit log.
	ID     string         `json:"id"`
	Pooled bool           `json:"pooled"`
	Result *result.Result `json:"result"`
}

// SandboxArgs is a sandbox to create.
type SandboxArgs struct {
	Manifest *manifest.Manifest
	// TTL is how long the sandbox lives unless extended; 0 is the
	// Config's DefaultTTL, and at most its MaxTTL is accepted.
	TTL      time.Duration
	Files    []engine.File
	Metadata map[string]string
	// Snapshot, when set, names a snapshot of the key (its id or one of
	// its names): the sandbox starts with the snapshot's files (before
	// Files) and, when Manifest is nil, the snapshot's manifest.
	Snapshot string
	// AutoPause: when the TTL passes the sandbox is paused (its files
	// kept, for Config.SnapshotTTL) rather than destroyed. Needs
	// Config.SnapshotDir.
	AutoPause bool
}

// Sandbox states. A paused sandbox has no processes; its workspace is
// kept until it is resumed (running again, same id) or deleted.
const (
	StateRunning  = "running"
	StatePausing  = "pausing"
	StatePaused   = "paused"
	StateResuming = "resuming"
	StateDeleting = "deleting"
	StateDeleted  = "deleted"
)

// Sandbox describes a session.
type Sandbox struct {
	ID             string            `json:"id"`
	State          string            `json:"state"`
	Tier           string            `json:"tier"`
	Image          result.Image      `json:"image"`
	ManifestDigest string            `json:"manifest_digest"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	Pooled         bool              `json:"pooled"`
	Metadata       map[string]string `json:"metadata"`
	// Execs counts the commands started in the sandbox.
	Execs int `json:"execs"`
	// AutoPause: the sandbox is paused, not destroyed, when it expires.
	AutoPause bool `json:"auto_pause,omitempty"`
}

// ExecArgs is a command to start in a sandbox.
type ExecArgs struct {
	Argv []string
	Env  map[string]string
	// Dir is the absolute working directory; "" is /workspace.
	Dir string
	// Timeout is at most the manifest's resources.timeout; 0 is that.
	Timeout time.Duration
	// CapTimeout makes a Timeout above the manifest's resources.timeout
	// that limit rather than an error: a front door whose clients give
	// a deadline for the whole call (E2B's timeoutMs) rather than ask
	// for a limit.
	CapTimeout bool
	// Stdin, when not nil, is the whole standard input.
	Stdin io.Reader
	// StdinOpen keeps stdin open for WriteStdin.
	StdinOpen bool
	// TTY starts the command on a terminal of this size (tiers with
	// terminals: native): WriteStdin types into it, all it shows is the
	// stdout stream, Resize changes its size.
	TTY *TTYSize
	// kernel, set only by the code interpreter (kernel.go), makes the
	// command its kernel: all its stdout goes to this writer, past the
	// manifest's cap (engine.ExecRequest.RawStdout), and its stdin is
	// the kernel's alone.
	kernel io.Writer
}

// TTYSize is a terminal's size in characters.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Exec states. An ended command is "exited" whatever ended it (its result's
// termination says how); "failed" means Moat lost it (termination
// infra-error).
const (
	ExecRunning = "running"
	ExecExited  = "exited"
	ExecFailed  = "failed"
)

// Exec describes one command of a sandbox.
type Exec struct {
	ID        string   `json:"id"`
	SandboxID string   `json:"sandbox_id"`
	State     string   `json:"state"`
	Argv      []string `json:"argv"`
	StdinOpen bool     `json:"stdin_open"`
	// TTY is the command's terminal size when it was started with one
	// (the size it was started with, or the last Resize).
	TTY *TTYSize `json:"tty,omitempty"`
	// Pid is the command's pid in the sandbox's PID namespace (what its
	// programs see and can signal); 0 when the tier cannot tell.
	Pid       int        `json:"pid,omitempty"`
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// Result is present once State is not running.
	Result *result.Result `json:"result,omitempty"`
	// Interrupted, when set, says the command was killed because its
	// sandbox was destroyed or paused while it ran, and why: one of the
	// Interrupt* values.
	Interrupted string `json:"interrupted,omitempty"`
}
