package server

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// Request decoding. Everything here reads untrusted bytes: it must never
// panic (the fuzz tests check), must answer every refusal with a 4xx *Error
// naming the field, and must have refused a request completely before any
// sandbox is touched.

// decodeStrict checks data against v's type (strictjson.Decode: unknown or
// repeated keys and values of the wrong type are refused with the path of
// the field, such as "files[2].mode"), then decodes it.
func decodeStrict(data []byte, v any) *Error {
	return jsonError(strictjson.Decode(data, v))
}

// jsonError is strictjson's refusal as the API answers it: a value of the
// wrong type is an invalid field, the rest a bad request.
func jsonError(e *strictjson.Error) *Error {
	switch {
	case e == nil:
		return nil
	case e.Kind == strictjson.WrongType:
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: e.Field, Message: e.Message}
	case e.Kind == strictjson.Unsupported:
		return internal(e)
	}
	return badRequest(e.Field, "%s", e.Message)
}

// quote shows a client's value in a message: quoted, escaped, short.
func quote(s string) string { return service.Quote(s) }

// checkPath refuses a workspace path that could name anything outside
// /workspace (service.CheckPath).
func checkPath(field, p string) *Error {
	if e := service.CheckPath(field, p); e != nil {
		return httpError(e)
	}
	return nil
}

// parseMode reads an octal permission ("0755", "644"); "" is 0644.
// Setuid, setgid and sticky bits are refused: nothing the API uploads
// should gain privileges.
func parseMode(field, s string) (fs.FileMode, *Error) {
	if s == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v > 0o777 || len(s) > 4 {
		return 0, invalid(field, "%s is not an octal permission between \"0000\" and \"0777\" such as \"0644\"", quote(s))
	}
	return fs.FileMode(v), nil
}

// decodeText decodes a content or stdin value by its encoding field.
func decodeText(field, encField, s, enc string) ([]byte, *Error) {
	switch enc {
	case "", "utf-8":
		return []byte(s), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, invalid(field, "is not valid standard base64: %v", err)
		}
		return b, nil
	}
	return nil, invalid(encField, "%s is not an encoding; accepted: utf-8, base64", quote(enc))
}

// upload is one decoded file.
type upload struct {
	field string // where it came from, for errors
	path  string
	mode  fs.FileMode
	data  []byte
}

func decodeFiles(files []FileUpload) ([]upload, *Error) {
	out := make([]upload, 0, len(files))
	for i, f := range files {
		field := fmt.Sprintf("files[%d]", i)
		if e := checkPath(field+".path", f.Path); e != nil {
			return nil, e
		}
		mode, e := parseMode(field+".mode", f.Mode)
		if e != nil {
			return nil, e
		}
		data, e := decodeText(field+".content", field+".encoding", f.Content, f.Encoding)
		if e != nil {
			return nil, e
		}
		out = append(out, upload{field: field + ".path", path: f.Path, mode: mode, data: data})
	}
	return out, nil
}

// checkUploads refuses too many files, two files at one path, a file below
// another file, and more bytes than the workspace holds.
func checkUploads(files []upload, maxFiles int, m *manifest.Manifest) *Error {
	if len(files) > maxFiles {
		return tooLarge("files", "%d files is more than the %d one request may upload (--max-files)", len(files), maxFiles)
	}
	paths := make(map[string]bool, len(files))
	var total int64
	for _, f := range files {
		if paths[f.path] {
			return invalid(f.field, "%s is given twice", quote(f.path))
		}
		paths[f.path] = true
		total += int64(len(f.data))
	}
	for _, f := range files {
		for dir := f.path; ; {
			i := strings.LastIndexByte(dir, '/')
			if i < 0 {
				break
			}
			dir = dir[:i]
			if paths[dir] {
				return invalid(f.field, "%s is below %s, which is uploaded as a file", quote(f.path), quote(dir))
			}
		}
	}
	if ws := int64(m.Workspace.Size); total > ws {
		return tooLarge("files", "the files hold %d bytes, more than the workspace's %d (raise manifest.workspace.size)", total, ws)
	}
	return nil
}

func engineFiles(files []upload) []service.File {
	out := make([]service.File, len(files))
	for i, f := range files {
		out[i] = service.File{Path: f.path, Mode: f.mode, Data: bytes.NewReader(f.data)}
	}
	return out
}

// decodeManifest parses the request's manifest object
// (service.ParseManifest): strictly, with its errors naming fields inside
// "manifest", and refusing host inputs.
func decodeManifest(raw json.RawMessage) (*manifest.Manifest, *Error) {
	m, e := service.ParseManifest(raw)
	if e != nil {
		return nil, httpError(e)
	}
	return m, nil
}

