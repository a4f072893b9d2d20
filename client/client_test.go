package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

const testKey = "moat_k1_secret"

// seen is one request as the fake API received it.
type seen struct {
	Method, Path string // Path is escaped, as on the wire
	Query        url.Values
	Header       http.Header
	Body         []byte
}

// fakeAPI is a stand-in for `moat serve`: it checks credentials the way
// docs/API.md says (every route but /v1/health needs "Authorization:
// Bearer KEY"), records each request and answers with what the test set.
type fakeAPI struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []seen
	handle http.HandlerFunc // answers authenticated requests
}

func newFakeAPI(t *testing.T, handle http.HandlerFunc) *fakeAPI {
	t.Helper()
	f := &fakeAPI{t: t, handle: handle}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, seen{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.Query(), Header: r.Header.Clone(), Body: body})
	f.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.URL.Path != "/v1/health" && r.Header.Get("Authorization") != "Bearer "+testKey {
		apiError(w, http.StatusUnauthorized, "unauthenticated", "missing, unknown or revoked API key", "")
		return
	}
	f.handle(w, r)
}

func (f *fakeAPI) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seen(nil), f.reqs...)
}

func (f *fakeAPI) last(t *testing.T) seen {
	t.Helper()
	reqs := f.requests()
	if len(reqs) == 0 {
		t.Fatal("the fake API received no request")
	}
	return reqs[len(reqs)-1]
}

func (f *fakeAPI) client(t *testing.T, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(f.srv.URL, testKey, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func apiError(w http.ResponseWriter, status int, code, msg, field string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
		"code": code, "message": msg, "field": field, "request_id": "r-test",
	}})
}

