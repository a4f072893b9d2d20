package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service/servicetest"
)

const (
	tokenA = "moat_ka_secret-a"
	tokenB = "moat_kb_secret-b"
	// tokenAdmin is the operator's key: it may read /metrics.
	tokenAdmin = "moat_kadmin_secret"
)

// env is a server over the fakes, listening on loopback.
type env struct {
	t   *testing.T
	srv *Server
	hs  *httptest.Server
	be  *servicetest.Backend
	au  *servicetest.Auditor
	// shutdownErr is what the final Shutdown may return (a test that
	// shut down past a deadline already).
	shutdownErr error
}

func newEnv(t *testing.T, mod func(*Config)) *env {
	t.Helper()
	be := &servicetest.Backend{Dir: t.TempDir()}
	au := servicetest.NewAuditor()
	au.AddKey(tokenA, audit.Key{ID: "ka", Name: "a", Quota: audit.DefaultQuota})
	au.AddKey(tokenB, audit.Key{ID: "kb", Name: "b", Quota: audit.DefaultQuota})
	au.AddKey(tokenAdmin, audit.Key{ID: "kadmin", Name: "monitoring", Quota: audit.DefaultQuota, Admin: true})
	level := slog.LevelError + 100 // silent
	if testing.Verbose() && os.Getenv("MOAT_TEST_LOG") != "" {
		level = slog.LevelDebug
	}
	cfg := Config{
		Backend:      be,
		Auditor:      au,
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		Version:      "test",
		ReapInterval: 10 * time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, srv: srv, hs: httptest.NewServer(srv.Handler()), be: be, au: au}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != e.shutdownErr {
			t.Errorf("Shutdown: %v", err)
		}
		e.hs.Close()
		if live, _, _, _ := be.Counts(); live != 0 {
			t.Errorf("after Shutdown %d fake sessions are alive", live)
		}
		if n := srv.Sessions(); n != 0 {
			t.Errorf("after Shutdown Sessions() = %d", n)
		}
		if ids := au.Unfinished(); len(ids) > 0 {
			t.Errorf("audit records never finished: %v", ids)
		}
	})
	return e
}

// response is an answer with its body read.
type response struct {
	*http.Response
	body []byte
}

// errBody decodes the JSON error document.
func (r response) errBody(t *testing.T) ErrorDetail {
	t.Helper()
	var eb ErrorBody
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eb); err != nil {
		t.Fatalf("error body %q: %v", r.body, err)
	}
	return eb.Error
}

// decode decodes the body strictly into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
}

// req is one request to send.
type req struct {
	method, path, token string
	body                any // string or []byte sent as is, else JSON
	header              map[string]string
}

func (e *env) do(rq req) response {
	e.t.Helper()
	var body io.Reader
	switch b := rq.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		body = bytes.NewReader(j)
	}
	hr, err := http.NewRequest(rq.method, e.hs.URL+rq.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if rq.token != "" {
		hr.Header.Set("Authorization", "Bearer "+rq.token)
	}
	for k, v := range rq.header {
		hr.Header.Set(k, v)
	}
	resp, err := e.hs.Client().Do(hr)
	if err != nil {
		e.t.Fatalf("%s %s: %v", rq.method, rq.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{Response: resp, body: b}
}

// must sends rq and fails unless the status is want.
func (e *env) must(want int, rq req) response {
	e.t.Helper()
	r := e.do(rq)
	if r.StatusCode != want {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", rq.method, rq.path, r.StatusCode, want, r.body)
	}
	return r
}

func (e *env) createSandbox(token string, body any) Sandbox {
	e.t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	var sb Sandbox
	e.must(http.StatusCreated, req{method: "POST", path: "/v1/sandboxes", token: token, body: body}).decode(e.t, &sb)
	return sb
}

func (e *env) exec(token, sbID string, body any, want int) Exec {
	e.t.Helper()
	var ex Exec
	e.must(want, req{method: "POST", path: "/v1/sandboxes/" + sbID + "/execs", token: token, body: body}).decode(e.t, &ex)
	return ex
}

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitExec polls an exec until it is not running.
func (e *env) waitExec(token, sbID, eid string) Exec {
	e.t.Helper()
	var ex Exec
	waitFor(e.t, "exec "+eid+" to end", func() bool {
		e.must(http.StatusOK, req{method: "GET", path: "/v1/sandboxes/" + sbID + "/execs/" + eid, token: token}).decode(e.t, &ex)
		return ex.State != ExecRunning
	})
	return ex
}

// jsonDecode decodes b strictly into v.
func jsonDecode(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
