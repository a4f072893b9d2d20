package egress

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	testPH     = "moat-secret-api-0123456789abcdef0123456789abcdef"
	testValue  = "sk-REAL-api-value-7f3e9d"
	testPH2    = "moat-secret-tok-fedcba9876543210fedcba9876543210"
	testValue2 = "tok-REAL-query-body-c41a"
)

// echoServer is a destination that records what it received and echoes
// the credentials back, as a careless debug endpoint would.
type echoServer struct {
	http, tls *httptest.Server
	mu        sync.Mutex
	seen      []string // "METHOD path?query | Authorization | X-Token | body"
}

func newEchoServer(t testing.TB) *echoServer {
	t.Helper()
	e := &echoServer{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write(make([]byte, 1<<20))
			return
		}
		body, _ := io.ReadAll(r.Body)
		line := fmt.Sprintf("%s %s | %s | %s | %s", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("X-Token"), body)
		e.mu.Lock()
		e.seen = append(e.seen, line)
		e.mu.Unlock()
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		io.WriteString(w, "echo: "+line)
	})
	e.http = httptest.NewServer(h)
	e.tls = httptest.NewUnstartedServer(h)
	e.tls.Config.ErrorLog = log.New(io.Discard, "", 0)
	e.tls.StartTLS()
	t.Cleanup(e.http.Close)
	t.Cleanup(e.tls.Close)
	return e
}

func (e *echoServer) last() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.seen) == 0 {
		return ""
	}
	return e.seen[len(e.seen)-1]
}

func (e *echoServer) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.seen)
}

// secretHarness is a proxy with two secrets bound to example.com (the name
// httptest's certificate carries), whose port 80 and 443 are the echo
// server.
type secretHarness struct {
	*harness
	e *echoServer
}

func testSecrets() []SecretBinding {
	return []SecretBinding{
		{Name: "api", Placeholder: testPH, Value: testValue, Hosts: []Rule{MustParseRule("example.com")}, Header: "Authorization", PathPrefix: "/v1"},
		{Name: "tok", Placeholder: testPH2, Value: testValue2, Hosts: []Rule{MustParseRule("example.com")}, Header: "X-Token", Query: true, Body: true},
	}
}

func newSecretHarness(t testing.TB) *secretHarness {
	t.Helper()
	pol := testPolicy()
	pol.Secrets = testSecrets()
	return newSecretHarnessPolicy(t, pol)
}

func newSecretHarnessPolicy(t testing.TB, pol Policy) *secretHarness {
	t.Helper()
	if err := pol.Validate(); err != nil {
		t.Fatal(err)
	}
	e := newEchoServer(t)
	roots := x509.NewCertPool()
	roots.AddCert(e.tls.Certificate())
	h := newHarness(t, pol, Options{RootCAs: roots})
	h.resolver.mu.Lock()
	h.resolver.names["example.com"] = [][]netip.Addr{{netip.MustParseAddr("127.0.0.1")}}
	h.resolver.mu.Unlock()
	h.dialer.mu.Lock()
	h.dialer.ports[80] = e.http.Listener.Addr().(*net.TCPAddr).Port
	h.dialer.ports[443] = e.tls.Listener.Addr().(*net.TCPAddr).Port
	h.dialer.mu.Unlock()
	return &secretHarness{harness: h, e: e}
}

