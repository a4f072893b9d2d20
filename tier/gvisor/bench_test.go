package gvisor_test

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// BenchmarkGVisorVsNative runs the same workloads on the native and the
// gvisor tier, interleaved in one run (so both see the same host load), and
// reports each tier's time from the request to the result (sandbox
// prepared, program run to exit, sandbox destroyed) and the ratio
// gvisor/native. The ratio is the figure to compare across machines.
func BenchmarkGVisorVsNative(b *testing.B) {
	g := need(b)
	if moatBin == "" {
		b.Skip("no moat binary for the native tier's init (TestMain builds one with -bench)")
	}
	e := newEngine(b, g)
	workloads := []struct {
		name string
		argv []string
	}{
		{"start-exit", []string{"python3", "-c", "pass"}},
		{"cpu-sum-2e6", []string{"python3", "-c", "print(sum(range(2_000_000)))"}},
		{"syscalls-2000-writes", []string{"python3", "-c", "import os\nfor i in range(2000):\n  with open(f'/workspace/f{i % 10}', 'w') as f: f.write('x' * 64)"}},
	}
	for _, w := range workloads {
		b.Run(w.name, func(b *testing.B) {
			var took [2]time.Duration
			var prog [2]float64 // the program's own duration, ms
			tiers := [2]string{"native", "gvisor"}
			for i := 0; i < b.N; i++ {
				for j, tierName := range tiers {
					m := manifest.Default()
					m.Tier = tierName
					start := time.Now()
					res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: w.argv})
					if err != nil {
						b.Fatalf("%s: %v", tierName, err)
					}
					took[j] += time.Since(start)
					prog[j] += res.DurationMS
					if res.Termination != result.Exited || res.ExitCode != 0 {
						b.Fatalf("%s: termination=%s exit=%d stderr=%q", tierName, res.Termination, res.ExitCode, res.Stderr.Data)
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(took[0].Microseconds())/1000/n, "native-ms/op")
			b.ReportMetric(float64(took[1].Microseconds())/1000/n, "gvisor-ms/op")
			b.ReportMetric(float64(took[1])/float64(took[0]), "gvisor/native")
			b.ReportMetric(prog[1]/prog[0], "gvisor/native-exec")
		})
	}
}
