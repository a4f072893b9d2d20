package dashboard

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// env is a dashboard over a real audit store and the service's fake
// backend, behind an httptest server.
type env struct {
	t      *testing.T
	d      *Dashboard
	svc    *service.Service
	store  *audit.Store
	hs     *httptest.Server
	admin  string // token
	adminK audit.Key
	tenant string
	tenK   audit.Key
	clock  time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	store, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := &env{t: t, store: store, clock: time.Now()}
	if e.admin, e.adminK, err = store.CreateAdminKey("operator", audit.DefaultQuota); err != nil {
		t.Fatal(err)
	}
	if e.tenant, e.tenK, err = store.CreateKey("tenant", audit.DefaultQuota); err != nil {
		t.Fatal(err)
	}
	be := &servicetest.Backend{Dir: t.TempDir()}
	svc, err := service.New(service.Config{Backend: be, Auditor: store, Logger: slog.New(slog.DiscardHandler), ReapInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		svc.Shutdown(ctx)
	})
	e.svc = svc
	d, err := New(Config{Service: svc, Authenticate: store.Authenticate, Records: store, Logger: slog.New(slog.DiscardHandler),
		now: func() time.Time { return e.clock }})
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
	e.hs = httptest.NewServer(d)
	t.Cleanup(e.hs.Close)
	return e
}

// login posts token through the form and returns the session cookie
// (nil when refused) and the answer's status.
func (e *env) login(token string) (*http.Cookie, int) {
	e.t.Helper()
	rq, _ := http.NewRequest("POST", e.hs.URL+"/dashboard/login", strings.NewReader(url.Values{"key": {token}}.Encode()))
	rq.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rq.Header.Set("Origin", e.hs.URL)
	resp, err := noRedirect.Do(rq)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			return c, resp.StatusCode
		}
	}
	return nil, resp.StatusCode
}

var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type call struct {
	method, path string
	cookie       *http.Cookie
	header       map[string]string
	body         string
}

func (e *env) do(c call) (*http.Response, string) {
	e.t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	rq, _ := http.NewRequest(c.method, e.hs.URL+c.path, body)
	if c.cookie != nil {
		rq.AddCookie(c.cookie)
	}
	for k, v := range c.header {
		rq.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(rq)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (e *env) csrfOf(c *http.Cookie) string {
	e.t.Helper()
	resp, body := e.do(call{method: "GET", path: "/dashboard/api/session", cookie: c})
	if resp.StatusCode != 200 {
		e.t.Fatalf("session: %d %s", resp.StatusCode, body)
	}
	var s Session
	json.Unmarshal([]byte(body), &s)
	return s.CSRF
}

func TestLogin(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name       string
		token      string
		wantStatus int
		wantCookie bool
	}{
		{"admin key", e.admin, http.StatusSeeOther, true},
		{"tenant key", e.tenant, http.StatusForbidden, false},
		{"unknown key", "moat_k000000000000_0000", http.StatusUnauthorized, false},
		{"empty", "", http.StatusUnauthorized, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, code := e.login(tc.token)
			if code != tc.wantStatus || (c != nil) != tc.wantCookie {
				t.Fatalf("login: status %d, cookie %v; want %d, cookie %v", code, c != nil, tc.wantStatus, tc.wantCookie)
			}
			if c == nil {
				return
			}
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/dashboard" {
				t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/dashboard", c)
			}
			if strings.Contains(c.Value, tc.token) || strings.Contains(c.Value, strings.Split(tc.token, "_")[2]) {
				t.Errorf("cookie %q carries the key", c.Value)
			}
		})
	}
	t.Run("cross-site login refused", func(t *testing.T) {
		resp, _ := e.do(call{method: "POST", path: "/dashboard/login", body: "key=" + url.QueryEscape(e.admin),
			header: map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "cross-site"}})
		if resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
			t.Errorf("cross-site login: %d, cookies %v", resp.StatusCode, resp.Cookies())
		}
	})
}

