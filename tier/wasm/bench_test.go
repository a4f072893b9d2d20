package wasm_test

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/wasm"
)

// benchEngine is an engine with the wasm tier and, when root, the native
// tier (whose init is a moat binary built for the benchmark).
func benchEngine(b *testing.B) (*engine.Engine, bool) {
	b.Helper()
	w, err := wasm.New(wasm.Options{})
	if err != nil {
		b.Skipf("wasm tier unavailable: %v", err)
	}
	b.Cleanup(func() { w.Close() })
	if err := w.Precompile(context.Background()); err != nil {
		b.Fatal(err)
	}
	opts := engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{wasm.Name: w}}
	native := os.Geteuid() == 0
	if native {
		bin, cleanup, err := testbin.Build()
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(cleanup)
		opts.Exe = bin
	}
	e, err := engine.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := e.Images().Lookup("python"); err != nil {
		b.Skipf("the python image is not built (%v)", err)
	}
	return e, native
}

func runOnce(b *testing.B, e *engine.Engine, tierName string, argv []string) {
	m := manifest.Default()
	m.Tier = tierName
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: argv})
	if err != nil {
		b.Fatalf("%s %q: %v", tierName, argv, err)
	}
	if res.Termination != result.Exited || res.ExitCode != 0 || res.Stdout.Data != "1\n" {
		b.Fatalf("%s %q: termination=%s exit=%d stdout=%q stderr=%q", tierName, argv, res.Termination, res.ExitCode, res.Stdout.Data, res.Stderr.Data)
	}
}

// BenchmarkWASMVsNative runs print(1) in Python and console.log(1) in
// JavaScript on the wasm tier, and print(1) on the native tier, interleaved
// in one run, each from request to result through the engine (sandbox
// prepared, program run, workspace diffed, sandbox destroyed). It reports
// milliseconds per run and the ratio wasm/native for Python. (The native
// tier's image has no JavaScript engine, so JS has no native peer.)
func BenchmarkWASMVsNative(b *testing.B) {
	e, native := benchEngine(b)
	py := []string{"python3", "-c", "print(1)"}
	js := []string{"node", "-e", "console.log(1)"}
	var tPy, tJS, tNat time.Duration
	for i := 0; i < b.N; i++ {
		s := time.Now()
		runOnce(b, e, wasm.Name, py)
		tPy += time.Since(s)
		s = time.Now()
		runOnce(b, e, wasm.Name, js)
		tJS += time.Since(s)
		if native {
			s = time.Now()
			runOnce(b, e, "native", py)
			tNat += time.Since(s)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(tPy.Microseconds())/1000/n, "wasm-py-ms/op")
	b.ReportMetric(float64(tJS.Microseconds())/1000/n, "wasm-js-ms/op")
	if native {
		b.ReportMetric(float64(tNat.Microseconds())/1000/n, "native-py-ms/op")
		b.ReportMetric(float64(tPy)/float64(tNat), "wasm-py/native-py")
		b.ReportMetric(float64(tJS)/float64(tNat), "wasm-js/native-py")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkWASMThroughput runs snippets on 2 workers at once (the
// reference machine's 2 cores) and reports snippets per second for each
// guest.
func BenchmarkWASMThroughput(b *testing.B) {
	e, _ := benchEngine(b)
	for _, c := range []struct {
		name string
		argv []string
	}{{"python", []string{"python3", "-c", "print(1)"}}, {"js", []string{"node", "-e", "console.log(1)"}}} {
		b.Run(c.name, func(b *testing.B) {
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for w := 0; w < 2; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						runOnce(b, e, wasm.Name, c.argv)
					}
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "snippets/s")
		})
	}
}

// BenchmarkInstantiate is the tier alone, without the engine: Prepare,
// Exec of console.log(1) / print(1), Destroy.
func BenchmarkInstantiate(b *testing.B) {
	w, err := wasm.New(wasm.Options{})
	if err != nil {
		b.Skipf("wasm tier unavailable: %v", err)
	}
	defer w.Close()
	if err := w.Precompile(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		argv []string
	}{{"python", []string{"python3", "-c", "print(1)"}}, {"js", []string{"node", "-e", "console.log(1)"}}} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			for i := 0; i < b.N; i++ {
				sb, err := w.Prepare(context.Background(), &tier.Spec{ID: "b", StateDir: dir + "/r", Limits: tier.Limits{MemoryBytes: 256 << 20, Timeout: 10 * time.Second}})
				if err != nil {
					b.Fatal(err)
				}
				out, err := sb.Exec(context.Background(), &tier.Command{Argv: c.argv})
				if err != nil || out.ExitCode != 0 {
					b.Fatalf("%v %+v", err, out)
				}
				sb.Destroy()
				os.Remove(dir + "/r")
			}
		})
	}
}
