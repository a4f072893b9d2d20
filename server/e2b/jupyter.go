package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// The code interpreter: @e2b/code-interpreter's Sandbox (runCode,
// createCodeContext, listCodeContexts, restartCodeContext,
// removeCodeContext) talks to a Jupyter-backed server E2B runs on port
// 49999 of its code-interpreter sandboxes: POST /execute answers with
// NDJSON lines (stdout, stderr, result, error, number_of_executions,
// end_of_execution), /contexts makes, lists, restarts and removes
// contexts. Moat serves that protocol on the host side, as it serves
// envd, by the service's kernel (RunCell's cells, its contexts): nothing
// listens on 49999 inside the sandbox, and a program there is not
// reachable through getHost(49999). The requests reach it as any port's
// (ports.go): "49999-<id>.<domain>" or E2b-Sandbox-Port: 49999, with the
// sandbox's traffic access token or its envd access token.

// JupyterPort is the code interpreter's port in E2B's addressing.
const JupyterPort = "49999"

// jupyterCwd is the only working directory a context may ask for: E2B's
// default, the home that Moat's workspace stands in for (envd.go).
const jupyterCwd = home

// mimeFields are the Result fields of the SDKs for a MIME type of a
// kernel's bundle; other types keep their MIME name (the SDKs' extra).
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
}

// jupyterContext is a context as the SDKs read it.
type jupyterContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// executeRequest is POST /execute's body.
type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// contextRequest is POST /contexts' body.
type contextRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// jupyterError answers as E2B's code interpreter server does: plain text,
// which the SDKs show as the message of a 404 (NotFoundError) and a 502.
func jupyterError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	fmt.Fprintf(w, format, args...)
}

// jupyterServiceError answers a service error with its Kind's status and
// its message.
func (h *Handler) jupyterServiceError(w http.ResponseWriter, err error) {
	e := h.fromService(err)
	jupyterError(w, e.Code, "%s", e.Message)
}

// checkLanguage refuses a language the kernel does not run, naming it.
// The answer is a 404, the one status whose text the SDKs show: there is
// no kernel for that language here.
func checkLanguage(lang string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(lang)) {
	case "", "python", "python3":
		return "", true
	}
	return fmt.Sprintf("language %s has no kernel in Moat's code interpreter: it runs python only (leave language out, or pass \"python\"; run other languages as commands, sandbox.commands.run)", strconv.Quote(truncate(lang, 64))), false
}

// serveJupyter serves one request of the code interpreter for sandbox b,
// whose token checked, as key.
func (h *Handler) serveJupyter(w http.ResponseWriter, r *http.Request, key audit.Key, b *box) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == "/health":
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`"OK"`))
	case path == "/execute":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			jupyterError(w, http.StatusMethodNotAllowed, "%s is not allowed on /execute: POST the code", r.Method)
			return
		}
		h.jupyterExecute(w, r, key, b)
	case path == "/contexts":
		switch r.Method {
		case http.MethodGet:
			h.jupyterListContexts(w, r, key, b)
		case http.MethodPost:
			h.jupyterCreateContext(w, r, key, b)
		default:
			w.Header().Set("Allow", "GET, POST")
			jupyterError(w, http.StatusMethodNotAllowed, "%s is not allowed on /contexts: GET lists them, POST makes one", r.Method)
		}
	case strings.HasPrefix(path, "/contexts/"):
		rest := strings.TrimPrefix(path, "/contexts/")
		id, action, _ := strings.Cut(rest, "/")
		switch {
		case id == "" || strings.Contains(action, "/"):
			jupyterError(w, http.StatusNotFound, "%s is not a path of the code interpreter: /contexts/{id} (DELETE) or /contexts/{id}/restart (POST)", strconv.Quote(truncate(r.URL.Path, 128)))
		case action == "" && r.Method == http.MethodDelete:
			if err := h.svc.DeleteContext(r.Context(), key, b.id, id); err != nil {
				h.jupyterServiceError(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case action == "restart" && r.Method == http.MethodPost:
			if _, err := h.svc.RestartKernel(r.Context(), key, b.id, id); err != nil {
				h.jupyterServiceError(w, err)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case action == "" || action == "restart":
			jupyterError(w, http.StatusMethodNotAllowed, "%s is not allowed on %s: DELETE /contexts/{id} removes a context, POST /contexts/{id}/restart restarts it", r.Method, strconv.Quote(truncate(r.URL.Path, 128)))
		default:
			jupyterError(w, http.StatusNotFound, "%s is not a path of the code interpreter: /contexts/{id} (DELETE) or /contexts/{id}/restart (POST)", strconv.Quote(truncate(r.URL.Path, 128)))
		}
	default:
		jupyterError(w, http.StatusNotFound, "%s is not a path of the code interpreter (port %s): it serves /execute and /contexts", strconv.Quote(truncate(r.URL.Path, 128)), JupyterPort)
	}
}

// readJupyterBody decodes r's JSON body into v; an empty body is {}.
func (h *Handler) readJupyterBody(w http.ResponseWriter, r *http.Request, v any) bool {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			jupyterError(w, http.StatusRequestEntityTooLarge, "the body is over this server's limit of %d bytes", mb.Limit)
		} else {
			jupyterError(w, http.StatusBadRequest, "reading the body: %v", err)
		}
		return false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	if err := json.Unmarshal(data, v); err != nil {
		jupyterError(w, http.StatusBadRequest, "the body is not the JSON object the code interpreter takes: %v", err)
		return false
	}
	return true
}

