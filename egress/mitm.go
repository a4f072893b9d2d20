package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The proxy's side of TLS for secret-bound hosts (issue 20 §1). For a
// CONNECT to a host some secret is bound to, the proxy is the TLS server
// the sandbox talks to, with a certificate from a CA made for this run
// only, and a TLS client of the real host, which it verifies fully. In
// between it reads HTTP/1.1 requests, puts the secret's value in where its
// binding allows, refuses placeholders anywhere else, and replaces the
// value by the placeholder in what comes back. See docs/THREATS.md
// ("Secrets and the run CA").

// caValidity is how long a run CA and its leaves are valid: a run's
// timeout is bounded well below it, and a session that outlives it gets
// handshake failures, never a CA that lasts.
const caValidity = 48 * time.Hour

// runCA is the per-run certificate authority. Its key lives in this
// struct only: never written, never logged, gone with the Proxy.
type runCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// newRunCA makes a CA whose name constraints permit only the bound hosts
// (PermittedDNSDomains, RFC 5280 4.2.1.10): a verifier refuses anything
// it signs for another name, so even its key, leaked, is good for nothing
// else. An exact rule "api.example.com" permits that name and its
// subdomains (x509 has no exact-name constraint); "*.example.com" permits
// example.com's subdomains.
func newRunCA(s *secretSet, now time.Time) (*runCA, error) {
	var permitted []string
	seen := map[string]bool{}
	for _, b := range s.bindings {
		for _, r := range b.rules {
			d := r.Host
			if r.Wildcard {
				d = "." + r.Host
			}
			if !seen[d] {
				seen[d] = true
				permitted = append(permitted, d)
			}
		}
	}
	if len(permitted) == 0 {
		return nil, errors.New("no secret is bound to a valid host")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("run CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("run CA serial: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{CommonName: "Moat run CA (secret-bound hosts only)", Organization: []string{"Moat"}},
		NotBefore:                   now.Add(-5 * time.Minute),
		NotAfter:                    now.Add(caValidity),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
		// No IP address, e-mail or URI is permitted: an empty
		// excluded-everything range for IPs.
		ExcludedIPRanges: []*net.IPNet{{IP: net.IPv4zero, Mask: net.IPv4Mask(0, 0, 0, 0)}, {IP: net.IPv6zero, Mask: make(net.IPMask, 16)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("run CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("run CA certificate: %w", err)
	}
	return &runCA{
		cert:   cert,
		key:    key,
		pem:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{},
	}, nil
}

// leaf returns the certificate for host, made once per run.
func (ca *runCA) leaf(host string, now time.Time) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[host]; ok {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}
	ca.leaves[host] = c
	return c, nil
}

// TrustPEM is the run CA's certificate in PEM, for the sandbox's trust
// store; nil when no secret is bound (nothing is intercepted). The key
// never leaves the proxy.
func (p *Proxy) TrustPEM() []byte {
	if p.ca == nil {
		return nil
	}
	return append([]byte(nil), p.ca.pem...)
}

// TrustError says why secrets cannot be honoured (the run CA could not
// be made); nil when there are none or all is well.
func (p *Proxy) TrustError() error {
	if p.sec != nil && p.ca == nil {
		return p.caErr
	}
	return nil
}

// countSecretUse adds one request that carried secret name to host.
func (p *Proxy) countSecretUse(names []string, host string) {
	if len(names) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range names {
		p.secretUses[SecretUse{Name: n, Host: host}]++
	}
}

// bufConn reads through the session's buffered reader (bytes the client
// sent right behind CONNECT) and writes to the connection.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// maxInterceptedRequests bounds the requests served on one intercepted
// connection; each is checked alone, this only bounds a connection's life.
const maxInterceptedRequests = 10000

// intercept serves a CONNECT to a secret-bound host: s.up is dialed to the
// pinned address, the client was told 200.
func (s *session) intercept(port int, bound []*secretBinding) {
	p := s.p
	lim := p.pol.limits
	host := s.att.Host
	leaf, err := p.ca.leaf(host, p.now())
	if err != nil {
		s.att.Allowed, s.att.Reason = false, ReasonUpstreamError
		return
	}
	sniOK := false
	srv := tls.Server(bufConn{Conn: s.client, r: s.br}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		// HTTP/2 would need its own framing here; clients fall back.
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			// The name was decided on the CONNECT line; the SNI must
			// agree, as for an opaque tunnel.
			if !sameHost(hello.ServerName, host) {
				return nil, errors.New("SNI does not match the CONNECT host")
			}
			sniOK = true
			return leaf, nil
		},
	})
	s.client.Conn.SetDeadline(time.Now().Add(lim.HandshakeTimeout))
	if err := srv.Handshake(); err != nil {
		s.att.Allowed = false
		s.att.Reason = ReasonBadRequest
		if !sniOK {
			s.att.Reason = ReasonSNIMismatch
		}
		return
	}
	up := tls.Client(s.up, &tls.Config{
		ServerName: host,
		RootCAs:    p.rootCAs, // nil: the system roots
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
	})
	s.up.Conn.SetDeadline(time.Now().Add(lim.HandshakeTimeout))
	if err := up.Handshake(); err != nil {
		s.att.Allowed, s.att.Reason = false, ReasonUpstreamError
		s.refuseTLS(srv, http.StatusBadGateway, ReasonUpstreamError, fmt.Sprintf("TLS to %s failed verification or did not complete", host))
		return
	}
	s.client.Conn.SetDeadline(time.Time{})
	s.up.Conn.SetDeadline(time.Time{})
	s.client.setIdle(lim.IdleTimeout)
	s.up.setIdle(lim.IdleTimeout)

	// One reader each way for the connection's life; the caps bound
	// each header and are lifted for bodies.
	ccap := &capReader{r: srv, n: -1, err: errHeaderTooLarge}
	cbr := bufio.NewReaderSize(ccap, 16<<10)
	ucap := &capReader{r: up, n: -1, err: errHeaderTooLarge}
	ubr := bufio.NewReaderSize(ucap, 32<<10)
	for range maxInterceptedRequests {
		ccap.n = maxHeaderBytes
		req, err := http.ReadRequest(cbr)
		if err != nil {
			return
		}
		ccap.n = -1
		if !s.serveIntercepted(srv, up, ubr, ucap, req, port, bound) {
			return
		}
	}
}

// serveIntercepted relays one request on an intercepted connection and
// reports whether the connection may carry another.
func (s *session) serveIntercepted(srv *tls.Conn, up *tls.Conn, ubr *bufio.Reader, ucap *capReader, req *http.Request, port int, bound []*secretBinding) bool {
	p := s.p
	host := s.att.Host
	if req.ProtoMajor != 1 || req.Method == http.MethodConnect || !forwardMethods[req.Method] {
		s.refuseTLS(srv, http.StatusBadRequest, ReasonBadRequest, fmt.Sprintf("method %q or protocol %s is not relayed to a secret-bound host", req.Method, req.Proto))
		return false
	}
	// Fronting inside TLS: the Host header routes the request at the
	// destination, and must name the host the decision (and the SNI)
	// was made on.
	if !hostHeaderMatches(req.Host, host, port) {
		s.att.Allowed, s.att.Reason = false, ReasonSNIMismatch
		s.refuseTLS(srv, http.StatusMisdirectedRequest, ReasonSNIMismatch, fmt.Sprintf("the Host header must name %s, the host of the CONNECT and the TLS SNI", host))
		return false
	}
	// The destination sees the name the decision was made on.
	req.Host = host
	if port != tlsPort {
		req.Host = net.JoinHostPort(host, strconv.Itoa(port))
	}
	if req.URL.IsAbs() || req.URL.Host != "" {
		s.refuseTLS(srv, http.StatusBadRequest, ReasonBadRequest, "send origin-form request targets (GET /path) inside the tunnel")
		return false
	}
	sub, err := p.sec.rewriteRequest(req, bound)
	if err != nil {
		s.att.Allowed, s.att.Reason = false, ReasonSecretExfiltration
		s.refuseTLS(srv, http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent outside the place its binding allows (header, path prefix, query, body); refused")
		return false
	}
	stripHopByHop(req.Header)
	expect := false
	for _, v := range req.Header.Values("Expect") {
		expect = expect || strings.EqualFold(strings.TrimSpace(v), "100-continue")
	}
	req.Header.Del("Expect")
	// A compressed answer could not be scrubbed of the value.
	req.Header.Del("Accept-Encoding")
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""}
	}
	closeAfter := req.Close
	req.Close = false
	if expect {
		// The client waits for this before it sends the body the
		// proxy is about to read.
		if _, err := io.WriteString(srv, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
			return false
		}
	}
	cb, err := p.sec.prepareBody(req.Body, req.ContentLength, sub.body)
	if cb.refused {
		s.att.Allowed, s.att.Reason = false, ReasonSecretExfiltration
		s.refuseTLS(srv, http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent in a request body its binding does not allow; refused")
		return false
	}
	if err != nil {
		return false
	}
	cb.apply(req)
	bodyRep := cb.rep

	sent := make(chan error, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				sent <- fmt.Errorf("panic: %v", r)
			}
		}()
		bw := bufio.NewWriterSize(up, 32<<10)
		err := req.Write(bw)
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			// Unblock the response read below.
			s.up.Conn.Close()
		}
		sent <- err
	}()
	ucap.n = maxRespHeaderBytes
	resp, rerr := readResponse(ubr, req.Method)
	ucap.n = -1
	if rerr != nil {
		// Unblock a writer stuck on a full socket.
		s.up.Conn.Close()
	}
	werr := <-sent
	if rerr == nil && werr != nil {
		// The destination answered before the whole request went
		// out; its answer is not to this request's body.
		resp.Body.Close()
	}
	// net/http wraps the body's error in a type without Unwrap: ask the
	// replacer (the writer is done, so this reads no moving state).
	if bodyRep.refused() {
		s.att.Allowed, s.att.Reason = false, ReasonSecretExfiltration
		s.refuseTLS(srv, http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder was sent in a request body its binding does not allow; refused")
		return false
	}
	if rerr != nil || werr != nil {
		if s.up.overBudget.Load() {
			s.att.Reason = ReasonLimitBytes
		}
		s.refuseTLS(srv, http.StatusBadGateway, ReasonUpstreamError, fmt.Sprintf("no valid response from %s", host))
		return false
	}
	p.countSecretUse(append(sub.used, bodyRep.replacedIn(sub.body)...), host)
	stripHopByHop(resp.Header)
	scrub := append(scrubPatterns(bound), sub.scrub...)
	scrubHeader(resp.Header, scrub)
	// Trailers arrive after the body; net/http fills resp.Trailer as it
	// reads it, and resp.Write writes them from there.
	resp.Trailer = nil
	if bodyAllowed(resp.StatusCode, req.Method) {
		resp.Body = newStreamReplacer(resp.Body, scrub)
		resp.ContentLength = -1
		resp.TransferEncoding = []string{"chunked"}
		resp.Header.Del("Content-Length")
	}
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	keep := !closeAfter && !resp.Close
	resp.Close = !keep
	cw := bufio.NewWriterSize(srv, 32<<10)
	if err := resp.Write(cw); err != nil || cw.Flush() != nil {
		return false
	}
	return keep
}

