package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The tools' arguments, as the model sends them: decoded strictly (an
// unknown or repeated key, a value of the wrong type, is refused naming
// the field), then checked with the service's own rules. The jsonschema
// tags are the descriptions the model reads.

// FileArg is one file of a tool call, written into /workspace.
type FileArg struct {
	Path     string `json:"path" jsonschema:"path relative to /workspace, e.g. data/input.csv (no leading /, no ..)"`
	Content  string `json:"content" jsonschema:"the file's content: text, or base64 when encoding is base64"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64 (for binary files)"`
	Mode     string `json:"mode,omitempty" jsonschema:"octal permission such as 0755; default 0644"`
}

// RunCodeArgs are run_code's arguments.
type RunCodeArgs struct {
	Language string          `json:"language" jsonschema:"the language of code: python, bash or sh"`
	Code     string          `json:"code" jsonschema:"the program's source; it runs in /workspace"`
	Files    []FileArg       `json:"files,omitempty" jsonschema:"files written into /workspace before the code runs"`
	Stdin    string          `json:"stdin,omitempty" jsonschema:"text given to the program on standard input"`
	Manifest json.RawMessage `json:"manifest,omitempty" jsonschema:"optional Moat manifest fields (resources, network, image...), within the API key's policy ceiling; omitted fields take Moat's safe defaults (no network, 512MiB, 30s)"`
}

// CreateSandboxArgs are create_sandbox's arguments.
type CreateSandboxArgs struct {
	Snapshot string            `json:"snapshot,omitempty" jsonschema:"optional id or name of a snapshot (snapshot_sandbox) whose files the sandbox starts with"`
	Manifest json.RawMessage   `json:"manifest,omitempty" jsonschema:"optional Moat manifest fields, as for run_code; commands in the sandbox are held to them"`
	TTL      string            `json:"ttl,omitempty" jsonschema:"how long the sandbox lives, a duration such as 10m or 1h (default 10m); it is destroyed after"`
	Files    []FileArg         `json:"files,omitempty" jsonschema:"files written into /workspace when the sandbox is created"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"labels kept with the sandbox"`
}

// ExecArgs are exec's arguments.
type ExecArgs struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Argv      []string          `json:"argv,omitempty" jsonschema:"the command and its arguments, e.g. [\"pip\", \"list\"]; or give code with language instead"`
	Language  string            `json:"language,omitempty" jsonschema:"with code: python, bash or sh"`
	Code      string            `json:"code,omitempty" jsonschema:"source to run with language, instead of argv"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables of the command"`
	Dir       string            `json:"dir,omitempty" jsonschema:"absolute working directory; default /workspace"`
	Timeout   string            `json:"timeout,omitempty" jsonschema:"a duration such as 30s, at most the sandbox's resources.timeout (its default)"`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"text given to the command on standard input"`
}

// WriteFileArgs are write_file's arguments.
type WriteFileArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Path      string `json:"path" jsonschema:"path relative to /workspace; missing directories are created"`
	Content   string `json:"content" jsonschema:"the file's content: text, or base64 when encoding is base64"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64"`
	Mode      string `json:"mode,omitempty" jsonschema:"octal permission such as 0755; default 0644"`
}

// FileArgs are read_file's and download's arguments.
type FileArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Path      string `json:"path" jsonschema:"path of a regular file relative to /workspace"`
}

// ListFilesArgs are list_files' arguments.
type ListFilesArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Path      string `json:"path,omitempty" jsonschema:"directory relative to /workspace; default . (the workspace itself)"`
}

// SandboxArgs are kill_sandbox's arguments.
type SandboxArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
}

// ApprovalArgs are get_approval's arguments.
type ApprovalArgs struct {
	ApprovalID string `json:"approval_id" jsonschema:"the id of a held command (ap-...), from a result that awaits approval"`
}

// decodeArgs decodes a tool call's arguments into v: absent or null is
// an empty object.
func decodeArgs(raw json.RawMessage, v any) *service.Error {
	if len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		raw = json.RawMessage("{}")
	}
	e := strictjson.Decode(raw, v)
	if e == nil {
		return nil
	}
	// strictjson names nested fields; the whole value is the call's
	// "arguments", as MCP names it.
	field, msg := e.Field, e.Message
	if field == "" {
		field, msg = "arguments", "arguments: "+msg
	}
	switch e.Kind {
	case strictjson.WrongType:
		return &service.Error{Kind: service.Invalid, Field: field, Message: msg}
	case strictjson.Unsupported:
		return service.InternalError(e)
	}
	return &service.Error{Kind: service.BadRequest, Field: field, Message: msg}
}

// required refuses an empty required argument.
func required(field, v, hint string) *service.Error {
	if v == "" {
		return service.InvalidField(field, "is missing; %s", hint)
	}
	return nil
}

const sandboxHint = "give the id create_sandbox returned"

