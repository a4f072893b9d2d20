package egress

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Attempt is one logged destination attempt (it goes into the run's Result
// under "network"). Allowed says whether traffic was let through to the
// destination; Reason says how the attempt ended, from a closed set.
type Attempt struct {
	Time   time.Time `json:"time"`
	Method string    `json:"method"` // CONNECT, GET, ...; empty if the request never arrived
	Host   string    `json:"host"`   // as normalised for the decision
	Port   int       `json:"port"`
	// Address is the resolved and pinned IP that was dialed, or the
	// offending address of a private-address refusal.
	Address  string `json:"address,omitempty"`
	Allowed  bool   `json:"allowed"`
	Reason   string `json:"reason"`
	BytesOut int64  `json:"bytes_out"` // forwarded to the destination
	BytesIn  int64  `json:"bytes_in"`  // forwarded back to the sandbox
	// Package and Resembles: a decision of the guarded package index
	// (index.go): the package asked for and, for a typosquat, the allowed
	// or popular name it resembles.
	Package   string `json:"package,omitempty"`
	Resembles string `json:"resembles,omitempty"`
}

// Reasons, the closed set of Attempt.Reason values.
const (
	ReasonAllowed        = "allowed"
	ReasonNotAllowlisted = "not-allowlisted"
	ReasonPrivateAddress = "private-address"
	ReasonIPLiteral      = "ip-literal"
	ReasonDNSFailure     = "dns-failure"
	ReasonSNIMismatch    = "sni-mismatch"
	ReasonLimitConns     = "limit-conns"
	ReasonLimitBytes     = "limit-bytes"
	ReasonLimitRate      = "limit-rate"
	ReasonBadRequest     = "bad-request"
	ReasonUpstreamError  = "upstream-error"
	// ReasonLimitNames: a new name only a wildcard rule allows, past
	// Limits.NamesPerSecond.
	ReasonLimitNames = "limit-names"
	// ReasonLimitLog: Limits.MaxAdmitted attempts were let through
	// already; the proxy lets nothing more through rather than leave
	// traffic unrecorded.
	ReasonLimitLog = "limit-log"
	// ReasonECHRefused: a TLS ClientHello with Encrypted Client Hello
	// (or its ESNI predecessor); its outer name may be allowed, but the
	// server routes on an inner name the proxy cannot read.
	ReasonECHRefused = "ech-refused"
)

// Resolver resolves host names; net.DefaultResolver fits.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer dials destinations; *net.Dialer fits.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// Options are the proxy's collaborators. Zero values: net.DefaultResolver,
// a net.Dialer, time.Now.
type Options struct {
	Resolver Resolver
	Dialer   Dialer
	// Now stamps attempts and drives the connection rate limiter.
	// Timeouts use the real clock (they are socket deadlines).
	Now func() time.Time
	// RootCAs verify the real hosts of secret-bound connections, which
	// the proxy re-originates; nil: the system roots. Tests inject their
	// own; production leaves it nil.
	RootCAs *x509.CertPool
}

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("egress: proxy closed")

// maxHeaderBytes bounds a request header from the sandbox; maxRespHeaderBytes
// a response header from a destination.
const (
	maxHeaderBytes     = 64 << 10
	maxRespHeaderBytes = 1 << 20
)

// Proxy is the egress proxy of one run. Its zero value is not usable; call
// New.
type Proxy struct {
	// pol is the policy as the proxy was made: its limits never change.
	// acc is what decides each new connection: pol, or the allowlist
	// SetAllow put in its place (with the same secrets' hosts).
	pol      policy
	acc      atomic.Pointer[policy]
	base     Policy // Secrets and Limits, for SetAllow
	resolver Resolver
	dialer   Dialer
	now      func() time.Time

	ctx    context.Context // cancelled by Close: stops resolving and dialing
	cancel context.CancelFunc
	out    budget
	in     budget
	rate   *rateLimiter
	slots  chan struct{} // one per concurrent client connection

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	// log holds every attempt let through (admitted of them, at most
	// Limits.MaxAdmitted, reserved before dialing) and the first
	// Limits.MaxLogEntries refused ones (refused of them); unlogged
	// counts the refused attempts past that.
	log      []Attempt
	admitted int
	refused  int
	unlogged tally
	// names are the wildcard-allowed names already charged (at most
	// maxChargedNames; a name not kept is charged again), nameRate their
	// rate limit, lookups and lookupBytes what was charged.
	names       map[string]struct{}
	nameRate    *rateLimiter
	lookups     int
	lookupBytes int64
	// sec are the run's secrets (nil: none), ca the run CA that signs
	// for their hosts (nil when there are none, or it could not be
	// made: then bound hosts are refused), secretUses the requests that
	// carried each secret to each host.
	sec        *secretSet
	ca         *runCA
	caErr      error
	rootCAs    *x509.CertPool
	secretUses map[SecretUse]int
	wg         sync.WaitGroup // Serve loops and connection handlers
	index      http.Handler   // the guarded package index (index.go); nil: none
}

// New returns a proxy enforcing p. Rules that ParseRule would not produce
// never match (see Policy.Validate).
func New(p Policy, opts Options) *Proxy {
	pol := compilePolicy(p)
	x := &Proxy{
		pol:       pol,
		resolver:  opts.Resolver,
		dialer:    opts.Dialer,
		now:       opts.Now,
		rate:      newRateLimiter(pol.limits.ConnRate),
		nameRate:  newRateLimiter(pol.limits.NamesPerSecond),
		names:     map[string]struct{}{},
		slots:     make(chan struct{}, pol.limits.MaxConns),
		listeners: map[net.Listener]struct{}{},
		conns:     map[net.Conn]struct{}{},
	}
	if x.resolver == nil {
		x.resolver = net.DefaultResolver
	}
	if x.dialer == nil {
		x.dialer = &net.Dialer{}
	}
	if x.now == nil {
		x.now = time.Now
	}
	x.acc.Store(&pol)
	x.base = Policy{Secrets: p.Secrets, Limits: p.Limits}
	x.sec, x.rootCAs, x.secretUses = compileGuarded(p.Secrets, p.Canaries), opts.RootCAs, map[SecretUse]int{}
	if len(p.Secrets) > 0 {
		// Only bound secrets need a CA: canaries bind nothing.
		// An error leaves ca nil: TrustPEM says so to the engine, which
		// refuses the run, and bound hosts are refused here.
		x.ca, x.caErr = newRunCA(x.sec, x.now())
	}
	x.out.limit = pol.limits.MaxBytesOut
	x.in.limit = pol.limits.MaxBytesIn
	x.ctx, x.cancel = context.WithCancel(context.Background())
	return x
}

// Serve accepts connections on l until Close, and returns ErrClosed then.
// l is a Unix listener in production; anything works. Serve closes l.
func (p *Proxy) Serve(l net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.Close()
		return ErrClosed
	}
	p.listeners[l] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.listeners, l)
		p.mu.Unlock()
		l.Close()
	}()

	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if p.isClosed() {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("egress: accept: %w", err)
			}
			// EMFILE, ECONNABORTED and the like: back off, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
				return ErrClosed
			}
			continue
		}
		backoff = 0
		p.admit(c)
	}
}

