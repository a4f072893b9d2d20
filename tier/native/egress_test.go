package native_test

import (
	"archive/zip"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// Every server these tests start listens on this machine's loopback; the
// sandbox reaches them only through the egress proxy and only with an
// explicit test address grant (allow_addresses: [127.0.0.1]).

type counted struct {
	srv  *httptest.Server
	hits atomic.Int64
	body atomic.Int64 // bytes of request bodies received
}

func startServer(t *testing.T, tls bool, h http.HandlerFunc) *counted {
	t.Helper()
	c := &counted{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.hits.Add(1)
		n, _ := io.Copy(io.Discard, r.Body)
		c.body.Add(n)
		h(w, r)
	})
	if tls {
		c.srv = httptest.NewTLSServer(handler)
	} else {
		c.srv = httptest.NewServer(handler)
	}
	t.Cleanup(c.srv.Close)
	return c
}

func port(s *httptest.Server) string {
	_, p, _ := net.SplitHostPort(s.Listener.Addr().String())
	return p
}

func egressManifest(allow ...string) *manifest.Manifest {
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = allow
	m.Network.AllowAddresses = tiertest.LoopbackAddresses
	return m
}

func runIn(t *testing.T, e *engine.Engine, m *manifest.Manifest, argv ...string) *result.Result {
	t.Helper()
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: argv})
	if err != nil {
		t.Fatalf("run %v: %v", argv, err)
	}
	// The proxy's sockets and goroutines are gone with the run.
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before+2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Errorf("%d goroutines after the run, %d before: the egress proxy left some behind", n, before)
	}
	if left := leftovers(e.Home())(res.ID); len(left) > 0 {
		t.Errorf("run left residual state: %v", left)
	}
	return res
}

func attempt(res *result.Result, host string) (result.NetworkAttempt, bool) {
	for _, a := range res.Network {
		if a.Host == host {
			return a, true
		}
	}
	return result.NetworkAttempt{}, false
}

func TestEgressAllowlist(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	granted := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from granted") })
	secure := startServer(t, true, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello over tls") })
	other := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "should not see this") })

	// localhost is the name the grant names; "other" is reachable only as
	// 127.0.0.1 too, but is never granted by name.
	m := egressManifest("localhost:"+port(granted.srv), "localhost:"+port(secure.srv))
	res := runIn(t, e, m, "sh", "-c", fmt.Sprintf(`
curl -sS --max-time 5 http://localhost:%s/ ; echo " curl=$?"
curl -sS --max-time 5 -k https://localhost:%s/ ; echo " curls=$?"
curl -sS --max-time 5 http://localhost:%s/ ; echo " other=$?"
python3 -c 'import urllib.request; print(urllib.request.urlopen("http://localhost:%s/").read().decode(), "py=0")'
`, port(granted.srv), port(secure.srv), port(other.srv), port(granted.srv)))
	out := res.Stdout.Data + res.Stderr.Data
	for _, want := range []string{"hello from granted curl=0", "hello over tls curls=0", "hello from granted py=0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "should not see this") || other.hits.Load() != 0 {
		t.Errorf("the not-granted server was reached (%d hits)", other.hits.Load())
	}
	var allowed, refused int
	for _, a := range res.Network {
		switch {
		case a.Allowed && a.Reason == "allowed" && a.Address == "127.0.0.1":
			allowed++
		case !a.Allowed && a.Reason == "not-allowlisted" && a.Port == mustAtoi(port(other.srv)):
			refused++
		}
	}
	if allowed < 3 || refused != 1 {
		t.Errorf("network log: %d allowed, %d refused for the other server; want >= 3 and 1: %+v", allowed, refused, res.Network)
	}
	if granted.hits.Load() < 2 || secure.hits.Load() != 1 {
		t.Errorf("server hits: granted %d, tls %d", granted.hits.Load(), secure.hits.Load())
	}
}

