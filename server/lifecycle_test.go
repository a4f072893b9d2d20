package server

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service/servicetest"
)

func TestShutdown(t *testing.T) {
	e := newEnv(t, nil)
	var ids []string
	for range 3 {
		ids = append(ids, e.createSandbox(tokenA, nil).ID)
	}
	blocked := e.exec(tokenA, ids[0], `{"argv":["fake","block"],"wait":false}`, 202)

	// A one-shot run in flight finishes.
	runDone := make(chan response, 1)
	go func() {
		runDone <- e.do(req{method: "POST", path: "/v1/runs", token: tokenB, body: `{"argv":["fake","sleep:200ms","out:finished"]}`})
	}()
	waitFor(t, "the run to start", func() bool {
		_, _, _, inflight := e.be.Counts()
		return inflight == 1
	})

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- e.srv.Shutdown(ctx) }()
	waitFor(t, "shutdown to begin", e.srv.isClosing)

	r := e.do(req{method: "POST", path: "/v1/sandboxes", token: tokenA, body: `{}`})
	if r.StatusCode != 503 || r.errBody(t).Code != CodeUnavailable {
		t.Errorf("create during shutdown: %d %s", r.StatusCode, r.body)
	}
	if r := e.do(req{method: "GET", path: "/v1/health"}); r.StatusCode != 503 {
		t.Errorf("health during shutdown: %d", r.StatusCode)
	}

	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	run := <-runDone
	if run.StatusCode != 200 || !strings.Contains(string(run.body), "finished") {
		t.Errorf("the in-flight run: %d %s", run.StatusCode, run.body)
	}
	if live, _, _, _ := e.be.Counts(); live != 0 || e.srv.Sessions() != 0 {
		t.Errorf("after Shutdown: %d fake sessions, %d registered", live, e.srv.Sessions())
	}
	for _, id := range ids {
		if rec, _ := e.au.Record(id); rec.Status != audit.Done {
			t.Errorf("sandbox %s record %+v", id, rec)
		}
	}
	if rec, _ := e.au.Record(ids[0] + "-" + blocked.ID); rec.Status != audit.Done || rec.Termination != "signaled" {
		t.Errorf("the running command's record %+v", rec)
	}
	// A second Shutdown returns at once.
	if err := e.srv.Shutdown(context.Background()); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
}

