package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/moat-sandbox/moat/result"
)

// metrics are the series docs/API.md lists. Labels take values from closed
// sets only (tiers, terminations, violation kinds, denial reasons, route
// patterns), never from a client's input, so the series stay bounded.
type metrics struct {
	handler  http.Handler
	reg      *prometheus.Registry
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
	denials  *prometheus.CounterVec
	limits   *prometheus.CounterVec
	http     *prometheus.CounterVec
}

func newMetrics(reg *prometheus.Registry, s *Server) (*metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	m := &metrics{
		handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
		reg:     reg,
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_runs_total",
			Help: "Programs that ended (one-shot runs and sandbox commands), by tier and termination.",
		}, []string{"tier", "termination"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "moat_run_duration_seconds",
			Help:    "Wall-clock duration of programs that ended (one-shot runs and sandbox commands).",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_denials_total",
			Help: "Network attempts the egress proxy refused, by reason.",
		}, []string{"reason"}),
		limits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_limit_hits_total",
			Help: "Limits and policies programs ran into (result violations), by kind.",
		}, []string{"kind"}),
		http: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "moat_http_requests_total",
			Help: "HTTP requests by route pattern and status code.",
		}, []string{"route", "code"}),
	}
	active := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "moat_sandboxes_active",
		Help: "Sandboxes alive: sessions plus one-shot runs in flight.",
	}, func() float64 {
		s.mu.Lock()
		defer s.mu.Unlock()
		return float64(s.active)
	})
	for _, c := range []prometheus.Collector{m.runs, m.duration, m.denials, m.limits, m.http, active, &poolCollector{b: s.cfg.Backend}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe counts one ended program.
func (m *metrics) observe(res *result.Result) {
	if res == nil {
		return
	}
	m.runs.WithLabelValues(res.Tier, string(res.Termination)).Inc()
	m.duration.Observe(res.DurationMS / 1000)
	for _, n := range res.Network {
		if !n.Allowed {
			m.denials.WithLabelValues(n.Reason).Inc()
		}
	}
	for _, v := range res.Violations {
		m.limits.WithLabelValues(v.Kind).Inc()
	}
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) error {
	s.metrics.handler.ServeHTTP(w, r)
	return nil
}

var (
	poolReadyDesc  = prometheus.NewDesc("moat_pool_ready", "Sandboxes prepared and waiting in a warm pool.", []string{"pool"}, nil)
	poolTakenDesc  = prometheus.NewDesc("moat_pool_taken_total", "Sandboxes handed out from a warm pool.", []string{"pool"}, nil)
	poolMissesDesc = prometheus.NewDesc("moat_pool_misses_total", "Requests a warm pool could not serve from ready sandboxes.", []string{"pool"}, nil)
)

// poolCollector reads the Backend's pools at scrape time; a Backend without
// pools yields no pool series.
type poolCollector struct{ b Backend }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- poolReadyDesc
	ch <- poolTakenDesc
	ch <- poolMissesDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	pr, ok := c.b.(PoolReporter)
	if !ok {
		return
	}
	seen := map[string]bool{}
	for _, p := range pr.PoolStats() {
		if seen[p.Pool] {
			continue // a duplicate series would fail the whole scrape
		}
		seen[p.Pool] = true
		ch <- prometheus.MustNewConstMetric(poolReadyDesc, prometheus.GaugeValue, float64(p.Ready), p.Pool)
		ch <- prometheus.MustNewConstMetric(poolTakenDesc, prometheus.CounterValue, float64(p.Taken), p.Pool)
		ch <- prometheus.MustNewConstMetric(poolMissesDesc, prometheus.CounterValue, float64(p.Misses), p.Pool)
	}
}