// decodeText decodes a content value by its encoding field.
func decodeText(field, encField, s, enc string) ([]byte, *service.Error) {
	switch enc {
	case "", "utf-8":
		return []byte(s), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, service.InvalidField(field, "is not valid standard base64: %v", err)
		}
		return b, nil
	}
	return nil, service.InvalidField(encField, "%s is not an encoding; accepted: utf-8, base64", service.Quote(enc))
}

// parseMode reads an octal permission ("0755", "644"); "" is 0644.
// Setuid, setgid and sticky bits are refused, as the HTTP API refuses them.
func parseMode(field, s string) (fs.FileMode, *service.Error) {
	if s == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 || len(s) > 4 {
		return 0, service.InvalidField(field, "%s is not an octal permission between \"0000\" and \"0777\" such as \"0644\"", service.Quote(s))
	}
	return fs.FileMode(v), nil
}

// files decodes a call's files: each path checked (service.CheckPath), no
// path twice or below another file, at most maxFiles, and no more bytes
// than the workspace of m holds.
func files(args []FileArg, maxFiles int, m *manifest.Manifest) ([]service.File, *service.Error) {
	if len(args) > maxFiles {
		return nil, service.Errorf(service.TooLarge, "files", "files: %d files is more than the %d one call may write", len(args), maxFiles)
	}
	out := make([]service.File, 0, len(args))
	paths := make(map[string]bool, len(args))
	var total int64
	for i, f := range args {
		field := fmt.Sprintf("files[%d]", i)
		if e := service.CheckPath(field+".path", f.Path); e != nil {
			return nil, e
		}
		if paths[f.Path] {
			return nil, service.InvalidField(field+".path", "%s is given twice", service.Quote(f.Path))
		}
		paths[f.Path] = true
		mode, e := parseMode(field+".mode", f.Mode)
		if e != nil {
			return nil, e
		}
		data, e := decodeText(field+".content", field+".encoding", f.Content, f.Encoding)
		if e != nil {
			return nil, e
		}
		total += int64(len(data))
		out = append(out, service.File{Path: f.Path, Mode: mode, Data: bytes.NewReader(data)})
	}
	if ws := int64(m.Workspace.Size); total > ws {
		return nil, service.Errorf(service.TooLarge, "files", "files: they hold %d bytes, more than the workspace's %d (raise manifest.workspace.size)", total, ws)
	}
	for i, f := range args {
		for dir := f.Path; ; {
			j := strings.LastIndexByte(dir, '/')
			if j < 0 {
				break
			}
			dir = dir[:j]
			if paths[dir] {
				return nil, service.InvalidField(fmt.Sprintf("files[%d].path", i), "%s is below %s, which is written as a file", service.Quote(f.Path), service.Quote(dir))
			}
		}
	}
	return out, nil
}

// duration parses a positive duration of field at most max (limit names
// where max comes from).
func duration(field, s string, max time.Duration, limit string) (time.Duration, *service.Error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, service.InvalidField(field, "%s is not a duration such as \"30s\" or \"10m\"", service.Quote(s))
	case d <= 0:
		return 0, service.InvalidField(field, "%s is not positive", service.Quote(s))
	case d > max:
		return 0, service.InvalidField(field, "%s is above %s %s", service.Quote(s), limit, max)
	}
	return d, nil
}

// textOrBase64 is a file's content as a tool returns it: UTF-8 text as it
// is, anything else in base64.
func textOrBase64(b []byte) (content, encoding string) {
	if utf8.Valid(b) {
		return string(b), "utf-8"
	}
	return base64.StdEncoding.EncodeToString(b), "base64"
}

// RunCellArgs are run_cell's arguments.
type RunCellArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Code      string `json:"code" jsonschema:"Python code; variables, imports and files persist from cell to cell. The last expression's value is returned"`
	Context   string `json:"context,omitempty" jsonschema:"the kernel to run in; default the sandbox's own"`
	Timeout   string `json:"timeout,omitempty" jsonschema:"a duration such as 30s, at most the sandbox's resources.timeout (its default)"`
}

// SnapshotArgs are snapshot_sandbox's arguments.
type SnapshotArgs struct {
	SandboxID string `json:"sandbox_id" jsonschema:"the id create_sandbox returned"`
	Name      string `json:"name,omitempty" jsonschema:"optional name to find the snapshot by (letters, digits, . _ : -), unique among the key's snapshots"`
}

// ListSnapshotsArgs are list_snapshots' arguments.
type ListSnapshotsArgs struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"only the snapshots of this sandbox"`
	Name      string `json:"name,omitempty" jsonschema:"only the snapshot of this name"`
}

// SnapshotRefArgs are delete_snapshot's arguments.
type SnapshotRefArgs struct {
	Snapshot string `json:"snapshot" jsonschema:"the snapshot's id or name"`
}
