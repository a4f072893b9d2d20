package egress

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every test talks to loopback only. The fake resolver maps test names to
// addresses without any DNS; the loopback dialer refuses (and fails the
// test on) anything that is not loopback, so even a proxy bug cannot send a
// packet elsewhere.

type fakeResolver struct {
	mu    sync.Mutex
	names map[string][][]netip.Addr // successive answers; the last repeats
	calls map[string]int
}

func newFakeResolver() *fakeResolver {
	r := &fakeResolver{names: map[string][][]netip.Addr{}, calls: map[string]int{}}
	set := func(name string, answers ...string) {
		var as []netip.Addr
		for _, a := range answers {
			as = append(as, netip.MustParseAddr(a))
		}
		r.names[name] = append(r.names[name], as)
	}
	set("allowed.test", "127.0.0.1")
	set("other.test", "127.0.0.1")
	set("a.wild.test", "127.0.0.1")
	set("a.b.wild.test", "127.0.0.1")
	set("xn--bcher-kva.test", "127.0.0.1")
	// rebind.test answers a granted address first, then an address of
	// the attacker's choosing.
	set("rebind.test", "127.0.0.1")
	set("rebind.test", "127.0.0.2")
	set("private.test", "10.1.2.3")
	set("meta.bad.test", "169.254.169.254")
	set("ten.bad.test", "10.0.0.1")
	set("lo.bad.test", "127.0.0.5")
	set("v6lo.bad.test", "::1")
	set("ula.bad.test", "fd00::1")
	set("cgnat.bad.test", "100.64.0.1")
	set("mapped.bad.test", "::ffff:127.0.0.1")
	set("mapped3.bad.test", "::ffff:127.0.0.3")
	set("zero.bad.test", "0.0.0.0")
	set("linklocal6.bad.test", "fe80::1")
	set("nat64.bad.test", "64:ff9b::a00:1")
	set("doc.bad.test", "192.0.2.1")
	// One good answer does not rescue a bad one.
	set("mixed.bad.test", "127.0.0.1", "10.9.9.9")
	set("empty.bad.test")
	return r
}

func (r *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	answers, ok := r.names[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls[host], len(answers)-1)
	r.calls[host]++
	return append([]netip.Addr(nil), answers[i]...), nil
}

func (r *fakeResolver) lookups(host string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[host]
}

// loopDialer dials loopback only, and maps the well-known ports 80 and 443
// to the test servers' real ports.
type loopDialer struct {
	t          testing.TB // nil while fuzzing: violations are counted instead
	violations atomic.Int32
	mu         sync.Mutex
	ports      map[int]int
	dialed     []string
}

func (d *loopDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		d.violations.Add(1)
		if d.t != nil {
			d.t.Errorf("proxy dialed a non-address %q", addr)
		}
		return nil, fmt.Errorf("not an address: %q", addr)
	}
	if !ap.Addr().Unmap().IsLoopback() {
		d.violations.Add(1)
		if d.t != nil {
			d.t.Errorf("proxy dialed non-loopback %s", addr)
		}
		return nil, fmt.Errorf("test dialer: %s is not loopback", addr)
	}
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	port := int(ap.Port())
	if p, ok := d.ports[port]; ok {
		port = p
	}
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, net.JoinHostPort(ap.Addr().String(), strconv.Itoa(port)))
}

func (d *loopDialer) addrs() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

// backend is the pair of loopback destinations the tests reach: a plain
// HTTP server (as port 80) and a TLS server (as port 443).
type backend struct {
	http, tls *httptest.Server
	mu        sync.Mutex
	uploaded  int64
	headers   http.Header
}

func newBackend(t testing.TB) *backend {
	t.Helper()
	b := &backend{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello from "+r.Host)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		n = max(0, min(n, 4<<20))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := make([]byte, 32<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		b.mu.Lock()
		b.uploaded += n
		b.mu.Unlock()
		fmt.Fprintf(w, "%d", n)
	})
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		b.mu.Lock()
		b.headers = r.Header.Clone()
		b.mu.Unlock()
		w.Header().Set("Keep-Alive", "timeout=99")
		w.Header().Set("Proxy-Authenticate", "Basic")
		io.WriteString(w, r.Host)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://other.test/", http.StatusFound)
	})
	b.http = httptest.NewServer(mux)
	// Refused tunnels end TLS handshakes early; that is the point, not
	// something to log.
	b.tls = httptest.NewUnstartedServer(mux)
	b.tls.Config.ErrorLog = log.New(io.Discard, "", 0)
	b.tls.StartTLS()
	t.Cleanup(b.http.Close)
	t.Cleanup(b.tls.Close)
	return b
}

