package egress

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// BenchmarkDownload1MB downloads 1 MiB from the same loopback server
// directly and through the proxy, alternating, and reports the ratio.
func BenchmarkDownload1MB(b *testing.B) {
	pol := testPolicy()
	pol.Limits.MaxBytesIn = 1 << 50
	pol.Limits.MaxBytesOut = 1 << 50
	pol.Limits.ConnRate = 1 << 20
	h := newHarness(b, pol, Options{})
	proxied := h.client()
	direct := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	directURL := h.b.http.URL + "/big?n=1048576"
	get := func(c *http.Client, u string) {
		resp, err := c.Get(u)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || n != 1<<20 {
			b.Fatalf("%s: %d bytes, %v", u, n, err)
		}
	}
	b.SetBytes(1 << 20)
	var tDirect, tProxy time.Duration
	for b.Loop() {
		t0 := time.Now()
		get(direct, directURL)
		t1 := time.Now()
		get(proxied, "http://allowed.test/big?n=1048576")
		tProxy += time.Since(t1)
		tDirect += t1.Sub(t0)
	}
	b.ReportMetric(float64(tDirect.Nanoseconds())/float64(b.N), "direct-ns/op")
	b.ReportMetric(float64(tProxy.Nanoseconds())/float64(b.N), "proxy-ns/op")
	b.ReportMetric(float64(tProxy)/float64(tDirect), "proxy/direct")
}
