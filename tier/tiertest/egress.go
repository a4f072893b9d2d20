package tiertest

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
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
