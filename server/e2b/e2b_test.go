package e2b

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/server"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

const keyA, keyB = "moat_ka_secret", "moat_kb_secret"

type env struct {
	t    *testing.T
	url  string
	b    *servicetest.Backend
	h    *Handler
	api  *server.Server
	keys *fakeKeys
	au   *servicetest.Auditor
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// The host's images: "base" is none of them, so it maps to python.
	return newEnvWith(t, []string{"node", "python"}, nil)
}

// newEnvWith is newEnv on a host with the given images, hasImage being the
// handler's Config.HasImage.
func newEnvWith(t *testing.T, images []string, hasImage func(string) bool) *env {
	t.Helper()
	return newEnvPolicy(t, images, hasImage, nil)
}

// newEnvPolicy is newEnvWith under the operator policy pol (nil: none).
func newEnvPolicy(t *testing.T, images []string, hasImage func(string) bool, pol *policy.Policy) *env {
	t.Helper()
	return newEnvConfig(t, images, hasImage, pol, nil)
}

// newEnvConfig is newEnvPolicy with the handler's Config changed by
// configure (nil: as is).
func newEnvConfig(t *testing.T, images []string, hasImage func(string) bool, pol *policy.Policy, configure func(*Config)) *env {
	t.Helper()
	b := &servicetest.Backend{Dir: t.TempDir(), Images: images}
	au := servicetest.NewAuditor()
	for token, k := range keys {
		au.AddKey(token, k)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	api, err := server.New(server.Config{Backend: b, Auditor: au, Logger: log, MaxBodyBytes: 1 << 16,
		ReapInterval: 20 * time.Millisecond, Policy: pol, SnapshotDir: filepath.Join(t.TempDir(), "snapshots")})
	if err != nil {
		t.Fatal(err)
	}
	fk := &fakeKeys{revoked: map[string]bool{}}
	cfg := Config{Service: api.Service(), Auditor: au, Keys: fk, Domain: "moat.test", Logger: log, MaxBodyBytes: 1 << 16, HasImage: hasImage}
	if configure != nil {
		configure(&cfg)
	}
	h := New(cfg)
	ts := httptest.NewServer(h.Wrap(api.Handler()))
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		api.Shutdown(ctx)
		if n, _, _, _ := b.Counts(); n != 0 {
			t.Errorf("%d sandboxes left after shutdown", n)
		}
	})
	return &env{t: t, url: ts.URL, b: b, h: h, api: api, keys: fk, au: au}
}

// live is how many of the fake backend's sandboxes are not yet closed.
func (e *env) live() int {
	n, _, _, _ := e.b.Counts()
	return n
}

// session is the fake backend's session id.
func (e *env) session(id string) *servicetest.Session {
	e.t.Helper()
	for _, s := range e.b.Sessions() {
		if s.ID() == id {
			return s
		}
	}
	e.t.Fatalf("no session %s", id)
	return nil
}

// alive reports whether key keyID's Moat sandbox id is live (running), as
// the service sees it.
func (e *env) alive(keyID, id string) bool {
	sb, err := e.api.Service().GetSandbox(context.Background(), audit.Key{ID: keyID}, id)
	return err == nil && sb.State == service.StateRunning
}

func (e *env) do(method, path string, hdr map[string]string, body io.Reader) (*http.Response, []byte) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, data
}

func (e *env) control(method, path, key, body string) (int, []byte) {
	e.t.Helper()
	hdr := map[string]string{"Content-Type": "application/json"}
	if key != "" {
		hdr["X-API-Key"] = key
	}
	resp, data := e.do(method, path, hdr, strings.NewReader(body))
	return resp.StatusCode, data
}

func (e *env) create(key, body string) created {
	e.t.Helper()
	status, data := e.control("POST", "/v2/sandboxes", key, body)
	if status != http.StatusCreated {
		e.t.Fatalf("create: %d %s", status, data)
	}
	var c created
	if err := json.Unmarshal(data, &c); err != nil {
		e.t.Fatal(err)
	}
	return c
}

func envdHeaders(c created) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": c.SandboxID, "E2b-Sandbox-Port": EnvdPort, "X-Access-Token": c.EnvdAccessToken}
}

// unary calls a Connect method with a JSON message.
func (e *env) unary(c created, method string, msg any) (int, map[string]any) {
	e.t.Helper()
	data, _ := json.Marshal(msg)
	hdr := envdHeaders(c)
	hdr["Content-Type"] = "application/json"
	hdr["Connect-Protocol-Version"] = "1"
	resp, body := e.do("POST", "/"+method, hdr, bytes.NewReader(data))
	var out map[string]any
	json.Unmarshal(body, &out)
	return resp.StatusCode, out
}

