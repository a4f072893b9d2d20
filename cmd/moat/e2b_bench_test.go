//go:build e2bbench

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/client"
)

// TestE2BBenchmark times Sandbox.create() to the first
// commands.run('echo hi') result through the real E2B SDK, sequentially
// (cold: no warm pool; warm: --session-pool 2) and as a burst, against the
// same measured through Moat's own API with the Go client in the same
// server (the peer: the ratio is what the E2B layer and the SDK add). It
// is behind a build tag, not in CI:
//
//	go test -tags e2bbench -count=1 -v -run TestE2BBenchmark ./cmd/moat/
//
// MOAT_E2B_BENCH_N sets the sequential count (default 30) and
// MOAT_E2B_BENCH_BURST the burst's (default 100; the key may hold that many
// sandboxes, and the warm burst's pool holds as many). The figures
// are N=100, BURST=100.
func TestE2BBenchmark(t *testing.T) {
	needRoot(t)
	sdk := e2bSDK(t, "testdata/e2b")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node: " + err.Error())
	}
	n := 30
	if v := os.Getenv("MOAT_E2B_BENCH_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	burst := 100
	if v := os.Getenv("MOAT_E2B_BENCH_BURST"); v != "" {
		burst, _ = strconv.Atoi(v)
	}
	type figure struct {
		name     string
		med, p95 float64
	}
	var figs []figure
	for _, tc := range []struct {
		name  string
		pool  string
		burst bool
	}{
		{"cold sequential", "0", false},
		{"warm sequential", "2", false},
		{fmt.Sprintf("cold burst of %d", burst), "0", true},
		{fmt.Sprintf("warm burst of %d", burst), strconv.Itoa(burst + 1), true}, // +1: the untimed first round
	} {
		home := serverHome(t)
		key := createKey(t, home, "--max-sandboxes", strconv.Itoa(2*burst))
		admin := createKey(t, home, "--admin") // GET /metrics needs one
		s := startServer(t, home, key, "--e2b", "--pool", "0", "--session-pool", tc.pool)
		count := n
		if tc.burst {
			count = burst
			if tc.pool != "0" {
				waitPool(t, s, admin, burst+1)
			}
		}
		pause := "0"
		if tc.pool != "0" {
			pause = "300" // the pool refills between creations, as think time allows
		}
		sdkTimes := benchSDK(t, node, sdk, s.url, key, count, tc.burst, pause)
		if tc.burst && tc.pool != "0" {
			waitPool(t, s, admin, burst+1)
		}
		apiTimes := benchAPI(t, s.client(t), count, tc.burst, pause)
		s.terminate(t, time.Minute)
		for _, f := range []struct {
			who   string
			times []float64
		}{{"e2b-sdk", sdkTimes}, {"moat-api", apiTimes}} {
			slices.Sort(f.times)
			figs = append(figs, figure{tc.name + " " + f.who, f.times[len(f.times)/2], f.times[min(len(f.times)-1, len(f.times)*95/100)]})
		}
	}
	for i := 0; i < len(figs); i += 2 {
		sdk, api := figs[i], figs[i+1]
		t.Logf("%-28s median %5.0f ms  p95 %5.0f ms", sdk.name, sdk.med, sdk.p95)
		t.Logf("%-28s median %5.0f ms  p95 %5.0f ms  (E2B SDK / Moat API: median %.2fx)", api.name, api.med, api.p95, sdk.med/api.med)
	}
	t.Logf("published, hosted (API call to first command, median sequential): E2B 491 ms, Daytona 186 ms; Moat's warm sequential E2B-SDK median: %.2fx E2B's, %.2fx Daytona's", figs[2].med/491, figs[2].med/186)
}

func benchSDK(t *testing.T, node, sdk, url, key string, n int, burst bool, pause string) []float64 {
	t.Helper()
	cmd := exec.Command(node, "testdata/e2b/sdk.cjs")
	cmd.Env = append(os.Environ(), "NODE_PATH="+sdk, "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+key,
		"E2B_BENCH="+strconv.Itoa(n), "E2B_BENCH_PAUSE_MS="+pause)
	if burst {
		cmd.Env = append(cmd.Env, "E2B_BENCH_BURST=1")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sdk.cjs bench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^bench (\[.*\])$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no bench line:\n%s", out)
	}
	var times []float64
	if err := json.Unmarshal(m[1], &times); err != nil || len(times) != n {
		t.Fatalf("bench line %s: %v", m[1], err)
	}
	return times
}

