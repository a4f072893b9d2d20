package server

import (
	"bufio"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server/accesslog"
)

// metrics are the series docs/API.md lists, written in Prometheus' text
// exposition format (version 0.0.4). Labels take values from closed sets
// only (tiers, terminations, violation kinds, denial reasons, route
// patterns), never from a client's input, so the series stay bounded.
//
// Written here rather than with the Prometheus client library: every
// sandbox's init is a moat process, and that library's package
// initialisation (its default registry, the Go and process collectors,
// procfs' regular expressions) was about 30% of the instructions a moat
// process ran before main (callgrind), paid on every run whether or not a
// server ever scraped. See docs/RATIONALE.md.
type metrics struct {
	g        gauges
	build    []string   // version, go_version, source: moat_build_info's labels
	runs     counterVec // tier, termination
	duration histogram
	start    histogram  // tier, pool
	denials  counterVec // reason
	limits   counterVec // kind
	http     counterVec // route, code
}

// gauges are what metrics reads at each scrape (*service.Service).
type gauges interface {
	Active() int
	PoolStats() []PoolStat
}

func newMetrics(g gauges) *metrics {
	return &metrics{
		g:     g,
		build: []string{"", runtime.Version(), ""},
		start: histogram{name: "moat_sandbox_start_seconds", labels: []string{"tier", "pool"},
			help:    "Time to have a sandbox ready for its program: taken from a warm pool (pool=\"hit\") or prepared on demand (pool=\"miss\"), by tier.",
			buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}},
		runs: counterVec{name: "moat_runs_total", labels: []string{"tier", "termination"},
			help: "Programs that ended (one-shot runs and sandbox commands), by tier and termination."},
		duration: histogram{name: "moat_run_duration_seconds",
			help:    "Wall-clock duration of programs that ended (one-shot runs and sandbox commands).",
			buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}},
		denials: counterVec{name: "moat_denials_total", labels: []string{"reason"},
			help: "Network attempts the egress proxy refused, by reason."},
		limits: counterVec{name: "moat_limit_hits_total", labels: []string{"kind"},
			help: "Limits and policies programs ran into (result violations), by kind."},
		http: counterVec{name: "moat_http_requests_total", labels: []string{"route", "code"},
			help: "HTTP requests by route pattern and status code."},
	}
}

// observe counts one ended program.
func (m *metrics) observe(res *result.Result) {
	if res == nil {
		return
	}
	m.runs.inc(res.Tier, string(res.Termination))
	m.duration.observe(res.DurationMS / 1000)
	for _, n := range res.Network {
		if !n.Allowed {
			m.denials.inc(n.Reason)
		}
	}
	// Denied attempts the result does not list one by one (a flood past
	// the proxy's log) count too.
	if ns := res.NetworkSummary; ns != nil {
		for reason, n := range ns.OmittedReasons {
			m.denials.add(float64(n), reason)
		}
	}
	for _, v := range res.Violations {
		m.limits.inc(v.Kind)
	}
}

// observeStart counts one sandbox made ready for a program
// (service.Config.ObserveStart).
func (m *metrics) observeStart(tier string, poolHit bool, d time.Duration) {
	pool := "miss"
	if poolHit {
		pool = "hit"
	}
	m.start.observe(d.Seconds(), tier, pool)
}

// MetricsHandler serves GET /metrics without a key, for a listener of its
// own (moat serve --metrics-listen) that only the host's scraper reaches:
// the same series the API's /metrics shows admin keys. Anything else is
// 404. Its requests are in the access log at debug level.
func (s *Server) MetricsHandler() http.Handler {
	return accesslog.Handler(s.log, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := accesslog.From(r.Context())
		e.Quiet()
		if r.URL.Path != "/metrics" {
			e.Note("unmatched", "")
			http.Error(w, "not found: this listener serves GET /metrics only", http.StatusNotFound)
			return
		}
		e.Note("GET /metrics", "")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, r.Method+" is not allowed on /metrics; allowed: GET, HEAD", http.StatusMethodNotAllowed)
			return
		}
		s.writeMetrics(w)
	}))
}

