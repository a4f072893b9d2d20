package e2b

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

// TestPorts: getHost(port) URLs reach what listens on that port in the
// sandbox (the fake backend's DialPort reaches a host listener standing
// in for it), with the traffic token unless the creator made the sandbox
// public, only while the sandbox lives.
func TestPorts(t *testing.T) {
	e := newEnv(t)
	var (
		mu   sync.Mutex
		seen []*http.Request
	)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Clone(r.Context()))
		mu.Unlock()
		io.WriteString(w, "app:"+r.URL.Path)
	}))
	t.Cleanup(app.Close)
	e.b.Listen(8000, strings.TrimPrefix(app.URL, "http://"))

	a := e.create(keyA, `{"templateID":"base"}`)
	other := e.create(keyB, `{"templateID":"base"}`)
	pub := e.create(keyA, `{"templateID":"base","network":{"allowPublicTraffic":true}}`)
	if a.TrafficAccessToken == nil || *a.TrafficAccessToken == "" || *a.TrafficAccessToken == a.EnvdAccessToken {
		t.Fatalf("trafficAccessToken %v: want one of its own for a sandbox that is not public", a.TrafficAccessToken)
	}
	if pub.TrafficAccessToken != nil {
		t.Errorf("a public sandbox has trafficAccessToken %q, want null as E2B", *pub.TrafficAccessToken)
	}
	if in := e.session(a.SandboxID).Manifest().Network; !in.InboundAllows(8000) || !in.InboundAllows(1) || !in.InboundAllows(65535) {
		t.Errorf("an E2B sandbox's network.inbound is %v, want every port", in.Inbound)
	}
	host := func(port string, c created) string { return port + "-" + c.SandboxID + ".moat.test" }
	tok := *a.TrafficAccessToken
	tests := []struct {
		name     string
		hdr      map[string]string
		want     int
		wantBody string
	}{
		{"token, host mode", map[string]string{"Host": host("8000", a), TrafficHeader: tok}, 200, "app:/some/path"},
		{"token, header mode", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": "8000", TrafficHeader: tok}, 200, "app:/some/path"},
		{"no token", map[string]string{"Host": host("8000", a)}, 401, ""},
		{"the envd token is not the traffic token", map[string]string{"Host": host("8000", a), TrafficHeader: a.EnvdAccessToken}, 401, ""},
		{"the envd token as envd's header", map[string]string{"Host": host("8000", a), "X-Access-Token": a.EnvdAccessToken}, 200, "app:/some/path"},
		{"another sandbox's envd token", map[string]string{"Host": host("8000", a), "X-Access-Token": other.EnvdAccessToken}, 401, ""},
		{"another sandbox's traffic token", map[string]string{"Host": host("8000", a), TrafficHeader: *other.TrafficAccessToken}, 401, ""},
		{"public, no token", map[string]string{"Host": host("8000", pub)}, 200, "app:/some/path"},
		{"nothing listening", map[string]string{"Host": host("8001", a), TrafficHeader: tok}, 502, "not open"},
		{"not a port", map[string]string{"Host": host("80x", a), TrafficHeader: tok}, 400, ""},
		{"port 0", map[string]string{"Host": host("0", a), TrafficHeader: tok}, 400, ""},
		{"port too large", map[string]string{"Host": host("65536", a), TrafficHeader: tok}, 400, ""},
		{"never existed", map[string]string{"Host": "8000-nope.moat.test", TrafficHeader: tok}, 502, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("GET", "/some/path", tc.hdr, nil)
			if resp.StatusCode != tc.want || !strings.Contains(string(body), tc.wantBody) {
				t.Fatalf("%d %s, want %d with %q", resp.StatusCode, body, tc.want, tc.wantBody)
			}
			if tc.want != 200 {
				var doc map[string]any
				if json.Unmarshal(body, &doc) != nil || doc["message"] == "" {
					t.Errorf("error body %s is not {code, message}", body)
				}
			}
		})
	}
	t.Run("the program sees no token and the client's host", func(t *testing.T) {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			t.Fatal("the app saw no request")
		}
		for _, r := range seen {
			for _, h := range []string{TrafficHeader, "X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
				if r.Header.Get(h) != "" {
					t.Errorf("the program received %s: %v", h, r.Header)
				}
			}
		}
		if h := seen[0].Host; !strings.HasPrefix(h, "8000-"+a.SandboxID+".moat.test") {
			t.Errorf("the program saw Host %q, want the client's", h)
		}
	})
	t.Run("after kill", func(t *testing.T) {
		if status, body := e.control("DELETE", "/sandboxes/"+a.SandboxID, keyA, ""); status != 204 {
			t.Fatalf("kill: %d %s", status, body)
		}
		resp, body := e.do("GET", "/", map[string]string{"Host": host("8000", a), TrafficHeader: tok}, nil)
		if resp.StatusCode != 502 || !strings.Contains(string(body), "not found") {
			t.Errorf("%d %s, want 502 sandbox not found", resp.StatusCode, body)
		}
	})
}

// TestInboundGrant: the E2B layer grants every port (network.inbound)
// with a justification naming the guard, and no longer refuses
// allowPublicTraffic.
func TestInboundGrant(t *testing.T) {
	tests := []struct {
		name       string
		body       string
		wantPublic bool
	}{
		{"default", `{}`, false},
		{"public false", `{"network":{"allowPublicTraffic":false}}`, false},
		{"public true", `{"network":{"allowPublicTraffic":true}}`, true},
		{"public with allowOut", `{"network":{"allowPublicTraffic":true,"allowOut":["example.com"]}}`, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var req newSandbox
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			p, e := translate(&req, false, Internet{})
			if e != nil {
				t.Fatalf("refused: %s", e.Message)
			}
			if p.public != tc.wantPublic {
				t.Errorf("public %v, want %v", p.public, tc.wantPublic)
			}
			data, _ := json.Marshal(p.manifest)
			m, err := manifest.Parse(data, "e2b.json")
			if err != nil {
				t.Fatalf("the manifest does not parse: %v\n%s", err, data)
			}
			if !m.Network.InboundAllows(8000) {
				t.Errorf("network.inbound %v does not grant 8000", m.Network.Inbound)
			}
			if j := m.Justifications["network.inbound"]; !strings.Contains(j, "E2B") {
				t.Errorf("justification %q", j)
			}
		})
	}
}