// command turns argv, or code with language, into the program's argv
// (service.Command: one rule for every front door).
func command(argv []string, code, language string) ([]string, *Error) {
	out, e := service.Command(argv, code, language)
	if e != nil {
		return nil, httpError(e)
	}
	return out, nil
}

// runSpec is a decoded, validated POST /v1/runs.
type runSpec struct {
	manifest *manifest.Manifest
	argv     []string
	files    []upload
	stdin    []byte
}

// decodeRun decodes and validates the JSON form of POST /v1/runs, with
// extra files from a multipart body.
func decodeRun(data []byte, extra []upload, maxFiles int) (*runSpec, *Error) {
	var req RunRequest
	if e := decodeStrict(data, &req); e != nil {
		return nil, e
	}
	m, e := decodeManifest(req.Manifest)
	if e != nil {
		return nil, e
	}
	// Neither argv nor code: the image config's Entrypoint and Cmd run
	// (service.Run), as `moat run IMAGE` with no command.
	var argv []string
	if req.Argv != nil || req.Code != "" || req.Language != "" {
		var e *Error
		if argv, e = command(req.Argv, req.Code, req.Language); e != nil {
			return nil, e
		}
	}
	if len(req.Files)+len(extra) > maxFiles {
		return nil, tooLarge("files", "%d files is more than the %d one request may upload (--max-files)", len(req.Files)+len(extra), maxFiles)
	}
	files, e := decodeFiles(req.Files)
	if e != nil {
		return nil, e
	}
	files = append(files, extra...)
	if e := checkUploads(files, maxFiles, m); e != nil {
		return nil, e
	}
	stdin, e := decodeText("stdin", "stdin_encoding", req.Stdin, req.StdinEncoding)
	if e != nil {
		return nil, e
	}
	return &runSpec{manifest: m, argv: argv, files: files, stdin: stdin}, nil
}

// sandboxSpec is a decoded, validated POST /v1/sandboxes.
type sandboxSpec struct {
	manifest *manifest.Manifest
	ttl      time.Duration
	files    []upload
	metadata map[string]string
}

func decodeSandbox(data []byte, maxFiles int, defaultTTL, maxTTL time.Duration) (*sandboxSpec, *Error) {
	var req SandboxRequest
	if e := decodeStrict(data, &req); e != nil {
		return nil, e
	}
	m, e := decodeManifest(req.Manifest)
	if e != nil {
		return nil, e
	}
	ttl := defaultTTL
	if req.TTL != "" {
		if ttl, e = parseTTL(req.TTL, maxTTL); e != nil {
			return nil, e
		}
	}
	if len(req.Files) > maxFiles {
		return nil, tooLarge("files", "%d files is more than the %d one request may upload (--max-files)", len(req.Files), maxFiles)
	}
	files, e := decodeFiles(req.Files)
	if e != nil {
		return nil, e
	}
	if e := checkUploads(files, maxFiles, m); e != nil {
		return nil, e
	}
	md := make(map[string]string, len(req.Metadata))
	for k, v := range req.Metadata {
		md[k] = v
	}
	if e := service.CheckMetadata(md); e != nil {
		return nil, httpError(e)
	}
	return &sandboxSpec{manifest: m, ttl: ttl, files: files, metadata: md}, nil
}

func parseTTL(s string, maxTTL time.Duration) (time.Duration, *Error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		return 0, invalid("ttl", "%s is not a duration such as \"10m\" or \"1h30m\"", quote(s))
	case d <= 0:
		return 0, invalid("ttl", "%s is not positive", quote(s))
	case d > maxTTL:
		return 0, invalid("ttl", "%s is above the maximum %s (--max-ttl)", quote(s), maxTTL)
	}
	return d, nil
}

// execSpec is a decoded, validated POST …/execs.
type execSpec struct {
	argv      []string
	env       map[string]string
	dir       string
	timeout   time.Duration
	stdin     []byte
	stdinOpen bool
	tty       *service.TTYSize
	wait      bool
}