func TestSession(t *testing.T) {
	e := newEnv(t)
	good, _ := e.login(e.admin)
	if good == nil {
		t.Fatal("admin login gave no cookie")
	}
	forged := *good
	forged.Value = strings.Replace(good.Value, e.adminK.ID, e.tenK.ID, 1)
	tampered := *good
	tampered.Value = good.Value[:len(good.Value)-2] + "AA"
	// A cookie for the tenant key signed right (as if the secret leaked
	// through a bug elsewhere) is still refused: the key is not admin.
	tenantSigned := &http.Cookie{Name: CookieName, Value: e.d.newCookie(e.tenK.ID)}
	tests := []struct {
		name   string
		path   string
		cookie *http.Cookie
		want   int
	}{
		{"page without cookie redirects to login", "/dashboard/", nil, http.StatusSeeOther},
		{"script without cookie", "/dashboard/app.js", nil, http.StatusUnauthorized},
		{"stylesheet without cookie", "/dashboard/app.css", nil, http.StatusUnauthorized},
		{"api without cookie", "/dashboard/api/runs", nil, http.StatusUnauthorized},
		{"login form is public", "/dashboard/login", nil, http.StatusOK},
		{"page with session", "/dashboard/", good, http.StatusOK},
		{"script with session", "/dashboard/app.js", good, http.StatusOK},
		{"api with session", "/dashboard/api/runs", good, http.StatusOK},
		{"other key id in the cookie", "/dashboard/api/runs", &forged, http.StatusUnauthorized},
		{"tampered signature", "/dashboard/api/runs", &tampered, http.StatusUnauthorized},
		{"tenant key session", "/dashboard/api/runs", tenantSigned, http.StatusUnauthorized},
		{"unknown page", "/dashboard/nope", good, http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do(call{method: "GET", path: tc.path, cookie: tc.cookie})
			if resp.StatusCode != tc.want {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, resp.StatusCode, body, tc.want)
			}
			if tc.want == http.StatusSeeOther && resp.Header.Get("Location") != "/dashboard/login" {
				t.Errorf("redirect to %q", resp.Header.Get("Location"))
			}
			for h, v := range map[string]string{"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
				"Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
				if got := resp.Header.Get(h); got != v {
					t.Errorf("%s: %q, want %q", h, got, v)
				}
			}
		})
	}
	t.Run("expired", func(t *testing.T) {
		e.clock = e.clock.Add(9 * time.Hour)
		defer func() { e.clock = e.clock.Add(-9 * time.Hour) }()
		if resp, _ := e.do(call{method: "GET", path: "/dashboard/api/runs", cookie: good}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("expired session: %d", resp.StatusCode)
		}
	})
	t.Run("revoked key ends the session", func(t *testing.T) {
		tok, k, err := e.store.CreateAdminKey("second", audit.DefaultQuota)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := e.login(tok)
		if resp, _ := e.do(call{method: "GET", path: "/dashboard/api/runs", cookie: c}); resp.StatusCode != 200 {
			t.Fatalf("before revocation: %d", resp.StatusCode)
		}
		if err := e.store.RevokeKey(k.ID); err != nil {
			t.Fatal(err)
		}
		if resp, _ := e.do(call{method: "GET", path: "/dashboard/api/runs", cookie: c}); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("after revocation: %d", resp.StatusCode)
		}
	})
}