func (b *backend) ports() map[int]int {
	port := func(s *httptest.Server) int { return s.Listener.Addr().(*net.TCPAddr).Port }
	return map[int]int{80: port(b.http), 443: port(b.tls)}
}

func (b *backend) uploadedBytes() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.uploaded
}

// testPolicy allows the test names and grants 127.0.0.1 (the backend).
func testPolicy() Policy {
	var rules []Rule
	for _, s := range []string{"allowed.test", "*.wild.test", "rebind.test", "private.test", "*.bad.test", "bücher.test"} {
		rules = append(rules, MustParseRule(s))
	}
	return Policy{
		Allow:          rules,
		AllowAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Limits:         Limits{HandshakeTimeout: 2 * time.Second, IdleTimeout: 5 * time.Second, ConnRate: 1000, NamesPerSecond: 1000},
	}
}

type harness struct {
	t        testing.TB
	b        *backend
	p        *Proxy
	resolver *fakeResolver
	dialer   *loopDialer
	addr     string // proxy's loopback TCP address
	served   chan error
}

func newHarness(t testing.TB, pol Policy, opts Options) *harness {
	t.Helper()
	h := &harness{t: t, b: newBackend(t), resolver: newFakeResolver()}
	h.dialer = &loopDialer{t: t, ports: h.b.ports()}
	if opts.Resolver == nil {
		opts.Resolver = h.resolver
	}
	if opts.Dialer == nil {
		opts.Dialer = h.dialer
	}
	h.p = New(pol, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = l.Addr().String()
	h.served = make(chan error, 1)
	go func() { h.served <- h.p.Serve(l) }()
	t.Cleanup(func() { h.p.Close() })
	return h
}

// client is an HTTP client whose every request goes through the proxy.
func (h *harness) client() *http.Client {
	u := &url.URL{Scheme: "http", Host: h.addr}
	tr := &http.Transport{
		Proxy:             http.ProxyURL(u),
		DisableKeepAlives: true,
		// Loopback test servers with httptest certificates; the names
		// are checked by the proxy (SNI), not here.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{
		Transport: tr,
		Timeout:   10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}

// settle waits until no connection is being handled and at least n
// attempts are logged, and returns the log.
func (h *harness) settle(n int) []Attempt {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Slots first, then the log: a connection updates its attempt
		// before it gives its slot back, so a log read after the slots
		// were seen empty holds every update. (Read the other way round,
		// a session could finish between the two reads: CI once got a
		// tunnel's attempt before the refusal was written into it.)
		idle := len(h.p.slots) == 0
		atts := h.p.Attempts()
		if idle && len(atts) >= n {
			return atts
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("attempts did not settle: %d active, log %+v", len(h.p.slots), atts)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// last returns the last attempt after settling.
func (h *harness) last() Attempt {
	h.t.Helper()
	atts := h.settle(1)
	return atts[len(atts)-1]
}

// raw opens a raw connection to the proxy.
func (h *harness) raw() net.Conn {
	h.t.Helper()
	c, err := net.DialTimeout("tcp", h.addr, 2*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	return c
}

// connect sends CONNECT target and returns the connection after a 200, or
// the status line otherwise.
func (h *harness) connect(target string) (net.Conn, string) {
	h.t.Helper()
	c := h.raw()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	status, err := readStatusLine(c)
	if err != nil {
		return nil, "error: " + err.Error()
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200") {
		return nil, status
	}
	c.SetReadDeadline(time.Time{})
	return c, status
}

// readStatusLine reads the response head byte by byte (so nothing of the
// tunnel is consumed) and returns the status line.
func readStatusLine(c net.Conn) (string, error) {
	var head []byte
	b := make([]byte, 1)
	for !strings.HasSuffix(string(head), "\r\n\r\n") {
		if _, err := c.Read(b); err != nil {
			return string(head), err
		}
		head = append(head, b[0])
		if len(head) > 8192 {
			return "", fmt.Errorf("header too long")
		}
	}
	line, _, _ := strings.Cut(string(head), "\r\n")
	return line, nil
}

func goroutinesSettle(t testing.TB, baseline int) int {
	t.Helper()
	var n int
	for range 200 {
		n = numGoroutine()
		if n <= baseline {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func numGoroutine() int { return runtime.NumGoroutine() }
