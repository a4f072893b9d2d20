package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHTTPForward(t *testing.T) {
	tests := []struct {
		name       string
		url        string
		wantStatus int
		wantBody   string // substring
		want       Attempt
	}{
		{name: "allowed", url: "http://allowed.test/", wantStatus: 200, wantBody: "hello from allowed.test",
			want: Attempt{Method: "GET", Host: "allowed.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "allowed upper case trailing dot", url: "http://ALLOWED.test./", wantStatus: 200, wantBody: "hello from allowed.test",
			want: Attempt{Method: "GET", Host: "allowed.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "wildcard", url: "http://a.b.wild.test/", wantStatus: 200, wantBody: "hello from a.b.wild.test",
			want: Attempt{Method: "GET", Host: "a.b.wild.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "unicode name as punycode", url: "http://b%C3%BCcher.test/", wantStatus: 200, wantBody: "hello from xn--bcher-kva.test",
			want: Attempt{Method: "GET", Host: "xn--bcher-kva.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "redirect not followed", url: "http://allowed.test/redirect", wantStatus: 302,
			want: Attempt{Method: "GET", Host: "allowed.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "not allowlisted", url: "http://other.test/", wantStatus: 403, wantBody: "not in network.allow",
			want: Attempt{Method: "GET", Host: "other.test", Port: 80, Reason: ReasonNotAllowlisted}},
		{name: "wildcard apex not allowlisted", url: "http://wild.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "wild.test", Port: 80, Reason: ReasonNotAllowlisted}},
		{name: "suffix trick", url: "http://allowed.test.evil.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "allowed.test.evil.test", Port: 80, Reason: ReasonNotAllowlisted}},
		{name: "port not allowlisted", url: "http://allowed.test:8080/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "allowed.test", Port: 8080, Reason: ReasonNotAllowlisted}},
		{name: "private 10", url: "http://private.test/", wantStatus: 403, wantBody: "allow_addresses",
			want: Attempt{Method: "GET", Host: "private.test", Port: 80, Address: "10.1.2.3", Reason: ReasonPrivateAddress}},
		{name: "metadata", url: "http://meta.bad.test/latest/meta-data/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "meta.bad.test", Port: 80, Address: "169.254.169.254", Reason: ReasonPrivateAddress}},
		{name: "private 10 wildcard", url: "http://ten.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "ten.bad.test", Port: 80, Address: "10.0.0.1", Reason: ReasonPrivateAddress}},
		{name: "loopback not granted", url: "http://lo.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "lo.bad.test", Port: 80, Address: "127.0.0.5", Reason: ReasonPrivateAddress}},
		{name: "ipv6 loopback", url: "http://v6lo.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "v6lo.bad.test", Port: 80, Address: "::1", Reason: ReasonPrivateAddress}},
		{name: "ula", url: "http://ula.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "ula.bad.test", Port: 80, Address: "fd00::1", Reason: ReasonPrivateAddress}},
		{name: "cgnat", url: "http://cgnat.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "cgnat.bad.test", Port: 80, Address: "100.64.0.1", Reason: ReasonPrivateAddress}},
		{name: "ipv4 mapped loopback is granted as 127.0.0.1", url: "http://mapped.bad.test/", wantStatus: 200,
			want: Attempt{Method: "GET", Host: "mapped.bad.test", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "ipv4 mapped loopback not granted", url: "http://mapped3.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "mapped3.bad.test", Port: 80, Address: "127.0.0.3", Reason: ReasonPrivateAddress}},
		{name: "unspecified", url: "http://zero.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "zero.bad.test", Port: 80, Address: "0.0.0.0", Reason: ReasonPrivateAddress}},
		{name: "ipv6 link local", url: "http://linklocal6.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "linklocal6.bad.test", Port: 80, Address: "fe80::1", Reason: ReasonPrivateAddress}},
		{name: "nat64 of private", url: "http://nat64.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "nat64.bad.test", Port: 80, Address: "64:ff9b::a00:1", Reason: ReasonPrivateAddress}},
		{name: "documentation", url: "http://doc.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "doc.bad.test", Port: 80, Address: "192.0.2.1", Reason: ReasonPrivateAddress}},
		{name: "one bad answer among good", url: "http://mixed.bad.test/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "mixed.bad.test", Port: 80, Address: "10.9.9.9", Reason: ReasonPrivateAddress}},
		{name: "dns failure", url: "http://nx.bad.test/", wantStatus: 502,
			want: Attempt{Method: "GET", Host: "nx.bad.test", Port: 80, Reason: ReasonDNSFailure}},
		{name: "dns empty answer", url: "http://empty.bad.test/", wantStatus: 502,
			want: Attempt{Method: "GET", Host: "empty.bad.test", Port: 80, Reason: ReasonDNSFailure}},
		{name: "ip literal", url: "http://10.0.0.1/", wantStatus: 403, wantBody: "IP addresses",
			want: Attempt{Method: "GET", Host: "10.0.0.1", Port: 80, Reason: ReasonIPLiteral}},
		{name: "ip literal loopback not granted", url: "http://127.0.0.2/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "127.0.0.2", Port: 80, Reason: ReasonIPLiteral}},
		{name: "ip literal ipv6", url: "http://[::1]/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "::1", Port: 80, Reason: ReasonIPLiteral}},
		{name: "ip literal mapped", url: "http://[::ffff:169.254.169.254]/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "169.254.169.254", Port: 80, Reason: ReasonIPLiteral}},
		{name: "ip literal numeric form", url: "http://2130706433/", wantStatus: 403,
			want: Attempt{Method: "GET", Host: "2130706433", Port: 80, Reason: ReasonIPLiteral}},
		{name: "ip literal granted", url: "http://127.0.0.1/", wantStatus: 200, wantBody: "hello from 127.0.0.1",
			want: Attempt{Method: "GET", Host: "127.0.0.1", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
	}
	h := newHarness(t, testPolicy(), Options{})
	c := h.client()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.settle(0))
			resp, err := c.Get(tc.url)
			if err != nil {
				t.Fatalf("GET %s: %v", tc.url, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Fatalf("GET %s: status %d (%s), want %d", tc.url, resp.StatusCode, body, tc.wantStatus)
			}
			if !strings.Contains(string(body), tc.wantBody) {
				t.Fatalf("GET %s: body %q, want %q in it", tc.url, body, tc.wantBody)
			}
			if tc.want.Allowed {
				// Redirects are the client's business.
				if loc := resp.Header.Get("Location"); tc.wantStatus == 302 && loc != "http://other.test/" {
					t.Fatalf("Location %q", loc)
				}
			} else if r := resp.Header.Get("X-Moat-Egress"); r != tc.want.Reason {
				t.Fatalf("X-Moat-Egress %q, want %q", r, tc.want.Reason)
			}
			atts := h.settle(before + 1)
			if len(atts) != before+1 {
				t.Fatalf("%d attempts logged for one request: %+v", len(atts)-before, atts[before:])
			}
			got := atts[before]
			checkAttempt(t, got, tc.want)
		})
	}
}

// checkAttempt compares everything but time and byte counts, which it
// checks for plausibility.
func checkAttempt(t *testing.T, got, want Attempt) {
	t.Helper()
	if got.Time.IsZero() {
		t.Errorf("attempt without time: %+v", got)
	}
	if got.Allowed && (got.BytesIn == 0 || got.BytesOut == 0) {
		t.Errorf("allowed attempt without bytes: %+v", got)
	}
	if !got.Allowed && got.Reason != ReasonLimitBytes && (got.BytesIn != 0 || got.BytesOut != 0) {
		t.Errorf("refused attempt with bytes: %+v", got)
	}
	got.Time, got.BytesIn, got.BytesOut = time.Time{}, 0, 0
	if got != want {
		t.Errorf("attempt\n got %+v\nwant %+v", got, want)
	}
}

func TestRebindingPinned(t *testing.T) {
	h := newHarness(t, testPolicy(), Options{})
	c := h.client()
	// First answer 127.0.0.1 (granted): allowed, dialed exactly that.
	resp, err := c.Get("http://rebind.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	// Second answer 127.0.0.2 (not granted): refused, never dialed.
	resp, err = c.Get("http://rebind.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Fatalf("rebound request: %d", resp.StatusCode)
	}
	atts := h.settle(2)
	if atts[0].Address != "127.0.0.1" || !atts[0].Allowed || atts[1].Reason != ReasonPrivateAddress || atts[1].Address != "127.0.0.2" {
		t.Fatalf("attempts %+v", atts)
	}
	if n := h.resolver.lookups("rebind.test"); n != 2 {
		t.Fatalf("%d lookups for two requests; want one each", n)
	}
	if d := h.dialer.addrs(); len(d) != 1 || d[0] != "127.0.0.1:80" {
		t.Fatalf("dialed %v, want only the pinned 127.0.0.1:80", d)
	}
}

func TestHopByHopAndPrivacy(t *testing.T) {
	h := newHarness(t, testPolicy(), Options{})
	c := h.raw()
	fmt.Fprint(c, "GET http://allowed.test/headers HTTP/1.1\r\n"+
		"Host: other.test\r\n"+ // ignored: the absolute URI decides
		"Proxy-Authorization: Basic c2VjcmV0\r\n"+
		"Proxy-Connection: keep-alive\r\n"+
		"Connection: X-Drop-Me, keep-alive\r\n"+
		"X-Drop-Me: 1\r\n"+
		"Keep-Alive: 300\r\n"+
		"Upgrade: websocket\r\n"+
		"TE: trailers\r\n"+
		"X-Keep: yes\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "allowed.test" {
		t.Fatalf("destination saw Host %q", body)
	}
	if resp.Header.Get("Keep-Alive") != "" || resp.Header.Get("Proxy-Authenticate") != "" || !resp.Close {
		t.Fatalf("response hop-by-hop headers not stripped: %v", resp.Header)
	}
	h.b.mu.Lock()
	got := h.b.headers
	h.b.mu.Unlock()
	for _, k := range []string{"Proxy-Authorization", "Proxy-Connection", "X-Drop-Me", "Keep-Alive", "Upgrade", "Te", "X-Forwarded-For", "Forwarded", "Via", "User-Agent"} {
		if v := got.Get(k); v != "" {
			t.Errorf("destination received %s: %q", k, v)
		}
	}
	if got.Get("X-Keep") != "yes" {
		t.Errorf("end-to-end header lost: %v", got)
	}
}

func TestBadRequests(t *testing.T) {
	tests := []struct {
		name, req  string
		wantStatus string // prefix of the status line; "" means the connection just closes
	}{
		{"origin form", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "HTTP/1.1 400"},
		{"https absolute", "GET https://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "HTTP/1.1 400"},
		{"ftp", "GET ftp://allowed.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"trace", "TRACE http://allowed.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 405"},
		{"unknown method", "BREW http://allowed.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 405"},
		{"userinfo", "GET http://allowed.test@other.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"connect no port", "CONNECT allowed.test HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"connect userinfo", "CONNECT allowed.test@other.test:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"connect bad port", "CONNECT allowed.test:99999 HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"garbage", "\x16\x03\x01\x00\x05hello\r\n\r\n", "HTTP/1.1 400"},
		{"http2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "HTTP/1.1 4"},
		{"header too large", "GET http://allowed.test/ HTTP/1.1\r\nX: " + strings.Repeat("a", 70<<10) + "\r\n\r\n", "HTTP/1.1 400"},
		{"bad host", "GET http://a_b.test/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400"},
		{"empty then close", "", ""},
	}
	h := newHarness(t, testPolicy(), Options{})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.settle(0))
			c := h.raw()
			io.WriteString(c, tc.req)
			c.(*net.TCPConn).CloseWrite()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			out, err := io.ReadAll(io.LimitReader(c, 64<<10))
			if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				t.Fatalf("read: %v", err)
			}
			if !strings.HasPrefix(string(out), tc.wantStatus) {
				t.Fatalf("response %q, want prefix %q", out, tc.wantStatus)
			}
			atts := h.settle(before + 1)
			if len(atts) != before+1 || atts[before].Reason != ReasonBadRequest || atts[before].Allowed {
				t.Fatalf("attempts %+v", atts[before:])
			}
		})
	}
	if d := h.dialer.addrs(); len(d) != 0 {
		t.Fatalf("bad requests dialed %v", d)
	}
}

func TestConnectTLS(t *testing.T) {
	h := newHarness(t, testPolicy(), Options{})
	t.Run("net/http client through CONNECT", func(t *testing.T) {
		before := len(h.settle(0))
		resp, err := h.client().Get("https://allowed.test/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello from allowed.test" {
			t.Fatalf("body %q", body)
		}
		atts := h.settle(before + 1)
		checkAttempt(t, atts[before], Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed})
	})

	tests := []struct {
		name   string
		target string
		// run talks over the established tunnel and reports whether
		// the destination answered.
		run      func(c net.Conn) error
		wantOK   bool
		want     Attempt
		refusing string // status line prefix when CONNECT itself is refused
	}{
		{name: "right SNI", target: "allowed.test:443", run: tlsGet("allowed.test"), wantOK: true,
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "SNI case and trailing dot", target: "allowed.test:443", run: tlsGet("ALLOWED.test."), wantOK: true,
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "wildcard host", target: "a.wild.test:443", run: tlsGet("a.wild.test"), wantOK: true,
			want: Attempt{Method: "CONNECT", Host: "a.wild.test", Port: 443, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "wrong SNI (fronting)", target: "allowed.test:443", run: tlsGet("other.test"),
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Reason: ReasonSNIMismatch}},
		{name: "sibling SNI", target: "a.wild.test:443", run: tlsGet("a.b.wild.test"),
			want: Attempt{Method: "CONNECT", Host: "a.wild.test", Port: 443, Address: "127.0.0.1", Reason: ReasonSNIMismatch}},
		{name: "no SNI", target: "allowed.test:443", run: tlsGet(""),
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Reason: ReasonSNIMismatch}},
		// Encrypted Client Hello: the outer SNI is the allowed CONNECT
		// name, the encrypted inner one names another site behind the
		// same front. Refused with its own reason, inner name or not.
		{name: "ECH with an allowed outer name", target: "allowed.test:443", run: tlsGetConfig(&tls.Config{ServerName: "other.test", MinVersion: tls.VersionTLS13,
			EncryptedClientHelloConfigList: echConfigList(t, "allowed.test"), InsecureSkipVerify: true}),
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Reason: ReasonECHRefused}},
		{name: "ECH with the same inner name", target: "allowed.test:443", run: tlsGetConfig(&tls.Config{ServerName: "allowed.test", MinVersion: tls.VersionTLS13,
			EncryptedClientHelloConfigList: echConfigList(t, "allowed.test"), InsecureSkipVerify: true}),
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Reason: ReasonECHRefused}},
		{name: "not TLS", target: "allowed.test:443", run: plainGet,
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 443, Address: "127.0.0.1", Reason: ReasonSNIMismatch}},
		{name: "granted IP literal, no SNI needed", target: "127.0.0.1:443", run: tlsGet(""), wantOK: true,
			want: Attempt{Method: "CONNECT", Host: "127.0.0.1", Port: 443, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "plain tunnel on a non-TLS port", target: "127.0.0.1:80", run: plainGet, wantOK: true,
			want: Attempt{Method: "CONNECT", Host: "127.0.0.1", Port: 80, Address: "127.0.0.1", Allowed: true, Reason: ReasonAllowed}},
		{name: "not allowlisted", target: "other.test:443", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "other.test", Port: 443, Reason: ReasonNotAllowlisted}},
		{name: "metadata", target: "meta.bad.test:443", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "meta.bad.test", Port: 443, Address: "169.254.169.254", Reason: ReasonPrivateAddress}},
		{name: "ip literal", target: "[::1]:443", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "::1", Port: 443, Reason: ReasonIPLiteral}},
		{name: "ip literal mapped", target: "[::ffff:127.0.0.2]:443", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "127.0.0.2", Port: 443, Reason: ReasonIPLiteral}},
		{name: "tunnel to port 80 needs an explicit rule", target: "allowed.test:80", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 80, Reason: ReasonNotAllowlisted}},
		{name: "port not allowlisted", target: "allowed.test:9", refusing: "HTTP/1.1 403",
			want: Attempt{Method: "CONNECT", Host: "allowed.test", Port: 9, Reason: ReasonNotAllowlisted}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.settle(0))
			c, status := h.connect(tc.target)
			if tc.refusing != "" {
				if !strings.HasPrefix(status, tc.refusing) {
					t.Fatalf("CONNECT %s: %q, want %q", tc.target, status, tc.refusing)
				}
			} else {
				if c == nil {
					t.Fatalf("CONNECT %s: %q", tc.target, status)
				}
				err := tc.run(c)
				if tc.wantOK && err != nil {
					t.Fatalf("through tunnel: %v", err)
				}
				if !tc.wantOK && err == nil {
					t.Fatalf("through tunnel: destination answered, want the tunnel refused")
				}
				c.Close()
			}
			atts := h.settle(before + 1)
			if len(atts) != before+1 {
				t.Fatalf("attempts %+v", atts[before:])
			}
			checkAttempt(t, atts[before], tc.want)
		})
	}
}

// tlsGet does a TLS handshake with the given SNI ("" sends none) and an
// HTTP request over it.
func tlsGet(sni string) func(net.Conn) error {
	return tlsGetConfig(&tls.Config{ServerName: sni, InsecureSkipVerify: true})
}

// tlsGetConfig is tlsGet with a whole client configuration.
func tlsGetConfig(cfg *tls.Config) func(net.Conn) error {
	return func(c net.Conn) error {
		tc := tls.Client(c, cfg)
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			return err
		}
		fmt.Fprint(tc, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		_, err = io.ReadAll(resp.Body)
		return err
	}
}

func plainGet(c net.Conn) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

func TestUpstreamError(t *testing.T) {
	// allowed.test:9 is allowlisted here; nothing listens on 127.0.0.1:9.
	pol := testPolicy()
	pol.Allow = append(pol.Allow, MustParseRule("allowed.test:9"))
	h := newHarness(t, pol, Options{})
	_, status := h.connect("allowed.test:9")
	if !strings.HasPrefix(status, "HTTP/1.1 502") {
		t.Fatalf("status %q", status)
	}
	checkAttempt(t, h.last(), Attempt{Method: "CONNECT", Host: "allowed.test", Port: 9, Reason: ReasonUpstreamError})
}

func TestByteBudget(t *testing.T) {
	const budget = 64 << 10
	t.Run("upload", func(t *testing.T) {
		pol := testPolicy()
		pol.Limits.MaxBytesOut = budget
		h := newHarness(t, pol, Options{})
		body := bytes.NewReader(make([]byte, 1<<20))
		resp, err := h.client().Post("http://allowed.test/upload", "application/octet-stream", body)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				t.Fatalf("1 MiB upload through a %d byte budget succeeded", budget)
			}
		}
		a := h.last()
		if a.Reason != ReasonLimitBytes || a.BytesOut > budget || a.BytesOut < budget/2 {
			t.Fatalf("attempt %+v, want limit-bytes with at most %d bytes out", a, budget)
		}
		if up := h.b.uploadedBytes(); up > budget {
			t.Fatalf("destination received %d bytes through a %d budget", up, budget)
		}
		// The budget is for the whole run: the next attempt is refused.
		resp, err = h.client().Get("http://allowed.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || h.last().Reason != ReasonLimitBytes {
			t.Fatalf("after the budget: %d %+v", resp.StatusCode, h.last())
		}
	})
	t.Run("download", func(t *testing.T) {
		pol := testPolicy()
		pol.Limits.MaxBytesIn = budget
		h := newHarness(t, pol, Options{})
		resp, err := h.client().Get("http://allowed.test/big?n=1048576")
		var n int64
		if err == nil {
			n, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Fatalf("1 MiB download through a %d byte budget completed (%d bytes)", budget, n)
		}
		if n > budget {
			t.Fatalf("client received %d bytes", n)
		}
		a := h.last()
		if a.Reason != ReasonLimitBytes || a.BytesIn != budget {
			t.Fatalf("attempt %+v, want limit-bytes with exactly %d bytes in", a, budget)
		}
	})
	t.Run("tunnel download", func(t *testing.T) {
		pol := testPolicy()
		pol.Limits.MaxBytesIn = budget
		h := newHarness(t, pol, Options{})
		resp, err := h.client().Get("https://allowed.test/big?n=1048576")
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err == nil {
			t.Fatal("1 MiB download through a tunnel within a 64 KiB budget completed")
		}
		if a := h.last(); a.Reason != ReasonLimitBytes || a.BytesIn != budget || a.Method != "CONNECT" {
			t.Fatalf("attempt %+v", a)
		}
	})
}

func TestMaxConns(t *testing.T) {
	pol := testPolicy()
	pol.Limits.MaxConns = 2
	h := newHarness(t, pol, Options{})
	// Two clients hold their slots by sending nothing.
	holders := []net.Conn{h.raw(), h.raw()}
	waitFor(t, "two connections held", func() bool { return len(h.p.slots) == 2 })
	c := h.raw()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	out, _ := io.ReadAll(c) // a 503, or a reset if the refusal raced the request
	if len(out) > 0 && !strings.HasPrefix(string(out), "HTTP/1.1 503") {
		t.Fatalf("third connection got %q", out)
	}
	found := false
	for _, a := range h.p.Attempts() {
		found = found || a.Reason == ReasonLimitConns && !a.Allowed
	}
	if !found {
		t.Fatalf("no limit-conns attempt: %+v", h.p.Attempts())
	}
	for _, hc := range holders {
		hc.Close()
	}
	waitFor(t, "slots released", func() bool { return len(h.p.slots) == 0 })
	resp, err := h.client().Get("http://allowed.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the holders left: %d", resp.StatusCode)
	}
}

func TestConnRate(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	pol := testPolicy()
	pol.Limits.ConnRate = 3
	h := newHarness(t, pol, Options{Now: clock})
	c := h.client()
	get := func() int {
		resp, err := c.Get("http://allowed.test/")
		if err != nil {
			return -1 // refused before the request was read (reset)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 3 {
		if s := get(); s != 200 {
			t.Fatalf("request %d within the rate: %d", i, s)
		}
	}
	if s := get(); s == 200 {
		t.Fatal("fourth request in the same second was served")
	}
	// The refusal may reach the client before the proxy has logged it:
	// wait for the fourth attempt, not just for the proxy to be idle.
	if atts := h.settle(4); atts[3].Reason != ReasonLimitRate {
		t.Fatalf("attempt %+v, want limit-rate", atts[3])
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if s := get(); s != 200 {
		t.Fatalf("after a second: %d", s)
	}
}

func TestSlowLoris(t *testing.T) {
	pol := testPolicy()
	pol.Limits.HandshakeTimeout = 300 * time.Millisecond
	pol.Limits.MaxConns = 4
	h := newHarness(t, pol, Options{})
	tests := []struct {
		name string
		send string
	}{
		{"half a request line", "GET http://allowed.test/ HT"},
		{"headers never end", "GET http://allowed.test/ HTTP/1.1\r\nX-A: 1\r\n"},
		{"connect without ClientHello", "CONNECT allowed.test:443 HTTP/1.1\r\n\r\n"},
		{"connect with half a ClientHello", "CONNECT allowed.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x02\x00\x01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			slow := h.raw()
			io.WriteString(slow, tc.send)
			start := time.Now()
			// Others are served while the slow client stalls.
			resp, err := h.client().Get("http://allowed.test/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("concurrent client: %d", resp.StatusCode)
			}
			slow.SetReadDeadline(time.Now().Add(5 * time.Second))
			io.Copy(io.Discard, slow) // returns when the proxy cuts it
			if d := time.Since(start); d > 2*time.Second || d < 200*time.Millisecond {
				t.Fatalf("slow client cut after %v, want about 300ms", d)
			}
		})
	}
}

func TestIdleTimeout(t *testing.T) {
	pol := testPolicy()
	pol.Limits.IdleTimeout = 300 * time.Millisecond
	h := newHarness(t, pol, Options{})
	c, status := h.connect("allowed.test:443")
	if c == nil {
		t.Fatal(status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := tc.Read(make([]byte, 1)) // nothing comes; the proxy closes
	if err == nil {
		t.Fatal("read data on an idle tunnel")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("idle tunnel closed after %v (%v), want about 300ms", d, err)
	}
	if a := h.last(); !a.Allowed || a.BytesIn == 0 {
		t.Fatalf("attempt %+v", a)
	}
}

func TestCloseLeavesNothing(t *testing.T) {
	b := newBackend(t) // the backend's goroutines belong to the baseline
	baseline := numGoroutine()
	func() {
		h := &harness{t: t, b: b, resolver: newFakeResolver()}
		h.dialer = &loopDialer{t: t, ports: b.ports()}
		h.p = New(testPolicy(), Options{Resolver: h.resolver, Dialer: h.dialer})
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		h.addr = l.Addr().String()
		served := make(chan error, 1)
		go func() { served <- h.p.Serve(l) }()

		cl := h.client()
		for _, u := range []string{"http://allowed.test/", "https://allowed.test/", "http://other.test/"} {
			resp, err := cl.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		// Left hanging at Close: a slow-loris, an open tunnel, a
		// tunnel mid-download.
		slow := h.raw()
		io.WriteString(slow, "GET http://allo")
		tun, status := h.connect("allowed.test:443")
		if tun == nil {
			t.Fatal(status)
		}
		tlsc := tls.Client(tun, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true})
		if err := tlsc.Handshake(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "two sessions active", func() bool { return len(h.p.slots) == 2 })

		if err := h.p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-served; !errors.Is(err, ErrClosed) {
			t.Fatalf("Serve returned %v, want ErrClosed", err)
		}
		if c, err := net.DialTimeout("tcp", h.addr, time.Second); err == nil {
			c.Close()
			t.Fatal("listener still accepting after Close")
		}
		// A closed proxy refuses everything, including new listeners.
		l2, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		if err := h.p.Serve(l2); !errors.Is(err, ErrClosed) {
			t.Fatalf("Serve after Close: %v", err)
		}
		if c, err := net.DialTimeout("tcp", l2.Addr().String(), time.Second); err == nil {
			c.Close()
			t.Fatal("listener passed to a closed proxy still accepting")
		}
		slow.Close()
		tun.Close()
		cl.CloseIdleConnections()
		b.http.CloseClientConnections()
		b.tls.CloseClientConnections()
		if n := len(h.p.Attempts()); n != 5 {
			t.Fatalf("%d attempts logged, want 5: %+v", n, h.p.Attempts())
		}
	}()
	if n := goroutinesSettle(t, baseline); n > baseline {
		t.Fatalf("%d goroutines after Close, baseline %d", n, baseline)
	}
}

func TestFloodBounded(t *testing.T) {
	pol := testPolicy()
	pol.Limits.MaxConns = 4
	pol.Limits.ConnRate = 1000
	pol.Limits.HandshakeTimeout = 3 * time.Second
	h := newHarness(t, pol, Options{})
	h.settle(0)
	baseline := numGoroutine()
	var conns []net.Conn
	for range 200 {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			break
		}
		io.WriteString(c, "GET http://allowed.test/ HT") // and stall
		conns = append(conns, c)
	}
	time.Sleep(100 * time.Millisecond)
	n := numGoroutine()
	// The proxy accepts and refuses at its own pace: under load, 100 ms
	// is not always enough for 200 connections, so wait for the refusals
	// (with the connections still open) rather than count them early.
	limited := func() int {
		k := 0
		for _, a := range h.p.Attempts() {
			if a.Reason == ReasonLimitConns {
				k++
			}
		}
		return k
	}
	waitFor(t, fmt.Sprintf("%d limit-conns attempts for %d connections", len(conns)-pol.Limits.MaxConns, len(conns)), func() bool {
		return limited() >= len(conns)-pol.Limits.MaxConns
	})
	for _, c := range conns {
		c.Close()
	}
	// Per held connection one handler goroutine; nothing per refused one.
	if extra := n - baseline; extra > pol.Limits.MaxConns+4 {
		t.Fatalf("%d connections cost %d goroutines; bound is MaxConns(%d)+4", len(conns), extra, pol.Limits.MaxConns)
	}
}

func TestUnixSocket(t *testing.T) {
	b := newBackend(t)
	p := New(testPolicy(), Options{Resolver: newFakeResolver(), Dialer: &loopDialer{t: t, ports: b.ports()}})
	sock := filepath.Join(t.TempDir(), "egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Serve(l) }()
	tr := &http.Transport{
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: "proxy"}),
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
	}
	for _, u := range []string{"http://allowed.test/", "https://allowed.test/"} {
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(u)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello from allowed.test" {
			t.Fatalf("%s: %q", u, body)
		}
	}
	p.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("Serve: %v", err)
	}
	if len(p.Attempts()) != 2 {
		t.Fatalf("attempts %+v", p.Attempts())
	}
}

func TestAttemptJSON(t *testing.T) {
	a := Attempt{Time: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC), Method: "CONNECT", Host: "pypi.org", Port: 443,
		Address: "151.101.0.223", Allowed: true, Reason: ReasonAllowed, BytesOut: 10, BytesIn: 20}
	got, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time":"2030-01-02T03:04:05Z","method":"CONNECT","host":"pypi.org","port":443,"address":"151.101.0.223","allowed":true,"reason":"allowed","bytes_out":10,"bytes_in":20}`
	if string(got) != want {
		t.Fatalf("json\n got %s\nwant %s", got, want)
	}
}

func TestLogBounded(t *testing.T) {
	p := New(Policy{Limits: Limits{MaxLogEntries: 3}}, Options{})
	defer p.Close()
	for range 5 {
		p.logRefused(Attempt{Reason: ReasonBadRequest})
	}
	if len(p.Attempts()) != 3 || p.DroppedAttempts() != 2 {
		t.Fatalf("log %d, dropped %d", len(p.Attempts()), p.DroppedAttempts())
	}
	if s := p.Summary(); s.Attempts != 5 || s.Unlogged != 2 || s.UnloggedReasons[ReasonBadRequest] != 2 {
		t.Fatalf("summary %+v", s)
	}
}

func TestDefaultsAndGrants(t *testing.T) {
	l := Limits{}.withDefaults()
	if l.MaxConns != 16 || l.MaxBytesOut != 64<<20 || l.MaxBytesIn != 512<<20 || l.ConnRate != 20 ||
		l.IdleTimeout != 60*time.Second || l.HandshakeTimeout != 10*time.Second {
		t.Fatalf("defaults %+v", l)
	}
	// A grant lets a private answer through only for an allowed name.
	pol := testPolicy()
	pol.AllowAddresses = append(pol.AllowAddresses, netip.MustParsePrefix("10.1.2.0/24"))
	p := New(pol, Options{Resolver: newFakeResolver()})
	defer p.Close()
	if v := p.decide(p.ctx, "private.test", 80, false); v.reason != ReasonAllowed || v.addrs[0] != netip.MustParseAddr("10.1.2.3") {
		t.Fatalf("granted private answer: %+v", v)
	}
	if v := p.decide(p.ctx, "other.test", 80, false); v.reason != ReasonNotAllowlisted {
		t.Fatalf("grant widened the allowlist: %+v", v)
	}
}

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