// serverStream calls a server-streaming method and returns its messages
// and the end-of-stream message.
func (e *env) serverStream(c created, method string, msg any) (msgs []map[string]any, end map[string]any) {
	e.t.Helper()
	data, _ := json.Marshal(msg)
	var buf bytes.Buffer
	buf.WriteByte(0)
	binary.Write(&buf, binary.BigEndian, uint32(len(data)))
	buf.Write(data)
	hdr := envdHeaders(c)
	hdr["Content-Type"] = "application/connect+json"
	resp, body := e.do("POST", "/"+method, hdr, &buf)
	if resp.StatusCode != 200 {
		e.t.Fatalf("%s: status %d %s", method, resp.StatusCode, body)
	}
	r := bytes.NewReader(body)
	for {
		flags, m, err := readEnvelope(r)
		if err != nil {
			e.t.Fatalf("%s: stream without an end message: %v", method, err)
		}
		var v map[string]any
		if err := json.Unmarshal(m, &v); err != nil {
			e.t.Fatalf("%s: message %q: %v", method, m, err)
		}
		if flags&flagEndStream != 0 {
			return msgs, v
		}
		msgs = append(msgs, v)
	}
}

func wantE2BError(t *testing.T, what string, status int, body []byte, want int) {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(body, &e); status != want || err != nil || e.Code != want || e.Message == "" {
		t.Errorf("%s: %d %s, want %d with {code, message}", what, status, body, want)
	}
}