// benchAPI is the peer: the same through Moat's API (create, then a
// command that waits for its result).
func benchAPI(t *testing.T, c *client.Client, n int, burst bool, pause string) []float64 {
	t.Helper()
	ctx := context.Background()
	ms, _ := strconv.Atoi(pause)
	one := func() (float64, *client.Sandbox) {
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{TTL: time.Minute})
		if err != nil {
			t.Error(err)
			return 0, nil
		}
		ex, err := sb.Exec(ctx, &client.ExecRequest{Argv: []string{"/bin/bash", "-l", "-c", "echo hi"}})
		d := float64(time.Since(t0).Microseconds()) / 1000
		if err != nil || ex.Result == nil || ex.Result.Stdout.Data != "hi\n" {
			t.Errorf("exec: %v %+v", err, ex)
		}
		return d, sb
	}
	// One untimed round first, as the SDK side does.
	if _, sb := one(); sb != nil {
		sb.Delete(ctx)
	}
	times := make([]float64, n)
	if burst {
		var wg sync.WaitGroup
		sbs := make([]*client.Sandbox, n)
		for i := range n {
			wg.Go(func() { times[i], sbs[i] = one() })
		}
		wg.Wait()
		for _, sb := range sbs {
			if sb != nil {
				sb.Delete(ctx)
			}
		}
	} else {
		for i := range n {
			var sb *client.Sandbox
			times[i], sb = one()
			if sb != nil {
				sb.Delete(ctx)
			}
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return times
}

// waitPool waits until the server's session pool holds n ready sandboxes,
// so that a warm burst measures sandboxes taken from the pool; admin is
// an admin key (GET /metrics is the whole server's).
func waitPool(t *testing.T, s *testServer, admin string, n int) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^moat_pool_ready\{pool="[^"]*session[^"]*"\} (\d+)`)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ready := -1
		if m := re.FindSubmatch(body); m != nil {
			ready, _ = strconv.Atoi(string(m[1]))
		}
		if ready >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session pool holds %d ready sandboxes after 3 minutes, want %d:\n%s", ready, n, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestE2BLifecycleBenchmark times, through the real E2B SDK on loopback,
// pause() and connect() (resume) of a sandbox holding MOAT_E2B_BENCH_MB
// MiB of files (default 0 and 100) and fork({ count: 10 }), each
// MOAT_E2B_BENCH_N times (default 10). Moat's pause is filesystem-only
// (a copy of the workspace; resume starts a new sandbox from it), so the
// figures scale with the files, not with memory. Behind the e2bbench tag:
//
//	go test -tags e2bbench -count=1 -v -run TestE2BLifecycleBenchmark ./cmd/moat/
func TestE2BLifecycleBenchmark(t *testing.T) {
	needRoot(t)
	sdk := e2bSDK(t, "testdata/e2b")
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node: " + err.Error())
	}
	n := 10
	if v := os.Getenv("MOAT_E2B_BENCH_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	sizes := []string{"0", "100"}
	if v := os.Getenv("MOAT_E2B_BENCH_MB"); v != "" {
		sizes = []string{v}
	}
	home := serverHome(t)
	key := createKey(t, home, "--max-sandboxes", "32")
	s := startServer(t, home, key, "--e2b", "--pool", "0", "--session-pool", "0")
	defer s.terminate(t, time.Minute)
	stat := func(v []float64) (float64, float64) {
		slices.Sort(v)
		return v[len(v)/2], v[min(len(v)-1, len(v)*95/100)]
	}
	for _, mb := range sizes {
		cmd := exec.Command(node, "testdata/e2b/sdk.cjs")
		cmd.Env = append(os.Environ(), "NODE_PATH="+sdk, "E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url, "E2B_API_KEY="+key,
			"E2B_BENCH_LIFECYCLE="+strconv.Itoa(n), "E2B_BENCH_MB="+mb)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("sdk.cjs lifecycle bench: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`(?m)^bench-lifecycle (\{.*\})$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no bench-lifecycle line:\n%s", out)
		}
		var r struct{ Pause, Resume, Fork []float64 }
		if err := json.Unmarshal(m[1], &r); err != nil || len(r.Pause) != n || len(r.Fork) != n {
			t.Fatalf("bench line %s: %v", m[1], err)
		}
		for _, f := range []struct {
			name  string
			times []float64
		}{{"pause", r.Pause}, {"resume (connect)", r.Resume}, {"fork of 10", r.Fork}} {
			med, p95 := stat(f.times)
			t.Logf("%4s MiB  %-18s N=%d  median %6.0f ms  p95 %6.0f ms", mb, f.name, n, med, p95)
		}
	}
	t.Logf("published, hosted (E2B docs, memory snapshots): pause about 4 s per GiB of RAM, resume about 1 s")
}
