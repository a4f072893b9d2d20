package server

import (
	"encoding/json"

	"github.com/moat-sandbox/moat/service"
)

// The wire types of docs/API.md and openapi.yaml. Requests are decoded
// strictly (internal/strictjson): an unknown or repeated key is refused.
// The views the service returns are its own types, encoded as they are.

// RunResponse is the answer to POST /v1/runs and GET /v1/runs/{id}.
type RunResponse = service.RunResponse

// Sandbox describes a session.
type Sandbox = service.Sandbox

// Exec describes one command of a sandbox.
type Exec = service.Exec

// Sandbox states.
const (
	StateRunning  = service.StateRunning
	StateDeleting = service.StateDeleting
	StateDeleted  = service.StateDeleted
)

// Exec states.
const (
	ExecRunning = service.ExecRunning
	ExecExited  = service.ExecExited
	ExecFailed  = service.ExecFailed
)

// FileUpload is one file of a request's "files", written into /workspace.
type FileUpload struct {
	// Path is relative to /workspace (see checkPath for what is refused).
	Path    string `json:"path"`
	Content string `json:"content"`
	// Encoding is "utf-8" (the default) or "base64".
	Encoding string `json:"encoding,omitempty"`
	// Mode is the octal permission, default "0644".
	Mode string `json:"mode,omitempty"`
}

// RunRequest is the body of POST /v1/runs.
type RunRequest struct {
	// Manifest is the capability manifest in its JSON form; omitted fields
	// take the defaults.
	Manifest json.RawMessage `json:"manifest,omitempty"`
	// Argv, or Code with Language: exactly one.
	Argv     []string     `json:"argv,omitempty"`
	Code     string       `json:"code,omitempty"`
	Language string       `json:"language,omitempty"`
	Files    []FileUpload `json:"files,omitempty"`
	Stdin    string       `json:"stdin,omitempty"`
	// StdinEncoding is "utf-8" (default) or "base64".
	StdinEncoding string `json:"stdin_encoding,omitempty"`
}

// SandboxRequest is the body of POST /v1/sandboxes.
type SandboxRequest struct {
	Manifest json.RawMessage `json:"manifest,omitempty"`
	// TTL is a Go duration ("10m"); default Config.DefaultTTL, at most
	// Config.MaxTTL.
	TTL      string            `json:"ttl,omitempty"`
	Files    []FileUpload      `json:"files,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	TTL string `json:"ttl"`
}

// SandboxList is the answer to GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/execs.
type ExecRequest struct {
	Argv     []string          `json:"argv,omitempty"`
	Code     string            `json:"code,omitempty"`
	Language string            `json:"language,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// Dir is the absolute working directory; default /workspace.
	Dir string `json:"dir,omitempty"`
	// Timeout is a Go duration, at most the manifest's resources.timeout
	// (the default).
	Timeout       string `json:"timeout,omitempty"`
	Stdin         string `json:"stdin,omitempty"`
	StdinEncoding string `json:"stdin_encoding,omitempty"`
	// StdinOpen keeps stdin open for POST …/stdin.
	StdinOpen bool `json:"stdin_open,omitempty"`
	// TTY starts the command on a terminal of this size (native tier):
	// stdin (POST …/stdin) is typed into it, everything it shows is the
	// stdout stream, POST …/resize changes its size.
	TTY *service.TTYSize `json:"tty,omitempty"`
	// Wait, true when omitted, answers with the finished Exec; false
	// answers 202 at once.
	Wait *bool `json:"wait,omitempty"`
}

// ExecList is the answer to GET /v1/sandboxes/{id}/execs.
type ExecList struct {
	Execs []Exec `json:"execs"`
}

// StdinResult is the answer to POST …/stdin.
type StdinResult struct {
	// Written is the number of bytes of the body the program's stdin took.
	Written int64 `json:"written"`
	// Closed is true once stdin is closed (?eof=1).
	Closed bool `json:"closed"`
}

// SignalRequest is the body of POST …/signal. Signal is a name ("SIGTERM",
// "TERM") or a number (15 or "15").
type SignalRequest struct {
	Signal json.RawMessage `json:"signal"`
}

// OutputEvent is the data of a stdout or stderr event.
type OutputEvent struct {
	Data     string `json:"data"`
	Encoding string `json:"encoding"`
}

// DirListing is the answer to GET …/files for a directory.
type DirListing struct {
	Path    string             `json:"path"`
	Entries []service.FileInfo `json:"entries"`
}

// Health is the answer to GET /v1/health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}

// CellRequest is the body of POST /v1/sandboxes/{id}/cells.
type CellRequest struct {
	Code string `json:"code"`
	// Context names the kernel (POST …/contexts); default "default".
	Context string `json:"context,omitempty"`
	// Language is "python" (the default).
	Language string `json:"language,omitempty"`
	// Timeout bounds the cell, e.g. "30s"; default and at most the
	// sandbox's resources.timeout.
	Timeout string `json:"timeout,omitempty"`
}

// ContextList is the body of GET /v1/sandboxes/{id}/contexts.
type ContextList struct {
	Contexts []service.Kernel `json:"contexts"`
}