// serveMetrics answers admin keys only: the series are the whole
// server's (every tenant's runs, denials, limits and requests), and a
// tenant's key must not learn what other tenants do.
func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	if k := keyOf(r); !k.Admin && k.Scope != audit.ScopeMetrics {
		return forbidden("GET /metrics shows the whole server's activity and needs an admin key or a metrics key; key %s is a tenant's (create one for monitoring with moat keys create --scope metrics)", k.ID)
	}
	return s.writeMetrics(w)
}

func (s *Server) writeMetrics(w http.ResponseWriter) error {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	s.metrics.write(bw)
	return bw.Flush()
}

// write renders every series: the counters and the histogram, then the
// gauges read now (active sandboxes, the Backend's pools), then the
// server process's own.
func (m *metrics) write(w *bufio.Writer) {
	header(w, "moat_build_info", "gauge", "Always 1; the labels say which Moat this is: its version, the Go it was built with, and its source digest (scripts/source-id).")
	fmt.Fprintf(w, "moat_build_info{%s} 1\n", labelPairs([]string{"version", "go_version", "source"}, m.build))
	m.runs.write(w)
	m.duration.write(w)
	m.start.write(w)
	m.denials.write(w)
	m.limits.write(w)
	m.http.write(w)

	active := m.g.Active()
	header(w, "moat_sandboxes_active", "gauge", "Sandboxes alive: sessions plus one-shot runs in flight.")
	fmt.Fprintf(w, "moat_sandboxes_active %d\n", active)

	if ps := m.g.PoolStats(); ps != nil {
		var stats []PoolStat
		seen := map[string]bool{}
		for _, p := range ps {
			if !seen[p.Pool] { // a duplicate series would fail the whole scrape
				seen[p.Pool] = true
				stats = append(stats, p)
			}
		}
		slices.SortFunc(stats, func(a, b PoolStat) int { return strings.Compare(a.Pool, b.Pool) })
		for _, g := range []struct {
			name, typ, help string
			value           func(PoolStat) uint64
		}{
			{"moat_pool_ready", "gauge", "Sandboxes prepared and waiting in a warm pool.", func(p PoolStat) uint64 { return uint64(max(p.Ready, 0)) }},
			{"moat_pool_taken_total", "counter", "Sandboxes handed out from a warm pool.", func(p PoolStat) uint64 { return p.Taken }},
			{"moat_pool_misses_total", "counter", "Requests a warm pool could not serve from ready sandboxes.", func(p PoolStat) uint64 { return p.Misses }},
		} {
			if len(stats) == 0 {
				break
			}
			header(w, g.name, g.typ, g.help)
			for _, p := range stats {
				fmt.Fprintf(w, "%s{pool=%s} %d\n", g.name, labelValue(p.Pool), g.value(p))
			}
		}
	}
	writeProcess(w)
}

// writeProcess writes the series the Prometheus client's Go and process
// collectors are best known for, under their usual names.
func writeProcess(w *bufio.Writer) {
	header(w, "go_goroutines", "gauge", "Number of goroutines that currently exist.")
	fmt.Fprintf(w, "go_goroutines %d\n", runtime.NumGoroutine())
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		header(w, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.")
		fmt.Fprintf(w, "process_cpu_seconds_total %s\n", formatFloat(cpu.Seconds()))
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		header(w, "process_open_fds", "gauge", "Number of open file descriptors.")
		fmt.Fprintf(w, "process_open_fds %d\n", len(ents))
	}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				header(w, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.")
				fmt.Fprintf(w, "process_resident_memory_bytes %d\n", pages*int64(os.Getpagesize()))
			}
		}
	}
	header(w, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.")
	fmt.Fprintf(w, "process_start_time_seconds %s\n", formatFloat(float64(processStart.UnixNano())/1e9))
}