// TestActions: a request that changes state needs the session, a
// same-origin request and the CSRF token.
func TestActions(t *testing.T) {
	e := newEnv(t)
	c, _ := e.login(e.admin)
	token := e.csrfOf(c)
	json := map[string]string{"Content-Type": "application/json"}
	with := func(extra map[string]string) map[string]string {
		h := map[string]string{}
		for k, v := range json {
			h[k] = v
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	tests := []struct {
		name   string
		cookie *http.Cookie
		header map[string]string
		want   int
	}{
		{"no CSRF token", c, with(map[string]string{"Sec-Fetch-Site": "same-origin"}), http.StatusForbidden},
		{"wrong CSRF token", c, with(map[string]string{"Sec-Fetch-Site": "same-origin", CSRFHeader: "x" + token}), http.StatusForbidden},
		{"cross-site", c, with(map[string]string{"Sec-Fetch-Site": "cross-site", CSRFHeader: token}), http.StatusForbidden},
		{"other origin", c, with(map[string]string{"Origin": "http://evil.example", CSRFHeader: token}), http.StatusForbidden},
		{"no origin at all", c, with(map[string]string{CSRFHeader: token}), http.StatusForbidden},
		{"no cookie", nil, with(map[string]string{"Sec-Fetch-Site": "same-origin", CSRFHeader: token}), http.StatusUnauthorized},
		{"all there: unknown approval", c, with(map[string]string{"Sec-Fetch-Site": "same-origin", CSRFHeader: token}), http.StatusNotFound},
		{"same origin by Origin", c, with(map[string]string{"Origin": e.hs.URL, CSRFHeader: token}), http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do(call{method: "POST", path: "/dashboard/api/approvals/ap-00000000", cookie: tc.cookie, header: tc.header, body: `{"approve": false}`})
			if resp.StatusCode != tc.want {
				t.Errorf("%d %s, want %d", resp.StatusCode, body, tc.want)
			}
		})
	}
	t.Run("GET cannot decide", func(t *testing.T) {
		if resp, _ := e.do(call{method: "GET", path: "/dashboard/api/approvals/ap-00000000", cookie: c}); resp.StatusCode == 200 {
			t.Errorf("GET on the decision: %d", resp.StatusCode)
		}
	})
}

// TestApproveAcrossKeys: a tenant's held run is listed for the admin and
// approved from the dashboard; it runs as the tenant's key.
func TestApproveAcrossKeys(t *testing.T) {
	e := newEnv(t)
	c, _ := e.login(e.admin)
	token := e.csrfOf(c)
	m := manifest.Default()
	_, err := e.svc.Run(t.Context(), e.tenK, service.RunArgs{Manifest: m, Argv: []string{"sh", "-c", "curl -fsSL https://e.com/i.sh | sh"}})
	var se *service.Error
	if !errorsAs(err, &se) || se.Held == nil {
		t.Fatalf("run was not held: %v", err)
	}
	_, body := e.do(call{method: "GET", path: "/dashboard/api/approvals", cookie: c})
	if !strings.Contains(body, se.Held.ID) || !strings.Contains(body, e.tenK.ID) {
		t.Fatalf("approvals %s lack %s of key %s", body, se.Held.ID, e.tenK.ID)
	}
	// The tenant's own view is unchanged: the admin's pending list is
	// not the tenant's.
	if got := e.svc.ListApprovals(t.Context(), e.adminK); len(got) != 0 {
		t.Errorf("the admin key's own approvals: %v", got)
	}
	resp, body := e.do(call{method: "POST", path: "/dashboard/api/approvals/" + se.Held.ID, cookie: c, body: `{"approve": true, "reason": "checked i.sh"}`,
		header: map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "same-origin", CSRFHeader: token}})
	if resp.StatusCode != 200 {
		t.Fatalf("approve: %d %s", resp.StatusCode, body)
	}
	var out service.ApprovalOutcome
	if err := json.Unmarshal([]byte(body), &out); err != nil || out.Run == nil || out.Approval.State != service.ApprovalApproved {
		t.Fatalf("outcome %s: %v", body, err)
	}
	rec, err := e.store.Get(out.Run.ID)
	if err != nil || rec.KeyID != e.tenK.ID {
		t.Errorf("the approved run's record %+v (%v): want key %s", rec, err, e.tenK.ID)
	}
	ap, err := e.store.Get(se.Held.ID)
	if err != nil || !strings.Contains(ap.Error, "by admin key "+e.adminK.ID) {
		t.Errorf("approval record %+v (%v) does not name the admin", ap, err)
	}
	// The run's page shows its output.
	_, body = e.do(call{method: "GET", path: "/dashboard/api/runs/" + out.Run.ID, cookie: c})
	var v RunView
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Result == nil || !strings.Contains(v.Stdout, "curl") {
		t.Errorf("run view %s: %v", body, err)
	}
}

func errorsAs(err error, se **service.Error) bool {
	e, ok := err.(*service.Error)
	if ok {
		*se = e
	}
	return ok
}

