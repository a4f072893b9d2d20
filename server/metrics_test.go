package server

import (
	"bufio"
	"regexp"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

func TestLabelValue(t *testing.T) {
	tests := []struct{ in, want string }{
		{"exited", `"exited"`},
		{`a"b`, `"a\"b"`},
		{`back\slash`, `"back\\slash"`},
		{"two\nlines", `"two\nlines"`},
		{"", `""`},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := labelValue(tc.in); got != tc.want {
				t.Errorf("labelValue(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestExposition: every line of a scrape is a comment or a sample in the
// text format, histogram buckets are cumulative with +Inf equal to the
// count, and counters render their labels sorted by name.
func TestExposition(t *testing.T) {
	be := &servicetest.Backend{}
	be.SetPools([]PoolStat{{Pool: "b", Ready: 1}, {Pool: "a", Ready: 2, Taken: 5}, {Pool: "a"}})
	m := newMetrics(testService(t, be))
	for _, d := range []float64{0.005, 0.01, 0.3, 2, 5000} {
		m.duration.observe(d)
	}
	m.runs.inc("native", "exited")
	m.runs.inc("native", "exited")
	m.http.inc(`GET /v1/x"y`, "200")
	var b strings.Builder
	w := bufio.NewWriter(&b)
	m.write(w)
	w.Flush()
	out := b.String()
	sample := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? [-+0-9.eEInfNa]+$`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.HasPrefix(line, "# HELP ") || strings.HasPrefix(line, "# TYPE ") {
			continue
		}
		if !sample.MatchString(line) {
			t.Errorf("not a sample line: %q", line)
		}
	}
	for _, want := range []string{
		`moat_run_duration_seconds_bucket{le="0.01"} 2`,
		`moat_run_duration_seconds_bucket{le="0.5"} 3`,
		`moat_run_duration_seconds_bucket{le="3600"} 4`,
		`moat_run_duration_seconds_bucket{le="+Inf"} 5`,
		`moat_run_duration_seconds_count 5`,
		`moat_runs_total{termination="exited",tier="native"} 2`,
		`moat_http_requests_total{code="200",route="GET /v1/x\"y"} 1`,
		"moat_pool_ready{pool=\"a\"} 2\nmoat_pool_ready{pool=\"b\"} 1\n",
		`moat_pool_taken_total{pool="a"} 5`,
		"# TYPE moat_run_duration_seconds histogram",
		"process_start_time_seconds ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q:\n%s", want, out)
		}
	}
}

// TestDenialsCountOmitted: denied attempts a result only counts in its
// network summary (a flood past the proxy's log) are denials too.
func TestDenialsCountOmitted(t *testing.T) {
	m := newMetrics(testService(t, &servicetest.Backend{}))
	m.observe(&result.Result{Tier: "native", Termination: result.Exited,
		Network:        []result.NetworkAttempt{{Reason: "limit-rate"}, {Allowed: true, Reason: "allowed"}},
		NetworkSummary: &result.NetworkSummary{Omitted: 10050, OmittedReasons: map[string]int{"limit-rate": 10000, "not-allowlisted": 50}}})
	var b strings.Builder
	w := bufio.NewWriter(&b)
	m.write(w)
	w.Flush()
	for _, want := range []string{`moat_denials_total{reason="limit-rate"} 10001`, `moat_denials_total{reason="not-allowlisted"} 50`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("scrape lacks %q:\n%s", want, b.String())
		}
	}
}

// testService is a service over b, shut down when the test ends.
func testService(t *testing.T, b *servicetest.Backend) *service.Service {
	t.Helper()
	svc, err := service.New(service.Config{Backend: b, Auditor: servicetest.NewAuditor()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Shutdown(t.Context()) })
	return svc
}
