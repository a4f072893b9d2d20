package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The guarded package index (issue 20 §2, package pkgguard) lives inside
// the proxy: the sandbox's pip and npm send it plain-HTTP requests whose
// path starts with IndexPrefix, and it fetches from the upstream index
// itself, through UpstreamTransport. This file is the proxy's side of it.

// IndexPrefix is the path the proxy hands to the index handler. It is
// reserved: a request with this path is never forwarded, whatever its host.
const IndexPrefix = "/moat-index/"

// ReasonTyposquat and ReasonPackageNotAllowed are the reasons of package
// refusals logged by the index (with Attempt.Package and Resembles);
// ReasonHashMismatch is a file whose bytes did not match its digest.
const (
	ReasonTyposquat         = "typosquat"
	ReasonPackageNotAllowed = "package-not-allowed"
	ReasonHashMismatch      = "hash-mismatch"
)

// ServeIndex makes h answer the sandbox's requests for IndexPrefix. Call
// it before Serve.
func (p *Proxy) ServeIndex(h http.Handler) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.index = h
}

// LogPackage records a decision of the index in the network log: a
// refused one counts as a refusal, an allowed one (a verified file served)
// as an admitted attempt.
func (p *Proxy) LogPackage(a Attempt) {
	if a.Time.IsZero() {
		a.Time = p.now()
	}
	a.Method = "GET"
	if a.Allowed {
		if p.reserveAdmitted() {
			p.logAdmitted(a)
		}
		return
	}
	p.logRefused(a)
}

// serveIndex answers req with the index handler if it is addressed to it:
// an origin-form request (GET /moat-index/...), or an absolute one for a
// loopback host (pip and npm send http://127.0.0.1:3128/moat-index/...
// through the proxy they were told to use). It reports whether it did.
func (s *session) serveIndex(req *http.Request) bool {
	s.p.mu.Lock()
	h := s.p.index
	s.p.mu.Unlock()
	if h == nil || req.URL == nil || !strings.HasPrefix(req.URL.Path, IndexPrefix) {
		return false
	}
	if req.URL.Host != "" {
		host, _, err := targetPort(req.URL.Host, 80)
		a, perr := netip.ParseAddr(host)
		if err != nil || !(host == "localhost" || perr == nil && a.Unmap().IsLoopback()) {
			return false
		}
	}
	// The attempts are logged by the handler (LogPackage) and by the
	// upstream dials; the request itself is the sandbox talking to the
	// proxy, not a destination.
	s.idx = -2
	s.client.Conn.SetDeadline(time.Time{})
	req.RequestURI = ""
	req.Header.Del("Proxy-Authorization")
	ctx, cancel := context.WithCancel(s.p.ctx)
	defer cancel()
	w := &indexWriter{conn: s.client, hdr: http.Header{}, bw: bufio.NewWriterSize(s.client, 32<<10)}
	h.ServeHTTP(w, req.WithContext(ctx))
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	w.bw.Flush()
	return true
}

// indexWriter is a minimal http.ResponseWriter on the client connection:
// one response, then the connection closes (as forwarded requests do), so
// a body without Content-Length ends with the connection.
type indexWriter struct {
	conn  net.Conn
	hdr   http.Header
	bw    *bufio.Writer
	wrote bool
}

func (w *indexWriter) Header() http.Header { return w.hdr }

func (w *indexWriter) WriteHeader(status int) {
	if w.wrote {
		return
	}
	w.wrote = true
	w.hdr.Set("Connection", "close")
	fmt.Fprintf(w.bw, "HTTP/1.1 %d %s\r\n", status, http.StatusText(status))
	w.hdr.Write(w.bw)
	w.bw.WriteString("\r\n")
}

func (w *indexWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.bw.Write(b)
}

// UpstreamTransport is the transport the index fetches with: each dial
// goes through the run's address policy (a private or loopback upstream
// needs network.allow_addresses, as any destination does; the index's
// host needs no network.allow entry, since the sandbox never reaches it
// directly), is logged as an attempt and spends the run's byte budget.
// TLS is verified against the system roots.
func (p *Proxy) UpstreamTransport() http.RoundTripper {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         p.dialUpstream,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: p.pol.limits.HandshakeTimeout,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
		ForceAttemptHTTP2:   true,
	}
}

func (p *Proxy) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	port, _ := strconv.Atoi(portStr)
	att := Attempt{Time: p.now(), Method: "INDEX", Host: host, Port: port}
	fail := func(reason string, err error) (net.Conn, error) {
		att.Reason = reason
		p.logRefused(att)
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.WithZone("").Unmap()}
	} else {
		rctx, cancel := context.WithTimeout(ctx, p.pol.limits.HandshakeTimeout)
		addrs, err = p.resolver.LookupNetIP(rctx, "ip", host)
		cancel()
		if err != nil || len(addrs) == 0 {
			return fail(ReasonDNSFailure, fmt.Errorf("package index: could not resolve %s", host))
		}
	}
	for _, a := range addrs {
		a = a.WithZone("").Unmap()
		if why, bad := reservedAddress(a); bad && !p.acc.Load().granted(a) {
			att.Address = a.String()
			return fail(ReasonPrivateAddress, fmt.Errorf("package index %s resolves to %s (%s); grant it with network.allow_addresses if that is intended", host, a, why))
		}
	}
	if p.out.spent() || p.in.spent() {
		return fail(ReasonLimitBytes, fmt.Errorf("the run's network byte budget is spent"))
	}
	if !p.reserveAdmitted() {
		return fail(ReasonLimitLog, fmt.Errorf("the run's network log is full"))
	}
	var lastErr error
	for i, a := range addrs {
		if i == maxDialAddrs {
			break
		}
		dctx, cancel := context.WithTimeout(ctx, p.pol.limits.HandshakeTimeout)
		c, err := p.dialer.DialContext(dctx, network, netip.AddrPortFrom(a.WithZone("").Unmap(), uint16(port)).String())
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		if !p.track(c) {
			return nil, ErrClosed
		}
		att.Address, att.Allowed, att.Reason = a.String(), true, ReasonAllowed
		uc := &upstreamConn{meteredConn: &meteredConn{idleConn: idleConn{Conn: c, act: newActivity()}, out: &p.out, in: &p.in}, p: p, att: att}
		uc.idx = p.logAdmitted(att)
		return uc, nil
	}
	p.releaseAdmitted()
	return fail(ReasonUpstreamError, fmt.Errorf("package index: could not connect to %s port %d: %v", host, port, lastErr))
}

// upstreamConn is one connection of the index to its upstream: metered
// against the run's budget, tracked so that Close of the proxy ends it,
// and its attempt updated with the bytes when it closes.
type upstreamConn struct {
	*meteredConn
	p    *Proxy
	att  Attempt
	idx  int
	once sync.Once
}

func (u *upstreamConn) Close() error {
	err := u.meteredConn.Close()
	u.once.Do(func() {
		u.p.untrack(u.meteredConn.Conn)
		u.att.BytesOut, u.att.BytesIn = u.bytesOut.Load(), u.bytesIn.Load()
		if u.overBudget.Load() {
			u.att.Reason = ReasonLimitBytes
		}
		u.p.updateAttempt(u.idx, u.att)
	})
	return err
}