// admit applies the rate and concurrency limits in the accept loop, so a
// refused connection costs no goroutine at all.
func (p *Proxy) admit(c net.Conn) {
	start := p.now()
	if !p.rate.allow(start) {
		p.refuseEarly(c, start, ReasonLimitRate, http.StatusTooManyRequests)
		return
	}
	select {
	case p.slots <- struct{}{}:
	default:
		p.refuseEarly(c, start, ReasonLimitConns, http.StatusServiceUnavailable)
		return
	}
	// Registering the connection and the goroutine under one lock orders
	// them before Close's Wait: Close either sees both or refuses c here.
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.Close()
		<-p.slots
		return
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		defer func() { <-p.slots }()
		p.handle(c, start)
	}()
}

// refuseEarly answers a connection refused before it was read. The write
// goes into a fresh socket buffer and cannot block for long; the deadline is
// there in case it does. The attempt is logged first, so whoever sees the
// refusal finds it in the log already (TestConnRate read the log a moment
// too early in CI: the last stop's unexplained egress failure, likely).
func (p *Proxy) refuseEarly(c net.Conn, start time.Time, reason string, status int) {
	p.logRefused(Attempt{Time: start, Reason: reason})
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	msg := "too many connections at once; retry later"
	if reason == ReasonLimitRate {
		msg = "too many new connections per second; retry later"
	}
	writeRefusal(c, status, reason, msg)
	c.Close()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track registers a connection so Close can close it; it refuses (and
// closes c) once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// CanarySeen reports whether a request, host name or body the proxy
// checked carried one of Policy.Canaries (and was refused for it).
func (p *Proxy) CanarySeen() bool { return p.sec != nil && p.sec.canarySeen.Load() }

// Close stops accepting, closes every connection and waits for every
// goroutine the proxy started. A closed proxy refuses everything.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.cancel()
		for l := range p.listeners {
			l.Close()
		}
		for c := range p.conns {
			c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
	return nil
}

// Attempts returns a copy of the attempt log, in the order the attempts were
// decided.
func (p *Proxy) Attempts() []Attempt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Attempt(nil), p.log...)
}

