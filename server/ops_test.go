package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/dashboard"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// accessLines are the access-log lines (msg "request") logged so far.
func accessLines(t *testing.T, logs *syncbuf.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["msg"] == "request" {
			out = append(out, m)
		}
	}
	return out
}

// TestAccessLog: one line per request once it has ended, with the request
// id the client got, the route pattern and the path, the status, the
// bytes, the key's id (never its secret); health checks at debug level.
func TestAccessLog(t *testing.T) {
	logs := &syncbuf.Buffer{}
	var level slog.LevelVar
	e := newEnv(t, func(c *Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: &level}))
	})
	sb := e.createSandbox(tokenA, nil)
	tests := []struct {
		name                 string
		level                slog.Level
		rq                   req
		wantLevel            string // "": no line at this log level
		route, path, key     string
		status               int
		wantBytes, wantQuiet bool
	}{
		{"a key's request names the key's id", slog.LevelInfo, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA},
			"INFO", "GET /v1/sandboxes/{id}", "/v1/sandboxes/" + sb.ID, "ka", 200, true, false},
		{"a refused key is -", slog.LevelInfo, req{method: "GET", path: "/v1/sandboxes", token: "moat_kx_wrong"},
			"INFO", "GET /v1/sandboxes", "/v1/sandboxes", "-", 401, true, false},
		{"another key's sandbox is its 404", slog.LevelInfo, req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: tokenB},
			"INFO", "DELETE /v1/sandboxes/{id}", "/v1/sandboxes/" + sb.ID, "kb", 404, true, false},
		{"an unknown path is unmatched", slog.LevelInfo, req{method: "GET", path: "/v2/nothing?secret=x"},
			"INFO", "unmatched", "/v2/nothing", "-", 404, true, false},
		{"the health check is not at info", slog.LevelInfo, req{method: "GET", path: "/v1/health"},
			"", "", "", "", 0, false, false},
		{"the health check is at debug", slog.LevelDebug, req{method: "GET", path: "/v1/health"},
			"DEBUG", "GET /v1/health", "/v1/health", "-", 200, true, true},
		{"the OpenAPI document is at info", slog.LevelInfo, req{method: "GET", path: "/v1/openapi.yaml"},
			"INFO", "GET /v1/openapi.yaml", "/v1/openapi.yaml", "-", 200, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			level.Set(tc.level)
			before := len(accessLines(t, logs))
			r := e.do(tc.rq)
			id := r.Header.Get("X-Request-Id")
			if !strings.HasPrefix(id, "r-") {
				t.Fatalf("X-Request-Id %q", id)
			}
			var line map[string]any
			waitFor(t, "the access-log line of "+id, func() bool {
				for _, l := range accessLines(t, logs)[before:] {
					if l["request_id"] == id {
						line = l
					}
				}
				// A request without a line at this level: give the
				// handler's deferred write time to happen, then check
				// that it did not.
				return line != nil || tc.wantLevel == ""
			})
			if tc.wantLevel == "" {
				time.Sleep(50 * time.Millisecond)
				for _, l := range accessLines(t, logs)[before:] {
					if l["request_id"] == id {
						t.Fatalf("logged at %v: %v", tc.level, l)
					}
				}
				return
			}
			for k, want := range map[string]any{"level": tc.wantLevel, "method": tc.rq.method, "route": tc.route, "path": tc.path,
				"key": tc.key, "status": float64(tc.status), "bytes": float64(len(r.body))} {
				if line[k] != want {
					t.Errorf("%s = %v (%T), want %v; line %v", k, line[k], line[k], want, line)
				}
			}
			if d, ok := line["duration_ms"].(float64); !ok || d < 0 {
				t.Errorf("duration_ms = %v", line["duration_ms"])
			}
		})
	}
	for _, secret := range []string{tokenA, tokenB, "moat_kx_wrong", "secret=x"} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the log holds %q:\n%s", secret, logs.String())
		}
	}
}

// TestOpenAPIServed: the embedded document is served without a key, as
// YAML, byte for byte the file in the tree.
func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t, nil)
	want, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		method string
		token  string
		status int
		body   []byte
	}{
		{"without a key", "GET", "", 200, want},
		{"with a key", "GET", tokenA, 200, want},
		{"HEAD", "HEAD", "", 200, nil},
		{"POST is not allowed", "POST", "", 405, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: tc.method, path: "/v1/openapi.yaml", token: tc.token})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if tc.status != 200 {
				return
			}
			if ct := r.Header.Get("Content-Type"); ct != "application/yaml; charset=utf-8" {
				t.Errorf("Content-Type %q", ct)
			}
			if !bytes.Equal(r.body, tc.body) {
				t.Errorf("body is not openapi.yaml (%d bytes, want %d)", len(r.body), len(tc.body))
			}
		})
	}
}

