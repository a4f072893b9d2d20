package egress

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// BenchmarkSecretBoundVsConnect measures, in one run and against the same
// loopback TLS server, a request through a secret-bound host (TLS
// terminated by the proxy, placeholder replaced, response scrubbed, TLS
// re-originated) and the same request through an opaque CONNECT tunnel,
// alternating, and reports the ratios: latency of a small request on a
// new connection each time (what curl does), and the time of a 1 MiB
// download.
func BenchmarkSecretBoundVsConnect(b *testing.B) {
	pol := testPolicy()
	pol.Secrets = testSecrets()
	pol.Limits.MaxBytesIn, pol.Limits.MaxBytesOut, pol.Limits.ConnRate = 1<<50, 1<<50, 1<<20
	pol.Limits.MaxAdmitted = 1 << 30
	h := newSecretHarnessPolicy(b, pol)
	bound := h.sandboxClient(false)
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: h.addr}),
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
	}
	b.Cleanup(tr.CloseIdleConnections)
	opaque := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	get := func(c *http.Client, u string, auth bool) {
		req, _ := http.NewRequest("GET", u, nil)
		if auth {
			req.Header.Set("Authorization", "Bearer "+testPH)
		}
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("%s: %d %v", u, resp.StatusCode, err)
		}
	}
	var tOpaque, tBound, tOpaqueBig, tBoundBig time.Duration
	for b.Loop() {
		t0 := time.Now()
		get(opaque, "https://allowed.test/v1/echo", false)
		t1 := time.Now()
		get(bound, "https://example.com/v1/echo", true)
		t2 := time.Now()
		get(opaque, "https://allowed.test/big", false)
		t3 := time.Now()
		get(bound, "https://example.com/big", false)
		t4 := time.Now()
		tOpaque += t1.Sub(t0)
		tBound += t2.Sub(t1)
		tOpaqueBig += t3.Sub(t2)
		tBoundBig += t4.Sub(t3)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tOpaque.Nanoseconds())/n, "connect-ns/req")
	b.ReportMetric(float64(tBound.Nanoseconds())/n, "secret-ns/req")
	b.ReportMetric(float64(tBound)/float64(tOpaque), "secret/connect-latency")
	b.ReportMetric(float64(tBoundBig)/float64(tOpaqueBig), "secret/connect-1MiB")
}