// sandboxClient trusts only the run CA, as the sandbox does.
func (h *secretHarness) sandboxClient(keepAlive bool) *http.Client {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(h.p.TrustPEM()) {
		h.t.Fatal("TrustPEM holds no certificate")
	}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr}),
		DisableKeepAlives: !keepAlive,
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		ForceAttemptHTTP2: true, // the proxy must still answer in HTTP/1.1
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func TestSecretSubstitution(t *testing.T) {
	h := newSecretHarness(t)
	b64 := base64.StdEncoding.EncodeToString([]byte("x" + testPH))
	tests := []struct {
		name    string
		method  string
		url     string
		host    string // Host header, when not the URL's
		header  http.Header
		body    string
		status  int
		seen    string // what the destination received ("" : nothing)
		reason  string // reason of the attempt
		noReach bool   // the destination must not see the request
	}{
		{name: "header replaced for bound host", method: "GET", url: "https://example.com/v1/echo",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 200,
			seen: "GET /v1/echo | Bearer " + testValue + " |  | ", reason: ReasonAllowed},
		{name: "basic credential replaced", method: "GET", url: "https://example.com/v1/x",
			header: http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+testPH))}}, status: 200,
			seen: "GET /v1/x | Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+testValue)) + " |  | ", reason: ReasonAllowed},
		{name: "outside path prefix refused", method: "GET", url: "https://example.com/v2/echo",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "prefix is a segment boundary", method: "GET", url: "https://example.com/v10",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "dot segments escape the prefix", method: "GET", url: "https://example.com/v1/%2e%2e/admin",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "other header refused", method: "GET", url: "https://example.com/v1/echo",
			header: http.Header{"X-Debug": {testPH}}, status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "query of a header-only secret refused", method: "GET", url: "https://example.com/v1/echo?k=" + testPH,
			status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "percent-encoded in path refused", method: "GET", url: "https://example.com/v1/%6D" + testPH[1:],
			status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "query replaced", method: "GET", url: "https://example.com/q?t=" + testPH2, status: 200,
			seen: "GET /q?t=" + testValue2 + " |  |  | ", reason: ReasonAllowed},
		{name: "body replaced", method: "POST", url: "https://example.com/b", body: `{"token":"` + testPH2 + `"}`, status: 200,
			seen: `POST /b |  |  | {"token":"` + testValue2 + `"}`, reason: ReasonAllowed},
		{name: "scoped header replaced", method: "GET", url: "https://example.com/any",
			header: http.Header{"X-Token": {testPH2}}, status: 200, seen: "GET /any |  | " + testValue2 + " | ", reason: ReasonAllowed},
		{name: "base64 in body refused", method: "POST", url: "https://example.com/v1/b", body: "data=" + b64, status: 403,
			reason: ReasonSecretExfiltration, noReach: true},
		{name: "hex in body refused", method: "POST", url: "https://example.com/v1/b", body: hex.EncodeToString([]byte(testPH)), status: 403,
			reason: ReasonSecretExfiltration, noReach: true},
		{name: "Host header differs from SNI", method: "GET", url: "https://example.com/v1/echo", host: "allowed.test",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: http.StatusMisdirectedRequest, reason: ReasonSNIMismatch, noReach: true},
		{name: "plain HTTP basic credential replaced", method: "GET", url: "http://example.com/v1/x",
			header: http.Header{"Authorization": {"Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+testPH))}}, status: 200,
			seen: "GET /v1/x | Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+testValue)) + " |  | ", reason: ReasonAllowed},
		{name: "plain HTTP header replaced", method: "GET", url: "http://example.com/v1/echo",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 200,
			seen: "GET /v1/echo | Bearer " + testValue + " |  | ", reason: ReasonAllowed},
		{name: "plain HTTP body replaced", method: "POST", url: "http://example.com/b", body: "t=" + testPH2, status: 200,
			seen: "POST /b |  |  | t=" + testValue2, reason: ReasonAllowed},
		{name: "plain HTTP to unbound host, header", method: "GET", url: "http://allowed.test/",
			header: http.Header{"Authorization": {"Bearer " + testPH}}, status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "plain HTTP to unbound host, path", method: "GET", url: "http://allowed.test/" + testPH2,
			status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "plain HTTP to unbound host, base64url header", method: "GET", url: "http://allowed.test/",
			header: http.Header{"Cookie": {"s=" + base64.RawURLEncoding.EncodeToString([]byte("ab"+testPH))}}, status: 403,
			reason: ReasonSecretExfiltration, noReach: true},
		{name: "plain HTTP to unbound host, body", method: "POST", url: "http://allowed.test/upload",
			body: strings.Repeat("a", 40000) + testPH + "tail", status: 403, reason: ReasonSecretExfiltration, noReach: true},
		{name: "plain HTTP to unbound host, body past the buffered part", method: "POST", url: "http://allowed.test/upload",
			body: strings.Repeat("a", maxBufferedBody+100) + testPH + "tail", status: 403, reason: ReasonSecretExfiltration},
		{name: "body past the buffered part, bound host", method: "POST", url: "https://example.com/v1/b",
			body: strings.Repeat("a", maxBufferedBody+100) + base64.StdEncoding.EncodeToString([]byte(testPH)), status: 403, reason: ReasonSecretExfiltration},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := h.e.count()
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req, err := http.NewRequest(tc.method, tc.url, body)
			if err != nil {
				t.Fatal(err)
			}
			for k, vs := range tc.header {
				req.Header[k] = vs
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			resp, err := h.sandboxClient(false).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, tc.status, got)
			}
			// The Basic credential the proxy encoded holds the value
			// in base64: an echo of it must not reach the sandbox.
			basicValue := base64.StdEncoding.EncodeToString([]byte("me:" + testValue))
			basicPH := base64.StdEncoding.EncodeToString([]byte("me:" + testPH))
			for _, v := range []string{testValue, testValue2, basicValue} {
				if strings.Contains(string(got), v) || strings.Contains(resp.Header.Get("X-Echo"), v) {
					t.Fatalf("the sandbox saw a real value: %q %v", got, resp.Header)
				}
			}
			if tc.seen != "" {
				if h.e.last() != tc.seen {
					t.Fatalf("destination saw %q, want %q", h.e.last(), tc.seen)
				}
				// The echo comes back with the placeholder.
				echo := strings.NewReplacer(testValue, testPH, testValue2, testPH2, basicValue, basicPH)
				if want := echo.Replace("echo: " + tc.seen); string(got) != want {
					t.Fatalf("sandbox got %q, want %q", got, want)
				}
				if want := echo.Replace(tc.header.Get("Authorization")); resp.StatusCode == 200 && resp.Header.Get("X-Echo") != want {
					t.Fatalf("sandbox got the header echo %q, want %q", resp.Header.Get("X-Echo"), want)
				}
			}
			if tc.noReach && h.e.count() != before {
				t.Fatalf("destination was reached: %q", h.e.last())
			}
			if a := h.last(); a.Reason != tc.reason {
				t.Fatalf("attempt %+v, want reason %s", a, tc.reason)
			}
		})
	}

	t.Run("value never in attempts or summary", func(t *testing.T) {
		h.settle(0)
		j, _ := json.Marshal(struct {
			A []Attempt
			S Summary
		}{h.p.Attempts(), h.p.Summary()})
		for _, v := range []string{testValue, testValue2} {
			if bytes.Contains(j, []byte(v)) {
				t.Fatalf("%s in %s", v, j)
			}
		}
		got := h.p.Summary().SecretsUsed
		want := []SecretUse{{Name: "api", Host: "example.com", Requests: 4}, {Name: "tok", Host: "example.com", Requests: 4}}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("SecretsUsed %+v, want %+v", got, want)
		}
		if !bytes.Contains(j, []byte(`"secrets_used":[{"name":"api","host":"example.com","requests":4}`)) {
			t.Fatalf("summary JSON %s", j)
		}
	})
}