func TestShutdownDeadline(t *testing.T) {
	e := newEnv(t, nil)
	e.createSandbox(tokenA, nil)
	runDone := make(chan response, 1)
	go func() {
		runDone <- e.do(req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"argv":["fake","block"]}`})
	}()
	waitFor(t, "the run to start", func() bool {
		_, _, _, inflight := e.be.Counts()
		return inflight == 1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	e.shutdownErr = context.DeadlineExceeded
	if err := e.srv.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Errorf("Shutdown past its deadline: %v", err)
	}
	// The run was killed, not abandoned: the backend returned before
	// Shutdown did.
	if live, _, _, inflight := e.be.Counts(); live != 0 || inflight != 0 {
		t.Errorf("after Shutdown: %d sessions, %d runs", live, inflight)
	}
	if r := <-runDone; r.StatusCode != 200 && r.StatusCode != 503 {
		t.Errorf("the killed run answered %d %s", r.StatusCode, r.body)
	}
}

func TestQuotas(t *testing.T) {
	t.Run("sandboxes per key", func(t *testing.T) {
		e := newEnv(t, nil)
		e.au.AddKey("small", audit.Key{ID: "ks", Quota: audit.Quota{MaxSandboxes: 2, CPUSecondsPerDay: 100}})
		first := e.createSandbox("small", nil)
		// A run in flight holds a slot too.
		runDone := make(chan response, 1)
		go func() {
			runDone <- e.do(req{method: "POST", path: "/v1/runs", token: "small", body: `{"argv":["fake","sleep:300ms"]}`})
		}()
		waitFor(t, "the run to start", func() bool {
			_, _, _, inflight := e.be.Counts()
			return inflight == 1
		})
		r := e.must(429, req{method: "POST", path: "/v1/sandboxes", token: "small", body: `{}`})
		if d := r.errBody(t); d.Code != CodeQuotaExceeded || !strings.Contains(d.Message, "ks") {
			t.Errorf("error %+v", d)
		}
		if r.Header.Get("Retry-After") == "" {
			t.Error("429 without Retry-After")
		}
		e.must(429, req{method: "POST", path: "/v1/runs", token: "small", body: `{"argv":["echo"]}`})
		// Other keys are not affected.
		e.createSandbox(tokenA, nil)
		<-runDone
		second := e.createSandbox("small", nil)
		e.must(429, req{method: "POST", path: "/v1/sandboxes", token: "small", body: `{}`})
		e.must(200, req{method: "DELETE", path: "/v1/sandboxes/" + first.ID, token: "small"})
		e.createSandbox("small", nil)
		_ = second
	})
	t.Run("CPU seconds per day", func(t *testing.T) {
		e := newEnv(t, nil)
		e.au.AddKey("cpu", audit.Key{ID: "kc", Quota: audit.Quota{MaxSandboxes: 8, CPUSecondsPerDay: 2}})
		sb := e.createSandbox("cpu", nil)
		e.must(200, req{method: "POST", path: "/v1/runs", token: "cpu", body: `{"argv":["fake","cpu:2500"]}`})
		for _, rq := range []req{
			{method: "POST", path: "/v1/runs", body: `{"argv":["echo"]}`},
			{method: "POST", path: "/v1/sandboxes", body: `{}`},
			{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", body: `{"argv":["echo"]}`},
		} {
			rq.token = "cpu"
			r := e.must(429, rq)
			if d := r.errBody(t); !strings.Contains(d.Message, "CPU-seconds") {
				t.Errorf("%s %s: %+v", rq.method, rq.path, d)
			}
		}
		e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"argv":["echo"]}`})
	})
	t.Run("server-wide concurrency", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.MaxConcurrent = 1; c.QueueWait = 50 * time.Millisecond })
		sb := e.createSandbox(tokenA, nil)
		ex := e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
		start := time.Now()
		r := e.must(429, req{method: "POST", path: "/v1/runs", token: tokenB, body: `{"argv":["echo"]}`})
		if d := r.errBody(t); !strings.Contains(d.Message, "max-concurrent") {
			t.Errorf("error %+v", d)
		}
		if time.Since(start) < 50*time.Millisecond {
			t.Error("refused without queueing")
		}
		e.must(429, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", token: tokenA, body: `{"argv":["echo"]}`})
		e.must(200, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal", token: tokenA, body: `{"signal":"KILL"}`})
		// A queued request gets the slot when it frees up: a server that
		// queues long enough for the slot to free (the queue wait is the
		// service's, fixed at New).
		e = newEnv(t, func(c *Config) { c.MaxConcurrent = 1; c.QueueWait = 5 * time.Second })
		sb = e.createSandbox(tokenA, nil)
		ex = e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
		done := make(chan response, 1)
		go func() { done <- e.do(req{method: "POST", path: "/v1/runs", token: tokenB, body: `{"argv":["echo"]}`}) }()
		time.Sleep(20 * time.Millisecond)
		e.must(200, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal", token: tokenA, body: `{"signal":"KILL"}`})
		if r := <-done; r.StatusCode != 200 {
			t.Errorf("queued run: %d %s", r.StatusCode, r.body)
		}
	})
}

