package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime/debug"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
)

// reply is what a tool answers: out is the structured content (the
// service's JSON view), text the summary a model reads first, extra more
// content (download's embedded resource).
type reply struct {
	out   any
	text  string
	extra []mcp.Content
}

// tool is one tool: its definition (with the input schema derived from
// its argument type) and its handler on decoded arguments.
type tool struct {
	def *mcp.Tool
	// call decodes raw into the tool's argument type and serves it as
	// key on the connection c.
	call func(ctx context.Context, s *Server, c *conn, key audit.Key, raw json.RawMessage) (reply, error)
}

// schemaOptions describe a manifest (json.RawMessage in the argument
// types) as the object it is; its fields are the manifest's (docs).
var schemaOptions = &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
	reflect.TypeFor[json.RawMessage](): {Type: "object", Description: "a Moat manifest in its JSON form (see docs/MANIFEST.md); unknown fields are refused"},
}}

// newTool makes a tool whose arguments are an In.
func newTool[In any](name, title, desc string, annot *mcp.ToolAnnotations, h func(ctx context.Context, s *Server, c *conn, key audit.Key, in *In) (reply, error)) (tool, error) {
	schema, err := jsonschema.For[In](schemaOptions)
	if err != nil {
		return tool{}, fmt.Errorf("mcp: input schema of %s: %w", name, err)
	}
	annot.Title = title
	return tool{
		def: &mcp.Tool{Name: name, Title: title, Description: desc, InputSchema: schema, Annotations: annot},
		call: func(ctx context.Context, s *Server, c *conn, key audit.Key, raw json.RawMessage) (reply, error) {
			var in In
			if e := decodeArgs(raw, &in); e != nil {
				return reply{}, e
			}
			return h(ctx, s, c, key, &in)
		},
	}, nil
}

func ptr[T any](v T) *T { return &v }

