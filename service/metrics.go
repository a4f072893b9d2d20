package service

import (
	"context"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
)

// A sandbox's usage over time (E2B's getMetrics): every MetricsInterval
// the service samples each running sandbox whose session reports
// metrics, and keeps the last MaxMetricSamples of them while the sandbox
// lives. Nothing is kept after it is destroyed: usage that must outlive a
// sandbox is in its audit record.

// MaxMetricSamples bounds the samples kept per sandbox: an hour at E2B's
// 5-second interval.
const MaxMetricSamples = 720

// MetricsReporter is implemented by a Session that can sample its
// sandbox's usage (engine.Session).
type MetricsReporter interface {
	Metrics() (engine.Metrics, error)
}

// Metric is one sample of a sandbox's usage.
type Metric struct {
	Time time.Time `json:"timestamp"`
	// CPUUsedPct is the share of the sandbox's CPUs used since the
	// sample before (since its creation for the first), 0 to 100.
	CPUUsedPct float64 `json:"cpu_used_pct"`
	CPUCount   int     `json:"cpu_count"`
	MemUsed    int64   `json:"mem_used"`
	MemTotal   int64   `json:"mem_total"`
	DiskUsed   int64   `json:"disk_used"`
	DiskTotal  int64   `json:"disk_total"`

	cpu time.Duration // cumulative, for the next sample's rate
}

// metricsHistory is every live sandbox's samples, by sandbox id.
type metricsHistory struct {
	mu sync.Mutex
	m  map[string][]Metric
}

// sample takes one sample of sb and appends it to its history.
func (s *Service) sample(sb *sandbox, now time.Time) (Metric, bool) {
	mr, ok := sb.sess.(MetricsReporter)
	if !ok {
		return Metric{}, false
	}
	em, err := mr.Metrics()
	if err != nil {
		return Metric{}, false
	}
	m := Metric{Time: now.UTC(), CPUCount: max(1, int(em.CPUs+0.5)), MemUsed: em.MemoryBytes, MemTotal: em.MemoryLimit,
		DiskUsed: em.DiskBytes, DiskTotal: em.DiskLimit, cpu: em.CPU}
	s.history.mu.Lock()
	defer s.history.mu.Unlock()
	if s.history.m == nil {
		s.history.m = map[string][]Metric{}
	}
	h := s.history.m[sb.id]
	prevT, prevCPU := sb.created, time.Duration(0)
	if len(h) > 0 {
		prevT, prevCPU = h[len(h)-1].Time, h[len(h)-1].cpu
		if !now.After(prevT) {
			// A concurrent sample got in first: the history stays in
			// time order.
			return h[len(h)-1], true
		}
	}
	m.CPUUsedPct = cpuPct(em.CPU-prevCPU, now.Sub(prevT), em.CPUs)
	if len(h) >= MaxMetricSamples {
		h = append(h[:0], h[len(h)-MaxMetricSamples+1:]...)
	}
	s.history.m[sb.id] = append(h, m)
	return m, true
}

// cpuPct is the share of cpus that cpu time used over wall, 0 to 100.
func cpuPct(cpu, wall time.Duration, cpus float64) float64 {
	if wall <= 0 || cpu <= 0 || cpus <= 0 {
		return 0
	}
	return min(100, 100*cpu.Seconds()/(wall.Seconds()*cpus))
}

// metricsLoop samples every running sandbox each MetricsInterval and
// forgets the histories of sandboxes that are gone, until Shutdown.
func (s *Service) metricsLoop() {
	t := time.NewTicker(s.cfg.MetricsInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case now := <-t.C:
			s.sampleAll(now)
		}
	}
}

func (s *Service) sampleAll(now time.Time) {
	s.mu.Lock()
	live := make([]*sandbox, 0, len(s.sandboxes))
	ids := make(map[string]bool, len(s.sandboxes))
	for id, sb := range s.sandboxes {
		ids[id] = true
		if sb.state == StateRunning {
			live = append(live, sb)
		}
	}
	s.mu.Unlock()
	s.history.mu.Lock()
	for id := range s.history.m {
		if !ids[id] {
			delete(s.history.m, id)
		}
	}
	s.history.mu.Unlock()
	for _, sb := range live {
		s.sample(sb, now)
	}
}

// SandboxMetrics is the usage of key's sandbox id over time: the samples
// taken between start and end (zero: unbounded), oldest first, with one
// taken now when the newest is older than a second, so that a sandbox
// just created has one. A paused sandbox has the samples of its running
// time.
func (s *Service) SandboxMetrics(ctx context.Context, key audit.Key, id string, start, end time.Time) ([]Metric, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	if !start.IsZero() && !end.IsZero() && end.Before(start) {
		return nil, InvalidField("end", "%s is before start %s", end.UTC().Format(time.RFC3339), start.UTC().Format(time.RFC3339))
	}
	now := time.Now()
	s.mu.Lock()
	running := sb.state == StateRunning
	s.mu.Unlock()
	s.history.mu.Lock()
	h := s.history.m[id]
	stale := len(h) == 0 || now.Sub(h[len(h)-1].Time) > time.Second
	s.history.mu.Unlock()
	if running && stale {
		s.sample(sb, now)
	}
	s.history.mu.Lock()
	defer s.history.mu.Unlock()
	out := []Metric{}
	for _, m := range s.history.m[id] {
		if (!start.IsZero() && m.Time.Before(start)) || (!end.IsZero() && m.Time.After(end)) {
			continue
		}
		out = append(out, m)
	}
	return out, nil
}