func (h *Handler) jupyterExecute(w http.ResponseWriter, r *http.Request, key audit.Key, b *box) {
	var req executeRequest
	if !h.readJupyterBody(w, r, &req) {
		return
	}
	switch {
	case req.Code == nil:
		jupyterError(w, http.StatusBadRequest, "code is missing: POST {\"code\": \"...\"}")
		return
	case req.ContextID != "" && req.Language != "":
		// E2B's server's refusal, which the SDKs also make themselves.
		jupyterError(w, http.StatusBadRequest, "context_id %s and language %s were both given: give one (a context has its language)", strconv.Quote(truncate(req.ContextID, 64)), strconv.Quote(truncate(req.Language, 64)))
		return
	case len(req.EnvVars) > 0:
		jupyterError(w, http.StatusBadRequest, "env_vars (runCode's envs) are not supported by Moat's code interpreter: a cell runs in its context's kernel with the sandbox's environment; set envs on Sandbox.create, or os.environ in the code")
		return
	}
	if msg, ok := checkLanguage(req.Language); !ok {
		jupyterError(w, http.StatusNotFound, "%s", msg)
		return
	}
	feed, err := h.svc.StartCell(r.Context(), key, b.id, service.CellArgs{Code: *req.Code, Context: req.ContextID})
	if err != nil {
		if service.KindOf(err) == service.NotFound && req.ContextID != "" {
			// E2B's words for it, with the service's reason.
			var se *service.Error
			if errors.As(err, &se) && se.Field == "context" {
				jupyterError(w, http.StatusNotFound, "Context %s not found: %s", strconv.Quote(truncate(req.ContextID, 64)), se.Message)
				return
			}
		}
		h.jupyterServiceError(w, err)
		return
	}
	h.streamCell(w, r, feed)
}

// streamCell writes a cell's outputs as the code interpreter's NDJSON
// lines. A client that leaves before the end (its timeoutMs, a closed
// connection) has its cell interrupted: nothing would read the rest, and
// the context would stay busy for the next runCode.
func (h *Handler) streamCell(w http.ResponseWriter, r *http.Request, feed *service.CellFeed) {
	hd := w.Header()
	hd.Set("Content-Type", "application/x-ndjson")
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	defer rc.SetWriteDeadline(time.Time{})
	var buf bytes.Buffer
	flush := func() bool {
		if buf.Len() == 0 {
			return rc.Flush() == nil
		}
		rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false
		}
		buf.Reset()
		return rc.Flush() == nil
	}
	interrupt := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		feed.Interrupt(ctx, "the client of the cell went away (its timeoutMs, or a closed connection)")
	}
	after := 0
	for {
		evs, notify := feed.Read(after)
		ended := false
		for _, ev := range evs {
			if ev.Cell != nil {
				for _, line := range endLines(ev.Cell) {
					writeLine(&buf, line)
				}
				ended = true
				continue
			}
			if line := outputLine(ev.Output, time.Now()); line != nil {
				writeLine(&buf, line)
			}
			after = ev.ID
		}
		if !flush() {
			interrupt()
			return
		}
		if ended {
			return
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			interrupt()
			return
		case <-h.svc.Stopped():
			return
		}
	}
}