// TestHostileOutput: what a program writes reaches the page escaped.
// (Bytes that are not UTF-8: TestInert and TestStreamText; the fake
// backend does not base64 them as the engine does.)
func TestHostileOutput(t *testing.T) {
	e := newEnv(t)
	c, _ := e.login(e.admin)
	hostile := "<script>window.__pwned=1</script><img src=x onerror=alert(1)>\x1b]52;c;aGk=\x07\x1b]8;;http://evil/\x07link\x1b]8;;\x07\u202etxt.exe\x00"
	resp, err := e.svc.Run(t.Context(), e.adminK, service.RunArgs{Manifest: manifest.Default(),
		Argv: []string{"fake", "raw:" + hexOf(hostile)}})
	if err != nil {
		t.Fatal(err)
	}
	_, body := e.do(call{method: "GET", path: "/dashboard/api/runs/" + resp.ID, cookie: c})
	var v RunView
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
	}{
		{"markup stays text", "<script>window.__pwned=1</script><img src=x onerror=alert(1)>"},
		{"OSC 52 escaped", `\x1b]52;c;aGk=\x07`},
		{"OSC 8 escaped", `\x1b]8;;http://evil/\x07link`},
		{"bidi override escaped", `\u202etxt.exe`},
		{"NUL escaped", `\x00`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(v.Stdout, tc.want) {
				t.Errorf("stdout %q lacks %q", v.Stdout, tc.want)
			}
		})
	}
	for _, bad := range []string{"\x1b", "\x00", "\u202e", "\x07"} {
		if strings.Contains(body, bad) {
			t.Errorf("the JSON carries %q raw", bad)
		}
	}
}

func hexOf(s string) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		out = append(out, digits[s[i]>>4], digits[s[i]&15])
	}
	return string(out)
}

func TestInert(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"plain", "hello world", "hello world"},
		{"newline and tab kept", "a\n\tb", "a\n\tb"},
		{"CSI", "\x1b[31mred", `\x1b[31mred`},
		{"OSC 52", "\x1b]52;c;aGk=\x07", `\x1b]52;c;aGk=\x07`},
		{"C1 CSI", "\u009b31m", `\u009b31m`},
		{"bidi", "a\u202eb\u2066c", `a\u202eb\u2066c`},
		{"NUL", "a\x00b", `a\x00b`},
		{"bare CR", "safe\rEVIL", `safe\rEVIL`},
		{"invalid UTF-8", "a\xffb", `a\xffb`},
		{"markup is left to textContent", "<b>x</b>", "<b>x</b>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Inert(tc.in); got != tc.want {
				t.Errorf("Inert(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
	t.Run("object keys too", func(t *testing.T) {
		rec := httptest.NewRecorder()
		writeJSON(rec, 200, map[string]map[string]string{"m": {"\x1b]0;title\x07": "\u202ev"}})
		if b := rec.Body.String(); strings.Contains(b, "\x1b") || strings.Contains(b, "\u202e") || !strings.Contains(b, `\\x1b]0;title\\x07`) {
			t.Errorf("body %q", b)
		}
	})
}

func TestNetworkAndTimeline(t *testing.T) {
	since := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	at := func(h int) time.Time { return since.Add(time.Duration(h)*time.Hour + time.Minute) }
	recs := []audit.Record{
		{ID: "r1", Kind: audit.KindRun, Started: at(0), Network: []result.NetworkAttempt{
			{Host: "pypi.org", Port: 443, Allowed: true, Reason: "allowed", Time: at(0)},
			{Host: "evil.example", Port: 443, Reason: "not-allowlisted", Time: at(0)},
		}},
		{ID: "r2", Kind: audit.KindExec, Started: at(5), Violations: []result.Violation{{Kind: "memory"}},
			NetworkSummary: &result.NetworkSummary{Omitted: 3, OmittedDestinations: []result.NetworkDestination{{Host: "evil.example", Port: 443, Reason: "limit-log", Count: 3}}}},
		{ID: "s1", Kind: audit.KindSandbox, Started: at(5)},
		{ID: "old", Kind: audit.KindRun, Started: since.Add(-time.Hour)},
	}
	n := networkOf(recs)
	want := map[string][2]int{"pypi.org": {1, 0}, "evil.example": {0, 4}}
	if len(n.Destinations) != 2 {
		t.Fatalf("destinations %+v", n.Destinations)
	}
	for _, d := range n.Destinations {
		if w := want[d.Host]; d.Allowed != w[0] || d.Denied != w[1] {
			t.Errorf("%s: allowed %d denied %d, want %v", d.Host, d.Allowed, d.Denied, w)
		}
	}
	if n.Destinations[0].Host != "evil.example" || n.Destinations[0].Reasons["limit-log"] != 3 {
		t.Errorf("first destination %+v", n.Destinations[0])
	}
	tl := timelineOf(recs, since)
	tests := []struct {
		name                            string
		hour, runs, denials, violations int
	}{
		{"first hour", 0, 1, 1, 0},
		{"sixth hour: the sandbox record does not count", 5, 1, 3, 1},
		{"empty hour", 3, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := tl.Buckets[tc.hour]
			if b.Runs != tc.runs || b.Denials != tc.denials || b.Violations != tc.violations {
				t.Errorf("bucket %+v, want runs %d denials %d violations %d", b, tc.runs, tc.denials, tc.violations)
			}
		})
	}
}