func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatalf("not JSON: %q: %v", a, err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatalf("not JSON: %q: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

const sandboxJSON = `{"id": "sb-1", "state": "running", "tier": "native", "image": {"name": "python", "digest": "sha256:aa"},
 "manifest_digest": "sha256:bb", "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:14:05Z", "pooled": true,
 "metadata": {"k": "v"}, "execs": 3}`

const execJSON = `{"id": "e-1", "sandbox_id": "sb-1", "state": "exited", "argv": ["echo", "hi"],
 "result": {"schema": 1, "termination": "exited", "exit_code": 0, "stdout": {"data": "hi\n", "encoding": "utf-8", "bytes": 3}}}`

func wantSandbox(t *testing.T, got any) {
	t.Helper()
	sb := got.(*client.Sandbox)
	want := client.Sandbox{ID: "sb-1", State: "running", Tier: "native", Image: result.Image{Name: "python", Digest: "sha256:aa"},
		ManifestDigest: "sha256:bb", CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), ExpiresAt: time.Date(2026, 1, 2, 3, 14, 5, 0, time.UTC),
		Pooled: true, Metadata: map[string]string{"k": "v"}, Execs: 3}
	if sb.ID != want.ID || sb.State != want.State || sb.Tier != want.Tier || sb.Image != want.Image ||
		sb.ManifestDigest != want.ManifestDigest || !sb.CreatedAt.Equal(want.CreatedAt) || !sb.ExpiresAt.Equal(want.ExpiresAt) ||
		sb.Pooled != want.Pooled || !reflect.DeepEqual(sb.Metadata, want.Metadata) || sb.Execs != want.Execs {
		t.Errorf("sandbox = %+v, want %+v", sb, want)
	}
}

func wantExec(t *testing.T, got any) {
	t.Helper()
	e := got.(*client.Exec)
	if e.ID != "e-1" || e.SandboxID != "sb-1" || e.State != client.ExecExited || e.Running() ||
		!reflect.DeepEqual(e.Argv, []string{"echo", "hi"}) || e.Result == nil || e.Result.Stdout.Data != "hi\n" {
		t.Errorf("exec = %+v", e)
	}
}

// TestRequests checks each method's request (method, path, query,
// headers, body) and the decoding of its answer.
func TestRequests(t *testing.T) {
	m := manifest.Default()
	m.Resources.SetTimeout(manifest.Duration(10 * time.Second))
	m.Resources.Memory = 256 * manifest.MiB
	tests := []struct {
		name      string
		call      func(ctx context.Context, c *client.Client) (any, error)
		method    string
		path      string
		query     url.Values
		ctype     string // request Content-Type
		wantBody  string // JSON compared as a value, or raw bytes when ctype is not JSON
		checkBody func(t *testing.T, body []byte)
		status    int
		respCT    string
		resp      string
		check     func(t *testing.T, got any)
	}{
		{
			name:   "health",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Health(ctx) },
			method: "GET", path: "/v1/health",
			status: 200, resp: `{"status": "ok", "version": "1.2.3"}`,
			check: func(t *testing.T, got any) {
				if h := got.(*client.Health); h.Status != "ok" || h.Version != "1.2.3" {
					t.Errorf("health = %+v", h)
				}
			},
		},
		{
			name: "run with argv, a Go manifest, files and stdin",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Run(ctx, &client.RunRequest{
					Manifest: m,
					Argv:     []string{"python3", "main.py"},
					Files:    []client.File{{Path: "main.py", Content: []byte("print('hi')")}, {Path: "bin/run", Content: []byte("#!/bin/sh\n"), Mode: 0o755}},
					Stdin:    []byte("optional text"),
				})
			},
			method: "POST", path: "/v1/runs", ctype: "application/json",
			checkBody: func(t *testing.T, body []byte) {
				var got struct {
					Manifest map[string]json.RawMessage `json:"manifest"`
					Argv     []string                   `json:"argv"`
					Files    []map[string]string        `json:"files"`
					Stdin    string                     `json:"stdin"`
					Encoding *string                    `json:"stdin_encoding"`
				}
				if err := json.Unmarshal(body, &got); err != nil {
					t.Fatal(err)
				}
				if _, ok := got.Manifest["inputs"]; ok {
					t.Errorf("manifest carries inputs: %s", body)
				}
				// The manifest's own JSON form: sizes and durations as text.
				back, err := manifest.Parse(mustJSON(t, got.Manifest), "sent.json")
				if err != nil {
					t.Fatalf("the sent manifest does not parse: %v\n%s", err, body)
				}
				if back.Digest() != m.Digest() {
					t.Errorf("the sent manifest has digest %s, want %s:\n%s", back.Digest(), m.Digest(), body)
				}
				if !jsonEqual(t, got.Manifest["resources"], []byte(`{"cpus":1,"memory":"256MiB","pids":128,"timeout":"10s","cpu_time":"10s","open_files":256,"file_size":"64MiB","stdout_bytes":"1MiB","stderr_bytes":"1MiB"}`)) {
					t.Errorf("resources = %s", got.Manifest["resources"])
				}
				wantFiles := []map[string]string{{"path": "main.py", "content": "print('hi')"}, {"path": "bin/run", "content": "#!/bin/sh\n", "mode": "0755"}}
				if !reflect.DeepEqual(got.Argv, []string{"python3", "main.py"}) || !reflect.DeepEqual(got.Files, wantFiles) ||
					got.Stdin != "optional text" || got.Encoding != nil {
					t.Errorf("body = %s", body)
				}
			},
			status: 200, resp: `{"id": "3f2a", "pooled": true, "result": {"schema": 1, "termination": "exited", "exit_code": 3, "stdout": {"data": "hi\n", "encoding": "utf-8", "bytes": 3}}}`,
			check: func(t *testing.T, got any) {
				r := got.(*client.RunResponse)
				if r.ID != "3f2a" || !r.Pooled || r.Result == nil || r.Result.ExitCode != 3 || r.Result.Termination != result.Exited || r.Result.Stdout.Data != "hi\n" {
					t.Errorf("run = %+v, result %+v", r, r.Result)
				}
			},
		},
		{
			name: "run with code, a raw manifest, binary file and stdin",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Run(ctx, &client.RunRequest{
					ManifestJSON: json.RawMessage(` {"resources": {"timeout": "10s"}} `),
					Code:         "print(6*7)", Language: "python",
					Files: []client.File{{Path: "data.bin", Content: []byte{0, 1, 2, 0xff}, Mode: 0o600}},
					Stdin: []byte{0xff, 0xfe},
				})
			},
			method: "POST", path: "/v1/runs", ctype: "application/json",
			wantBody: `{"manifest": {"resources": {"timeout": "10s"}}, "code": "print(6*7)", "language": "python",
				"files": [{"path": "data.bin", "content": "AAEC/w==", "encoding": "base64", "mode": "0600"}],
				"stdin": "//4=", "stdin_encoding": "base64"}`,
			status: 200, resp: `{"id": "r-2", "pooled": false, "result": {"termination": "timeout", "exit_code": 124, "timed_out": true}}`,
			check: func(t *testing.T, got any) {
				if r := got.(*client.RunResponse); r.Result.Termination != result.Timeout || !r.Result.TimedOut || r.Pooled {
					t.Errorf("run = %+v", r.Result)
				}
			},
		},
		{
			name:   "get run escapes the id",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.GetRun(ctx, "a/b?c") },
			method: "GET", path: "/v1/runs/a%2Fb%3Fc",
			status: 200, resp: `{"id": "a/b?c", "result": {"exit_code": 0}}`,
			check: func(t *testing.T, got any) {
				if r := got.(*client.RunResponse); r.ID != "a/b?c" || r.Result == nil {
					t.Errorf("run = %+v", r)
				}
			},
		},
		{
			name: "create sandbox",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.CreateSandbox(ctx, &client.SandboxRequest{
					ManifestJSON: json.RawMessage(`{"image": "python"}`),
					TTL:          10 * time.Minute,
					Files:        []client.File{{Path: "a.txt", Content: []byte("A")}},
					Metadata:     map[string]string{"k": "v"},
				})
			},
			method: "POST", path: "/v1/sandboxes", ctype: "application/json",
			wantBody: `{"manifest": {"image": "python"}, "ttl": "10m", "files": [{"path": "a.txt", "content": "A"}], "metadata": {"k": "v"}}`,
			status:   201, resp: sandboxJSON, check: wantSandbox,
		},
		{
			name:   "create sandbox with defaults",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.CreateSandbox(ctx, nil) },
			method: "POST", path: "/v1/sandboxes", ctype: "application/json", wantBody: `{}`,
			status: 201, resp: sandboxJSON, check: wantSandbox,
		},
		{
			name:   "list sandboxes as an array",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.ListSandboxes(ctx) },
			method: "GET", path: "/v1/sandboxes",
			status: 200, resp: `[` + sandboxJSON + `]`,
			check: func(t *testing.T, got any) {
				list := got.([]*client.Sandbox)
				if len(list) != 1 {
					t.Fatalf("list = %+v", list)
				}
				wantSandbox(t, list[0])
			},
		},
		{
			name:   "list sandboxes as an object",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.ListSandboxes(ctx) },
			method: "GET", path: "/v1/sandboxes",
			status: 200, resp: `{"sandboxes": [` + sandboxJSON + `, ` + sandboxJSON + `]}`,
			check: func(t *testing.T, got any) {
				if list := got.([]*client.Sandbox); len(list) != 2 || list[1].ID != "sb-1" {
					t.Errorf("list = %+v", list)
				}
			},
		},
		{
			name:   "get sandbox",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.GetSandbox(ctx, "sb-1") },
			method: "GET", path: "/v1/sandboxes/sb-1",
			status: 200, resp: sandboxJSON, check: wantSandbox,
		},
		{
			name:   "delete sandbox",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Sandbox("sb-1").Delete(ctx) },
			method: "DELETE", path: "/v1/sandboxes/sb-1",
			status: 200, resp: `{"id": "sb-1", "state": "deleted"}`,
			check: func(t *testing.T, got any) {
				if sb := got.(*client.Sandbox); sb.State != "deleted" {
					t.Errorf("sandbox = %+v", sb)
				}
			},
		},
		{
			name: "set timeout",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.SetTimeout(ctx, "sb-1", 5*time.Minute)
			},
			method: "POST", path: "/v1/sandboxes/sb-1/timeout", ctype: "application/json", wantBody: `{"ttl": "5m"}`,
			status: 200, resp: sandboxJSON, check: wantSandbox,
		},
		{
			name: "exec waits",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Sandbox("sb-1").Exec(ctx, &client.ExecRequest{Argv: []string{"echo", "hi"}, Env: map[string]string{"A": "1"},
					Dir: "sub", Timeout: 90 * time.Second, Stdin: []byte("in")})
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs", ctype: "application/json",
			wantBody: `{"argv": ["echo", "hi"], "env": {"A": "1"}, "dir": "sub", "timeout": "1m30s", "stdin": "in", "wait": true}`,
			status:   200, resp: execJSON, check: wantExec,
		},
		{
			name: "start does not wait",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Sandbox("sb-1").Start(ctx, &client.ExecRequest{Code: "input()", Language: "python", StdinOpen: true})
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs", ctype: "application/json",
			wantBody: `{"code": "input()", "language": "python", "stdin_open": true, "wait": false}`,
			status:   202, resp: `{"id": "e-2", "sandbox_id": "sb-1", "state": "running", "argv": ["python3", "-c", "input()"]}`,
			check: func(t *testing.T, got any) {
				if e := got.(*client.Exec); e.ID != "e-2" || !e.Running() || e.Result != nil {
					t.Errorf("exec = %+v", e)
				}
			},
		},
		{
			name: "a held command is a HeldError",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				e, err := c.Sandbox("sb-1").Exec(ctx, &client.ExecRequest{Argv: []string{"sh", "-c", "curl -o x http://h/x; sh x"}})
				var held *client.HeldError
				if !errors.As(err, &held) {
					return nil, fmt.Errorf("exec = %+v, %v; want a *client.HeldError", e, err)
				}
				return held, nil
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs", ctype: "application/json",
			wantBody: `{"argv": ["sh", "-c", "curl -o x http://h/x; sh x"], "wait": true}`,
			status:   202, resp: `{"approval": {"id": "ap-1", "state": "pending", "sandbox_id": "sb-1", "argv": ["sh"],
				"effects": [{"kind": "exec-fetched", "detail": "runs x, fetched from h", "commands": [0, 1], "hosts": ["h"]}],
				"created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:09:05Z"}}`,
			check: func(t *testing.T, got any) {
				h := got.(*client.HeldError)
				if h.Approval.ID != "ap-1" || h.Approval.State != client.ApprovalPending || len(h.Approval.Effects) != 1 ||
					!strings.Contains(h.Error(), "ap-1") || !strings.Contains(h.Error(), "runs x, fetched from h") {
					t.Errorf("held = %+v (%v)", h.Approval, h)
				}
			},
		},
		{
			name:   "list approvals",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.ListApprovals(ctx) },
			method: "GET", path: "/v1/approvals",
			status: 200, resp: `{"approvals": [{"id": "ap-1", "state": "pending", "argv": ["sh"], "effects": [], "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:09:05Z"}]}`,
			check: func(t *testing.T, got any) {
				if l := got.([]*client.Approval); len(l) != 1 || l[0].ID != "ap-1" || l[0].ExpiresAt.IsZero() {
					t.Errorf("approvals = %+v", l)
				}
			},
		},
		{
			name: "approve a held command",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.DecideApproval(ctx, "ap/1", true, "reviewed the script")
			},
			method: "POST", path: "/v1/approvals/ap%2F1", ctype: "application/json",
			wantBody: `{"approve": true, "reason": "reviewed the script"}`,
			status:   200, resp: `{"approval": {"id": "ap/1", "state": "approved", "argv": ["sh"], "effects": [], "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:09:05Z"},
				"exec": {"id": "e-3", "sandbox_id": "sb-1", "state": "running", "argv": ["sh"]}}`,
			check: func(t *testing.T, got any) {
				if o := got.(*client.ApprovalOutcome); o.Approval.State != client.ApprovalApproved || o.Exec == nil || o.Exec.ID != "e-3" || o.Run != nil {
					t.Errorf("outcome = %+v", o)
				}
			},
		},
		{
			name: "deny sends approve false",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.DecideApproval(ctx, "ap-2", false, "")
			},
			method: "POST", path: "/v1/approvals/ap-2", ctype: "application/json", wantBody: `{"approve": false}`,
			status: 200, resp: `{"approval": {"id": "ap-2", "state": "denied", "argv": ["sh"], "effects": [], "created_at": "2026-01-02T03:04:05Z", "expires_at": "2026-01-02T03:09:05Z"}}`,
			check: func(t *testing.T, got any) {
				if o := got.(*client.ApprovalOutcome); o.Approval.State != client.ApprovalDenied || o.Exec != nil || o.Run != nil {
					t.Errorf("outcome = %+v", o)
				}
			},
		},
		{
			name:   "get exec",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Sandbox("sb-1").GetExec(ctx, "e-1") },
			method: "GET", path: "/v1/sandboxes/sb-1/execs/e-1",
			status: 200, resp: execJSON, check: wantExec,
		},
		{
			name:   "list execs",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Sandbox("sb-1").ListExecs(ctx) },
			method: "GET", path: "/v1/sandboxes/sb-1/execs",
			status: 200, resp: `{"execs": [` + execJSON + `]}`,
			check: func(t *testing.T, got any) {
				list := got.([]*client.Exec)
				if len(list) != 1 {
					t.Fatalf("list = %+v", list)
				}
				wantExec(t, list[0])
			},
		},
		{
			name: "write stdin",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").WriteStdin(ctx, "e-1", strings.NewReader("line\n"))
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs/e-1/stdin", ctype: "application/octet-stream", wantBody: "line\n",
			status: 204,
		},
		{
			name: "close stdin",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").CloseStdin(ctx, "e-1")
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs/e-1/stdin", query: url.Values{"eof": {"1"}}, ctype: "application/octet-stream", wantBody: "",
			status: 200, resp: `{}`,
		},
		{
			name: "signal",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").Signal(ctx, "e-1", "SIGTERM")
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs/e-1/signal", ctype: "application/json", wantBody: `{"signal": "SIGTERM"}`,
			status: 200, resp: `{}`,
		},
		{
			name: "exec on a terminal",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Sandbox("sb-1").Start(ctx, &client.ExecRequest{Argv: []string{"bash", "-i"}, StdinOpen: true, TTY: &client.TTYSize{Rows: 24, Cols: 80}})
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs", ctype: "application/json",
			wantBody: `{"argv": ["bash", "-i"], "stdin_open": true, "tty": {"rows": 24, "cols": 80}, "wait": false}`,
			status:   202, resp: `{"id": "e-2", "sandbox_id": "sb-1", "state": "running", "argv": ["bash", "-i"], "tty": {"rows": 24, "cols": 80}}`,
			check: func(t *testing.T, got any) {
				if e := got.(*client.Exec); e.TTY == nil || *e.TTY != (client.TTYSize{Rows: 24, Cols: 80}) {
					t.Errorf("exec = %+v", e)
				}
			},
		},
		{
			name: "resize",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").Resize(ctx, "e-2", client.TTYSize{Rows: 40, Cols: 132})
			},
			method: "POST", path: "/v1/sandboxes/sb-1/execs/e-2/resize", ctype: "application/json", wantBody: `{"rows": 40, "cols": 132}`,
			status: 200, resp: `{}`,
		},
		{
			name: "run a cell",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Sandbox("sb-1").RunCell(ctx, &client.CellRequest{Code: "x = 1\nx + 1", Context: "k-2", Timeout: 5 * time.Second})
			},
			method: "POST", path: "/v1/sandboxes/sb-1/cells", ctype: "application/json",
			wantBody: `{"code": "x = 1\nx + 1", "context": "k-2", "timeout": "5s"}`,
			status:   200, resp: `{"id": "c-1", "sandbox_id": "sb-1", "context": "k-2", "status": "error", "outputs": [{"type": "stdout", "text": "hi\n"}],
				"result": {"text/plain": "2"}, "error": {"name": "ValueError", "value": "bad", "traceback": ["line 1"]}, "kernel_started": true}`,
			check: func(t *testing.T, got any) {
				c := got.(*client.Cell)
				if c.ID != "c-1" || c.Result["text/plain"] != "2" || c.Error == nil || c.Error.Name != "ValueError" || len(c.Outputs) != 1 || c.Outputs[0].Text != "hi\n" || !c.KernelStarted {
					t.Errorf("cell = %+v", c)
				}
			},
		},
		{
			name: "restart a context's kernel",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").RestartKernel(ctx, "k-2")
			},
			method: "POST", path: "/v1/sandboxes/sb-1/kernel/restart", query: url.Values{"context": {"k-2"}}, ctype: "application/json", wantBody: `{}`,
			status: 200, resp: `{}`,
		},
		{
			name: "interrupt the default kernel",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").InterruptKernel(ctx, "")
			},
			method: "POST", path: "/v1/sandboxes/sb-1/kernel/interrupt", ctype: "application/json", wantBody: `{}`,
			status: 200, resp: `{}`,
		},
		{
			name: "create a context",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return c.Sandbox("sb-1").CreateContext(ctx)
			},
			method: "POST", path: "/v1/sandboxes/sb-1/contexts", ctype: "application/json", wantBody: `{}`,
			status: 201, resp: `{"sandbox_id": "sb-1", "context": "k-3", "state": "none"}`,
			check: func(t *testing.T, got any) {
				if k := got.(*client.Kernel); k.Context != "k-3" || k.State != "none" {
					t.Errorf("kernel = %+v", k)
				}
			},
		},
		{
			name: "delete a context",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").DeleteContext(ctx, "k-3")
			},
			method: "DELETE", path: "/v1/sandboxes/sb-1/contexts/k-3",
			status: 204,
		},
		{
			name: "upload",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").Upload(ctx, "dir/run.sh", strings.NewReader("#!/bin/sh\necho hi\n"), 0o755)
			},
			method: "PUT", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"dir/run.sh"}, "mode": {"0755"}},
			ctype: "application/octet-stream", wantBody: "#!/bin/sh\necho hi\n",
			status: 201, resp: `{"path": "dir/run.sh"}`,
		},
		{
			name: "upload with the default mode",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").Upload(ctx, "a b&c.txt", bytes.NewReader([]byte{0, 1, 2}), 0)
			},
			method: "PUT", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"a b&c.txt"}},
			ctype: "application/octet-stream", wantBody: "\x00\x01\x02",
			status: 204,
		},
		{
			name: "download",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				rc, err := c.Sandbox("sb-1").Download(ctx, "out/result.bin")
				if err != nil {
					return nil, err
				}
				defer rc.Close()
				return io.ReadAll(rc)
			},
			method: "GET", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"out/result.bin"}},
			status: 200, respCT: "application/octet-stream", resp: "\x00binary\xff",
			check: func(t *testing.T, got any) {
				if b := got.([]byte); string(b) != "\x00binary\xff" {
					t.Errorf("downloaded %q", b)
				}
			},
		},
		{
			name:   "list a directory",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Sandbox("sb-1").List(ctx, "") },
			method: "GET", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"."}},
			status: 200, resp: `[{"name": "a.txt", "path": "a.txt", "type": "file", "size": 1, "mode": "0644", "modified": "2026-01-02T03:04:05Z"},
				{"name": "l", "path": "l", "type": "symlink", "size": 5, "mode": "0777", "modified": "2026-01-02T03:04:05Z", "target": "a.txt"}]`,
			check: func(t *testing.T, got any) {
				list := got.([]client.FileInfo)
				if len(list) != 2 || list[0].Name != "a.txt" || list[0].Type != "file" || list[0].Size != 1 || list[0].Mode != "0644" ||
					!list[0].ModTime.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) || list[1].Target != "a.txt" {
					t.Errorf("list = %+v", list)
				}
			},
		},
		{
			name:   "list a directory answered as an object",
			call:   func(ctx context.Context, c *client.Client) (any, error) { return c.Sandbox("sb-1").List(ctx, "sub") },
			method: "GET", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"sub"}},
			status: 200, resp: `{"path": "sub", "entries": [{"name": "x", "path": "sub/x", "type": "dir", "mode": "0755"}]}`,
			check: func(t *testing.T, got any) {
				if list := got.([]client.FileInfo); len(list) != 1 || list[0].Path != "sub/x" || list[0].Type != "dir" {
					t.Errorf("list = %+v", list)
				}
			},
		},
		{
			name: "remove",
			call: func(ctx context.Context, c *client.Client) (any, error) {
				return nil, c.Sandbox("sb-1").Remove(ctx, "tmp")
			},
			method: "DELETE", path: "/v1/sandboxes/sb-1/files", query: url.Values{"path": {"tmp"}},
			status: 204,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				ct := tc.respCT
				if ct == "" {
					ct = "application/json"
				}
				w.Header().Set("Content-Type", ct)
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.resp)
			})
			got, err := tc.call(context.Background(), f.client(t))
			if err != nil {
				t.Fatalf("call: %v", err)
			}
			reqs := f.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests, want 1", len(reqs))
			}
			req := reqs[0]
			if req.Method != tc.method || req.Path != tc.path {
				t.Errorf("request %s %s, want %s %s", req.Method, req.Path, tc.method, tc.path)
			}
			wantQuery := tc.query
			if wantQuery == nil {
				wantQuery = url.Values{}
			}
			if !reflect.DeepEqual(req.Query, wantQuery) {
				t.Errorf("query %v, want %v", req.Query, wantQuery)
			}
			if got := req.Header.Get("Authorization"); got != "Bearer "+testKey {
				t.Errorf("Authorization %q", got)
			}
			if got := req.Header.Get("Content-Type"); got != tc.ctype {
				t.Errorf("Content-Type %q, want %q", got, tc.ctype)
			}
			switch {
			case tc.checkBody != nil:
				tc.checkBody(t, req.Body)
			case tc.ctype == "application/json":
				if !jsonEqual(t, req.Body, []byte(tc.wantBody)) {
					t.Errorf("body %s\nwant %s", req.Body, tc.wantBody)
				}
			case string(req.Body) != tc.wantBody:
				t.Errorf("body %q, want %q", req.Body, tc.wantBody)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRequestRefusedLocally checks requests the client refuses before
// sending anything.
func TestRequestRefusedLocally(t *testing.T) {
	tests := []struct {
		name string
		call func(ctx context.Context, c *client.Client) error
		want string
	}{
		{"both manifest forms", func(ctx context.Context, c *client.Client) error {
			_, err := c.Run(ctx, &client.RunRequest{Manifest: manifest.Default(), ManifestJSON: json.RawMessage(`{}`), Argv: []string{"true"}})
			return err
		}, "not both"},
		{"manifest JSON that is not an object", func(ctx context.Context, c *client.Client) error {
			_, err := c.Run(ctx, &client.RunRequest{ManifestJSON: json.RawMessage(`["image"]`), Argv: []string{"true"}})
			return err
		}, "not a JSON object"},
		{"manifest JSON that is not JSON", func(ctx context.Context, c *client.Client) error {
			_, err := c.CreateSandbox(ctx, &client.SandboxRequest{ManifestJSON: json.RawMessage(`{image: python}`)})
			return err
		}, "not a JSON object"},
		{"file without a path", func(ctx context.Context, c *client.Client) error {
			_, err := c.Run(ctx, &client.RunRequest{Argv: []string{"true"}, Files: []client.File{{Content: []byte("x")}}})
			return err
		}, "files[0]: empty path"},
		{"nil run request", func(ctx context.Context, c *client.Client) error {
			_, err := c.Run(ctx, nil)
			return err
		}, "nil request"},
		{"negative exec timeout", func(ctx context.Context, c *client.Client) error {
			_, err := c.Sandbox("sb-1").Exec(ctx, &client.ExecRequest{Argv: []string{"true"}, Timeout: -time.Second})
			return err
		}, "negative"},
		{"zero ttl", func(ctx context.Context, c *client.Client) error {
			_, err := c.SetTimeout(ctx, "sb-1", 0)
			return err
		}, "positive"},
		{"sandbox without a client", func(ctx context.Context, c *client.Client) error {
			return (&client.Sandbox{ID: "sb-1"}).Remove(ctx, "x")
		}, "no Client"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) { reply(w, 200, `{}`) })
			err := tc.call(context.Background(), f.client(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
			if n := len(f.requests()); n != 0 {
				t.Errorf("%d requests were sent", n)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name, url, key string
		ok             bool
	}{
		{"http with port", "http://127.0.0.1:7070", testKey, true},
		{"trailing slash", "http://127.0.0.1:7070/", testKey, true},
		{"https with a path prefix", "https://moat.example/api", testKey, true},
		{"no key", "http://127.0.0.1:7070", "", true},
		{"empty", "", testKey, false},
		{"no scheme", "127.0.0.1:7070", testKey, false},
		{"other scheme", "ftp://host", testKey, false},
		{"no host", "http://", testKey, false},
		{"query", "http://host/?key=x", testKey, false},
		{"user info", "http://me:pw@host", testKey, false},
		{"key with a line break", "http://host", "k\r\nX-Evil: 1", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := client.New(tc.url, tc.key)
			if (err == nil) != tc.ok {
				t.Errorf("New(%q) err = %v, want ok %v", tc.url, err, tc.ok)
			}
		})
	}
}

// TestPathPrefixAndNoKey checks that a base URL's path is kept and that an
// empty key sends no Authorization header.
func TestPathPrefixAndNoKey(t *testing.T) {
	var got seen
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = seen{Method: r.Method, Path: r.URL.EscapedPath(), Header: r.Header.Clone()}
		reply(w, 200, `{"status": "ok"}`)
	}))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL+"/moat/", "", client.WithUserAgent("test-agent/1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got.Path != "/moat/v1/health" {
		t.Errorf("path %q, want /moat/v1/health", got.Path)
	}
	if a, ok := got.Header["Authorization"]; ok {
		t.Errorf("Authorization sent without a key: %q", a)
	}
	if ua := got.Header.Get("User-Agent"); ua != "test-agent/1" {
		t.Errorf("User-Agent %q", ua)
	}
}