func writeLine(buf *bytes.Buffer, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		return // a map of strings always encodes
	}
	buf.Write(data)
	buf.WriteByte('\n')
}

// outputLine is a kernel output as the code interpreter's line, nil for
// none.
func outputLine(o *service.CellOutput, now time.Time) map[string]any {
	switch o.Type {
	case "stdout", "stderr":
		// timestamp: nanoseconds, as E2B's server (the Python SDK reads
		// it).
		return map[string]any{"type": o.Type, "text": o.Text, "timestamp": now.UnixNano()}
	case "result", "display":
		return resultLine(o.Data, o.Type == "result")
	case "error":
		if o.Error == nil {
			return nil
		}
		return errorLine(o.Error)
	}
	return nil
}

// resultLine is a MIME bundle as a result line: the SDKs' fields for the
// types they name, the MIME name for others (the SDKs' extra).
func resultLine(data map[string]string, main bool) map[string]any {
	line := map[string]any{"type": "result", "is_main_result": main}
	mimes := make([]string, 0, len(data))
	for mime := range data {
		mimes = append(mimes, mime)
	}
	sort.Strings(mimes)
	for _, mime := range mimes {
		v := data[mime]
		field, ok := mimeFields[mime]
		if !ok {
			field = mime
		}
		if _, taken := line[field]; taken {
			continue // "type" or "is_main_result" as a MIME name
		}
		if mime == "application/json" && json.Valid([]byte(v)) {
			// The kernel carries JSON as text; E2B's server sends the
			// value.
			line[field] = json.RawMessage(v)
			continue
		}
		line[field] = v
	}
	return line
}

func errorLine(e *service.CellErrorInfo) map[string]any {
	// The SDKs' traceback is one string (E2B's server joins the lines).
	return map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": strings.Join(e.Traceback, "\n")}
}

// endLines are the lines after a cell's outputs: its execution count,
// when the cell's id carries one (the kernel counts "c-N"), then the end.
func endLines(c *service.Cell) []map[string]any {
	var lines []map[string]any
	if n, err := strconv.Atoi(strings.TrimPrefix(c.ID, "c-")); err == nil && strings.HasPrefix(c.ID, "c-") {
		lines = append(lines, map[string]any{"type": "number_of_executions", "execution_count": n})
	}
	if c.Status == service.CellKernelDied {
		// E2B's server's line for a kernel that died under the cell.
		lines = append(lines, map[string]any{"type": "unexpected_end_of_execution"})
	}
	return append(lines, map[string]any{"type": "end_of_execution"})
}

func contextOf(k service.Kernel) jupyterContext {
	return jupyterContext{ID: k.Context, Language: "python", Cwd: jupyterCwd}
}

func (h *Handler) jupyterCreateContext(w http.ResponseWriter, r *http.Request, key audit.Key, b *box) {
	var req contextRequest
	if !h.readJupyterBody(w, r, &req) {
		return
	}
	if msg, ok := checkLanguage(req.Language); !ok {
		jupyterError(w, http.StatusNotFound, "%s", msg)
		return
	}
	if req.Cwd != "" && strings.TrimSuffix(req.Cwd, "/") != jupyterCwd {
		jupyterError(w, http.StatusBadRequest, "cwd %s is not supported: a context of Moat's code interpreter starts in the sandbox's workspace, %s; leave cwd out, or os.chdir in the code", strconv.Quote(truncate(req.Cwd, 256)), jupyterCwd)
		return
	}
	k, err := h.svc.CreateContext(r.Context(), key, b.id)
	if err != nil {
		h.jupyterServiceError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, contextOf(k))
}

func (h *Handler) jupyterListContexts(w http.ResponseWriter, r *http.Request, key audit.Key, b *box) {
	ks, err := h.svc.ListContexts(r.Context(), key, b.id)
	if err != nil {
		h.jupyterServiceError(w, err)
		return
	}
	out := make([]jupyterContext, 0, len(ks))
	for _, k := range ks {
		out = append(out, contextOf(k))
	}
	writeJSON(w, http.StatusOK, out)
}
