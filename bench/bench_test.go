package bench

import (
	"context"
	"fmt"
	"os"
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