// TestErrors checks the decoding of the API's error documents and of
// answers that are not one.
func TestErrors(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		handle http.HandlerFunc
		call   func(ctx context.Context, c *client.Client) error
		want   client.Error
		inMsg  []string // substrings of err.Error()
	}{
		{
			name: "invalid field",
			handle: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 400, "invalid_field", "resources.memory: 99TiB is above the maximum 64GiB", "manifest.resources.memory")
			},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Run(ctx, &client.RunRequest{ManifestJSON: json.RawMessage(`{"resources": {"memory": "99TiB"}}`), Argv: []string{"true"}})
				return err
			},
			want: client.Error{Status: 400, Code: client.CodeInvalidField, Message: "resources.memory: 99TiB is above the maximum 64GiB",
				Field: "manifest.resources.memory", RequestID: "r-test", Method: "POST", Path: "/v1/runs"},
			inMsg: []string{"POST /v1/runs", "400 invalid_field", "99TiB", "(field: manifest.resources.memory)", "r-test"},
		},
		{
			name:   "wrong key",
			key:    "moat_k1_wrong",
			handle: func(w http.ResponseWriter, r *http.Request) { t.Error("the fake let a wrong key through") },
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.ListSandboxes(ctx)
				return err
			},
			want: client.Error{Status: 401, Code: client.CodeUnauthenticated, Message: "missing, unknown or revoked API key", RequestID: "r-test",
				Method: "GET", Path: "/v1/sandboxes"},
		},
		{
			name:   "another key's sandbox",
			handle: func(w http.ResponseWriter, r *http.Request) { apiError(w, 404, "not_found", "no sandbox sb-9", "") },
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.GetSandbox(ctx, "sb-9")
				return err
			},
			want: client.Error{Status: 404, Code: client.CodeNotFound, Message: "no sandbox sb-9", RequestID: "r-test", Method: "GET", Path: "/v1/sandboxes/sb-9"},
		},
		{
			name: "quota",
			handle: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 429, "quota_exceeded", "8 sandboxes are running", "")
			},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.CreateSandbox(ctx, nil)
				return err
			},
			want: client.Error{Status: 429, Code: client.CodeQuotaExceeded, Message: "8 sandboxes are running", RequestID: "r-test", Method: "POST", Path: "/v1/sandboxes"},
		},
		{
			name: "ended process",
			handle: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 409, "conflict", "the process already ended", "")
			},
			call: func(ctx context.Context, c *client.Client) error {
				return c.Sandbox("sb-1").Signal(ctx, "e-1", "9")
			},
			want: client.Error{Status: 409, Code: client.CodeConflict, Message: "the process already ended", RequestID: "r-test",
				Method: "POST", Path: "/v1/sandboxes/sb-1/execs/e-1/signal"},
		},
		{
			name: "download of a missing file",
			handle: func(w http.ResponseWriter, r *http.Request) {
				apiError(w, 404, "not_found", "no such file: out.txt", "path")
			},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Sandbox("sb-1").Download(ctx, "out.txt")
				return err
			},
			want: client.Error{Status: 404, Code: client.CodeNotFound, Message: "no such file: out.txt", Field: "path", RequestID: "r-test",
				Method: "GET", Path: "/v1/sandboxes/sb-1/files"},
		},
		{
			name: "request id from the header",
			handle: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-ID", "r-hdr")
				reply(w, 500, `{"error": {"code": "internal", "message": "Moat failed (request r-hdr)"}}`)
			},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Health(ctx)
				return err
			},
			want: client.Error{Status: 500, Code: client.CodeInternal, Message: "Moat failed (request r-hdr)", RequestID: "r-hdr", Method: "GET", Path: "/v1/health"},
		},
		{
			name: "a proxy's error page",
			handle: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(502)
				io.WriteString(w, "<html>upstream down</html>")
			},
			call: func(ctx context.Context, c *client.Client) error {
				_, err := c.Health(ctx)
				return err
			},
			want:  client.Error{Status: 502, Message: `Bad Gateway: "<html>upstream down</html>"`, Method: "GET", Path: "/v1/health"},
			inMsg: []string{"502", "Bad Gateway", "upstream down"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, tc.handle)
			key := testKey
			if tc.key != "" {
				key = tc.key
			}
			c, err := client.New(f.srv.URL, key)
			if err != nil {
				t.Fatal(err)
			}
			err = tc.call(context.Background(), c)
			var apiErr *client.Error
			if !errors.As(err, &apiErr) {
				t.Fatalf("err = %v (%T), want a *client.Error", err, err)
			}
			if *apiErr != tc.want {
				t.Errorf("error = %#v\nwant    %#v", *apiErr, tc.want)
			}
			for _, s := range tc.inMsg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%q does not mention %q", err, s)
				}
			}
		})
	}
}