// TestEgressRefusals: the metadata service, the host's loopback services,
// private addresses, IP literals and names that resolve to loopback are
// refused by the proxy (with the reason logged); DNS, raw sockets and UDP
// from inside fail and produce no egress.
func TestEgressRefusals(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	hostOnly := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "host loopback service") })
	// This manifest grants names, not the loopback address: so localhost
	// (which resolves to loopback) must be refused as private-address.
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"localhost:" + port(hostOnly.srv), "metadata.google.internal", "allowed.test"}
	tests := []struct {
		name, url, reason string
	}{
		{"name resolving to loopback", "http://localhost:" + port(hostOnly.srv) + "/", "private-address"},
		{"metadata service literal", "http://169.254.169.254/latest/meta-data/", "ip-literal"},
		{"private literal", "http://10.1.2.3/", "ip-literal"},
		{"loopback literal", "http://127.0.0.1:" + port(hostOnly.srv) + "/", "ip-literal"},
		{"not allowlisted", "http://evil.example/", "not-allowlisted"},
		{"matcher trick", "http://allowed.test.evil.example/", "not-allowlisted"},
	}
	var script strings.Builder
	for _, tc := range tests {
		fmt.Fprintf(&script, "curl -s -o /dev/null -w '%%{http_code}\\n' --max-time 5 %q\n", tc.url)
	}
	// No resolver, no raw sockets, no UDP from inside.
	script.WriteString(`python3 -c '
import socket
try:
    socket.getaddrinfo("example.com", 80); print("RESOLVED")
except OSError as e: print("dns fails", e)
for fam, typ, proto in [(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), (socket.AF_PACKET, socket.SOCK_RAW, 0)]:
    try:
        socket.socket(fam, typ, proto); print("RAW OK")
    except OSError as e: print("raw fails", e.errno)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.sendto(b"x", ("8.8.8.8", 53)); print("UDP SENT")
except OSError as e: print("udp fails", e.errno)
'
`)
	res := runIn(t, e, m, "sh", "-c", script.String())
	out := res.Stdout.Data + res.Stderr.Data
	for _, bad := range []string{"RESOLVED", "RAW OK", "UDP SENT", "host loopback service"} {
		if strings.Contains(out, bad) {
			t.Errorf("output shows %q: %s", bad, out)
		}
	}
	if hostOnly.hits.Load() != 0 {
		t.Errorf("the host's loopback service was reached %d times", hostOnly.hits.Load())
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := strings.Split(strings.TrimPrefix(tc.url, "http://"), "/")[0]
			if h, _, err := net.SplitHostPort(host); err == nil {
				host = h
			}
			a, ok := attempt(res, host)
			if !ok {
				t.Fatalf("no network log entry for %s: %+v", host, res.Network)
			}
			if a.Allowed || a.Reason != tc.reason {
				t.Errorf("%s: allowed=%v reason=%q, want refused with %q", tc.url, a.Allowed, a.Reason, tc.reason)
			}
		})
	}
	// DNS lookups from inside never reach the proxy: nothing but the curl
	// attempts is logged.
	if len(res.Network) != len(tests) {
		t.Errorf("network log has %d entries, want %d (one per curl): %+v", len(res.Network), len(tests), res.Network)
	}
}

// TestEgressByteBudget: the exfiltration budget stops a large upload.
func TestEgressByteBudget(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	sink := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	m := egressManifest("localhost:" + port(sink.srv))
	m.Network.MaxBytesOut = 1 * manifest.MiB
	res := runIn(t, e, m, "sh", "-c", fmt.Sprintf(
		"head -c 8000000 /dev/zero > /tmp/big; curl -sS --max-time 10 -X POST --data-binary @/tmp/big http://localhost:%s/ ; echo \" rc=$?\"", port(sink.srv)))
	if got := sink.body.Load(); got > 2<<20 {
		t.Errorf("the server received %d bytes past a 1 MiB budget", got)
	}
	found := false
	for _, a := range res.Network {
		found = found || a.Reason == "limit-bytes"
	}
	if !found {
		t.Errorf("no limit-bytes entry in the network log: %+v (output %q)", res.Network, res.Stdout.Data+res.Stderr.Data)
	}
}

