package client

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// RunRequest is a one-shot run: a fresh sandbox, one command, destroyed
// afterwards. Give Argv, or Code with Language; not both.
type RunRequest struct {
	// Manifest is the capability manifest, sent in its JSON form with
	// every field, so start from manifest.Default() or manifest.Parse
	// rather than a zero Manifest. Its Inputs must be empty: the API
	// refuses host paths; upload Files instead. nil sends no manifest
	// (the server's defaults).
	Manifest *manifest.Manifest
	// ManifestJSON is the manifest as a raw JSON object, for a partial
	// manifest whose omitted fields take the defaults, e.g.
	// {"resources": {"timeout": "10s"}}. Set at most one of Manifest and
	// ManifestJSON.
	ManifestJSON json.RawMessage
	// Argv is the command and its arguments.
	Argv []string
	// Code is source code run by Language: "python" (python3 -c CODE),
	// "bash" or "sh".
	Code     string
	Language string
	// Files are written into /workspace before the program starts.
	Files []File
	// Stdin is the program's standard input; nil means empty.
	Stdin []byte
}

// RunResponse is the answer of a one-shot run.
type RunResponse struct {
	// ID names the run for GetRun.
	ID string `json:"id"`
	// Pooled is true when the sandbox came from the server's warm pool.
	Pooled bool `json:"pooled"`
	// Result is the run's outcome (docs/RESULT.md), whatever the
	// program's exit.
	Result *result.Result `json:"result"`
	// Approval, when set, says the server's effects policy held the run
	// for a person's approval (HTTP 202): nothing ran, and ID and Result
	// are empty. Approve or deny it with POST /v1/approvals/{id}.
	Approval *Approval `json:"approval,omitempty"`
}

// Approval is a run or command held for a person's approval.
type Approval struct {
	ID        string    `json:"id"`
	State     string    `json:"state"`
	SandboxID string    `json:"sandbox_id,omitempty"`
	Argv      []string  `json:"argv"`
	Effects   []Effect  `json:"effects"`
	Reasons   []string  `json:"reasons,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Effect is one effect the server's analysis found (package effects).
type Effect struct {
	Kind     string   `json:"kind"`
	Detail   string   `json:"detail"`
	Commands []int    `json:"commands"`
	Hosts    []string `json:"hosts,omitempty"`
	Paths    []string `json:"paths,omitempty"`
}

// File is one file written into a sandbox's /workspace.
type File struct {
	// Path is relative to /workspace: no "..", no NUL, no leading "/".
	// Missing parent directories are created.
	Path string
	// Content is the file's bytes. Valid UTF-8 travels as text, anything
	// else as base64.
	Content []byte
	// Mode is the permission bits; 0 means the server's default, 0644.
	Mode fs.FileMode
}

// SandboxRequest creates a sandbox.
type SandboxRequest struct {
	// Manifest and ManifestJSON are as in RunRequest; both empty means
	// the server's defaults.
	Manifest     *manifest.Manifest
	ManifestJSON json.RawMessage
	// TTL is how long the sandbox lives; 0 means the server's default
	// (10m). SetTimeout changes it later.
	TTL time.Duration
	// Files are written into /workspace before the first command.
	Files []File
	// Metadata is the caller's own labels, returned with the sandbox.
	Metadata map[string]string
}

// Sandbox is a sandbox's state as the server reported it, and a handle for
// acting on it: its methods call the server with the Client that returned
// it. The fields are a snapshot; GetSandbox reads them again.
type Sandbox struct {
	ID    string `json:"id"`
	State string `json:"state"` // "running", then "deleted"
	Tier  string `json:"tier"`
	// Image is the root image's name and digest.
	Image          result.Image      `json:"image"`
	ManifestDigest string            `json:"manifest_digest"`
	CreatedAt      time.Time         `json:"created_at"`
	ExpiresAt      time.Time         `json:"expires_at"`
	Pooled         bool              `json:"pooled"`
	Metadata       map[string]string `json:"metadata"`
	// Execs counts the commands started in the sandbox.
	Execs int `json:"execs"`

	c *Client
}

// ExecRequest is one command in a sandbox. Give Argv, or Code with
// Language; not both. Whether the call waits is chosen by the method:
// Sandbox.Exec waits, Sandbox.Start does not.
type ExecRequest struct {
	Argv     []string
	Code     string
	Language string
	// Env is added to the manifest's environment.
	Env map[string]string
	// Dir is the working directory; "" means /workspace.
	Dir string
	// Timeout bounds this command; 0 means the manifest's
	// resources.timeout, which is also the maximum.
	Timeout time.Duration
	// Stdin is the command's whole input, closed after; nil means empty.
	Stdin []byte
	// StdinOpen keeps stdin open for Sandbox.WriteStdin and
	// Sandbox.CloseStdin (Stdin is then ignored by the server).
	StdinOpen bool
	// TTY starts the command on a terminal of this size (native tier):
	// WriteStdin types into it, everything it shows is its stdout, and
	// Sandbox.Resize changes its size.
	TTY *TTYSize
}

// TTYSize is a terminal's size in characters, each 1 to 1000.
type TTYSize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

// Exec states. Result is set once State is not ExecRunning.
const (
	ExecRunning = "running"
	ExecExited  = "exited"
)

// Exec is one command of a sandbox.
type Exec struct {
	ID        string   `json:"id"`
	SandboxID string   `json:"sandbox_id"`
	State     string   `json:"state"`
	Argv      []string `json:"argv"`
	// Pid is the command's pid inside the sandbox (what its programs see
	// and can signal), when the server's tier tells it; else 0.
	Pid int `json:"pid,omitempty"`
	// TTY is the terminal's size for a command started with one.
	TTY *TTYSize `json:"tty,omitempty"`
	// Result is the command's outcome (exit code, termination, output,
	// the files it changed), present once State is not ExecRunning.
	Result *result.Result `json:"result,omitempty"`
	// Interrupted, when set, says the command was killed because its
	// sandbox went while it ran: "sandbox-deleted", "sandbox-expired",
	// "sandbox-auto-paused", "sandbox-paused", "server-shutdown" or
	// "sandbox-ended" (docs/API.md).
	Interrupted string `json:"interrupted,omitempty"`
}

// Running reports whether the command has not ended yet.
func (e *Exec) Running() bool { return e.State == ExecRunning }

// FileInfo is one entry of a workspace directory listing.
type FileInfo struct {
	Name string `json:"name"`
	// Path is relative to /workspace.
	Path string `json:"path"`
	// Type is "file", "dir", "symlink" or "other".
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Mode is the permission bits in octal, e.g. "0644".
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"modified"`
	// Target is a symlink's target (never followed by the server).
	Target string `json:"target,omitempty"`
}