// DroppedAttempts is the number of refused attempts not stored because
// Limits.MaxLogEntries were (Summary says where they went and why).
func (p *Proxy) DroppedAttempts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unlogged.n
}

// logRefused appends a refused attempt and returns its index, or counts it
// in the summary and returns -1 once MaxLogEntries refused ones are stored.
func (p *Proxy) logRefused(a Attempt) int {
	// A refused request's host is whatever the client sent (up to the
	// 64 KiB header bound when it is not a valid name): 10000 of those
	// would hold 640 MiB. No valid name is longer than maxLoggedHost.
	if len(a.Host) > maxLoggedHost {
		a.Host = strings.ToValidUTF8(a.Host[:maxLoggedHost], "\uFFFD") + "..."
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.refused >= p.pol.limits.MaxLogEntries {
		p.unlogged.add(a)
		return -1
	}
	p.refused++
	p.log = append(p.log, a)
	return len(p.log) - 1
}

// maxLoggedHost bounds the host of a logged attempt: normaliseHost refuses
// anything longer, so only refused garbage is cut.
const maxLoggedHost = 1024

// reserveAdmitted takes one of the MaxAdmitted log entries for an attempt
// about to be let through, before anything is dialed: an attempt that
// reaches its destination always has its place in the log.
func (p *Proxy) reserveAdmitted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.admitted >= p.pol.limits.MaxAdmitted {
		return false
	}
	p.admitted++
	return true
}

// releaseAdmitted gives back a reservation whose dial failed.
func (p *Proxy) releaseAdmitted() {
	p.mu.Lock()
	p.admitted--
	p.mu.Unlock()
}

// logAdmitted appends an attempt let through, on its reservation.
func (p *Proxy) logAdmitted(a Attempt) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log = append(p.log, a)
	return len(p.log) - 1
}

func (p *Proxy) updateAttempt(i int, a Attempt) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log[i] = a
}

// session is one client connection: one request, and so one attempt.
type session struct {
	p      *Proxy
	client *idleConn
	hdr    *capReader
	br     *bufio.Reader
	act    *activity
	up     *meteredConn // nil until dialed
	att    Attempt
	idx    int // log index once the attempt is logged, else -1
}

// handle serves one client connection to its end and logs its attempt
// exactly once.
func (p *Proxy) handle(c net.Conn, start time.Time) {
	s := &session{p: p, act: newActivity(), idx: -1, att: Attempt{Time: start}}
	s.client = &idleConn{Conn: c, act: s.act}
	s.hdr = &capReader{r: s.client, n: maxHeaderBytes, err: errHeaderTooLarge}
	s.br = bufio.NewReaderSize(s.hdr, 16<<10)
	defer s.finish()
	defer func() {
		// A panic here must not take moat down; the connection is
		// refused (fail closed) and the attempt logged.
		if r := recover(); r != nil {
			s.att.Allowed = false
			if s.att.Reason == "" || s.att.Reason == ReasonAllowed {
				s.att.Reason = ReasonBadRequest
			}
		}
	}()

	// Slow-loris bound: the whole header must arrive within the handshake
	// timeout, however slowly it trickles.
	c.SetDeadline(time.Now().Add(p.pol.limits.HandshakeTimeout))
	req, err := http.ReadRequest(s.br)
	if err != nil {
		s.att.Reason = ReasonBadRequest
		if !isTimeout(err) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			s.refuse(http.StatusBadRequest, ReasonBadRequest, "malformed request")
		}
		return
	}
	s.hdr.n = -1
	s.att.Method = req.Method
	if req.Method == http.MethodConnect {
		s.connect(req)
		return
	}
	s.forward(req)
}