// TestEgressPipDownload: pip, unchanged, downloads from a PyPI-style index
// through the proxy; a name outside the index is refused by the index.
func TestEgressPipDownload(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	wheel := tinyWheel(t)
	var idx *counted
	idx = startServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/simple/moatdemo/":
			fmt.Fprintf(w, `<html><body><a href="http://localhost:%s/files/moatdemo-1.0-py3-none-any.whl">moatdemo-1.0-py3-none-any.whl</a></body></html>`, port(idx.srv))
		case "/files/moatdemo-1.0-py3-none-any.whl":
			w.Write(wheel)
		default:
			http.NotFound(w, r)
		}
	})
	m := egressManifest("localhost:" + port(idx.srv))
	res := runIn(t, e, m, "sh", "-c", fmt.Sprintf(
		"python3 -m pip download --no-deps --disable-pip-version-check -d dl --index-url http://localhost:%s/simple moatdemo 2>&1 | tail -3; ls dl", port(idx.srv)))
	if !strings.Contains(res.Stdout.Data, "moatdemo-1.0-py3-none-any.whl") {
		t.Errorf("pip download did not fetch the wheel: %s %s", res.Stdout.Data, res.Stderr.Data)
	}
	if idx.hits.Load() < 2 {
		t.Errorf("the index saw %d requests", idx.hits.Load())
	}
	found := false
	for _, f := range res.Files {
		found = found || strings.HasSuffix(f.Path, "moatdemo-1.0-py3-none-any.whl")
	}
	if !found {
		t.Errorf("the downloaded wheel is not in the workspace diff: %+v", res.Files)
	}
}

// tinyWheel builds a minimal valid wheel in memory.
func tinyWheel(t *testing.T) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := newZip(&buf)
	files := map[string]string{
		"moatdemo/__init__.py":                 "VALUE = 42\n",
		"moatdemo-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: moatdemo\nVersion: 1.0\n",
		"moatdemo-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"moatdemo-1.0.dist-info/RECORD":        "",
		"moatdemo-1.0.dist-info/top_level.txt": "moatdemo\n",
	}
	for name, content := range files {
		w, err := zw.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, content)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func mustAtoi(s string) int {
	var n int
	fmt.Sscanf(s, "%d", &n)
	return n
}

func newZip(w io.Writer) *zip.Writer { return zip.NewWriter(w) }

// BenchmarkEgressDownload1MB compares, in one run, a 1 MB download from a
// loopback server through the sandbox's egress path (program -> init's
// bridge -> the host's proxy -> server) with the same download made
// directly by the same python on the host (the image's, under chroot):
//
//	CGO_ENABLED=0 go test -run '^$' -bench EgressDownload ./tier/native/
func BenchmarkEgressDownload1MB(b *testing.B) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	e, err := newEngine()
	if err != nil {
		b.Fatal(err)
	}
	img, err := e.Images().Lookup("python")
	if err != nil {
		b.Fatal(err)
	}
	payload := bytes.Repeat([]byte("x"), 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(payload) }))
	defer srv.Close()
	n := max(b.N, 20)
	prog := fmt.Sprintf(`
import time, urllib.request, sys, os
url = sys.argv[1]
opener = urllib.request.build_opener() if os.environ.get("HTTP_PROXY") else urllib.request.build_opener(urllib.request.ProxyHandler({}))
ts = []
for _ in range(%d):
    t = time.perf_counter(); assert len(opener.open(url).read()) == 1 << 20; ts.append(time.perf_counter() - t)
ts.sort(); print("%%.3f" %% (ts[len(ts)//2] * 1000))
`, n)
	url := "http://localhost:" + port(srv) + "/"
	m := egressManifest("localhost:" + port(srv))
	m.Network.MaxBytesIn = 4 * manifest.GiB
	m.Network.ConnectionsPerSecond = 1000
	m.Resources.Timeout = manifest.Duration(120 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	b.ResetTimer()
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"python3", "-c", prog, url}})
	if err != nil {
		b.Fatal(err)
	}
	direct := exec.Command("/usr/bin/python3", "-c", prog, "http://127.0.0.1:"+port(srv)+"/")
	direct.SysProcAttr = &syscall.SysProcAttr{Chroot: img.Root}
	direct.Dir = "/"
	direct.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := direct.CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("direct download: %v: %s", err, out)
	}
	var proxied, plain float64
	if _, err := fmt.Sscan(strings.TrimSpace(res.Stdout.Data), &proxied); err != nil {
		b.Fatalf("sandboxed download: %q %q", res.Stdout.Data, res.Stderr.Data)
	}
	fmt.Sscan(strings.TrimSpace(string(out)), &plain)
	b.ReportMetric(proxied, "egress-ms/MB")
	b.ReportMetric(plain, "direct-ms/MB")
	b.ReportMetric(proxied/plain, "egress/direct")
	b.ReportMetric(proxied-plain, "added-ms")
}
