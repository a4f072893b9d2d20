package egress

import (
	"bytes"
	"crypto/tls"
	"golang.org/x/text/unicode/norm"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{
		"pypi.org", "*.pythonhosted.org", "api.example.com:443", "PyPI.ORG.", "bücher.example",
		"xn--bcher-kva.example", "*.com", "*.co.uk", "*", "127.0.0.1", "[::1]:443", "https://a.b/c",
		"allowed.com@evil.test", "a..b", "a:0", "a:65536", "2130706433", "0x7f.1", "ａ.com", "\u212A.com",
		"xn--", "xn--a", "xn--zz-.ex", strings.Repeat("a.", 130),
		"cafe\u0301.com", "caf\u00e9.com", "xn--caf-dma.com", "*.cafe\u0301.com", "\u0430llowed.com",
		"xn--llowed-2nf.com", "fa\u00df.de", "a\u05d0.com", "\ufb01le.example", "allowed\u3002com",
	} {
		f.Add(s, "allowed.com", 443)
	}
	f.Fuzz(func(t *testing.T, s, host string, port int) {
		r, err := ParseRule(s)
		// Matching arbitrary hosts never panics, valid rule or not.
		_ = r.Matches(host, port)
		if err != nil {
			if r != (Rule{}) {
				t.Fatalf("error with a non-zero rule: %+v", r)
			}
			return
		}
		// A parsed rule is canonical: its host is normalised, it
		// round-trips, and it is valid for a Policy.
		if n, err := normaliseHost(r.Host); err != nil || n != r.Host {
			t.Fatalf("rule host %q not normalised (%q, %v)", r.Host, n, err)
		}
		if again, err := ParseRule(r.String()); err != nil || again != r {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, r, r.String(), again, err)
		}
		if err := (Policy{Allow: []Rule{r}}).Validate(); err != nil {
			t.Fatalf("parsed rule does not validate: %v", err)
		}
		if r.Port < 0 || r.Port > 65535 || strings.ContainsAny(r.Host, "*:/@[] ") {
			t.Fatalf("rule %+v", r)
		}
		p := r.Port
		if p == 0 {
			p = 443
		}
		if !r.Wildcard && !r.Matches(r.Host, p) {
			t.Fatalf("rule %+v does not match its own host", r)
		}
		if r.Wildcard && (r.Matches(r.Host, p) || !r.Matches("x."+r.Host, p)) {
			t.Fatalf("wildcard %+v matches wrongly", r)
		}
	})
}

// FuzzNormaliseHost: the name normaliser (rules and requested names) is
// idempotent, yields ASCII the strict IDNA profile accepts unchanged, and
// gives one answer for the canonically equivalent (NFC and NFD) spellings
// of a name it accepts.
func FuzzNormaliseHost(f *testing.F) {
	for _, s := range []string{
		"pypi.org", "PyPI.ORG.", "b\u00fccher.example", "bu\u0308cher.example", "xn--bcher-kva.example",
		"cafe\u0301.com", "CAF\u00c9.com", "xn--caf-dma.com", "xn--cafe-yvc.com", "\u0430llowed.com",
		"g\u03bfogle.com", "\u212Aey.example", "\uff41.com", "allowed\u3002com", "xn--99999999999.com",
		"\u0301a.com", "a\u05d0.com", "\u05d0\u05d1.com", "ca\u200dfe.com", "faß.de", "tokyo\u306e.jp",
		"127.1", "a..b", "xn--", "r1---sn-abc.example", strings.Repeat("\u00e9", 70) + ".com",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := normaliseHost(s)
		if err != nil {
			return
		}
		for i := 0; i < len(n); i++ {
			if n[i] >= 0x80 || n[i] >= 'A' && n[i] <= 'Z' {
				t.Fatalf("%q normalised to %q, not lower-case ASCII", s, n)
			}
		}
		if again, err := normaliseHost(n); err != nil || again != n {
			t.Fatalf("%q -> %q -> %q, %v: not idempotent", s, n, again, err)
		}
		// Every A-label is one the strict profile writes itself. (ASCII
		// labels keep the LDH rule only: "r1---sn-x" is a real CDN name
		// IDNA2008's hyphen rule would refuse.)
		for _, l := range strings.Split(n, ".") {
			if !strings.HasPrefix(l, "xn--") {
				continue
			}
			if a, err := idnaProfile.ToASCII(l); err != nil || a != l {
				t.Fatalf("%q -> %q, whose label %q IDNA writes %q, %v", s, n, l, a, err)
			}
		}
		for _, form := range []norm.Form{norm.NFC, norm.NFD} {
			v := form.String(s)
			if got, err := normaliseHost(v); err != nil || got != n {
				t.Fatalf("%q -> %q, but its equivalent %q -> %q, %v", s, n, v, got, err)
			}
		}
	})
}