// bodyAllowed reports whether a response to method with status has a
// body (RFC 9110 6.4.1).
func bodyAllowed(status int, method string) bool {
	return method != http.MethodHead && status != http.StatusNoContent && status != http.StatusNotModified && (status < 100 || status >= 200)
}

// hostHeaderMatches reports whether a request's Host names host (with the
// tunnel's port, or none for the scheme's default).
func hostHeaderMatches(hostHeader, host string, port int) bool {
	h, pt, err := targetPort(hostHeader, 443)
	if err != nil {
		return false
	}
	if pt != port && !(pt == 443 && port == tlsPort && !strings.Contains(hostHeader, ":")) {
		return false
	}
	return sameHost(h, host)
}

// refuseTLS answers a refused request inside the intercepted TLS
// connection, so the client sees why, and records the reason.
func (s *session) refuseTLS(srv *tls.Conn, status int, reason, msg string) {
	s.att.Allowed = false
	s.att.Reason = reason
	s.client.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	var b bytes.Buffer
	writeRefusal(&b, status, reason, msg)
	srv.Write(b.Bytes())
}

// secretUsesSorted lists m by host, then name.
func secretUsesSorted(m map[SecretUse]int) []SecretUse {
	out := make([]SecretUse, 0, len(m))
	for u, n := range m {
		u.Requests = n
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b SecretUse) int {
		return cmp.Or(cmp.Compare(a.Host, b.Host), cmp.Compare(a.Name, b.Name))
	})
	return out
}