// tools are the tools every connection is served, in the order listed.
var tools = func() []tool {
	var out []tool
	add := func(t tool, err error) {
		if err != nil {
			// A schema that cannot be derived is a bug in this file's
			// types, found by every test; New reports it.
			toolsErr = errors.Join(toolsErr, err)
			return
		}
		out = append(out, t)
	}
	add(newTool("run_code", "Run code",
		"Run a program once in a fresh, isolated sandbox and return its result: exit code, stdout, stderr, "+
			"the files it created or changed, resource usage and any policy violations. Nothing persists after "+
			"the call; for multi-step work use create_sandbox and exec. language is python, bash or sh. By "+
			"default the sandbox has no network, 512MiB of memory and 30s; ask for more with manifest "+
			"(e.g. {\"resources\": {\"timeout\": \"2m\"}}), within the API key's ceiling.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)}, runCode))
	add(newTool("create_sandbox", "Create a sandbox",
		"Create a long-lived sandbox for multi-step work and return its id (sandbox_id for the other tools). "+
			"Files and installed state persist across exec calls until kill_sandbox or its ttl (default 10m). "+
			"Give manifest fields to change its image, resources or network, within the API key's ceiling.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)}, createSandbox))
	add(newTool("exec", "Run a command in a sandbox",
		"Run a command in a sandbox from create_sandbox and wait for it to end; returns its result (exit code, "+
			"stdout, stderr, changed files). Give argv (e.g. [\"python3\", \"main.py\"]) or code with language. "+
			"The working directory is /workspace. A command that needs a person's approval is not run: the "+
			"answer gives the approval's id (see get_approval).",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false)}, execTool))
	add(newTool("write_file", "Write a file",
		"Write a file into a sandbox's /workspace (missing directories are created, an existing file is "+
			"replaced). Binary content goes as base64 with encoding base64.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), IdempotentHint: true}, writeFile))
	add(newTool("read_file", "Read a file",
		"Read a file of a sandbox's /workspace: its content as text (utf-8) or, when it is not text, as base64. "+
			"For images and other produced files to keep, use download.",
		&mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}, readFile))
	add(newTool("list_files", "List files",
		"List a directory of a sandbox's /workspace: each entry's name, path, type (file, dir, symlink), size, "+
			"mode and modification time. Symlinks are shown, never followed.",
		&mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}, listFiles))
	add(newTool("download", "Download a file",
		"Return a file of a sandbox's /workspace as an embedded MCP resource (text, or a base64 blob with its "+
			"MIME type, e.g. a PNG chart), to show or keep.",
		&mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}, download))
	add(newTool("kill_sandbox", "Destroy a sandbox",
		"Destroy a sandbox now, with its files and processes; its id stops working. Do it when the work is done.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(true), IdempotentHint: false}, killSandbox))
	add(newTool("run_cell", "Run a cell in the sandbox's Python kernel",
		"Run Python code as one cell of a stateful interpreter in a sandbox from create_sandbox (the first cell "+
			"starts it): variables, imports and files persist from cell to cell, as in a notebook. Returns the "+
			"printed output, the last expression's value, displays and charts (matplotlib figures come back as "+
			"images; use a sandbox whose manifest says \"image\": \"code-interpreter\" for pandas and "+
			"matplotlib), or the exception with its traceback.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false)}, runCell))
	add(newTool("snapshot_sandbox", "Snapshot a sandbox's files",
		"Keep a copy of a sandbox's /workspace files (not its processes or memory) as a snapshot, to start "+
			"new sandboxes from (create_sandbox with snapshot). The sandbox keeps running. A snapshot counts "+
			"against the key's sandbox quota until delete_snapshot or its expiry.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(false)}, snapshotSandbox))
	add(newTool("list_snapshots", "List snapshots",
		"List the key's snapshots, optionally of one sandbox or by name: id, names, source sandbox, files, "+
			"bytes, when it expires.",
		&mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}, listSnapshots))
	add(newTool("delete_snapshot", "Delete a snapshot",
		"Delete a snapshot (by id or name) and its files now.",
		&mcp.ToolAnnotations{OpenWorldHint: ptr(false), DestructiveHint: ptr(true)}, deleteSnapshot))
	add(newTool("get_approval", "Check an approval",
		"Check a command held for a person's approval (the id an exec or run_code answer gave): pending with "+
			"when it expires, or no longer pending once it was approved, denied or expired (then run the "+
			"command again, or check its sandbox's files).",
		&mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: ptr(false)}, getApproval))
	return out
}()

// toolsErr is the error deriving a tool's schema returned, if any.
var toolsErr error

// addTools registers the tools on srv for the connection c.
func (s *Server) addTools(srv *mcp.Server, c *conn) {
	for _, t := range tools {
		srv.AddTool(t.def, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			key, ok := c.key(req.Extra)
			if !ok {
				return s.errorResult(service.Errorf(service.Unauthenticated, "", "a valid API key is required")), nil
			}
			var raw json.RawMessage
			if req.Params != nil {
				raw = req.Params.Arguments
			}
			r, err := s.safeCall(ctx, t, c, key, raw)
			if err != nil {
				return s.errorResult(err), nil
			}
			return resultOf(r), nil
		})
	}
}

// safeCall calls t, turning a panic into an internal error: a bug in one
// tool must not take the server (and every session on it) down.
func (s *Server) safeCall(ctx context.Context, t tool, c *conn, key audit.Key, raw json.RawMessage) (r reply, err error) {
	defer func() {
		if p := recover(); p != nil {
			r, err = reply{}, service.InternalError(fmt.Errorf("panic in tool %s: %v\n%s", t.def.Name, p, debug.Stack()))
		}
	}()
	return t.call(ctx, s, c, key, raw)
}

// resultOf is a successful reply as a tool result: the summary first,
// then any extra content; the view as structured content.
func resultOf(r reply) *mcp.CallToolResult {
	content := []mcp.Content{&mcp.TextContent{Text: r.text}}
	content = append(content, r.extra...)
	return &mcp.CallToolResult{Content: content, StructuredContent: r.out}
}

// ToolError is the structured content of a refused tool call: the
// service's error kind as the API's code, the field to fix and the
// message naming it.
type ToolError struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
	// RetryAfter, when positive, is the seconds after which a retry may
	// succeed (quota_exceeded, unavailable).
	RetryAfter int `json:"retry_after,omitempty"`
}

// errorResult is a refused call as an MCP tool error (IsError), never a
// protocol error: the model reads the message and fixes its call. A
// command held for approval is not an error: it says so with the id.
func (s *Server) errorResult(err error) *mcp.CallToolResult {
	var e *service.Error
	switch {
	case errors.As(err, &e):
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		// The client cancelled the call or went away (service.RunExec
		// returns ctx's error; the command is not killed).
		e = service.Errorf(service.Conflict, "", "the call was cancelled before it finished; a command it started goes on in its sandbox until it ends or reaches its timeout")
	default:
		e = service.InternalError(err)
	}
	if e.Held != nil {
		return &mcp.CallToolResult{
			Content: []mcp.Content{&mcp.TextContent{Text: "Not run yet: " + e.Message +
				". A person decides; call get_approval with approval_id " + e.Held.ID + " to see whether it was decided."}},
			StructuredContent: map[string]any{"approval": e.Held},
		}
	}
	if e.Kind == service.Internal {
		s.log.Error("mcp: tool call failed", "err", err)
	}
	te := ToolError{Code: e.Kind.String(), Field: e.Field, Message: e.Message, RetryAfter: e.RetryAfter}
	text := te.Code + ": " + te.Message
	if te.RetryAfter > 0 {
		text += fmt.Sprintf(" (retry after %ds)", te.RetryAfter)
	}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}},
		StructuredContent: map[string]any{"error": te}}
}

