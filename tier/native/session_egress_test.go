package native_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// sessionFloodProg opens argv[2] connections to the sandbox's egress
// bridge, each closed with a reset (SO_LINGER 0) after its answer's
// status line, tallies the answers (an HTTP status, or "closed" when the
// bridge closed without one), then GETs argv[1] through the proxy, again
// while the proxy answers 429 (the flood spent the connection rate).
const sessionFloodProg = `
import collections, socket, struct, sys
url, n = sys.argv[1], int(sys.argv[2])
linger = struct.pack("ii", 1, 0)
tally = collections.Counter()
first = None
for i in range(n):
    try:
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        s.sendall(b"GET http://evil.example/ HTTP/1.1\r\nHost: evil.example\r\n\r\n")
        k = s.recv(512)[9:12].decode("latin-1") or "closed"
        s.close()
    except OSError as e:
        k = type(e).__name__
    tally[k] += 1
    if k == "closed" and first is None:
        first = i
print("tally", sorted(tally.items()), "first closed", first)
import time, urllib.error, urllib.request
for i in range(40):
    try:
        print("granted", urllib.request.urlopen(url, timeout=10).read().decode())
        break
    except urllib.error.HTTPError as e:
        if e.code != 429:
            print("granted failed", e)
            break
        time.sleep(0.25) # the proxy's connection rate, spent by the flood
    except Exception as e:
        print("granted failed", e)
        break
`

// TestSessionEgressFlood: in a session, the egress bridge (served by init
// itself) passes on every connection, however many came before and
// however they ended. After about 1500 connections closed with a reset,
// every new one was closed unread and the proxy logged it bad-request:
// init's GC closed, a second time, a descriptor number of an earlier
// command's stderr, by then the read end of the relay's pooled splice
// pipe. One-shot runs never served a command that way and were fine.
func TestSessionEgressFlood(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	granted := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello from granted") })
	url := "http://localhost:" + port(granted.srv) + "/"
	s := newSession(t, e, func(m *manifest.Manifest) {
		m.Network.Mode = "allowlist"
		m.Network.Allow = []string{"localhost:" + port(granted.srv)}
		m.Network.AllowAddresses = tiertest.LoopbackAddresses
		m.Resources.Timeout = manifest.Duration(180 * time.Second)
		m.Resources.CPUTime = m.Resources.Timeout
	})
	// Each round leaves other commands' descriptor numbers for init to
	// reuse, then floods with a few times the connections after which
	// the bridge broke (when init's GC first ran; whether the closed
	// number was the pipe's is chance, hence several rounds: the old
	// behaviour failed 3 of 4 single floods, the nsinit unit test
	// TestExecLeavesDescriptorsToServe is the deterministic one).
	const rounds, n = 3, 3000
	for round := range rounds {
		for _, argv := range [][]string{{"true"}, {"moat-no-such-command"}, {"sh", "-c", "echo oops >&2; exit 3"}} {
			execWait(t, s, &engine.ExecRequest{Argv: argv})
		}
		res := execWait(t, s, &engine.ExecRequest{Argv: []string{"python3", "-c", sessionFloodProg, url, fmt.Sprint(n)}, Timeout: 150 * time.Second})
		t.Run(fmt.Sprintf("flood %d", round+1), func(t *testing.T) {
			wantResult(t, res, result.Exited, 0)
			out := res.Stdout.Data
			t.Logf("%d connections: %s", n, strings.TrimSpace(out))
			if strings.Contains(out, "'closed'") || !strings.Contains(out, "first closed None") {
				t.Errorf("the bridge closed connections without an answer from the proxy: %s", clipped(out))
			}
			if !strings.Contains(out, "granted hello from granted") {
				t.Errorf("the granted server was not reached after %d connections: %s %s", n, clipped(out), clipped(res.Stderr.Data))
			}
			if bad := badRequests(res); bad > 0 {
				t.Errorf("the proxy logged %d attempts bad-request: the bridge passed on nothing of them (%s)", bad, clipped(out))
			}
		})
	}
	if got := granted.hits.Load(); got != rounds {
		t.Errorf("the granted server saw %d requests, want %d", got, rounds)
	}
}

// badRequests counts a result's bad-request attempts, listed or summarised.
func badRequests(res *result.Result) int {
	n := 0
	for _, a := range res.Network {
		if a.Reason == egress.ReasonBadRequest {
			n++
		}
	}
	if ns := res.NetworkSummary; ns != nil {
		n += ns.OmittedReasons[egress.ReasonBadRequest]
	}
	return n
}

func clipped(s string) string {
	if len(s) > 600 {
		return s[:600] + "..."
	}
	return s
}
