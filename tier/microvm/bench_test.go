package microvm_test

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/microvm"
)

// BenchmarkBootToResult measures request-to-result for `python3 -c pass`
// on the native tier (the peer), a cold microVM (boot included) and a
// microVM taken from a warm pool (booted before the request), interleaved
// in one run so all three see the same host load. It reports each time
// and the ratios to native; the accelerator is in the log.
func BenchmarkBootToResult(b *testing.B) {
	v := need(b, microvm.Options{})
	bin, cleanup, err := testbin.Build()
	if err != nil {
		b.Fatal(err)
	}
	defer cleanup()
	m := manifest.Default()
	m.Tier = microvm.Name
	e, err := engine.New(engine.Options{NoAutoBuild: true, Exe: bin, Tiers: map[string]tier.Tier{microvm.Name: v},
		Pools: []engine.PoolConfig{{Manifest: m, Size: 1}}})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	cold, err := engine.New(engine.Options{NoAutoBuild: true, Exe: bin, Tiers: map[string]tier.Tier{microvm.Name: v}})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.StartPools(); err != nil {
		b.Fatal(err)
	}
	argv := []string{"python3", "-c", "pass"}
	runs := []struct {
		name string
		e    *engine.Engine
		tier string
		pool bool
	}{{"native", cold, "native", false}, {"microvm-cold", cold, microvm.Name, false}, {"microvm-pooled", e, microvm.Name, true}}
	var took [3]time.Duration
	var exec [3]float64 // the command's own duration (after boot), ms
	runtime := ""
	for i := 0; i < b.N; i++ {
		for j, r := range runs {
			{
				// The pool refills in the background: wait outside the
				// measurement until a booted VM is waiting, before every
				// run, so no boot competes with the one measured.
				b.StopTimer()
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				err := e.WaitPools(ctx)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			mm := manifest.Default()
			mm.Tier = r.tier
			start := time.Now()
			res, err := r.e.Run(context.Background(), &engine.Request{Manifest: mm, Argv: argv})
			if err != nil {
				b.Fatalf("%s: %v", r.name, err)
			}
			took[j] += time.Since(start)
			exec[j] += res.DurationMS
			if res.Termination != result.Exited || res.ExitCode != 0 {
				b.Fatalf("%s: termination=%s exit=%d error=%q", r.name, res.Termination, res.ExitCode, res.Error)
			}
			if r.pool && !res.Pooled {
				b.Fatalf("%s: the run did not come from the pool", r.name)
			}
			if r.tier == microvm.Name {
				runtime = res.Runtime
			}
		}
	}
	n := float64(b.N)
	b.Logf("microvm runtime: %s", runtime)
	b.ReportMetric(float64(took[0].Microseconds())/1000/n, "native-ms/op")
	b.ReportMetric(float64(took[1].Microseconds())/1000/n, "cold-ms/op")
	b.ReportMetric(float64(took[2].Microseconds())/1000/n, "pooled-ms/op")
	b.ReportMetric(exec[1]/n, "cold-exec-ms/op")
	b.ReportMetric(exec[2]/n, "pooled-exec-ms/op")
	b.ReportMetric(float64(took[1])/float64(took[0]), "cold/native")
	b.ReportMetric(float64(took[2])/float64(took[0]), "pooled/native")
}