var processStart = time.Now()

func header(w *bufio.Writer, name, typ, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
}

// counterVec is a counter with labels; a series exists once incremented.
type counterVec struct {
	name, help string
	labels     []string

	mu     sync.Mutex
	values map[string]float64 // by the rendered label set
}

func (c *counterVec) inc(values ...string) { c.add(1, values...) }

// add adds n to the series of values.
func (c *counterVec) add(n float64, values ...string) {
	if len(values) != len(c.labels) {
		panic(fmt.Sprintf("metric %s: %d label values for %d labels", c.name, len(values), len(c.labels)))
	}
	// Labels in name order, as the client library rendered them.
	key := "{" + labelPairs(c.labels, values) + "}"
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.values == nil {
		c.values = map[string]float64{}
	}
	c.values[key] += n
}

func (c *counterVec) write(w *bufio.Writer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	header(w, c.name, "counter", c.help)
	keys := make([]string, 0, len(c.values))
	for k := range c.values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "%s%s %s\n", c.name, k, formatFloat(c.values[k]))
	}
}

// histogram is a cumulative histogram, with labels or without. Without
// labels its one series is always written (zeros before the first
// observation); with labels a series exists once observed.
type histogram struct {
	name, help string
	labels     []string
	buckets    []float64 // upper bounds, ascending; +Inf is implicit

	mu     sync.Mutex
	series map[string]*histogramSeries // by the rendered label pairs
}

type histogramSeries struct {
	counts []uint64 // per bucket, not cumulative; len(buckets)+1
	sum    float64
	count  uint64
}

// observe adds v to the series of values (one per label).
func (h *histogram) observe(v float64, values ...string) {
	if len(values) != len(h.labels) {
		panic(fmt.Sprintf("metric %s: %d label values for %d labels", h.name, len(values), len(h.labels)))
	}
	key := labelPairs(h.labels, values)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.series == nil {
		h.series = map[string]*histogramSeries{}
	}
	se := h.series[key]
	if se == nil {
		se = &histogramSeries{counts: make([]uint64, len(h.buckets)+1)}
		h.series[key] = se
	}
	i, _ := slices.BinarySearch(h.buckets, v) // the first bound >= v
	se.counts[i]++
	se.sum += v
	se.count++
}

func (h *histogram) write(w *bufio.Writer) {
	h.mu.Lock()
	defer h.mu.Unlock()
	header(w, h.name, "histogram", h.help)
	keys := make([]string, 0, len(h.series))
	for k := range h.series {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if len(h.labels) == 0 && len(keys) == 0 {
		keys = []string{""}
	}
	for _, k := range keys {
		se := h.series[k]
		if se == nil {
			se = &histogramSeries{counts: make([]uint64, len(h.buckets)+1)}
		}
		// le goes last, after the series' own labels.
		le, braces := "{", ""
		if k != "" {
			le, braces = "{"+k+",", "{"+k+"}"
		}
		var cum uint64
		for i, bound := range h.buckets {
			cum += se.counts[i]
			fmt.Fprintf(w, "%s_bucket%sle=%q} %d\n", h.name, le, formatFloat(bound), cum)
		}
		fmt.Fprintf(w, "%s_bucket%sle=\"+Inf\"} %d\n", h.name, le, se.count)
		fmt.Fprintf(w, "%s_sum%s %s\n%s_count%s %d\n", h.name, braces, formatFloat(se.sum), h.name, braces, se.count)
	}
}

// labelPairs renders label names and values as the text format writes
// them inside braces, in name order: a="x",b="y".
func labelPairs(labels, values []string) string {
	pairs := make([]string, len(values))
	for i, v := range values {
		pairs[i] = labels[i] + "=" + labelValue(v)
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// labelValue renders a label value: double quotes, with backslash, double
// quote and newline escaped as the text format requires.
func labelValue(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(v) + `"`
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	case math.IsNaN(f):
		return "NaN"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}