func FuzzClientHello(f *testing.F) {
	real := captureHello(f, &tls.Config{ServerName: "files.pythonhosted.org", InsecureSkipVerify: true})
	f.Add(real)
	f.Add(refragment(real, 1000))
	f.Add(captureHello(f, &tls.Config{ServerName: "pypi.org", MaxVersion: tls.VersionTLS12, InsecureSkipVerify: true}))
	f.Add(captureHello(f, &tls.Config{InsecureSkipVerify: true}))
	f.Add(synthHello(sniExt("allowed.test")))
	f.Add(synthHello(sniExt("a"), sniExt("b")))
	f.Add(synthHello())
	// Encrypted Client Hello, real and crafted, in the final and the
	// draft code points.
	ech := echHello(f, "allowed.test", "other.test")
	f.Add(ech)
	f.Add(refragment(ech, 300))
	f.Add(synthHello(sniExt("allowed.test"), []byte{0xfe, 0x0d, 0, 3, 0, 1, 2}))
	f.Add(synthHello([]byte{0xff, 0xce, 0, 0}, sniExt("allowed.test")))
	f.Add(synthHello(sniExt("allowed.test"), []byte{0xfe, 0x08, 0, 0}))
	f.Add(synthHello(sniExt("allowed.test"), []byte{0xfd, 0x00, 0, 3, 2, 0, 10}))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		raw, sni, err := readClientHello(bytes.NewReader(in))
		if len(raw) > len(in) || !bytes.Equal(raw, in[:len(raw)]) {
			t.Fatalf("raw is not a prefix of the input")
		}
		if len(raw) > 5*maxClientHelloRecords+maxClientHelloBytes+4 {
			t.Fatalf("read %d bytes", len(raw))
		}
		if err != nil {
			if sni != "" {
				t.Fatalf("error %v with SNI %q", err, sni)
			}
			return
		}
		if sni == "" || len(sni) > maxSNILength {
			t.Fatalf("SNI %q", sni)
		}
		for i := 0; i < len(sni); i++ {
			if sni[i] <= 0x20 || sni[i] >= 0x7f {
				t.Fatalf("SNI %q has byte %#x", sni, sni[i])
			}
		}
		// The body parser alone is just as robust.
		parseClientHello(in)
	})
}

// FuzzProxyRequest writes arbitrary bytes to a live proxy and requires a
// bounded answer in bounded time, and never a dial outside loopback.
func FuzzProxyRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://other.test/ HTTP/1.1\r\n\r\n",
		"GET http://meta.bad.test/ HTTP/1.1\r\n\r\n",
		"GET http://127.0.0.1/ HTTP/1.1\r\n\r\n",
		"GET http://[::1]/ HTTP/1.1\r\n\r\n",
		"POST http://allowed.test/upload HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
		"POST http://allowed.test/upload HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST http://allowed.test/upload HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET http://allowed.test/ HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
		"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n\x16\x03\x01\x00\x05hello",
		"CONNECT 127.0.0.1:80 HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
		"CONNECT [::ffff:10.0.0.1]:443 HTTP/1.1\r\n\r\n",
		"GET http://allowed.test/ HTTP/1.1\r\n\r\nGET http://other.test/ HTTP/1.1\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"\x05\x01\x00",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Add(captureHello(f, &tls.Config{ServerName: "allowed.test", InsecureSkipVerify: true}))
	pol := testPolicy()
	pol.Limits.HandshakeTimeout = time.Second
	pol.Limits.IdleTimeout = time.Second
	pol.Limits.MaxBytesIn = 1 << 40
	pol.Limits.MaxBytesOut = 1 << 40
	pol.Limits.ConnRate = 1 << 20
	pol.Limits.MaxLogEntries = 100
	h := newHarness(f, pol, Options{})
	h.dialer.t = nil
	const bound = 5 << 20 // the largest backend response is 4 MiB
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			c.Write(in)
			c.(*net.TCPConn).CloseWrite()
		}()
		n, err := io.Copy(io.Discard, io.LimitReader(c, bound+1))
		if n > bound {
			t.Fatalf("response over %d bytes", bound)
		}
		if err != nil && isTimeout(err) {
			t.Fatalf("no end to the response within 10s: %v", err)
		}
		if v := h.dialer.violations.Load(); v != 0 {
			t.Fatalf("%d dials outside loopback", v)
		}
	})
}
