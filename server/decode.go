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
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

// Request decoding. Everything here reads untrusted bytes: it must never
// panic (the fuzz tests check), must answer every refusal with a 4xx *Error
// naming the field, and must have refused a request completely before any
// sandbox is touched.

const (
	// maxPathLen and maxNameLen bound a workspace path and each of its
	// components (NAME_MAX).
	maxPathLen = 1024
	maxNameLen = 255
	// maxJSONDepth bounds nesting; the deepest legitimate value (a
	// manifest's network.allow list) is four levels down.
	maxJSONDepth = 32
	// maxMetadata bounds a sandbox's metadata: it is labels, not storage.
	maxMetadata         = 64
	maxMetadataKeyLen   = 128
	maxMetadataValueLen = 1024
	maxEnv              = 1024
)

// checkJSON walks data against the shape of the Go type t, refusing unknown
// keys, repeated keys and values of the wrong type with the path of the
// field ("files[2].mode"). encoding/json alone matches keys
// case-insensitively, lets a repeated key win silently and names neither
// the index nor an unknown nested key. Values of types that decode
// themselves (json.RawMessage: the manifest, which manifest.Parse checks)
// are only checked to be well-formed.
func checkJSON(data []byte, t reflect.Type) *Error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	w := walker{dec: dec}
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(err)
	}
	if e := w.value(tok, t, "", 0); e != nil {
		return e
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return badRequest("", "malformed JSON: unexpected data after the top-level object")
	}
	return nil
}