// finish closes both sides and writes the attempt with its byte counts.
func (s *session) finish() {
	s.p.untrack(s.client.Conn)
	if s.up != nil {
		s.p.untrack(s.up.Conn)
		s.att.BytesOut = s.up.bytesOut.Load()
		s.att.BytesIn = s.up.bytesIn.Load()
		if s.up.overBudget.Load() {
			s.att.Reason = ReasonLimitBytes
		}
	}
	if s.idx >= 0 {
		s.p.updateAttempt(s.idx, s.att)
	} else if s.idx == -2 {
		// Served by the package index, which logged its own decisions.
	} else {
		// Never let through (admitDestination logs those): refused.
		s.att.Allowed = false
		s.p.logRefused(s.att)
	}
}

// refuse answers the client with an error response (best effort, bounded
// by a short write deadline) and records the reason.
func (s *session) refuse(status int, reason, msg string) {
	s.att.Allowed = false
	s.att.Reason = reason
	s.client.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	writeRefusal(s.client.Conn, status, reason, msg)
}

func writeRefusal(w io.Writer, status int, reason, msg string) {
	body := "moat egress: " + msg + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Moat-Egress: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		status, http.StatusText(status), reason, len(body), body)
}

// verdict is the policy decision on one destination.
type verdict struct {
	reason string
	status int
	msg    string
	host   string // normalised name, or the address for an IP literal
	port   int
	addrs  []netip.Addr // validated addresses to dial, in order
	ipLit  bool
}

// decide applies the policy to the host the client asked for. It resolves
// the name itself and checks every answer; the addresses it returns are the
// only ones that may be dialed.
//
// A tunnel to port 80 needs a rule that names port 80 explicitly: plain HTTP
// is forwarded as GET http://..., where the proxy writes the Host header
// itself; an opaque tunnel to a CDN address would let the client name any
// site behind that CDN in its own Host header (fronting over plain HTTP).
func (p *Proxy) decide(ctx context.Context, rawHost string, port int, tunnel bool) verdict {
	// One allowlist decides the whole connection, even if SetAllow
	// replaces it meanwhile.
	pol := p.acc.Load()
	v := verdict{host: rawHost, port: port}
	refuse := func(reason string, status int, msg string) verdict {
		v.reason, v.status, v.msg = reason, status, msg
		return v
	}
	if p.out.spent() || p.in.spent() {
		return refuse(ReasonLimitBytes, http.StatusServiceUnavailable, "the run's network byte budget is spent")
	}
	if a, err := netip.ParseAddr(rawHost); err == nil {
		a = a.WithZone("").Unmap()
		v.host, v.ipLit = a.String(), true
		if !pol.granted(a) {
			return refuse(ReasonIPLiteral, http.StatusForbidden, fmt.Sprintf("requests to IP addresses (%s) are refused; use a host name from network.allow, or grant the address in network.allow_addresses", a))
		}
		if !pol.allowsLiteralPort(port) {
			return refuse(ReasonIPLiteral, http.StatusForbidden, fmt.Sprintf("%s is granted, but port %d is named by no network.allow rule", a, port))
		}
		v.addrs = []netip.Addr{a}
		v.reason = ReasonAllowed
		return v
	}
	host, err := normaliseHost(rawHost)
	if err != nil {
		if errors.Is(err, errNumericHost) {
			return refuse(ReasonIPLiteral, http.StatusForbidden, fmt.Sprintf("%q looks like an IP address; requests to IP addresses are refused", rawHost))
		}
		return refuse(ReasonBadRequest, http.StatusBadRequest, fmt.Sprintf("%q is not a valid host name", rawHost))
	}
	v.host = host
	if pol.allowsName(host, port) && tunnel && port == 80 && !pol.allowsExplicitPort(host, port) {
		return refuse(ReasonNotAllowlisted, http.StatusForbidden, fmt.Sprintf("tunnels to %s port 80 need the rule %q in network.allow; plain HTTP goes through the proxy as GET http://%s/", host, host+":80", host))
	}
	if !pol.allowsName(host, port) {
		return refuse(ReasonNotAllowlisted, http.StatusForbidden, fmt.Sprintf("%s port %d is not in network.allow; add it to the manifest to grant it", host, port))
	}
	if !pol.namesExactly(host) {
		// Only a wildcard allows this name: the program chose it, and
		// the lookup carries it off the host (DNS exfiltration through
		// the host's resolver).
		switch p.chargeName(host) {
		case ReasonLimitNames:
			return refuse(ReasonLimitNames, http.StatusTooManyRequests, fmt.Sprintf("too many new host names per second for wildcard rules (network.names_per_second %d); retry later", p.pol.limits.NamesPerSecond))
		case ReasonLimitBytes:
			return refuse(ReasonLimitBytes, http.StatusServiceUnavailable, "the run's network byte budget is spent (each new name a wildcard rule allows costs its length)")
		}
	}
	rctx, cancel := context.WithTimeout(ctx, p.pol.limits.HandshakeTimeout)
	defer cancel()
	addrs, err := p.resolver.LookupNetIP(rctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return refuse(ReasonDNSFailure, http.StatusBadGateway, fmt.Sprintf("could not resolve %s", host))
	}
	seen := map[netip.Addr]bool{}
	for _, a := range addrs {
		a = a.WithZone("").Unmap()
		if !a.IsValid() {
			return refuse(ReasonDNSFailure, http.StatusBadGateway, fmt.Sprintf("could not resolve %s", host))
		}
		// Any reserved answer refuses the name: with several answers a
		// client library might pick any, and so might an attacker's
		// rebinding server.
		if why, bad := reservedAddress(a); bad && !pol.granted(a) {
			v.addrs = []netip.Addr{a}
			return refuse(ReasonPrivateAddress, http.StatusForbidden, fmt.Sprintf("%s resolves to %s (%s); grant it with network.allow_addresses if that is intended", host, a, why))
		}
		if !seen[a] {
			seen[a] = true
			v.addrs = append(v.addrs, a)
		}
	}
	v.reason = ReasonAllowed
	return v
}

