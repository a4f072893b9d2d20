package server

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// TestAccrue: while a run, a command and a sandbox are running, the audit
// log already holds the time (and, where the backend tells, the CPU) they
// have used, so that a crash of the server loses at most AccrueInterval
// of their accounting and the daily CPU quota sees them.
func TestAccrue(t *testing.T) {
	store, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	token, key, err := store.CreateKey("accrue", audit.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Auditor = store
		c.AccrueInterval = 10 * time.Millisecond
	})

	// The run outlives the checks below even on a loaded machine: its
	// audit record must still be running when they look.
	ran := make(chan response, 1)
	go func() {
		ran <- e.do(req{method: "POST", path: "/v1/runs", token: token, body: map[string]any{"argv": []string{"fake", "sleep:5s"}}})
	}()
	sb := e.createSandbox(token, nil)
	ex := e.exec(token, sb.ID, map[string]any{"argv": []string{"fake", "block"}, "wait": false}, http.StatusAccepted)

	// running is the one running record of kind, once there is one: the
	// run's request, sent from its own goroutine, may reach the server
	// after the checks begin on a loaded machine.
	running := func(t *testing.T, kind audit.Kind) (audit.Record, bool) {
		t.Helper()
		recs, err := store.Query(audit.Filter{Kind: kind, Status: audit.Running})
		if err != nil {
			t.Fatalf("running %s records: %v", kind, err)
		}
		if len(recs) > 1 {
			t.Fatalf("running %s records: %v, want one", kind, recs)
		}
		if len(recs) == 0 {
			return audit.Record{}, false
		}
		return recs[0], true
	}
	tests := []struct {
		kind    audit.Kind
		wantCPU bool
	}{
		{audit.KindRun, true},      // the fake's processes: the test process
		{audit.KindExec, true},     // the fake session's CPU since the command started
		{audit.KindSandbox, false}, // its CPU is its commands'
	}
	for _, tc := range tests {
		t.Run(string(tc.kind), func(t *testing.T) {
			waitFor(t, "usage of the running "+string(tc.kind)+" in the audit log", func() bool {
				r, ok := running(t, tc.kind)
				return ok && r.WallMS >= 50 && (r.CPUMS > 0) == tc.wantCPU
			})
		})
	}
	if used, err := store.CPUSecondsToday(key.ID); err != nil || used <= 0 {
		t.Errorf("CPU seconds today while running: %v, %v; want the accrued CPU", used, err)
	}

	// The final numbers are the results'; accrual does not overwrite them.
	e.must(http.StatusOK, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal", token: token, body: map[string]any{"signal": "SIGTERM"}})
	e.waitExec(token, sb.ID, ex.ID)
	e.must(http.StatusOK, req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: token})
	time.Sleep(50 * time.Millisecond)
	r, err := store.Get(sb.ID + "-" + ex.ID)
	if err != nil || r.Status == audit.Running || r.CPUMS != 0 {
		t.Errorf("exec record after its end: %+v, %v; want the fake result's CPU (0)", r, err)
	}
	var run RunResponse
	resp := <-ran
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("run: %d %s", resp.StatusCode, resp.body)
	}
	resp.decode(t, &run)
	if r, err := store.Get(run.ID); err != nil || r.Status != audit.Done || r.WallMS != run.Result.DurationMS {
		t.Errorf("run record after its end: %+v, %v; want done with the result's wall time %v", r, err, run.Result.DurationMS)
	}
}