func TestControlPlane(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","timeout":60,"metadata":{"team":"x","n":"1"},"envVars":{"WHO":"me"}}`)
	if c.EnvdVersion == "" || len(c.EnvdAccessToken) != 64 || c.TemplateID != "base" || c.Domain == nil || *c.Domain != "moat.test" {
		t.Errorf("created: %+v", c)
	}
	e.create(keyA, `{"templateID":"base","metadata":{"team":"y"}}`)
	e.create(keyA, `{"templateID":"base","metadata":{"team":"x"}}`)
	e.create(keyB, `{"templateID":"base","metadata":{"team":"x"}}`)

	// The manifest Moat got.
	if env := e.b.Sessions()[0].Manifest().Env; env["WHO"] != "me" {
		t.Errorf("envVars did not reach the manifest: %v", env)
	}

	t.Run("get", func(t *testing.T) {
		status, body := e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
		var l listed
		json.Unmarshal(body, &l)
		if status != 200 || l.SandboxID != c.SandboxID || l.State != "running" || l.Metadata["team"] != "x" || l.EnvdAccessToken != c.EnvdAccessToken {
			t.Errorf("get: %d %s", status, body)
		}
		if left := time.Until(l.EndAt); left < 50*time.Second || left > 61*time.Second {
			t.Errorf("endAt in %s, want about 60s", left)
		}
	})
	t.Run("list", func(t *testing.T) {
		tests := []struct {
			name, query string
			want        int
			status      int
		}{
			{"all of the key's", "", 3, 200},
			{"metadata", "?metadata=team%3Dx", 2, 200},
			{"two metadata pairs", "?metadata=team%3Dx%26n%3D1", 1, 200},
			{"no match", "?metadata=team%3Dz", 0, 200},
			{"running", "?state=running", 3, 200},
			{"paused", "?state=paused", 0, 200},
			{"bad state", "?state=sleeping", 0, 400},
			{"bad limit", "?limit=0", 0, 400},
			{"bad token", "?nextToken=nope", 0, 400},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				status, body := e.control("GET", "/v2/sandboxes"+tc.query, keyA, "")
				if status != tc.status {
					t.Fatalf("%d %s, want %d", status, body, tc.status)
				}
				if status != 200 {
					wantE2BError(t, tc.name, status, body, tc.status)
					return
				}
				var l []listed
				json.Unmarshal(body, &l)
				if len(l) != tc.want {
					t.Errorf("%d sandboxes, want %d: %s", len(l), tc.want, body)
				}
			})
		}
	})
	t.Run("pagination", func(t *testing.T) {
		seen := map[string]bool{}
		token := ""
		for page := 0; page < 5; page++ {
			q := "?limit=2"
			if token != "" {
				q += "&nextToken=" + token
			}
			resp, body := e.do("GET", "/v2/sandboxes"+q, map[string]string{"X-API-Key": keyA}, nil)
			var l []listed
			json.Unmarshal(body, &l)
			for _, s := range l {
				if seen[s.SandboxID] {
					t.Errorf("%s on two pages", s.SandboxID)
				}
				seen[s.SandboxID] = true
			}
			if token = resp.Header.Get("X-Next-Token"); token == "" {
				break
			}
		}
		if len(seen) != 3 {
			t.Errorf("pages gave %d sandboxes, want 3", len(seen))
		}
	})
	t.Run("timeout", func(t *testing.T) {
		status, body := e.control("POST", "/sandboxes/"+c.SandboxID+"/timeout", keyA, `{"timeout":600}`)
		if status != http.StatusNoContent {
			t.Fatalf("%d %s", status, body)
		}
		_, body = e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
		var l listed
		json.Unmarshal(body, &l)
		if left := time.Until(l.EndAt); left < 590*time.Second {
			t.Errorf("endAt in %s after timeout 600", left)
		}
	})
	t.Run("connect", func(t *testing.T) {
		status, body := e.control("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", keyA, `{"timeout":300}`)
		var again created
		json.Unmarshal(body, &again)
		if status != 200 || again.EnvdAccessToken != c.EnvdAccessToken {
			t.Errorf("connect: %d %s", status, body)
		}
	})
	t.Run("refused", func(t *testing.T) {
		_, before, _, _ := e.b.Counts()
		tests := []struct {
			name, method, path, key, body string
			status                        int
		}{
			{"no key", "POST", "/v2/sandboxes", "", `{"templateID":"base"}`, 401},
			{"wrong key", "POST", "/v2/sandboxes", "moat_kx_nope", `{"templateID":"base"}`, 401},
			{"unknown field", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","cpu":4}`, 400},
			{"not json", "POST", "/v2/sandboxes", keyA, `templateID=base`, 400},
			{"template", "POST", "/v2/sandboxes", keyA, `{"templateID":"desktop"}`, 400},
			{"negative timeout", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","timeout":-1}`, 400},
			{"ttl over Moat's max", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","timeout":999999999}`, 400},
			{"auto pause with memory", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","autoPause":true,"autoPauseMemory":true}`, 400},
			{"auto resume", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","autoResume":{"enabled":true}}`, 400},
			{"auto resume, unknown field", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","autoResume":{"on":true}}`, 400},
			{"mcp", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","mcp":{"x":{}}}`, 400},
			{"volumes", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`, 400},
			{"narrow deny", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","network":{"denyOut":["10.0.0.0/8"]}}`, 400},
			{"mask request host", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","network":{"maskRequestHost":"x"}}`, 400},
			{"allow and no internet", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","allow_internet_access":false,"network":{"allowOut":["example.com"]}}`, 400},
			{"bad allow host", "POST", "/v2/sandboxes", keyA, `{"templateID":"base","network":{"allowOut":["not a host!"]}}`, 400},
			{"other key's get", "GET", "/sandboxes/" + c.SandboxID, keyB, "", 404},
			{"other key's kill", "DELETE", "/sandboxes/" + c.SandboxID, keyB, "", 404},
			{"other key's timeout", "POST", "/sandboxes/" + c.SandboxID + "/timeout", keyB, `{"timeout":5}`, 404},
			{"other key's connect", "POST", "/v2/sandboxes/" + c.SandboxID + "/connect", keyB, `{}`, 404},
			{"never existed", "GET", "/sandboxes/nope", keyA, "", 404},
			{"never existed kill", "DELETE", "/sandboxes/nope", keyA, "", 404},
			{"unknown route", "POST", "/sandboxes/" + c.SandboxID + "/no-such-route", keyA, "", 501},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				status, body := e.control(tc.method, tc.path, tc.key, tc.body)
				wantE2BError(t, tc.name, status, body, tc.status)
			})
		}
		if _, n, _, _ := e.b.Counts(); n != before {
			t.Errorf("refused requests created %d sandboxes", n-before)
		}
		if ok := e.alive("ka", c.SandboxID); !ok {
			t.Error("another key's kill ended the sandbox")
		}
	})
	t.Run("allowlist", func(t *testing.T) {
		e.create(keyB, `{"templateID":"base","network":{"allowOut":["example.com","192.0.2.0/24"],"denyOut":["0.0.0.0/0"]}}`)
		n := e.b.Sessions()[len(e.b.Sessions())-1].Manifest().Network
		if n.Mode != "allowlist" || !slices.Equal(n.Allow, []string{"example.com"}) || !slices.Equal(n.AllowAddresses, []string{"192.0.2.0/24"}) {
			t.Errorf("network: %+v", n)
		}
	})
	t.Run("kill", func(t *testing.T) {
		status, body := e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
		if status != http.StatusNoContent {
			t.Fatalf("kill: %d %s", status, body)
		}
		status, body = e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
		wantE2BError(t, "get after kill", status, body, 404)
		if ok := e.alive("ka", c.SandboxID); ok {
			t.Error("the Moat sandbox outlived its E2B kill")
		}
		// Its token is dead with it.
		resp, _ := e.do("GET", "/health", envdHeaders(c), nil)
		if resp.StatusCode != http.StatusBadGateway {
			t.Errorf("envd health of a killed sandbox: %d, want 502", resp.StatusCode)
		}
	})
	t.Run("health", func(t *testing.T) {
		resp, _ := e.do("GET", "/health", nil, nil)
		if resp.StatusCode != 200 {
			t.Errorf("health %d", resp.StatusCode)
		}
	})
}

func TestTimeoutDestroys(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","timeout":1}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok := e.alive("ka", c.SandboxID); !ok && e.live() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a sandbox with timeout 1 was not destroyed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := e.h.Boxes(); n != 0 {
		t.Errorf("%d E2B records left after the timeout", n)
	}
}

func TestEnvdAccess(t *testing.T) {
	e := newEnv(t)
	a := e.create(keyA, `{"templateID":"base"}`)
	b := e.create(keyB, `{"templateID":"base"}`)
	stat := func(hdr map[string]string) int {
		hdr["Content-Type"] = "application/json"
		resp, _ := e.do("POST", "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path":"/home/user"}`))
		return resp.StatusCode
	}
	tests := []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"own token", envdHeaders(a), 200},
		{"no token", map[string]string{"E2b-Sandbox-Id": a.SandboxID}, 401},
		{"another sandbox's token", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "X-Access-Token": b.EnvdAccessToken}, 401},
		{"never existed", map[string]string{"E2b-Sandbox-Id": "nope", "X-Access-Token": a.EnvdAccessToken}, 502},
		{"other port", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "8080", "X-Access-Token": a.EnvdAccessToken}, 502},
		{"by host name", map[string]string{"Host": "49983-" + a.SandboxID + ".moat.test", "X-Access-Token": a.EnvdAccessToken}, 200},
		{"by host name, wrong token", map[string]string{"Host": "49983-" + a.SandboxID + ".moat.test", "X-Access-Token": b.EnvdAccessToken}, 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := stat(tc.hdr); got != tc.want {
				t.Errorf("status %d, want %d", got, tc.want)
			}
		})
	}
}

func TestWorkspacePath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"/home/user", ".", true},
		{"/home/user/", ".", true},
		{"/home/user/a/b.txt", "a/b.txt", true},
		{"a/b.txt", "a/b.txt", true},
		{"/workspace/a", "a", true},
		{"/home/user/a/../b", "b", true},
		{"/home/user/../../etc/passwd", "", false},
		{"../x", "", false},
		{"/etc/passwd", "", false},
		{"/home/userx/a", "", false},
		{"/", "", false},
		{"", "", false},
		{"a\x00b", "", false},
	}
	for _, tc := range tests {
		got, e := workspacePath("path", tc.in)
		if (e == nil) != tc.ok || got != tc.want {
			t.Errorf("workspacePath(%q) = %q, %v; want %q ok=%v", tc.in, got, e, tc.want, tc.ok)
		}
	}
}

func TestFilesystem(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	call := func(method string, msg any, want int) map[string]any {
		t.Helper()
		status, out := e.unary(c, "filesystem.Filesystem/"+method, msg)
		if status != want {
			t.Fatalf("%s %v: status %d %v, want %d", method, msg, status, out, want)
		}
		return out
	}
	entry := call("MakeDir", map[string]any{"path": "/home/user/d/e"}, 200)["entry"].(map[string]any)
	if entry["type"] != "FILE_TYPE_DIRECTORY" || entry["path"] != "/home/user/d/e" {
		t.Errorf("MakeDir entry %v", entry)
	}
	if out := call("MakeDir", map[string]any{"path": "/home/user/d/e"}, 409); out["code"] != "already_exists" {
		t.Errorf("MakeDir again: %v", out)
	}
	resp, body := e.do("POST", "/files?path=/home/user/d/f.txt", map[string]string{"E2b-Sandbox-Id": c.SandboxID, "X-Access-Token": c.EnvdAccessToken, "Content-Type": "application/octet-stream"}, strings.NewReader("hello"))
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"path":"/home/user/d/f.txt"`) {
		t.Fatalf("upload: %d %s", resp.StatusCode, body)
	}
	entry = call("Stat", map[string]any{"path": "d/f.txt"}, 200)["entry"].(map[string]any)
	if entry["type"] != "FILE_TYPE_FILE" || entry["size"] != "5" || entry["name"] != "f.txt" {
		t.Errorf("Stat entry %v", entry)
	}
	list := items(call("ListDir", map[string]any{"path": "/home/user", "depth": 3}, 200), "entries")
	if len(list) != 3 {
		t.Errorf("ListDir depth 3: %v", list)
	}
	if list := items(call("ListDir", map[string]any{"path": "/home/user"}, 200), "entries"); len(list) != 1 {
		t.Errorf("ListDir depth 1: %v", list)
	}
	call("Move", map[string]any{"source": "d/f.txt", "destination": "/home/user/g.txt"}, 200)
	call("Stat", map[string]any{"path": "d/f.txt"}, 404)
	call("Remove", map[string]any{"path": "g.txt"}, 200)
	if out := call("Stat", map[string]any{"path": "g.txt"}, 404); out["code"] != "not_found" {
		t.Errorf("Stat of removed: %v", out)
	}
	for _, p := range []string{"/etc/passwd", "/home/user/../../etc", "../up"} {
		if out := call("Stat", map[string]any{"path": p}, 403); out["code"] != "permission_denied" {
			t.Errorf("Stat %q: %v", p, out)
		}
	}
	call("Remove", map[string]any{"path": "/home/user"}, 403)
	call("Move", map[string]any{"source": "/etc/passwd", "destination": "x"}, 403)
	call("Nope", map[string]any{}, 404)
}

func TestFilesREST(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	hdr := func(kv ...string) map[string]string {
		h := envdHeaders(c)
		for i := 0; i+1 < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	// multipart, each part named by its path
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	for name, data := range map[string]string{"a/one.txt": "1", "/home/user/two.txt": "22"} {
		w, _ := mw.CreateFormFile("file", name)
		io.WriteString(w, data)
	}
	mw.Close()
	resp, body := e.do("POST", "/files", hdr("Content-Type", mw.FormDataContentType()), &mp)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "/home/user/a/one.txt") || !strings.Contains(string(body), "/home/user/two.txt") {
		t.Fatalf("multipart: %d %s", resp.StatusCode, body)
	}
	// gzip octet-stream
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "0123456789")
	zw.Close()
	resp, body = e.do("POST", "/files?path=z.txt", hdr("Content-Type", "application/octet-stream", "Content-Encoding", "gzip"), &gz)
	if resp.StatusCode != 200 {
		t.Fatalf("gzip upload: %d %s", resp.StatusCode, body)
	}
	// download, whole and a range
	resp, body = e.do("GET", "/files?path=/home/user/z.txt", hdr(), nil)
	if resp.StatusCode != 200 || string(body) != "0123456789" {
		t.Errorf("download: %d %q", resp.StatusCode, body)
	}
	resp, body = e.do("GET", "/files?path=z.txt", hdr("Range", "bytes=2-4"), nil)
	if resp.StatusCode != http.StatusPartialContent || string(body) != "234" {
		t.Errorf("range: %d %q", resp.StatusCode, body)
	}
	req, _ := http.NewRequest("GET", e.url+"/files?path=z.txt", nil)
	for k, v := range hdr("Accept-Encoding", "gzip") {
		req.Header.Set(k, v)
	}
	raw, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(raw.Body)
	if err != nil || raw.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %v %v", err, raw.Header)
	}
	got, _ := io.ReadAll(zr)
	raw.Body.Close()
	if string(got) != "0123456789" {
		t.Errorf("gzip download %q", got)
	}

	before := e.live()
	tests := []struct {
		name, method, path string
		hdr                map[string]string
		body               io.Reader
		want               int
	}{
		{"missing file", "GET", "/files?path=nope.txt", hdr(), nil, 404},
		{"a directory", "GET", "/files?path=a", hdr(), nil, 400},
		{"traversal read", "GET", "/files?path=/home/user/../../etc/passwd", hdr(), nil, 403},
		{"absolute read", "GET", "/files?path=/etc/shadow", hdr(), nil, 403},
		{"traversal write", "POST", "/files?path=../../tmp/x", hdr("Content-Type", "application/octet-stream"), strings.NewReader("x"), 403},
		{"oversized", "POST", "/files?path=big.bin", hdr("Content-Type", "application/octet-stream"), bytes.NewReader(make([]byte, 1<<17)), 413},
		{"no path", "POST", "/files", hdr("Content-Type", "application/octet-stream"), strings.NewReader("x"), 400},
		{"bad gzip", "POST", "/files?path=q", hdr("Content-Type", "application/octet-stream", "Content-Encoding", "gzip"), strings.NewReader("plain"), 400},
		{"other content type", "POST", "/files?path=q", hdr("Content-Type", "text/plain"), strings.NewReader("x"), 400},
		{"method", "DELETE", "/files?path=z.txt", hdr(), nil, 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do(tc.method, tc.path, tc.hdr, tc.body)
			wantE2BError(t, tc.name, resp.StatusCode, body, tc.want)
		})
	}
	if e.live() != before {
		t.Error("file requests created or destroyed sandboxes")
	}
}

func TestProcess(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","envVars":{"WHO":"me"}}`)
	decode := func(s any) string {
		b, _ := base64.StdEncoding.DecodeString(s.(string))
		return string(b)
	}
	run := func(args ...string) (pid float64, stdout, stderr string, end map[string]any) {
		t.Helper()
		msgs, last := e.serverStream(c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "fake", "args": args}})
		if last["error"] != nil {
			t.Fatalf("Start %v: %v", args, last)
		}
		for _, m := range msgs {
			ev := m["event"].(map[string]any)
			switch {
			case ev["start"] != nil:
				pid = ev["start"].(map[string]any)["pid"].(float64)
			case ev["data"] != nil:
				d := ev["data"].(map[string]any)
				if d["stdout"] != nil {
					stdout += decode(d["stdout"])
				}
				if d["stderr"] != nil {
					stderr += decode(d["stderr"])
				}
			case ev["end"] != nil:
				end = ev["end"].(map[string]any)
			}
		}
		return
	}
	pid, out, _, end := run("out:hello")
	if pid != servicetest.FirstPid || out != "hello\n" || end["exited"] != true || end["exitCode"] != nil && end["exitCode"] != 0.0 {
		t.Errorf("echo: pid %v out %q end %v", pid, out, end)
	}
	_, _, errOut, end := run("err:bad", "exit:3")
	if errOut != "bad\n" || end["exitCode"] != 3.0 || end["status"] != "exit status 3" {
		t.Errorf("fail: stderr %q end %v", errOut, end)
	}
	if _, out, _, _ := run("env:WHO"); out != "me\n" {
		t.Errorf("envVars in the command: %q", out)
	}

	// A background process: stdin, list, signal, connect.
	done := make(chan map[string]any, 1)
	go func() {
		msgs, last := e.serverStream(c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "fake", "args": []string{"cat"}}, "stdin": true, "tag": "t1"})
		var out string
		for _, m := range msgs {
			if d, ok := m["event"].(map[string]any)["data"].(map[string]any); ok && d["stdout"] != nil {
				out += decode(d["stdout"])
			}
		}
		done <- map[string]any{"out": out, "last": last}
	}()
	var catPid float64
	for i := 0; i < 200 && catPid == 0; i++ {
		_, l := e.unary(c, "process.Process/List", map[string]any{})
		for _, p := range items(l, "processes") {
			if p.(map[string]any)["tag"] == "t1" {
				catPid = p.(map[string]any)["pid"].(float64)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if catPid == 0 {
		t.Fatal("the tagged process was never listed")
	}
	if st, out := e.unary(c, "process.Process/SendInput", map[string]any{"process": map[string]any{"tag": "t1"}, "input": map[string]any{"stdin": base64.StdEncoding.EncodeToString([]byte("piped"))}}); st != 200 {
		t.Fatalf("SendInput: %d %v", st, out)
	}
	if st, out := e.unary(c, "process.Process/CloseStdin", map[string]any{"process": map[string]any{"pid": catPid}}); st != 200 {
		t.Fatalf("CloseStdin: %d %v", st, out)
	}
	select {
	case r := <-done:
		if r["out"] != "piped" {
			t.Errorf("cat's output %q", r["out"])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cat did not end after CloseStdin")
	}
	// A second Connect replays the ended process's events to its end.
	msgs, last := e.serverStream(c, "process.Process/Connect", map[string]any{"process": map[string]any{"pid": catPid}})
	if last["error"] != nil || len(msgs) < 2 {
		t.Errorf("Connect to an ended process: %v %v", msgs, last)
	}

	go func() {
		_, last := e.serverStream(c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "fake", "args": []string{"block"}}, "tag": "s"})
		done <- last
	}()
	var sleepPid float64
	for i := 0; i < 200 && sleepPid == 0; i++ {
		_, l := e.unary(c, "process.Process/List", map[string]any{})
		for _, p := range items(l, "processes") {
			if p.(map[string]any)["tag"] == "s" {
				sleepPid = p.(map[string]any)["pid"].(float64)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st, out := e.unary(c, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": sleepPid}, "signal": "SIGNAL_SIGKILL"}); st != 200 {
		t.Fatalf("SendSignal: %d %v", st, out)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream of a killed process did not end")
	}

	tests := []struct {
		name, method string
		msg          any
		want         string
	}{
		{"signal an unknown pid", "SendSignal", map[string]any{"process": map[string]any{"pid": 99}, "signal": "SIGNAL_SIGKILL"}, "not_found"},
		{"bad signal", "SendSignal", map[string]any{"process": map[string]any{"pid": 1}, "signal": "SIGNAL_SIGHUP"}, "invalid_argument"},
		{"input to an unknown tag", "SendInput", map[string]any{"process": map[string]any{"tag": "nope"}, "input": map[string]any{"stdin": ""}}, "not_found"},
		{"no selector", "CloseStdin", map[string]any{"process": map[string]any{}}, "invalid_argument"},
		{"pty update of an unknown pid", "Update", map[string]any{"process": map[string]any{"pid": 1}, "pty": map[string]any{"size": map[string]any{"cols": 80, "rows": 24}}}, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, out := e.unary(c, "process.Process/"+tc.method, tc.msg)
			if out["code"] != tc.want {
				t.Errorf("%v, want code %s", out, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name, method string
		msg          any
		want         string
	}{
		{"pty start of zero cols", "Start", map[string]any{"process": map[string]any{"cmd": "x"}, "pty": map[string]any{"size": map[string]any{"cols": 0, "rows": 24}}}, "invalid_argument"},
		{"pty start without a size", "Start", map[string]any{"process": map[string]any{"cmd": "x"}, "pty": map[string]any{}}, "invalid_argument"},
		{"pty start of absurd rows", "Start", map[string]any{"process": map[string]any{"cmd": "x"}, "pty": map[string]any{"size": map[string]any{"cols": 80, "rows": 4000000000}}}, "invalid_argument"},
		{"cwd outside", "Start", map[string]any{"process": map[string]any{"cmd": "x", "cwd": "/etc"}}, "permission_denied"},
		{"empty cmd", "Start", map[string]any{"process": map[string]any{"cmd": ""}}, "invalid_argument"},
		{"connect unknown", "Connect", map[string]any{"process": map[string]any{"pid": 77}}, "not_found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, last := e.serverStream(c, "process.Process/"+tc.method, tc.msg)
			if errv, _ := last["error"].(map[string]any); errv["code"] != tc.want {
				t.Errorf("end %v, want code %s", last, tc.want)
			}
		})
	}
}

func TestWatchDir(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	data, _ := json.Marshal(map[string]any{"path": "/home/user"})
	var buf bytes.Buffer
	buf.WriteByte(0)
	binary.Write(&buf, binary.BigEndian, uint32(len(data)))
	buf.Write(data)
	// A bound, not a timing assertion: without it a missing event would
	// hang the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/filesystem.Filesystem/WatchDir", &buf)
	for k, v := range envdHeaders(c) {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, first, err := readEnvelope(resp.Body)
	if err != nil || !strings.Contains(string(first), `"start"`) {
		t.Fatalf("first message %s %v", first, err)
	}
	e.session(c.SandboxID).WriteFile("new.txt", strings.NewReader("x"), 0o644)
	_, ev, err := readEnvelope(resp.Body)
	if err != nil || !strings.Contains(string(ev), `"name":"new.txt"`) || !strings.Contains(string(ev), "EVENT_TYPE_CREATE") {
		t.Errorf("event %s %v", ev, err)
	}
}

const flagEndStream = 0x02

// readEnvelope reads one enveloped Connect stream message.
func readEnvelope(r io.Reader) (flags byte, msg []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	msg = make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, nil, err
	}
	return hdr[0], msg, nil
}

// The polling watchers the Python SDK's watch_dir uses.
func TestPollWatcher(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	st, out := e.unary(c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "/home/user", "recursive": true})
	id, _ := out["watcherId"].(string)
	if st != 200 || id == "" {
		t.Fatalf("CreateWatcher: %d %v", st, out)
	}
	sess := e.session(c.SandboxID)
	sess.WriteFile("sub/a.txt", strings.NewReader("1"), 0o644)
	st, out = e.unary(c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": id})
	got := map[string]bool{}
	for _, ev := range items(out, "events") {
		m := ev.(map[string]any)
		got[m["type"].(string)+":"+m["name"].(string)] = true
	}
	if st != 200 || !got["EVENT_TYPE_CREATE:sub"] || !got["EVENT_TYPE_CREATE:sub/a.txt"] {
		t.Errorf("events after a write: %d %v", st, out)
	}
	sess.Remove("sub")
	_, out = e.unary(c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": id})
	if n := len(items(out, "events")); n != 2 {
		t.Errorf("events after a remove: %v", out)
	}
	_, out = e.unary(c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": id})
	if n := len(items(out, "events")); n != 0 {
		t.Errorf("events with no change: %v", out)
	}
	if st, _ := e.unary(c, "filesystem.Filesystem/RemoveWatcher", map[string]any{"watcherId": id}); st != 200 {
		t.Errorf("RemoveWatcher: %d", st)
	}
	if st, out := e.unary(c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": id}); st != 404 || out["code"] != "not_found" {
		t.Errorf("a removed watcher: %d %v", st, out)
	}
	for i := 0; i < maxWatchers; i++ {
		e.unary(c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "/home/user"})
	}
	if st, out := e.unary(c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "/home/user"}); st != 429 || out["code"] != "resource_exhausted" {
		t.Errorf("watcher %d: %d %v", maxWatchers+1, st, out)
	}
	if st, _ := e.unary(c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "/etc"}); st != 403 {
		t.Errorf("a watcher outside the workspace: %d", st)
	}
}

// items is a repeated field of a JSON message: protojson leaves an empty
// one out.
func items(m map[string]any, field string) []any {
	l, _ := m[field].([]any)
	return l
}

func TestRevokedKey(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	hdr := envdHeaders(c)
	hdr["Content-Type"] = "application/json"
	if resp, _ := e.do("POST", "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path":"."}`)); resp.StatusCode != 200 {
		t.Fatalf("before revocation: %d", resp.StatusCode)
	}
	e.keys.revoke("ka")
	resp, body := e.do("POST", "/filesystem.Filesystem/Stat", hdr, strings.NewReader(`{"path":"."}`))
	wantE2BError(t, "after revocation", resp.StatusCode, body, 401)
}

// TestTemplateIsImage: a template is the image of the same name the host
// has; "base" is the default image; an unknown one is a 400 naming it and
// the images there are.
func TestTemplateIsImage(t *testing.T) {
	tests := []struct {
		template  string
		status    int
		wantImage string
		wantMsg   []string
	}{
		{template: "node", status: http.StatusCreated, wantImage: "node"},
		{template: "python", status: http.StatusCreated, wantImage: "python"},
		{template: "base", status: http.StatusCreated, wantImage: "python"},
		{template: "", status: http.StatusCreated, wantImage: "python"},
		{template: "desktop", status: http.StatusBadRequest, wantMsg: []string{"templateID", "'desktop'", "node, python"}},
		{template: "../etc", status: http.StatusBadRequest, wantMsg: []string{"'../etc'"}},
	}
	for _, tc := range tests {
		t.Run(cmp.Or(tc.template, "default"), func(t *testing.T) {
			e := newEnv(t)
			body, _ := json.Marshal(map[string]string{"templateID": tc.template})
			status, data := e.control("POST", "/v2/sandboxes", keyA, string(body))
			if status != tc.status {
				t.Fatalf("create template %q: %d %s, want %d", tc.template, status, data, tc.status)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(string(data), w) {
					t.Errorf("answer %s does not mention %q", data, w)
				}
			}
			if tc.wantImage == "" {
				return
			}
			ss := e.b.Sessions()
			if len(ss) != 1 || ss[0].Manifest().Image != tc.wantImage {
				t.Errorf("template %q made sandboxes %v, want one on image %s", tc.template, ss, tc.wantImage)
			}
			var c created
			json.Unmarshal(data, &c)
			if c.TemplateID != cmp.Or(tc.template, "base") {
				t.Errorf("templateID answered %q, want %q", c.TemplateID, cmp.Or(tc.template, "base"))
			}
		})
	}
}