func syntaxError(err error) *Error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return badRequest("", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

type walker struct {
	dec *json.Decoder
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

func (w *walker) next() (json.Token, *Error) {
	tok, err := w.dec.Token()
	if err != nil {
		return nil, syntaxError(err)
	}
	return tok, nil
}

func (w *walker) value(tok json.Token, t reflect.Type, path string, depth int) *Error {
	if depth > maxJSONDepth {
		return badRequest(path, "malformed JSON: nested more than %d levels deep", maxJSONDepth)
	}
	if tok == nil {
		return nil // null leaves the zero value: "not given"
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return w.skip(tok, path, depth)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return w.value(tok, t.Elem(), path, depth)
	case reflect.Struct:
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return typeError(tok, path, "an object")
		}
		fields, names := jsonFields(t)
		seen := map[string]bool{}
		for w.dec.More() {
			k, e := w.next()
			if e != nil {
				return e
			}
			key := k.(string) // object keys are strings, or Token failed
			field := joinField(path, key)
			if seen[key] {
				return badRequest(field, "%s is given twice; give each key once", field)
			}
			seen[key] = true
			ft, ok := fields[key]
			if !ok {
				where := "at the top level"
				if path != "" {
					where = "in " + path
				}
				return badRequest(field, "unknown field %s; accepted %s: %s", field, where, strings.Join(names, ", "))
			}
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, ft, field, depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.Map:
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return typeError(tok, path, "an object of names to strings")
		}
		seen := map[string]bool{}
		for w.dec.More() {
			k, e := w.next()
			if e != nil {
				return e
			}
			key := k.(string)
			field := joinField(path, key)
			if seen[key] {
				return badRequest(field, "%s is given twice; give each key once", field)
			}
			seen[key] = true
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, t.Elem(), field, depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.Slice:
		if d, ok := tok.(json.Delim); !ok || d != '[' {
			return typeError(tok, path, "a list")
		}
		for i := 0; w.dec.More(); i++ {
			v, e := w.next()
			if e != nil {
				return e
			}
			if e := w.value(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), depth+1); e != nil {
				return e
			}
		}
		_, e := w.next()
		return e
	case reflect.String:
		if _, ok := tok.(string); !ok {
			return typeError(tok, path, "a string")
		}
	case reflect.Bool:
		if _, ok := tok.(bool); !ok {
			return typeError(tok, path, "true or false")
		}
	default:
		// Only reachable when a wire type gains a field of a kind this
		// walker does not know; the wire-type test catches that.
		return internal(fmt.Errorf("checkJSON: no rule for %s at %s", t, path))
	}
	return nil
}

// skip consumes the rest of a value that decodes itself.
func (w *walker) skip(tok json.Token, path string, depth int) *Error {
	d, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	if d != '{' && d != '[' {
		return badRequest(path, "malformed JSON: unexpected %q", rune(d))
	}
	for level := 1; level > 0; {
		if depth+level > maxJSONDepth {
			return badRequest(path, "malformed JSON: nested more than %d levels deep", maxJSONDepth)
		}
		t, e := w.next()
		if e != nil {
			return e
		}
		if d, ok := t.(json.Delim); ok {
			if d == '{' || d == '[' {
				level++
			} else {
				level--
			}
		}
	}
	return nil
}

func typeError(tok json.Token, path, want string) *Error {
	var got string
	switch t := tok.(type) {
	case json.Delim:
		got = map[json.Delim]string{'{': "an object", '[': "a list"}[t]
	case string:
		got = "a string"
	case json.Number:
		got = "a number"
	case bool:
		got = "a boolean"
	}
	return invalid(path, "is %s; expected %s", got, want)
}

// jsonFields maps the JSON names of t's fields to their types.
func jsonFields(t reflect.Type) (map[string]reflect.Type, []string) {
	fields := map[string]reflect.Type{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	slices.Sort(names)
	return fields, names
}

// joinField appends a key to a field path; a key that is not a plain name
// is quoted and shortened, so a hostile key cannot forge an error message.
func joinField(path, key string) string {
	if !plainKey(key) {
		if len(key) > 40 {
			key = strings.ToValidUTF8(key[:40], "") + "..."
		}
		key = strconv.Quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

func plainKey(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c == '-' || c == '.' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// decodeStrict checks data against v's type with checkJSON, then decodes it.
func decodeStrict(data []byte, v any) *Error {
	if e := checkJSON(data, reflect.TypeOf(v).Elem()); e != nil {
		return e
	}
	if err := json.Unmarshal(data, v); err != nil {
		// checkJSON accepted the shape; what is left is e.g. a number
		// out of range.
		return badRequest("", "malformed JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// quote shows a client's value in a message: quoted, escaped, short.
func quote(s string) string {
	if len(s) > 80 {
		s = strings.ToValidUTF8(s[:80], "") + "..."
	}
	return strconv.Quote(s)
}

// checkPath refuses a workspace path that could name anything outside
// /workspace or that different layers could read differently: it must be
// relative, valid UTF-8 without NUL or control characters, without empty,
// "." or ".." components, and of bounded length. The engine resolves it
// again beneath the workspace without following links; this check is so
// that a bad path is refused before anything is created.
func checkPath(field, p string) *Error {
	switch {
	case p == "":
		return invalid(field, "is empty; give a path relative to /workspace such as \"main.py\"")
	case len(p) > maxPathLen:
		return invalid(field, "is %d bytes long; at most %d are accepted", len(p), maxPathLen)
	case !utf8.ValidString(p):
		return invalid(field, "%s is not valid UTF-8", quote(p))
	case strings.IndexByte(p, 0) >= 0:
		return invalid(field, "%s contains a NUL byte", quote(p))
	case strings.HasPrefix(p, "/"):
		return invalid(field, "%s is absolute; give a path relative to /workspace such as \"main.py\"", quote(p))
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return invalid(field, "%s contains a control character", quote(p))
		}
	}
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "":
			return invalid(field, "%s has an empty component (a doubled or trailing /)", quote(p))
		case c == "." || c == "..":
			return invalid(field, "%s contains %q; paths stay inside /workspace and are written without . or ..", quote(p), c)
		case len(c) > maxNameLen:
			return invalid(field, "%s has a component of %d bytes; at most %d are accepted", quote(p), len(c), maxNameLen)
		}
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

func engineFiles(files []upload) []engine.File {
	out := make([]engine.File, len(files))
	for i, f := range files {
		out[i] = engine.File{Path: f.path, Mode: f.mode, Data: bytes.NewReader(f.data)}
	}
	return out
}

// decodeManifest parses the request's manifest object with the manifest
// package's own strict parser, so its errors keep their field names
// (prefixed "manifest."). Absent or null is the default manifest. Host
// inputs are refused: an API caller must not name the server's files.
func decodeManifest(raw json.RawMessage) (*manifest.Manifest, *Error) {
	if len(raw) == 0 || string(raw) == "null" {
		return manifest.Default(), nil
	}
	// Inputs are refused before parsing, so that the answer is about the
	// grant, not about a detail of the host path.
	var peek struct {
		Inputs []json.RawMessage `json:"inputs"`
	}
	if json.Unmarshal(raw, &peek) == nil && len(peek.Inputs) > 0 {
		return nil, refusedInputs()
	}
	m, err := manifest.Parse(raw, "request.json")
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		return nil, manifestError(err)
	}
	if len(m.Inputs) > 0 {
		return nil, refusedInputs()
	}
	return m, nil
}

func refusedInputs() *Error {
	return invalid("manifest.inputs", "host paths cannot be granted through the API; upload the files with \"files\" instead")
}

// manifestError turns Parse's errors (the file name, then *FieldError
// values joined with errors.Join) into one invalid_field error naming the
// first field and listing every problem.
func manifestError(err error) *Error {
	inner := err
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "request.json: ") {
		inner = u
	}
	parts := []error{inner}
	if j, ok := inner.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	field := ""
	msgs := make([]string, 0, len(parts))
	for _, p := range parts {
		var fe *manifest.FieldError
		if !errors.As(p, &fe) {
			msgs = append(msgs, "manifest: "+strings.TrimPrefix(p.Error(), "request.json: "))
			continue
		}
		f := *fe
		f.Field = manifestField(fe.Field)
		if f.Field == "" {
			f.Field = "manifest"
		}
		if field == "" {
			field = f.Field
		}
		msgs = append(msgs, f.Error())
	}
	if field == "" {
		field = "manifest"
	}
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: field, Message: strings.Join(msgs, "; "), Err: err}
}

// command turns argv, or code with language, into the program's argv.
func command(argv []string, code, language string) ([]string, *Error) {
	switch {
	case len(argv) > 0 && (code != "" || language != ""):
		return nil, invalid("code", "give either argv, or code with language; not both")
	case len(argv) > 0:
		for i, a := range argv {
			if strings.IndexByte(a, 0) >= 0 {
				return nil, invalid(fmt.Sprintf("argv[%d]", i), "contains a NUL byte, which no program can receive")
			}
		}
		if argv[0] == "" {
			return nil, invalid("argv[0]", "is empty; it names the program, e.g. \"python3\"")
		}
		return argv, nil
	case code == "" && language == "":
		return nil, invalid("argv", "is missing: give argv, e.g. [\"python3\", \"main.py\"], or code with language")
	case code == "":
		return nil, invalid("code", "is missing: language %s needs code to run", quote(language))
	case strings.IndexByte(code, 0) >= 0:
		return nil, invalid("code", "contains a NUL byte, which no program can receive")
	}
	switch language {
	case "python":
		return []string{"python3", "-c", code}, nil
	case "bash", "sh":
		return []string{language, "-c", code}, nil
	case "":
		return nil, invalid("language", "is missing; accepted with code: python, bash, sh")
	}
	return nil, invalid("language", "%s is not supported; accepted: python, bash, sh (or give argv)", quote(language))
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
	argv, e := command(req.Argv, req.Code, req.Language)
	if e != nil {
		return nil, e
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
	if len(req.Metadata) > maxMetadata {
		return nil, invalid("metadata", "has %d entries; at most %d are accepted", len(req.Metadata), maxMetadata)
	}
	md := make(map[string]string, len(req.Metadata))
	for k, v := range req.Metadata {
		field := joinField("metadata", k)
		switch {
		case k == "" || len(k) > maxMetadataKeyLen || !utf8.ValidString(k):
			return nil, invalid(field, "is not a key of 1 to %d bytes of UTF-8", maxMetadataKeyLen)
		case len(v) > maxMetadataValueLen:
			return nil, invalid(field, "is %d bytes long; at most %d are accepted", len(v), maxMetadataValueLen)
		}
		md[k] = v
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
	spec := &execSpec{argv: argv, wait: req.Wait == nil || *req.Wait, stdinOpen: req.StdinOpen}
	if len(req.Env) > maxEnv {
		return nil, invalid("env", "has %d variables; at most %d are accepted", len(req.Env), maxEnv)
	}
	for k, v := range req.Env {
		field := joinField("env", k)
		if !envName(k) {
			return nil, invalid(field, "%s is not a variable name (letters, digits and _, not starting with a digit)", quote(k))
		}
		if strings.IndexByte(v, 0) >= 0 {
			return nil, invalid(field, "contains a NUL byte")
		}
	}
	spec.env = req.Env
	if req.Dir != "" {
		switch {
		case !strings.HasPrefix(req.Dir, "/"):
			return nil, invalid("dir", "%s is not absolute; give a directory such as \"/workspace/src\"", quote(req.Dir))
		case len(req.Dir) > maxPathLen || strings.IndexByte(req.Dir, 0) >= 0 || !utf8.ValidString(req.Dir):
			return nil, invalid("dir", "%s is not a usable directory", quote(req.Dir))
		}
		spec.dir = req.Dir
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

func envName(s string) bool {
	if s == "" || len(s) > 256 || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
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