// maxSummary bounds each stream's share of a summary: the whole output is
// in the structured result.
const maxSummary = 4000

// summarize is a result in a few lines a model reads first.
func summarize(what string, res *result.Result) string {
	if res == nil {
		return what + ": no result"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s, exit code %d, %.0f ms", what, res.Termination, res.ExitCode, res.DurationMS)
	if len(res.Violations) > 0 {
		fmt.Fprintf(&b, ", %d policy violation(s)", len(res.Violations))
	}
	for _, st := range []struct {
		name string
		s    result.Stream
	}{{"stdout", res.Stdout}, {"stderr", res.Stderr}} {
		switch {
		case st.s.Bytes == 0:
			continue
		case st.s.Encoding != "utf-8":
			fmt.Fprintf(&b, "\n%s: %d bytes of binary output (base64 in the structured result)", st.name, st.s.Bytes)
			continue
		}
		data := st.s.Data
		cut := ""
		if len(data) > maxSummary {
			data, cut = data[:maxSummary], "\n[… more in the structured result]"
		} else if st.s.Truncated {
			cut = fmt.Sprintf("\n[… truncated by the sandbox's output cap; %d bytes written]", st.s.Bytes)
		}
		fmt.Fprintf(&b, "\n%s:\n%s%s", st.name, data, cut)
	}
	if n := len(res.Files); n > 0 {
		names := make([]string, 0, min(n, 20))
		for _, f := range res.Files[:min(n, 20)] {
			names = append(names, string(f.Change)+" "+f.Path)
		}
		fmt.Fprintf(&b, "\nfiles: %s", strings.Join(names, ", "))
		if n > 20 {
			fmt.Fprintf(&b, " and %d more", n-20)
		}
	}
	return b.String()
}

func runCode(ctx context.Context, s *Server, _ *conn, key audit.Key, in *RunCodeArgs) (reply, error) {
	if in.Language == "" && in.Code == "" {
		return reply{}, service.InvalidField("code", "is missing: give code with language, e.g. {\"language\": \"python\", \"code\": \"print(1+1)\"}")
	}
	argv, e := service.Command(nil, in.Code, in.Language)
	if e != nil {
		return reply{}, e
	}
	m, e := service.ParseManifest(in.Manifest)
	if e != nil {
		return reply{}, e
	}
	fs, e := files(in.Files, s.cfg.MaxFiles, m)
	if e != nil {
		return reply{}, e
	}
	args := service.RunArgs{Manifest: m, Argv: argv, Files: fs}
	if in.Stdin != "" {
		args.Stdin = strings.NewReader(in.Stdin)
	}
	resp, err := s.svc.Run(ctx, key, args)
	if err != nil {
		return reply{}, err
	}
	return reply{out: resp, text: summarize("run "+resp.ID, resp.Result)}, nil
}

func createSandbox(ctx context.Context, s *Server, c *conn, key audit.Key, in *CreateSandboxArgs) (reply, error) {
	m, e := service.ParseManifest(in.Manifest)
	if e != nil {
		return reply{}, e
	}
	var ttl time.Duration
	if in.TTL != "" {
		if ttl, e = duration("ttl", in.TTL, s.svc.MaxTTL(), "the server's maximum (--max-ttl)"); e != nil {
			return reply{}, e
		}
	}
	fs, e := files(in.Files, s.cfg.MaxFiles, m)
	if e != nil {
		return reply{}, e
	}
	if e := service.CheckMetadata(in.Metadata); e != nil {
		return reply{}, e
	}
	if in.Snapshot != "" && in.Manifest == nil {
		m = nil // the snapshot's own manifest
	}
	sb, err := s.svc.CreateSandbox(ctx, key, service.SandboxArgs{Manifest: m, TTL: ttl, Files: fs, Metadata: in.Metadata, Snapshot: in.Snapshot})
	if err != nil {
		return reply{}, err
	}
	if !c.own(sb.ID) {
		// The stdio session ended while the sandbox was being created.
		s.destroyAll(key, []string{sb.ID})
		return reply{}, service.Errorf(service.Unavailable, "", "the session ended; the sandbox was destroyed")
	}
	return reply{out: sb, text: fmt.Sprintf("sandbox %s is %s (tier %s, image %s), expires at %s; pass sandbox_id %q to exec, write_file, read_file, list_files, download and kill_sandbox",
		sb.ID, sb.State, sb.Tier, sb.Image.Name, sb.ExpiresAt.Format(time.RFC3339), sb.ID)}, nil
}

func execTool(ctx context.Context, s *Server, _ *conn, key audit.Key, in *ExecArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	argv, e := service.Command(in.Argv, in.Code, in.Language)
	if e != nil {
		return reply{}, e
	}
	m, err := s.svc.SandboxManifest(ctx, key, in.SandboxID)
	if err != nil {
		return reply{}, err
	}
	args := service.ExecArgs{Argv: argv, Env: in.Env, Dir: in.Dir}
	if e := service.CheckExec(&args, m); e != nil {
		return reply{}, e
	}
	if in.Timeout != "" {
		if args.Timeout, e = duration("timeout", in.Timeout, m.Resources.Timeout.D(), "the sandbox's resources.timeout"); e != nil {
			return reply{}, e
		}
	}
	if in.Stdin != "" {
		args.Stdin = strings.NewReader(in.Stdin)
	}
	ex, err := s.svc.RunExec(ctx, key, in.SandboxID, args)
	if err != nil {
		return reply{}, err
	}
	return reply{out: ex, text: summarize("command "+ex.ID, ex.Result)}, nil
}

func writeFile(ctx context.Context, s *Server, _ *conn, key audit.Key, in *WriteFileArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	if e := service.CheckPath("path", in.Path); e != nil {
		return reply{}, e
	}
	mode, e := parseMode("mode", in.Mode)
	if e != nil {
		return reply{}, e
	}
	data, e := decodeText("content", "encoding", in.Content, in.Encoding)
	if e != nil {
		return reply{}, e
	}
	fi, err := s.svc.WriteFile(ctx, key, in.SandboxID, in.Path, bytes.NewReader(data), mode)
	if err != nil {
		return reply{}, err
	}
	return reply{out: fi, text: fmt.Sprintf("wrote %s (%d bytes, mode %s)", fi.Path, fi.Size, fi.Mode)}, nil
}

// FileContent is read_file's answer.
type FileContent struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Encoding is "utf-8" (Content is the text) or "base64".
	Encoding string `json:"encoding"`
	Content  string `json:"content"`
}

