package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
)

func TestCPUPct(t *testing.T) {
	tests := []struct {
		name      string
		cpu, wall time.Duration
		cpus      float64
		want      float64
	}{
		{"one cpu busy", time.Second, time.Second, 1, 100},
		{"half of two cpus", time.Second, time.Second, 2, 50},
		{"a quarter", 250 * time.Millisecond, time.Second, 1, 25},
		{"more than the cpus (estimate) is capped", 3 * time.Second, time.Second, 1, 100},
		{"no time passed", time.Second, 0, 1, 0},
		{"clock went back", time.Second, -time.Second, 1, 0},
		{"cpu went down (a process ended)", -time.Second, time.Second, 1, 0},
		{"no cpus", time.Second, time.Second, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := cpuPct(tc.cpu, tc.wall, tc.cpus); got != tc.want {
				t.Errorf("cpuPct(%v, %v, %v) = %v, want %v", tc.cpu, tc.wall, tc.cpus, got, tc.want)
			}
		})
	}
}

// meteredSession is a Session that reports the metrics it is given.
type meteredSession struct {
	Session
	m   engine.Metrics
	err error
}

func (s *meteredSession) Metrics() (engine.Metrics, error) { return s.m, s.err }

func TestSampleHistory(t *testing.T) {
	t0 := time.Now().Add(-time.Hour)
	tests := []struct {
		name    string
		sess    Session
		samples int
		want    int // kept
	}{
		{"one", &meteredSession{m: engine.Metrics{CPUs: 1}}, 1, 1},
		{"bounded", &meteredSession{m: engine.Metrics{CPUs: 1}}, MaxMetricSamples + 10, MaxMetricSamples},
		{"a session that fails", &meteredSession{err: errors.New("closed")}, 3, 0},
		{"a session without metrics", &struct{ Session }{}, 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{}
			sb := &sandbox{id: "sb", sess: tc.sess, created: t0}
			for i := 0; i < tc.samples; i++ {
				s.sample(sb, t0.Add(time.Duration(i+1)*time.Second))
			}
			h := s.history.m["sb"]
			if len(h) != tc.want {
				t.Fatalf("%d samples kept, want %d", len(h), tc.want)
			}
			for i := 1; i < len(h); i++ {
				if !h[i].Time.After(h[i-1].Time) {
					t.Fatalf("samples out of order at %d", i)
				}
			}
			if tc.want > 0 && !h[len(h)-1].Time.Equal(t0.Add(time.Duration(tc.samples)*time.Second).UTC()) {
				t.Errorf("the newest sample is %v, not the last taken", h[len(h)-1].Time)
			}
		})
	}
	t.Run("an earlier sample after a later one is not kept", func(t *testing.T) {
		s := &Service{}
		sb := &sandbox{id: "sb", sess: &meteredSession{m: engine.Metrics{CPUs: 1}}, created: t0}
		s.sample(sb, t0.Add(2*time.Second))
		s.sample(sb, t0.Add(time.Second))
		if n := len(s.history.m["sb"]); n != 1 {
			t.Errorf("%d samples, want 1", n)
		}
	})
	t.Run("rate between samples", func(t *testing.T) {
		s := &Service{}
		ms := &meteredSession{m: engine.Metrics{CPUs: 2, CPU: time.Second}}
		sb := &sandbox{id: "sb", sess: ms, created: t0}
		s.sample(sb, t0.Add(time.Second)) // 1 s of CPU over 1 s on 2 CPUs
		ms.m.CPU = 3 * time.Second
		s.sample(sb, t0.Add(3*time.Second)) // 2 s more over 2 s
		h := s.history.m["sb"]
		if h[0].CPUUsedPct != 50 || h[1].CPUUsedPct != 50 {
			t.Errorf("cpu %v, %v, want 50, 50", h[0].CPUUsedPct, h[1].CPUUsedPct)
		}
	})
}

func TestSandboxMetricsRefusals(t *testing.T) {
	s := &Service{sandboxes: map[string]*sandbox{"sb": {id: "sb", key: "k1", state: StateRunning, sess: &meteredSession{m: engine.Metrics{CPUs: 1}}, created: time.Now()}}}
	now := time.Now()
	tests := []struct {
		name       string
		key        string
		id         string
		start, end time.Time
		kind       Kind
		n          int
	}{
		{"its own", "k1", "sb", time.Time{}, time.Time{}, -1, 1},
		{"another key's", "k2", "sb", time.Time{}, time.Time{}, NotFound, 0},
		{"unknown", "k1", "nope", time.Time{}, time.Time{}, NotFound, 0},
		{"end before start", "k1", "sb", now, now.Add(-time.Minute), Invalid, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms, err := s.SandboxMetrics(context.Background(), audit.Key{ID: tc.key}, tc.id, tc.start, tc.end)
			if tc.kind >= 0 {
				if KindOf(err) != tc.kind {
					t.Errorf("err %v, want kind %v", err, tc.kind)
				}
				return
			}
			if err != nil || len(ms) != tc.n {
				t.Errorf("%d samples, %v; want %d", len(ms), err, tc.n)
			}
		})
	}
}
