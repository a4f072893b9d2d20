package engines_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/engines"
)

// benchHandlers are the CRI handlers the start benchmarks compare, in the
// order each iteration runs them. gVisor's runsc is not among them: under
// containerd's runc shim (io.containerd.runc.v2 with BinaryName runsc)
// its pods start but the container's output never arrives and the pods
// cannot be removed; gVisor needs its own shim (containerd-shim-runsc-v1),
// which is not built here (docs/ENGINES.md).
var benchHandlers = []string{"runc", "moat"}

// firstOutput runs a pod sandbox and one container that prints "ready",
// the way the kubelet starts a pod (runp, create, start), and returns the
// time until "ready" is in the container's log file; the pod is removed
// afterwards, outside the measurement.
func firstOutput(ctx context.Context, f *fixture, handler string, i int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	p, err := f.runPod(ctx, handler, fmt.Sprintf("bench-%s-%d", handler, i), nil)
	if err != nil {
		return 0, err
	}
	defer p.remove(context.Background())
	if _, err := p.start(ctx, "c", []string{"echo", "ready"}, busybox); err != nil {
		return 0, err
	}
	log := filepath.Join(p.dir, "logs", "c.log")
	for {
		if b, _ := os.ReadFile(log); strings.Contains(string(b), "ready") {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no output within 30 s: %w", ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// BenchmarkCRIStartToFirstOutput is §3's figure: pod sandbox plus
// container start to the container's first output through containerd's
// CRI, each handler in turn within every iteration (so the machine's
// load falls on all alike), reported as ms per handler and as the ratio
// to runc. Run: go test -run '^$' -bench CRIStart -benchtime 10x ./internal/engines/
func BenchmarkCRIStartToFirstOutput(b *testing.B) {
	f := getFixture(b)
	ctx := context.Background()
	var handlers []string
	for _, h := range benchHandlers {
		if h == "moat" && f.moatErr != nil {
			b.Fatalf("moat-runtime: %v", f.moatErr)
		}
		// One unmeasured start each: image unpacking, the first shim.
		if _, err := firstOutput(ctx, f, h, -1); err != nil {
			b.Logf("%s left out: %v", h, err)
			continue
		}
		handlers = append(handlers, h)
	}
	total := map[string]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, h := range handlers {
			d, err := firstOutput(ctx, f, h, i)
			if err != nil {
				b.Fatalf("%s: %v", h, err)
			}
			total[h] += d
		}
	}
	b.StopTimer()
	for _, h := range handlers {
		b.ReportMetric(float64(total[h].Microseconds())/1000/float64(b.N), h+"-ms")
		if h != "runc" && total["runc"] > 0 {
			b.ReportMetric(float64(total[h])/float64(total["runc"]), h+"/runc")
		}
	}
}

// BenchmarkDockerRun is the same figure for `docker run --rm` (create,
// start, wait, remove: what a user waits for), moat against runc.
func BenchmarkDockerRun(b *testing.B) {
	f := getFixture(b)
	preconditions(b, "dockerd", engines.DockerClient)
	d := getDockerd(b, f)
	ctx := context.Background()
	runtimes := []string{"runc", "moat"}
	runOnce := func(rt string) (time.Duration, error) {
		start := time.Now()
		out, err := d.Docker(ctx, nil, "run", "--rm", "--runtime", rt, "--network", "none", busyboxImage, "echo", "ready")
		if err == nil && !strings.Contains(out, "ready") {
			err = fmt.Errorf("output %q", out)
		}
		return time.Since(start), err
	}
	for _, rt := range runtimes {
		if _, err := runOnce(rt); err != nil {
			b.Fatalf("%s: %v", rt, err)
		}
	}
	total := map[string]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, rt := range runtimes {
			dur, err := runOnce(rt)
			if err != nil {
				b.Fatalf("%s: %v", rt, err)
			}
			total[rt] += dur
		}
	}
	b.StopTimer()
	for _, rt := range runtimes {
		b.ReportMetric(float64(total[rt].Microseconds())/1000/float64(b.N), rt+"-ms")
	}
	b.ReportMetric(float64(total["moat"])/float64(total["runc"]), "moat/runc")
}