func TestSecretKeepAliveAndSplitEcho(t *testing.T) {
	h := newSecretHarness(t)
	c := h.sandboxClient(true)
	for i := range 3 {
		req, _ := http.NewRequest("GET", "https://example.com/v1/echo", nil)
		req.Header.Set("Authorization", "Bearer "+testPH)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 1 || string(got) != "echo: GET /v1/echo | Bearer "+testPH+" |  | " || resp.Header.Get("X-Echo") != "Bearer "+testPH {
			t.Fatalf("request %d: %s %q %v", i, resp.Proto, got, resp.Header)
		}
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	if n := len(h.settle(1)); n != 1 {
		t.Fatalf("three requests on one kept-alive connection made %d attempts", n)
	}
	if u := h.p.Summary().SecretsUsed; len(u) != 1 || u[0].Requests != 3 {
		t.Fatalf("SecretsUsed %+v", u)
	}
}

func TestSecretNames(t *testing.T) {
	h := newSecretHarness(t)
	tests := []struct {
		name, target string
	}{
		{"placeholder as a wildcard-allowed label", testPH + ".wild.test:443"},
		{"upper case", strings.ToUpper(testPH2) + ".wild.test:443"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, status := h.connect(tc.target)
			if !strings.HasPrefix(status, "HTTP/1.1 403") {
				t.Fatalf("CONNECT %s: %q", tc.target, status)
			}
			a := h.last()
			if a.Reason != ReasonSecretExfiltration || a.Allowed {
				t.Fatalf("attempt %+v", a)
			}
			host, _, _ := strings.Cut(tc.target, ":")
			if n := h.resolver.lookups(strings.ToLower(host)); n != 0 {
				t.Fatalf("the name was resolved %d times", n)
			}
		})
	}
	t.Run("unbound host stays an opaque tunnel", func(t *testing.T) {
		conn, status := h.connect("allowed.test:443")
		if conn == nil {
			t.Fatal(status)
		}
		tc := tls.Client(conn, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
		defer tc.Close()
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		if got := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; strings.Contains(got, "Moat") {
			t.Fatalf("unbound host answered with a run CA certificate (issuer %q)", got)
		}
	})
	t.Run("SNI differs from CONNECT host", func(t *testing.T) {
		conn, status := h.connect("example.com:443")
		if conn == nil {
			t.Fatal(status)
		}
		tc := tls.Client(conn, &tls.Config{ServerName: "other.example", InsecureSkipVerify: true})
		if err := tc.Handshake(); err == nil {
			t.Fatal("handshake with a foreign SNI succeeded")
		}
		if a := h.last(); a.Reason != ReasonSNIMismatch {
			t.Fatalf("attempt %+v", a)
		}
	})
}

func TestSecretUpstreamVerified(t *testing.T) {
	// Without the test roots the proxy must refuse the destination's
	// httptest certificate: re-originated TLS is verified.
	pol := testPolicy()
	pol.Secrets = testSecrets()
	e := newEchoServer(t)
	h := newHarness(t, pol, Options{})
	h.resolver.mu.Lock()
	h.resolver.names["example.com"] = [][]netip.Addr{{netip.MustParseAddr("127.0.0.1")}}
	h.resolver.mu.Unlock()
	h.dialer.mu.Lock()
	h.dialer.ports[443] = e.tls.Listener.Addr().(*net.TCPAddr).Port
	h.dialer.mu.Unlock()
	sh := &secretHarness{harness: h, e: e}
	req, _ := http.NewRequest("GET", "https://example.com/v1/echo", nil)
	req.Header.Set("Authorization", "Bearer "+testPH)
	resp, err := sh.sandboxClient(false).Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
	}
	if e.count() != 0 {
		t.Fatal("an unverified destination got the request")
	}
	if a := h.last(); a.Reason != ReasonUpstreamError {
		t.Fatalf("attempt %+v", a)
	}
}