// decodeExec decodes an exec request for a sandbox whose manifest is m.
func decodeExec(data []byte, m *manifest.Manifest) (*execSpec, *Error) {
	var req ExecRequest
	if e := decodeStrict(data, &req); e != nil {
		return nil, e
	}
	argv, e := command(req.Argv, req.Code, req.Language)
	if e != nil {
		return nil, e
	}
	spec := &execSpec{argv: argv, wait: req.Wait == nil || *req.Wait, stdinOpen: req.StdinOpen, env: req.Env, dir: req.Dir, tty: req.TTY}
	// The environment, the directory and the terminal are the service's
	// rules: the E2B layer's commands are held to the same.
	if e := service.CheckExec(&service.ExecArgs{Argv: argv, Env: req.Env, Dir: req.Dir, TTY: req.TTY}, m); e != nil {
		return nil, httpError(e)
	}
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		limit := m.Resources.Timeout.D()
		switch {
		case err != nil:
			return nil, invalid("timeout", "%s is not a duration such as \"30s\"", quote(req.Timeout))
		case d <= 0:
			return nil, invalid("timeout", "%s is not positive", quote(req.Timeout))
		case d > limit:
			return nil, invalid("timeout", "%s is above the sandbox's resources.timeout %s", quote(req.Timeout), limit)
		}
		spec.timeout = d
	}
	if req.StdinOpen && (req.Stdin != "" || req.StdinEncoding != "") {
		return nil, invalid("stdin", "cannot be combined with stdin_open; send the input with POST …/stdin instead")
	}
	if spec.stdin, e = decodeText("stdin", "stdin_encoding", req.Stdin, req.StdinEncoding); e != nil {
		return nil, e
	}
	return spec, nil
}

// readBody reads a request body of at most limit bytes.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, *Error) {
	if e := checkLength(r, limit); e != nil {
		return nil, e
	}
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		return nil, bodyError(err, limit)
	}
	return data, nil
}

// checkLength refuses a body whose Content-Length is over limit before a
// byte of it is read: a client that sent "Expect: 100-continue" then gets
// the 413 without sending the body at all.
func checkLength(r *http.Request, limit int64) *Error {
	if r.ContentLength > limit {
		return tooLarge("", "the request body is %d bytes, over the %d-byte limit (--max-body)", r.ContentLength, limit)
	}
	return nil
}

func bodyError(err error, limit int64) *Error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge("", "the request body is over the %d-byte limit (--max-body)", limit)
	}
	return badRequest("", "reading the request body: %v", err)
}

// requireJSON refuses a body that says it is something other than JSON.
// An absent Content-Type is taken as JSON.
func requireJSON(r *http.Request) *Error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return badRequest("", "Content-Type %s: send application/json", quote(ct))
	}
	return nil
}

// readJSON reads and strictly decodes a JSON body into v.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) *Error {
	if e := requireJSON(r); e != nil {
		return e
	}
	data, e := readBody(w, r, limit)
	if e != nil {
		return e
	}
	return decodeStrict(data, v)
}

// readRun reads POST /v1/runs as JSON or multipart/form-data: a part named
// "request" with the JSON, and one part per file whose filename is the
// workspace path.
func readRun(w http.ResponseWriter, r *http.Request, limit int64, maxFiles int) (*runSpec, *Error) {
	ct := r.Header.Get("Content-Type")
	mt, params, err := mime.ParseMediaType(ct)
	if ct == "" || err == nil && mt == "application/json" {
		data, e := readBody(w, r, limit)
		if e != nil {
			return nil, e
		}
		return decodeRun(data, nil, maxFiles)
	}
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return nil, badRequest("", "Content-Type %s: send application/json or multipart/form-data", quote(ct))
	}
	if e := checkLength(r, limit); e != nil {
		return nil, e
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	return decodeMultipartRun(multipart.NewReader(body, params["boundary"]), limit, maxFiles)
}

func decodeMultipartRun(mr *multipart.Reader, limit int64, maxFiles int) (*runSpec, *Error) {
	var reqJSON []byte
	var files []upload
	for i := 0; ; i++ {
		// NextRawPart: a file is bytes, not something to
		// quoted-printable-decode.
		p, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bodyError(err, limit)
		}
		field := fmt.Sprintf("parts[%d]", i)
		// Not p.FileName(): it returns the base name, which would turn
		// "../../etc/passwd" into an innocent "passwd" and "src/a.py"
		// into "a.py". The raw parameter is checked like any path.
		_, disp, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		if err != nil {
			return nil, badRequest(field, "part %d has no usable Content-Disposition: %v", i, err)
		}
		name := disp["name"]
		filename, hasFile := disp["filename"]
		data, err := io.ReadAll(io.LimitReader(p, limit+1))
		if err != nil {
			return nil, bodyError(err, limit)
		}
		switch {
		case name == "request" && !hasFile:
			if reqJSON != nil {
				return nil, badRequest(field, "the request part is given twice")
			}
			reqJSON = data
		case hasFile:
			if len(files) >= maxFiles {
				return nil, tooLarge("files", "more files than the %d one request may upload (--max-files)", maxFiles)
			}
			if e := checkPath(field+".filename", filename); e != nil {
				return nil, e
			}
			files = append(files, upload{field: field + ".filename", path: filename, mode: 0o644, data: data})
		default:
			return nil, badRequest(field, "unexpected part %s: send a part named \"request\" with the JSON and one part per file with its path as filename", quote(name))
		}
	}
	if reqJSON == nil {
		reqJSON = []byte("{}")
	}
	return decodeRun(reqJSON, files, maxFiles)
}