func TestPanicRecovery(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	r := e.must(500, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/files?path=panic", token: tokenA})
	d := r.errBody(t)
	if d.Code != CodeInternal || d.RequestID == "" || strings.Contains(d.Message, "fake session") {
		t.Errorf("panic answered %+v", d)
	}
	// The server goes on.
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA})
	var rr RunResponse
	e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"argv":["echo"]}`}).decode(t, &rr)
}

// TestConcurrency runs many clients creating, using and deleting sandboxes
// at once, then checks nothing leaked.
func TestConcurrency(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxConcurrent = 64 })
	const clients = 16
	const rounds = 5
	var wg sync.WaitGroup
	errs := make(chan error, clients*rounds)
	for c := range clients {
		// Two clients per key: each holds a sandbox and a run at once.
		token := fmt.Sprintf("token-%d", c/2)
		e.au.AddKey(token, audit.Key{ID: fmt.Sprintf("k%d", c/2), Quota: audit.Quota{MaxSandboxes: 4, CPUSecondsPerDay: 1000}})
		wg.Go(func() {
			for i := range rounds {
				if err := e.clientRound(token, fmt.Sprintf("c%d-%d", c, i)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if live, created, _, _ := e.be.Counts(); live != 0 || created != clients*rounds || e.srv.Sessions() != 0 {
		t.Errorf("live %d created %d registered %d", live, created, e.srv.Sessions())
	}
	waitFor(t, "streams to close", func() bool { return e.srv.streams.Load() == 0 })
	held, active := e.srv.svc.HeldKeys(), e.srv.svc.Active()
	if held != 0 || active != 0 {
		t.Errorf("slots still held: %d keys, %d active", held, active)
	}
	if ids := e.au.Unfinished(); len(ids) != 0 {
		t.Errorf("unfinished records %v", ids)
	}
}

// clientRound is one client's session: errors, not t.Fatal, since it runs
// in a goroutine.
func (e *env) clientRound(token, name string) error {
	do := func(want int, rq req) (response, error) {
		rq.token = token
		r := e.do(rq)
		if r.StatusCode != want {
			return r, fmt.Errorf("%s: %s %s: %d %s", name, rq.method, rq.path, r.StatusCode, r.body)
		}
		return r, nil
	}
	r, err := do(201, req{method: "POST", path: "/v1/sandboxes", body: `{"metadata":{"name":"` + name + `"}}`})
	if err != nil {
		return err
	}
	var sb Sandbox
	if err := jsonDecode(r.body, &sb); err != nil {
		return err
	}
	base := "/v1/sandboxes/" + sb.ID
	deleted := false
	defer func() {
		if !deleted {
			e.do(req{method: "DELETE", path: base, token: token})
		}
	}()
	if _, err := do(201, req{method: "PUT", path: base + "/files?path=in.txt", body: name}); err != nil {
		return err
	}
	r, err = do(200, req{method: "POST", path: base + "/execs", body: `{"argv":["fake","out:` + name + `"]}`})
	if err != nil {
		return err
	}
	var ex Exec
	if err := jsonDecode(r.body, &ex); err != nil {
		return err
	}
	if ex.Result.Stdout.Data != name+"\n" {
		return fmt.Errorf("%s: stdout %q", name, ex.Result.Stdout.Data)
	}
	if _, err := do(202, req{method: "POST", path: base + "/execs", body: `{"argv":["fake","block"],"wait":false}`}); err != nil {
		return err
	}
	if _, err := do(200, req{method: "GET", path: base + "/execs/" + ex.ID + "/events"}); err != nil {
		return err
	}
	if r, err := do(200, req{method: "GET", path: base + "/files?path=in.txt"}); err != nil || string(r.body) != name {
		return fmt.Errorf("%s: download %q %v", name, r.body, err)
	}
	if _, err := do(200, req{method: "POST", path: "/v1/runs", body: `{"argv":["echo","` + name + `"]}`}); err != nil {
		return err
	}
	// Deleting kills the blocked command.
	_, err = do(200, req{method: "DELETE", path: base})
	deleted = true
	return err
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, nil)
	e.be.SetPools([]PoolStat{{Pool: "python", Ready: 3, Taken: 7, Misses: 1}})
	e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"argv":["fake","deny:evil.example","violate:memory","exit:1"]}`})
	sb := e.createSandbox(tokenA, nil)
	e.exec(tokenA, sb.ID, `{"argv":["echo"]}`, 200)
	e.do(req{method: "GET", path: "/v1/nope"})
	body := string(e.must(200, req{method: "GET", path: "/metrics", token: tokenAdmin}).body)
	for _, want := range []string{
		`moat_runs_total{termination="exited",tier="fake"} 2`,
		`moat_run_duration_seconds_count 2`,
		`moat_sandboxes_active 1`,
		`moat_pool_ready{pool="python"} 3`,
		`moat_pool_taken_total{pool="python"} 7`,
		`moat_pool_misses_total{pool="python"} 1`,
		`moat_denials_total{reason="not-allowlisted"} 1`,
		`moat_limit_hits_total{kind="memory"} 1`,
		`moat_http_requests_total{code="200",route="POST /v1/runs"} 1`,
		`moat_http_requests_total{code="201",route="POST /v1/sandboxes"} 1`,
		`moat_http_requests_total{code="404",route="unmatched"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

func TestConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without a Backend")
	}
	if _, err := New(Config{Backend: &servicetest.Backend{}}); err == nil {
		t.Error("New without an Auditor")
	}
	if _, err := New(Config{Backend: &servicetest.Backend{}, Auditor: servicetest.NewAuditor(), DefaultTTL: 48 * time.Hour}); err == nil {
		t.Error("DefaultTTL above MaxTTL accepted")
	}
	s, err := New(Config{Backend: &servicetest.Backend{}, Auditor: servicetest.NewAuditor(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c := s.cfg
	if c.MaxBodyBytes != 64<<20 || c.MaxFiles != 1000 || c.MaxConcurrent <= 0 || c.DefaultTTL != 10*time.Minute || c.MaxTTL != 24*time.Hour || c.KeepRuns != 1000 || c.QueueWait != 10*time.Second {
		t.Errorf("defaults %+v", c)
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t, nil)
	var h Health
	e.must(http.StatusOK, req{method: "GET", path: "/v1/health"}).decode(t, &h)
	if h.Status != "ok" || h.Version != "test" {
		t.Errorf("health %+v", h)
	}
}