// readAll reads the regular file path of key's sandbox, at most
// MaxFileBytes of it (a bigger one is refused naming the limit).
func (s *Server) readAll(ctx context.Context, key audit.Key, id, p string) ([]byte, service.FileInfo, error) {
	if e := required("sandbox_id", id, sandboxHint); e != nil {
		return nil, service.FileInfo{}, e
	}
	if e := service.CheckPath("path", p); e != nil {
		return nil, service.FileInfo{}, e
	}
	f, fi, err := s.svc.OpenFile(ctx, key, id, p)
	if err != nil {
		return nil, fi, err
	}
	defer f.Close()
	max := s.cfg.MaxFileBytes
	if fi.Size > max {
		return nil, fi, service.Errorf(service.TooLarge, "path", "path: %s is %d bytes, more than the %d a tool result carries; read part of it with exec (e.g. head -c)", service.Quote(p), fi.Size, max)
	}
	// The file may grow between the stat and the read: read one byte
	// more than the limit to notice.
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fi, service.Classify(err, "file "+service.Quote(p))
	}
	if int64(len(data)) > max {
		return nil, fi, service.Errorf(service.TooLarge, "path", "path: %s is more than the %d bytes a tool result carries", service.Quote(p), max)
	}
	return data, fi, nil
}

func readFile(ctx context.Context, s *Server, _ *conn, key audit.Key, in *FileArgs) (reply, error) {
	data, fi, err := s.readAll(ctx, key, in.SandboxID, in.Path)
	if err != nil {
		return reply{}, err
	}
	content, enc := textOrBase64(data)
	out := FileContent{Path: fi.Path, Size: int64(len(data)), Encoding: enc, Content: content}
	text := content
	if enc != "utf-8" {
		text = fmt.Sprintf("%s: %d bytes of binary data (base64 in the structured result; download returns it as a resource)", fi.Path, len(data))
	}
	return reply{out: out, text: text}, nil
}