func TestRunCA(t *testing.T) {
	tests := []struct {
		name    string
		hosts   []string
		leafFor string
		ok      bool
	}{
		{"bound host", []string{"api.example.com"}, "api.example.com", true},
		{"other host refused by name constraints", []string{"api.example.com"}, "bank.example.net", false},
		{"sibling refused", []string{"api.example.com"}, "www.example.com", false},
		{"wildcard subdomain", []string{"*.example.org"}, "a.example.org", true},
		{"wildcard apex refused", []string{"*.example.org"}, "example.org", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var rules []Rule
			for _, hs := range tc.hosts {
				rules = append(rules, MustParseRule(hs))
			}
			p := New(Policy{Secrets: []SecretBinding{{Name: "s", Placeholder: testPH, Value: testValue, Hosts: rules}}}, Options{})
			defer p.Close()
			blk, _ := pem.Decode(p.TrustPEM())
			if blk == nil {
				t.Fatal("no PEM")
			}
			ca, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if !ca.IsCA || !ca.PermittedDNSDomainsCritical || ca.NotAfter.Sub(ca.NotBefore) > caValidity+time.Hour {
				t.Fatalf("CA %+v", ca)
			}
			if k, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
				t.Fatal("not a P-256 key")
			}
			// Sign with the CA key as a thief would, and verify as a
			// client trusting the CA would.
			leaf, err := p.ca.leaf(tc.leafFor, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			lc, _ := x509.ParseCertificate(leaf.Certificate[0])
			pool := x509.NewCertPool()
			pool.AddCert(ca)
			_, err = lc.Verify(x509.VerifyOptions{DNSName: tc.leafFor, Roots: pool})
			if (err == nil) != tc.ok {
				t.Fatalf("verify %s: %v, want ok=%v", tc.leafFor, err, tc.ok)
			}
		})
	}
	t.Run("no secrets, no CA", func(t *testing.T) {
		p := New(Policy{}, Options{})
		defer p.Close()
		if p.TrustPEM() != nil {
			t.Fatal("a CA without secrets")
		}
	})
}