// TestMetricsHandler: the metrics listener's handler serves the series
// without a key, and nothing but GET /metrics.
func TestMetricsHandler(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Version, c.Source = "v9.9.9", "src123" })
	e.createSandbox(tokenA, nil)
	hs := httptest.NewServer(e.srv.MetricsHandler())
	t.Cleanup(hs.Close)
	tests := []struct {
		name, method, path string
		status             int
		want               []string
	}{
		{"metrics without a key", "GET", "/metrics", 200, []string{
			`moat_build_info{go_version="go`, `",source="src123",version="v9.9.9"} 1`,
			`moat_sandbox_start_seconds_count{pool="miss",tier="fake"} 1`,
			"# TYPE moat_sandbox_start_seconds histogram"}},
		{"another path", "GET", "/v1/sandboxes", 404, nil},
		{"the API's health is not here", "GET", "/v1/health", 404, nil},
		{"POST", "POST", "/metrics", 405, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rq, _ := http.NewRequest(tc.method, hs.URL+tc.path, nil)
			resp, err := hs.Client().Do(rq)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			bufio.NewReader(resp.Body).WriteTo(&b)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

// TestStartMetric: each sandbox made ready (a session, a one-shot run)
// is one observation of moat_sandbox_start_seconds, labelled by tier and
// by whether a warm pool had it.
func TestStartMetric(t *testing.T) {
	tests := []struct {
		name     string
		poolHits bool
		want     string
	}{
		{"prepared on demand", false, `moat_sandbox_start_seconds_count{pool="miss",tier="fake"} 2`},
		{"from a warm pool", true, `moat_sandbox_start_seconds_count{pool="hit",tier="fake"} 2`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.be.PoolHits = tc.poolHits
			e.createSandbox(tokenA, nil)
			e.must(http.StatusOK, req{method: "POST", path: "/v1/runs", token: tokenA, body: map[string]any{"argv": []string{"echo", "hi"}}})
			out := string(e.must(http.StatusOK, req{method: "GET", path: "/metrics", token: tokenAdmin}).body)
			if !strings.Contains(out, tc.want) {
				t.Errorf("lacks %q:\n%s", tc.want, out)
			}
			if strings.Count(out, "moat_sandbox_start_seconds_count{") != 1 {
				t.Errorf("want one start series:\n%s", out)
			}
		})
	}
}

// TestMetricsScope: a metrics key reads GET /metrics and nothing else; a
// tenant's key still may not read it.
func TestMetricsScope(t *testing.T) {
	const tokenMetrics = "moat_kmetrics_secret"
	e := newEnv(t, nil)
	e.au.AddKey(tokenMetrics, audit.Key{ID: "kmetrics", Name: "scraper", Quota: audit.DefaultQuota, Scope: audit.ScopeMetrics})
	tests := []struct {
		name         string
		method, path string
		token        string
		body         any
		status       int
	}{
		{"a metrics key reads /metrics", "GET", "/metrics", tokenMetrics, nil, 200},
		{"an admin key reads /metrics", "GET", "/metrics", tokenAdmin, nil, 200},
		{"a tenant's key does not", "GET", "/metrics", tokenA, nil, 403},
		{"a metrics key lists no sandboxes", "GET", "/v1/sandboxes", tokenMetrics, nil, 401},
		{"a metrics key creates none", "POST", "/v1/sandboxes", tokenMetrics, map[string]any{}, 401},
		{"a metrics key runs nothing", "POST", "/v1/runs", tokenMetrics, map[string]any{"argv": []string{"echo", "hi"}}, 401},
		{"a metrics key reads no incidents", "GET", "/v1/incidents", tokenMetrics, nil, 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: tc.method, path: tc.path, token: tc.token, body: tc.body})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
		})
	}
	if live, created, runs, _ := e.be.Counts(); live+created+runs != 0 {
		t.Errorf("the metrics key reached the backend: %d live, %d created, %d runs", live, created, runs)
	}
}

// TestAccessLogDashboard: the dashboard's requests are in the access log
// under its route, with the id of the admin key its session is for.
func TestAccessLogDashboard(t *testing.T) {
	store, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	token, admin, err := store.CreateAdminKey("operator", audit.DefaultQuota)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	srv, err := New(Config{Backend: &servicetest.Backend{Dir: t.TempDir()}, Auditor: store, Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		hs.Close()
		srv.Shutdown(t.Context())
	})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	login, _ := http.NewRequest("POST", hs.URL+"/dashboard/login", strings.NewReader(url.Values{"key": {token}}.Encode()))
	login.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	login.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := client.Do(login)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == dashboard.CookieName {
			cookie = c
		}
	}
	if cookie == nil {
		t.Fatalf("login: %d, no session cookie", resp.StatusCode)
	}
	tests := []struct {
		name    string
		session bool
		status  int
		key     string
	}{
		{"with a session", true, 200, admin.ID},
		{"without one", false, 401, "-"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rq, _ := http.NewRequest("GET", hs.URL+"/dashboard/api/session", nil)
			if tc.session {
				rq.AddCookie(cookie)
			}
			resp, err := client.Do(rq)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			id := resp.Header.Get("X-Request-Id")
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			var line map[string]any
			waitFor(t, "the access-log line", func() bool {
				for _, l := range accessLines(t, logs) {
					if l["request_id"] == id {
						line = l
					}
				}
				return line != nil
			})
			if line["route"] != dashboard.Prefix || line["key"] != tc.key || line["status"] != float64(tc.status) {
				t.Errorf("line %v; want route %s, key %s, status %d", line, dashboard.Prefix, tc.key, tc.status)
			}
		})
	}
	if strings.Contains(logs.String(), token) {
		t.Errorf("the log holds the key:\n%s", logs.String())
	}
}