// wireFile is File in the API's JSON form.
type wireFile struct {
	Path     string `json:"path"`
	Content  string `json:"content"`
	Encoding string `json:"encoding,omitempty"`
	Mode     string `json:"mode,omitempty"`
}

func wireFiles(files []File) ([]wireFile, error) {
	if len(files) == 0 {
		return nil, nil
	}
	out := make([]wireFile, len(files))
	for i, f := range files {
		if f.Path == "" {
			return nil, fmt.Errorf("files[%d]: empty path", i)
		}
		text, enc := encodeBytes(f.Content)
		out[i] = wireFile{Path: f.Path, Content: text, Encoding: enc}
		if f.Mode != 0 {
			out[i].Mode = octalMode(f.Mode)
		}
	}
	return out, nil
}

// octalMode renders permission bits as the API writes them, "0755".
func octalMode(m fs.FileMode) string { return fmt.Sprintf("%04o", m.Perm()) }

// encodeBytes returns b as JSON text: itself when valid UTF-8 (encoding
// ""), else standard base64 (encoding "base64").
func encodeBytes(b []byte) (string, string) {
	if utf8.Valid(b) {
		return string(b), ""
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// manifestJSON returns the manifest to send, or nil for none.
func manifestJSON(m *manifest.Manifest, raw json.RawMessage) (json.RawMessage, error) {
	switch {
	case m != nil && raw != nil:
		return nil, errors.New("set Manifest or ManifestJSON, not both")
	case m != nil:
		b, err := json.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("encode the manifest: %w", err)
		}
		// The API refuses host inputs; an empty list says nothing, so it
		// is left out rather than risk being read as a grant.
		if len(m.Inputs) == 0 {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(b, &obj); err != nil {
				return nil, fmt.Errorf("encode the manifest: %w", err)
			}
			delete(obj, "inputs")
			if b, err = json.Marshal(obj); err != nil {
				return nil, fmt.Errorf("encode the manifest: %w", err)
			}
		}
		return b, nil
	case raw != nil:
		t := bytes.TrimSpace(raw)
		if !json.Valid(t) || len(t) == 0 || t[0] != '{' {
			return nil, errors.New("ManifestJSON is not a JSON object")
		}
		return json.RawMessage(t), nil
	}
	return nil, nil
}

func (r *RunRequest) wire() ([]byte, error) {
	man, err := manifestJSON(r.Manifest, r.ManifestJSON)
	if err != nil {
		return nil, err
	}
	files, err := wireFiles(r.Files)
	if err != nil {
		return nil, err
	}
	w := struct {
		Manifest      json.RawMessage `json:"manifest,omitempty"`
		Argv          []string        `json:"argv,omitempty"`
		Code          string          `json:"code,omitempty"`
		Language      string          `json:"language,omitempty"`
		Files         []wireFile      `json:"files,omitempty"`
		Stdin         string          `json:"stdin,omitempty"`
		StdinEncoding string          `json:"stdin_encoding,omitempty"`
	}{Manifest: man, Argv: r.Argv, Code: r.Code, Language: r.Language, Files: files}
	if len(r.Stdin) > 0 {
		w.Stdin, w.StdinEncoding = encodeBytes(r.Stdin)
	}
	return json.Marshal(w)
}

func (r *SandboxRequest) wire() ([]byte, error) {
	man, err := manifestJSON(r.Manifest, r.ManifestJSON)
	if err != nil {
		return nil, err
	}
	files, err := wireFiles(r.Files)
	if err != nil {
		return nil, err
	}
	if r.TTL < 0 {
		return nil, fmt.Errorf("SandboxRequest.TTL %v is negative; give 0 for the server's default or a positive duration", r.TTL)
	}
	w := struct {
		Manifest json.RawMessage   `json:"manifest,omitempty"`
		TTL      string            `json:"ttl,omitempty"`
		Files    []wireFile        `json:"files,omitempty"`
		Metadata map[string]string `json:"metadata,omitempty"`
	}{Manifest: man, Files: files, Metadata: r.Metadata}
	if r.TTL > 0 {
		w.TTL = durationString(r.TTL)
	}
	return json.Marshal(w)
}

func (r *ExecRequest) wire(wait bool) ([]byte, error) {
	if r.Timeout < 0 {
		return nil, fmt.Errorf("ExecRequest.Timeout %v is negative; give 0 for the manifest's timeout or a positive duration", r.Timeout)
	}
	w := struct {
		Argv          []string          `json:"argv,omitempty"`
		Code          string            `json:"code,omitempty"`
		Language      string            `json:"language,omitempty"`
		Env           map[string]string `json:"env,omitempty"`
		Dir           string            `json:"dir,omitempty"`
		Timeout       string            `json:"timeout,omitempty"`
		Stdin         string            `json:"stdin,omitempty"`
		StdinEncoding string            `json:"stdin_encoding,omitempty"`
		StdinOpen     bool              `json:"stdin_open,omitempty"`
		TTY           *TTYSize          `json:"tty,omitempty"`
		Wait          bool              `json:"wait"`
	}{Argv: r.Argv, Code: r.Code, Language: r.Language, Env: r.Env, Dir: r.Dir, StdinOpen: r.StdinOpen, TTY: r.TTY, Wait: wait}
	if r.Timeout > 0 {
		w.Timeout = durationString(r.Timeout)
	}
	if len(r.Stdin) > 0 {
		w.Stdin, w.StdinEncoding = encodeBytes(r.Stdin)
	}
	return json.Marshal(w)
}

// StreamBytes returns the bytes of a captured stdout or stderr of a
// result, decoding its base64 form (used when the output was not valid
// UTF-8).
func StreamBytes(s result.Stream) ([]byte, error) {
	switch s.Encoding {
	case "", "utf-8":
		return []byte(s.Data), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s.Data)
		if err != nil {
			return nil, fmt.Errorf("decode base64 output: %w", err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("output has unknown encoding %q", s.Encoding)
}

// ApprovalOutcome is the answer to DecideApproval: the approval in its
// final state and, when it was approved, what ran: Run for a held
// one-shot run (already ended), Exec for a held command (running: follow
// it with Sandbox.GetExec or Sandbox.Events).
type ApprovalOutcome struct {
	Approval Approval     `json:"approval"`
	Run      *RunResponse `json:"run,omitempty"`
	Exec     *Exec        `json:"exec,omitempty"`
}

// The states of an Approval.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalExpired  = "expired"
)