// refuseExfiltration refuses a request whose destination name or request
// carried a placeholder, before anything was resolved or dialed.
func (s *session) refuseExfiltration(rawHost string, port int) {
	s.att.Host, s.att.Port = rawHost, port
	if h, err := normaliseHost(rawHost); err == nil {
		s.att.Host = h
	}
	s.refuse(http.StatusForbidden, ReasonSecretExfiltration, "a secret's placeholder may only go to the hosts the secret is bound to, in the places its binding names; refused")
}

// secretUsesSince is what cur counts beyond prev (a session's commands
// share their sandbox's proxy).
func secretUsesSince(cur, prev []SecretUse) []SecretUse {
	before := map[SecretUse]int{}
	for _, u := range prev {
		before[SecretUse{Name: u.Name, Host: u.Host}] = u.Requests
	}
	var out []SecretUse
	for _, u := range cur {
		if n := u.Requests - before[SecretUse{Name: u.Name, Host: u.Host}]; n > 0 {
			u.Requests = n
			out = append(out, u)
		}
	}
	return out
}

// scrubHeader replaces each pattern's old by its new in every header value.
func scrubHeader(h http.Header, pats []replacement) {
	for _, vs := range h {
		for i := range vs {
			for _, r := range pats {
				vs[i] = strings.ReplaceAll(vs[i], string(r.old), string(r.new))
			}
		}
	}
}
