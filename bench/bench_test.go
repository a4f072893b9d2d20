package bench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/testbin"
)

// BenchmarkOverhead runs the same interleaved comparison as 'moat bench'
// and reports the ratios as benchmark metrics:
//
//	CGO_ENABLED=0 go test -run '^$' -bench Overhead ./bench/
func BenchmarkOverhead(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root: the native tier creates cgroups and maps user namespaces")
	}
	bin, cleanup, err := testbin.Build()
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	e, err := engine.New(engine.Options{Exe: bin, NoAutoBuild: true})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.Images().Lookup("python"); err != nil {
		b.Fatalf("%v (build it with: moat image build python)", err)
	}
	b.ResetTimer()
	rep, err := Run(context.Background(), Options{Runs: max(b.N, 10), Throughput: 100, Moat: bin, Engine: e})
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	for _, s := range rep.Samples {
		b.ReportMetric(s.MedianMS, s.Name+"-median-ms")
	}
	b.ReportMetric(rep.OverheadMS, "cli-overhead-ms")
	b.ReportMetric(rep.EngineOverheadMS, "engine-overhead-ms")
	b.ReportMetric(rep.RatioBwrap, "moat/bwrap")
	b.ReportMetric(rep.RunsPerSecond, "runs/s")
	if testing.Verbose() {
		rep.Print(os.Stdout)
	}
	fmt.Fprintln(os.Stderr)
}

func TestSummarize(t *testing.T) {
	ms := func(v ...float64) []float64 { return v }
	tests := []struct {
		name     string
		in       []float64
		median   float64
		min, p90 float64
	}{
		{"one", ms(5), 5, 5, 5},
		{"odd", ms(3, 1, 2), 2, 1, 2},
		{"ten", ms(10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 5, 1, 9},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ds []timeDuration
			for _, v := range tc.in {
				ds = append(ds, msDuration(v))
			}
			s := summarize("x", "cmd", ds)
			if s.MedianMS != tc.median || s.MinMS != tc.min || s.P90MS != tc.p90 || s.Runs != len(tc.in) {
				t.Errorf("summarize(%v) = %+v, want median %v min %v p90 %v", tc.in, s, tc.median, tc.min, tc.p90)
			}
		})
	}
}

type timeDuration = time.Duration

func msDuration(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// TestPairedDiff: quantiles of this-minus-reference per round, not the
// difference of the medians.
func TestPairedDiff(t *testing.T) {
	ms := func(v ...float64) []time.Duration {
		var ds []time.Duration
		for _, x := range v {
			ds = append(ds, msDuration(x))
		}
		return ds
	}
	tests := []struct {
		name          string
		this, ref     []time.Duration
		p25, p50, p75 float64
	}{
		{"empty", nil, nil, 0, 0, 0},
		{"one", ms(10), ms(12), -2, -2, -2},
		// Load drifts from round to round; each round's pair moves
		// together, so the difference stays at -1.
		{"drifting load", ms(10, 20, 30, 40, 50), ms(11, 21, 31, 41, 51), -1, -1, -1},
		{"spread", ms(1, 2, 3, 4, 5), ms(3, 3, 3, 3, 3), -1, 0, 1},
		{"unequal lengths use the common rounds", ms(5, 5, 100), ms(4, 4), 1, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p25, p50, p75 := pairedDiff(tc.this, tc.ref)
			if p25 != tc.p25 || p50 != tc.p50 || p75 != tc.p75 {
				t.Errorf("pairedDiff = %v, %v, %v; want %v, %v, %v", p25, p50, p75, tc.p25, tc.p50, tc.p75)
			}
		})
	}
}

// TestWithGuest: a reference moat gets the guest named for it, or none of
// ours.
func TestWithGuest(t *testing.T) {
	env := []string{"PATH=/bin", "MOAT_GUEST=/ours/moat-guest", "HOME=/root"}
	if got := withGuest(env, ""); slices.Contains(got, "MOAT_GUEST=/ours/moat-guest") || len(got) != 2 {
		t.Errorf("withGuest(env, \"\") = %v: our MOAT_GUEST must go", got)
	}
	if got := withGuest(env, "/ref/moat-guest"); !slices.Equal(got, []string{"PATH=/bin", "HOME=/root", "MOAT_GUEST=/ref/moat-guest"}) {
		t.Errorf("withGuest(env, /ref/moat-guest) = %v", got)
	}
	if env[1] != "MOAT_GUEST=/ours/moat-guest" {
		t.Errorf("withGuest changed its argument: %v", env)
	}
}