// TestTransportError checks that a failure to reach the server is not an
// *Error and names the call.
func TestTransportError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	base := srv.URL
	srv.Close()
	c, err := client.New(base, testKey)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Sandbox("sb-1").GetExec(context.Background(), "e-1")
	var apiErr *client.Error
	if err == nil || errors.As(err, &apiErr) {
		t.Fatalf("err = %v, want a transport error", err)
	}
	if !strings.Contains(err.Error(), "GET /v1/sandboxes/sb-1/execs/e-1") {
		t.Errorf("%q does not name the call", err)
	}
}

// TestContextCancellation checks that a call waiting on the server returns
// when its context ends.
func TestContextCancellation(t *testing.T) {
	tests := []struct {
		name string
		call func(ctx context.Context, c *client.Client) error
	}{
		{"waiting exec", func(ctx context.Context, c *client.Client) error {
			_, err := c.Sandbox("sb-1").Exec(ctx, &client.ExecRequest{Argv: []string{"sleep", "100"}})
			return err
		}},
		{"run", func(ctx context.Context, c *client.Client) error {
			_, err := c.Run(ctx, &client.RunRequest{Argv: []string{"sleep", "100"}})
			return err
		}},
		{"download", func(ctx context.Context, c *client.Client) error {
			_, err := c.Sandbox("sb-1").Download(ctx, "big")
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
				case <-release:
				}
			})
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			err := tc.call(ctx, f.client(t))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want context.DeadlineExceeded", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the call took %v after its deadline", d)
			}
		})
	}
}

func TestStreamBytes(t *testing.T) {
	tests := []struct {
		name    string
		in      result.Stream
		want    string
		wantErr bool
	}{
		{"text", result.Stream{Data: "héllo\n", Encoding: "utf-8"}, "héllo\n", false},
		{"no encoding", result.Stream{Data: "x"}, "x", false},
		{"base64", result.Stream{Data: "AP8=", Encoding: "base64"}, "\x00\xff", false},
		{"bad base64", result.Stream{Data: "!!", Encoding: "base64"}, "", true},
		{"unknown encoding", result.Stream{Data: "x", Encoding: "rot13"}, "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := client.StreamBytes(tc.in)
			if (err != nil) != tc.wantErr || string(got) != tc.want {
				t.Errorf("StreamBytes = %q, %v; want %q, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}