func TestValidateSecrets(t *testing.T) {
	good := testSecrets()[0]
	tests := []struct {
		name string
		mod  func(b *SecretBinding)
		want string
	}{
		{"valid", func(*SecretBinding) {}, ""},
		{"short placeholder", func(b *SecretBinding) { b.Placeholder = "short" }, "placeholder must be"},
		{"placeholder characters", func(b *SecretBinding) { b.Placeholder = testPH + "/x" }, "placeholder must be"},
		{"empty value", func(b *SecretBinding) { b.Value = "" }, "empty value"},
		{"no hosts", func(b *SecretBinding) { b.Hosts = nil }, "no hosts"},
		{"bad host rule", func(b *SecretBinding) { b.Hosts = []Rule{{Host: "EXAMPLE.com"}} }, "not a valid rule"},
		{"bad prefix", func(b *SecretBinding) { b.PathPrefix = "v1" }, "must start with /"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := good
			tc.mod(&b)
			err := Policy{Secrets: []SecretBinding{b}}.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), testValue) {
				t.Fatal("the value is in the error")
			}
		})
	}
}

// oneByte reads one byte at a time: every pattern is split across reads.
type oneByte struct{ r io.Reader }

func (o oneByte) Read(b []byte) (int, error) {
	if len(b) > 1 {
		b = b[:1]
	}
	return o.r.Read(b)
}

func TestStreamReplacer(t *testing.T) {
	scrub := []replacement{{old: []byte(testValue), new: []byte(testPH)}}
	refuse := append([]replacement{{old: []byte(testPH2), new: []byte(testValue2)}}, replacement{old: []byte(testPH), refuse: true})
	tests := []struct {
		name    string
		in      string
		pats    []replacement
		want    string
		refused bool
	}{
		{"none", "hello", scrub, "hello", false},
		{"whole", "a" + testValue + "b", scrub, "a" + testPH + "b", false},
		{"twice adjacent", testValue + testValue, scrub, testPH + testPH, false},
		{"at the end", "xyz" + testValue, scrub, "xyz" + testPH, false},
		{"prefix only", "xyz" + testValue[:10], scrub, "xyz" + testValue[:10], false},
		{"long input", strings.Repeat("z", 70000) + testValue + strings.Repeat("y", 70000), scrub,
			strings.Repeat("z", 70000) + testPH + strings.Repeat("y", 70000), false},
		{"replace then refuse", "a" + testPH2 + "b" + testPH + "c", refuse, "a" + testValue2 + "b", true},
	}
	for _, tc := range tests {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/split=%v", tc.name, split), func(t *testing.T) {
				var r io.Reader = strings.NewReader(tc.in)
				if split {
					r = oneByte{r}
				}
				got, err := io.ReadAll(newStreamReplacer(r, tc.pats))
				if (err == errExfiltration) != tc.refused || (err != nil && err != errExfiltration) {
					t.Fatalf("err %v, refused want %v", err, tc.refused)
				}
				if string(got) != tc.want {
					t.Fatalf("got %q, want %q", got, tc.want)
				}
			})
		}
	}
}