// Listing is list_files' answer.
type Listing struct {
	Path    string             `json:"path"`
	Entries []service.FileInfo `json:"entries"`
}

func listFiles(ctx context.Context, s *Server, _ *conn, key audit.Key, in *ListFilesArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	p := in.Path
	if p == "" {
		p = "."
	}
	entries, err := s.svc.ListDir(ctx, key, in.SandboxID, p)
	if err != nil {
		return reply{}, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d entries in %s", len(entries), p)
	for i, e := range entries {
		if i == 100 {
			fmt.Fprintf(&b, "\n… and %d more (all in the structured result)", len(entries)-100)
			break
		}
		fmt.Fprintf(&b, "\n%s %s %d", e.Type, e.Path, e.Size)
	}
	return reply{out: Listing{Path: p, Entries: entries}, text: b.String()}, nil
}

// Download is download's structured answer; the file itself is the
// embedded resource.
type Download struct {
	URI      string `json:"uri"`
	Path     string `json:"path"`
	Size     int64  `json:"size"`
	MIMEType string `json:"mime_type"`
}

func download(ctx context.Context, s *Server, _ *conn, key audit.Key, in *FileArgs) (reply, error) {
	data, fi, err := s.readAll(ctx, key, in.SandboxID, in.Path)
	if err != nil {
		return reply{}, err
	}
	rc := fileContents(fileURI(in.SandboxID, in.Path), in.Path, data)
	out := Download{URI: rc.URI, Path: fi.Path, Size: int64(len(data)), MIMEType: rc.MIMEType}
	return reply{out: out, text: fmt.Sprintf("%s (%s, %d bytes) as resource %s", fi.Path, rc.MIMEType, len(data), rc.URI),
		extra: []mcp.Content{&mcp.EmbeddedResource{Resource: rc}}}, nil
}

func killSandbox(ctx context.Context, s *Server, c *conn, key audit.Key, in *SandboxArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	sb, err := s.svc.DeleteSandbox(ctx, key, in.SandboxID)
	if err != nil {
		return reply{}, err
	}
	c.disown(sb.ID)
	return reply{out: sb, text: fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)}, nil
}

func getApproval(ctx context.Context, s *Server, _ *conn, key audit.Key, in *ApprovalArgs) (reply, error) {
	if e := required("approval_id", in.ApprovalID, "give the id (ap-...) a held command's answer gave"); e != nil {
		return reply{}, e
	}
	for _, a := range s.svc.ListApprovals(ctx, key) {
		if a.ID == in.ApprovalID {
			return reply{out: a, text: fmt.Sprintf("approval %s is %s until %s (argv %q)", a.ID, a.State, a.ExpiresAt.Format(time.RFC3339), a.Argv)}, nil
		}
	}
	return reply{}, service.Errorf(service.NotFound, "approval_id", "approval_id: %s is not pending: it was approved (the command ran), denied, expired, or is not this key's", service.Quote(in.ApprovalID))
}

