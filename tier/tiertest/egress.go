package tiertest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// HTTPServer serves on the host's loopback for egress tests: "/big" is
// big bytes, any other path body; it counts requests.
// LoopbackAddresses is the address grant for test servers reached as
// "localhost": both loopbacks, because a stock Debian /etc/hosts maps
// localhost to ::1 as well as 127.0.0.1, and the proxy refuses a name when
// any of its addresses is reserved and not granted (the CI host's
// /etc/hosts has 127.0.0.1 alone; TestCgroupV2InVM's VM has both).
var LoopbackAddresses = []string{"127.0.0.1", "::1"}

func HTTPServer(t *testing.T, body string, big int) (port string, hits *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hits = &atomic.Int64{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path == "/big" {
			w.Write(bytes.Repeat([]byte("b"), big))
			return
		}
		fmt.Fprint(w, body)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	_, port, _ = net.SplitHostPort(l.Addr().String())
	return port, hits
}

// egressCases need Moat's egress proxy: the sandbox reaches a granted host
// on the host's loopback through HTTP_PROXY, and nothing else, neither a
// host that is not granted nor anything without the proxy (TCP, UDP, raw
// sockets, its own DNS).
func egressCases() []Case {
	var grantedHits, otherHits *atomic.Int64
	return []Case{{
		Name:  "egress: only the granted host, only through the proxy",
		Needs: []string{"network-egress"},
		Setup: func(t *testing.T) map[string]string {
			env := map[string]string{"granted_body": secret(), "other_body": secret()}
			env["granted"], grantedHits = HTTPServer(t, env["granted_body"], 0)
			env["other"], otherHits = HTTPServer(t, env["other_body"], 0)
			return env
		},
		Manifest: func(m *manifest.Manifest, env map[string]string) {
			m.Network.Mode = "allowlist"
			m.Network.Allow = []string{"localhost:" + env["granted"]}
			// The test servers live on the host's loopback, which only
			// an explicit address grant opens.
			m.Network.AllowAddresses = LoopbackAddresses
		},
		Argv: py(`
import socket, urllib.request
def get(port):
    try:
        return urllib.request.urlopen("http://localhost:%s/" % port, timeout=5).read().decode()
    except Exception as e:
        return "ERR " + type(e).__name__
print("granted", get({granted}))
print("other", get({other}))
for host in ["127.0.0.1", "10.0.2.2", "8.8.8.8"]:
    try:
        socket.create_connection((host, {granted}), timeout=2); print("DIRECT", host)
    except OSError as e:
        print("direct refused", host, e.errno)
# The grant opens the proxy and nothing else: no resolver, no UDP out, no
# raw sockets.
try:
    socket.getaddrinfo("example.com", 80); print("RESOLVED")
except OSError as e:
    print("no dns", e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)); print("DIRECT udp")
except OSError as e:
    print("udp refused", e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("DIRECT raw")
except OSError as e:
    print("raw refused", e.errno)
`),
		Check: func(t *testing.T, res *result.Result, env map[string]string) {
			wantExit(t, res, 0)
			if !strings.Contains(res.Stdout.Data, "granted "+env["granted_body"]) {
				t.Errorf("the granted server was not reached through the proxy: %q", res.Stdout.Data)
			}
			if strings.Contains(res.Stdout.Data, env["other_body"]) || otherHits.Load() != 0 {
				t.Errorf("the server that is not granted was reached (%d hits)", otherHits.Load())
			}
			if strings.Contains(res.Stdout.Data, "DIRECT") {
				t.Errorf("a direct connection bypassed the proxy: %q", res.Stdout.Data)
			}
			if strings.Contains(res.Stdout.Data, "RESOLVED") {
				t.Errorf("the sandbox resolved a name itself: %q", res.Stdout.Data)
			}
			if grantedHits.Load() != 1 {
				t.Errorf("granted server hits = %d, want 1", grantedHits.Load())
			}
			var allowed, refused bool
			for _, a := range res.Network {
				switch {
				case a.Allowed && strconv.Itoa(a.Port) == env["granted"]:
					allowed = true
				case !a.Allowed && strconv.Itoa(a.Port) == env["other"]:
					refused = true
				}
			}
			if !allowed || !refused {
				t.Errorf("network log lacks the allowed (%v) or the refused (%v) attempt: %+v", allowed, refused, res.Network)
			}
		},
	}}
}