// FuzzInert: whatever a program writes, what the dashboard sends has no
// control, bidi or invalid byte left, and sanitising twice changes
// nothing more.
func FuzzInert(f *testing.F) {
	for _, s := range []string{"plain", "\x1b]52;c;aGk=\x07", "<script>x</script>", "\u202e\u2066", "\x00\xff\r\n", "\u009b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Inert(s)
		for _, r := range got {
			if (r < 0x20 && r != '\n' && r != '\t' && r != '\r') || r == 0x7f || (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069) || r == 0xfffd && !strings.ContainsRune(s, 0xfffd) {
				t.Fatalf("Inert(%q) = %q keeps %U", s, got, r)
			}
		}
		if again := Inert(got); again != got {
			t.Fatalf("Inert is not idempotent on %q: %q then %q", s, got, again)
		}
	})
}

// FuzzSessionCookie: no cookie value but one the dashboard signed is
// accepted.
func FuzzSessionCookie(f *testing.F) {
	d, err := New(Config{Service: &service.Service{}, Authenticate: func(string) (audit.Key, error) { return audit.Key{}, audit.ErrBadKey },
		Records: (*audit.Store)(nil), Secret: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		f.Fatal(err)
	}
	good := d.newCookie("k0123456789ab")
	f.Add(good)
	f.Add(strings.Replace(good, "k0123456789ab", "k0123456789ac", 1))
	f.Add("k.1.x.y")
	f.Add("")
	f.Fuzz(func(t *testing.T, v string) {
		tok, ok := d.parseCookie(v)
		if !ok {
			return
		}
		payload, mac, _ := cutLast(v, ".")
		if mac != d.sign("session\x00"+payload) || tok.keyID == "" {
			t.Fatalf("accepted %q", v)
		}
	})
}

func TestStreamText(t *testing.T) {
	tests := []struct {
		name string
		in   result.Stream
		want string
	}{
		{"utf-8", result.Stream{Data: "a\x1b[2J", Encoding: "utf-8"}, `a\x1b[2J`},
		{"base64 of bytes that are not UTF-8", result.Stream{Data: "Yf9i", Encoding: "base64"}, `a\xffb`},
		{"bad base64", result.Stream{Data: "!!", Encoding: "base64"}, "(undecodable base64 output)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Inert(streamText(tc.in)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRunView: a run's page has its output while the server holds it: a
// one-shot run's, a command's of a live sandbox; a session record has
// none.
func TestRunView(t *testing.T) {
	e := newEnv(t)
	c, _ := e.login(e.admin)
	ctx := t.Context()
	run, err := e.svc.Run(ctx, e.tenK, service.RunArgs{Manifest: manifest.Default(), Argv: []string{"fake", "out:from-run", "err:run-err"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := e.svc.CreateSandbox(ctx, e.tenK, service.SandboxArgs{Manifest: manifest.Default()})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := e.svc.RunExec(ctx, e.tenK, sb.ID, service.ExecArgs{Argv: []string{"fake", "out:from-exec"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, id, stdout, stderr string
		result                   bool
	}{
		{"one-shot run", run.ID, "from-run\n", "run-err\n", true},
		{"command of a live sandbox", sb.ID + "-" + ex.ID, "from-exec\n", "", true},
		{"session record", sb.ID, "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do(call{method: "GET", path: "/dashboard/api/runs/" + tc.id, cookie: c})
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			var v RunView
			if err := json.Unmarshal([]byte(body), &v); err != nil {
				t.Fatal(err)
			}
			if v.Record.ID != tc.id || (v.Result != nil) != tc.result || v.Stdout != tc.stdout || v.Stderr != tc.stderr {
				t.Errorf("view of %s: record %s, result %v, stdout %q, stderr %q", tc.id, v.Record.ID, v.Result != nil, v.Stdout, v.Stderr)
			}
		})
	}
	if resp, _ := e.do(call{method: "GET", path: "/dashboard/api/runs/nope", cookie: c}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown run: %d", resp.StatusCode)
	}
	if _, err := e.svc.DeleteSandbox(ctx, e.tenK, sb.ID); err != nil {
		t.Fatal(err)
	}
}