func runCell(ctx context.Context, s *Server, _ *conn, key audit.Key, in *RunCellArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	if e := required("code", in.Code, "give the Python code of the cell, e.g. \"x = 1\\nx + 1\""); e != nil {
		return reply{}, e
	}
	args := service.CellArgs{Code: in.Code, Context: in.Context}
	if in.Timeout != "" {
		m, err := s.svc.SandboxManifest(ctx, key, in.SandboxID)
		if err != nil {
			return reply{}, err
		}
		var e *service.Error
		if args.Timeout, e = duration("timeout", in.Timeout, m.Resources.Timeout.D(), "the sandbox's resources.timeout"); e != nil {
			return reply{}, e
		}
	}
	c, err := s.svc.RunCell(ctx, key, in.SandboxID, args)
	if err != nil {
		return reply{}, err
	}
	text, images := cellSummary(c)
	return reply{out: c, text: text, extra: images}, nil
}

// cellSummary is a cell in a few lines a model reads first, and its
// images (charts) as MCP image content.
func cellSummary(c service.Cell) (string, []mcp.Content) {
	var b strings.Builder
	fmt.Fprintf(&b, "cell %s: %s", c.ID, c.Status)
	if c.KernelStarted {
		b.WriteString(" (a fresh kernel: earlier variables are gone)")
	}
	var images []mcp.Content
	for _, o := range c.Outputs {
		switch o.Type {
		case "stdout", "stderr":
			fmt.Fprintf(&b, "\n%s: %s", o.Type, cut(o.Text))
		case "result", "display":
			if png := o.Data["image/png"]; png != "" {
				if data, err := base64.StdEncoding.DecodeString(png); err == nil {
					images = append(images, &mcp.ImageContent{Data: data, MIMEType: "image/png"})
					fmt.Fprintf(&b, "\n%s: an image/png (%d bytes), attached", o.Type, len(data))
					continue
				}
			}
			if t := o.Data["text/plain"]; t != "" {
				fmt.Fprintf(&b, "\n%s: %s", o.Type, cut(t))
			}
		case "error":
			if o.Error != nil {
				fmt.Fprintf(&b, "\nerror: %s: %s\n%s", o.Error.Name, o.Error.Value, cut(strings.Join(o.Error.Traceback, "\n")))
			}
		}
	}
	if c.Truncated {
		b.WriteString("\n[… outputs past the cell's caps were dropped]")
	}
	return b.String(), images
}

// cut bounds one piece of a summary: the whole is in the structured result.
func cut(s string) string {
	if len(s) > maxSummary {
		return s[:maxSummary] + "\n[… more in the structured result]"
	}
	return s
}

func snapshotSandbox(ctx context.Context, s *Server, _ *conn, key audit.Key, in *SnapshotArgs) (reply, error) {
	if e := required("sandbox_id", in.SandboxID, sandboxHint); e != nil {
		return reply{}, e
	}
	sn, err := s.svc.CreateSnapshot(ctx, key, in.SandboxID, in.Name)
	if err != nil {
		return reply{}, err
	}
	return reply{out: sn, text: fmt.Sprintf("snapshot %s of sandbox %s: %d files, %d bytes, kept until %s; create_sandbox with snapshot %q starts from it",
		sn.ID, sn.SandboxID, sn.Files, sn.Bytes, sn.ExpiresAt.Format(time.RFC3339), sn.ID)}, nil
}

// SnapshotList is list_snapshots' answer.
type SnapshotList struct {
	Snapshots []service.Snapshot `json:"snapshots"`
}

func listSnapshots(ctx context.Context, s *Server, _ *conn, key audit.Key, in *ListSnapshotsArgs) (reply, error) {
	list, err := s.svc.ListSnapshots(ctx, key, in.SandboxID, in.Name)
	if err != nil {
		return reply{}, err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d snapshots", len(list))
	for _, sn := range list {
		fmt.Fprintf(&b, "\n%s %v of %s: %d files, until %s", sn.ID, sn.Names, sn.SandboxID, sn.Files, sn.ExpiresAt.Format(time.RFC3339))
	}
	return reply{out: SnapshotList{Snapshots: list}, text: b.String()}, nil
}

func deleteSnapshot(ctx context.Context, s *Server, _ *conn, key audit.Key, in *SnapshotRefArgs) (reply, error) {
	if e := required("snapshot", in.Snapshot, "give the id or name list_snapshots shows"); e != nil {
		return reply{}, e
	}
	if err := s.svc.DeleteSnapshot(ctx, key, in.Snapshot); err != nil {
		return reply{}, err
	}
	return reply{out: map[string]any{"deleted": in.Snapshot}, text: "snapshot " + in.Snapshot + " deleted"}, nil
}