// maxDialAddrs bounds how many of the checked addresses are tried.
const maxDialAddrs = 3

// dial connects to one of the verdict's checked addresses, never to the
// name: the name was resolved once, in decide.
func (s *session) dial(v verdict) error {
	p := s.p
	ctx, cancel := context.WithTimeout(p.ctx, p.pol.limits.HandshakeTimeout)
	defer cancel()
	var lastErr error = errors.New("no address")
	for i, a := range v.addrs {
		if i == maxDialAddrs {
			break
		}
		c, err := p.dialer.DialContext(ctx, "tcp", netip.AddrPortFrom(a, uint16(v.port)).String())
		if err != nil {
			lastErr = err
			continue
		}
		if !p.track(c) {
			return ErrClosed
		}
		s.att.Address = a.String()
		s.up = &meteredConn{idleConn: idleConn{Conn: c, act: s.act}, out: &p.out, in: &p.in}
		return nil
	}
	return lastErr
}

// admitDestination decides on host:port, logs the attempt, dials, and
// answers the client itself when refused. It reports whether to go on.
func (s *session) admitDestination(rawHost string, port int, tunnel bool) bool {
	v := s.p.decide(s.p.ctx, rawHost, port, tunnel)
	s.att.Host, s.att.Port = v.host, v.port
	if v.reason != ReasonAllowed {
		if v.reason == ReasonPrivateAddress && len(v.addrs) == 1 {
			s.att.Address = v.addrs[0].String()
		}
		s.refuse(v.status, v.reason, v.msg)
		return false
	}
	if !s.p.reserveAdmitted() {
		s.refuse(http.StatusServiceUnavailable, ReasonLimitLog, fmt.Sprintf("this run let %d connections through, as many as its log holds; the run's egress is over", s.p.pol.limits.MaxAdmitted))
		return false
	}
	if err := s.dial(v); err != nil {
		s.p.releaseAdmitted()
		s.refuse(http.StatusBadGateway, ReasonUpstreamError, fmt.Sprintf("could not connect to %s port %d", v.host, v.port))
		return false
	}
	s.att.Allowed, s.att.Reason = true, ReasonAllowed
	// Logged now so that a long tunnel shows in Attempts while it runs;
	// finish fills in the bytes.
	s.idx = s.p.logAdmitted(s.att)
	return true
}

// targetPort parses the port of a request target, with def for none.
func targetPort(hostport string, def int) (string, int, error) {
	if hostport == "" {
		return "", 0, errors.New("missing host")
	}
	if h, p, err := splitHostPort(hostport); err == nil {
		return h, p, nil
	}
	// No port: a bare name, or a bracketed IPv6 literal.
	h := hostport
	if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
		if _, err := netip.ParseAddr(h); err != nil {
			return "", 0, errors.New("bad IPv6 literal")
		}
		return h, def, nil
	}
	for i := 0; i < len(h); i++ {
		if h[i] == ':' || h[i] == '[' || h[i] == ']' {
			return "", 0, errors.New("bad port")
		}
	}
	return h, def, nil
}