// FuzzSecretStream checks the streaming replacer against the whole-input
// rule under every way of splitting the input into reads, and that a
// scrubbed stream never carries the value.
func FuzzSecretStream(f *testing.F) {
	f.Add([]byte("Bearer "+testValue), []byte{3, 7, 1})
	f.Add([]byte(testValue[:5]+testValue+testValue[5:]), []byte{1})
	f.Add([]byte("echo: "+testValue+testValue+"\r\n"), []byte{30, 2})
	f.Add([]byte(testPH), []byte{5})
	f.Fuzz(func(t *testing.T, in, splits []byte) {
		pats := []replacement{
			{old: []byte(testValue), new: []byte(testPH)},
			{old: []byte(testPH2), refuse: true},
		}
		want, refused := replaceAll(in, pats)
		got, err := io.ReadAll(newStreamReplacer(&splitReader{b: in, splits: splits}, pats))
		if refused != (err == errExfiltration) {
			t.Fatalf("refused %v, stream err %v", refused, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("stream %q, whole %q", got, want)
		}
		if !refused && bytes.Contains(got, []byte(testValue)) && !bytes.Contains(in, []byte(testPH[:1])) {
			// Only a value built from placeholder pieces could survive;
			// the value here shares no prefix with it.
			t.Fatalf("value survived scrubbing: %q", got)
		}
	})
}

type splitReader struct {
	b      []byte
	splits []byte
	i      int
}

func (s *splitReader) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := len(s.b)
	if len(s.splits) > 0 {
		n = int(s.splits[s.i%len(s.splits)])%17 + 1
		s.i++
	}
	n = min(n, len(p), len(s.b))
	copy(p, s.b[:n])
	s.b = s.b[n:]
	return n, nil
}

func TestEncodedForms(t *testing.T) {
	s := compileSecrets([]SecretBinding{{Name: "a", Placeholder: testPH, Value: testValue, Hosts: []Rule{MustParseRule("example.com")}}})
	for pad := 0; pad < 3; pad++ {
		in := append(bytes.Repeat([]byte("q"), pad), testPH...)
		in = append(in, "tail"...)
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
			if e := enc.EncodeToString(in); !s.containsString(e) {
				t.Errorf("pad %d: %s not recognised", pad, e)
			}
		}
	}
	for _, v := range []string{hex.EncodeToString([]byte(testPH)), strings.ToUpper(hex.EncodeToString([]byte(testPH))), "x" + testPH,
		strings.ToUpper(testPH), "Bearer " + strings.ToUpper(testPH[:10]) + testPH[10:]} {
		if !s.containsString(v) {
			t.Errorf("%s not recognised", v)
		}
	}
	if s.containsString("moat-secret-api-0123") || s.containsString(testValue) {
		t.Error("a partial placeholder or the value itself is not a placeholder")
	}
}

// FuzzRewriteRequest: whatever request line and header the sandbox sends,
// a request rewriteRequest lets through carries no recognised form of a
// placeholder except the values it put in, and the values only in the
// binding's header.
func FuzzRewriteRequest(f *testing.F) {
	f.Add("/v1/echo", "Authorization", "Bearer "+testPH)
	f.Add("/v2/x?q="+testPH2, "X-Token", testPH2)
	f.Add("/v1/%6D"+testPH[1:], "Cookie", base64.StdEncoding.EncodeToString([]byte(testPH)))
	f.Add("/v1", "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("u:"+testPH)))
	s := compileSecrets(testSecrets())
	bound := s.bound("example.com", 443)
	f.Fuzz(func(t *testing.T, target, name, value string) {
		raw := "GET " + target + " HTTP/1.1\r\nHost: example.com\r\n" + name + ": " + value + "\r\n\r\n"
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		if _, err := s.rewriteRequest(req, bound); err != nil {
			return
		}
		var b bytes.Buffer
		req.Header.Write(&b)
		b.WriteString(req.URL.RequestURI())
		for k, vs := range req.Header {
			for _, v := range vs {
				if strings.Contains(v, testValue) && !strings.EqualFold(k, "Authorization") {
					t.Fatalf("api's value in header %q", k)
				}
			}
		}
		out := strings.NewReplacer(testValue, "", testValue2, "").Replace(b.String())
		if s.containsString(out) {
			t.Fatalf("a placeholder passed: %q", b.String())
		}
	})
}

func TestSecretsUsedSince(t *testing.T) {
	tests := []struct {
		name      string
		cur, prev []SecretUse
		want      []SecretUse
	}{
		{"nothing before", []SecretUse{{"a", "h", 2}}, nil, []SecretUse{{"a", "h", 2}}},
		{"some before", []SecretUse{{"a", "h", 5}, {"b", "h", 1}}, []SecretUse{{"a", "h", 2}, {"b", "h", 1}}, []SecretUse{{"a", "h", 3}}},
		{"none since", []SecretUse{{"a", "h", 2}}, []SecretUse{{"a", "h", 2}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Summary{SecretsUsed: tc.cur}.Since(Summary{SecretsUsed: tc.prev}).SecretsUsed
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
