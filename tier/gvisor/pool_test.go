package gvisor_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/gvisor"
)

// poolEngine is an engine with its own home (sharing the built images), so
// that what is left in it after Close is this engine's, with gvisor pools
// of class.
func poolEngine(t testing.TB, g *gvisor.GVisor, class *manifest.Manifest, pools ...engine.PoolConfig) *engine.Engine {
	t.Helper()
	shared := newEngine(t, g)
	home, err := os.MkdirTemp("", "moat-gvisor-pool-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chmod(home, 0o711); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(shared.Home(), "images"), filepath.Join(home, "images")); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{Home: home, Exe: moatBin, NoAutoBuild: true, Tiers: map[string]tier.Tier{gvisor.Name: g}, Pools: pools})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func gvisorClass(t testing.TB) *manifest.Manifest {
	t.Helper()
	m := manifest.Default()
	m.Tier = gvisor.Name
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestWarmPool: a run or session of a pool's class takes a booted gVisor
// sandbox (its Sentry waiting for the command), once; closing the engine
// destroys what still waits.
func TestWarmPool(t *testing.T) {
	g := need(t)
	class := gvisorClass(t)
	e := poolEngine(t, g, class, engine.PoolConfig{Manifest: class, Size: 1}, engine.PoolConfig{Manifest: class, Size: 1, Session: true})
	closed := false
	t.Cleanup(func() {
		if !closed {
			e.Close()
		}
	})
	if err := e.StartPools(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := e.WaitPools(ctx); err != nil {
		t.Fatalf("pools did not fill: %v (%+v)", err, e.PoolStats())
	}
	ids := map[string]bool{}
	for i := 0; i < 2; i++ {
		if err := e.WaitPools(ctx); err != nil {
			t.Fatalf("pools did not refill: %v (%+v)", err, e.PoolStats())
		}
		// A fresh sandbox: an empty workspace, and no process but init
		// and this program.
		res, err := e.Run(context.Background(), &engine.Request{Manifest: class, Argv: []string{"python3", "-c", "import os; print(len(os.listdir('/workspace')), len([p for p in os.listdir('/proc') if p.isdigit()]))"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Termination != result.Exited || res.Stdout.Data != "0 2\n" {
			t.Errorf("run %d: %s exit %d stdout %q stderr %q (want an empty workspace and 2 processes: init and the program)", i, res.Termination, res.ExitCode, res.Stdout.Data, res.Stderr.Data)
		}
		if !res.Pooled {
			t.Errorf("run %d did not come from the pool", i)
		}
		if ids[res.ID] {
			t.Errorf("sandbox %s handed out twice", res.ID)
		}
		ids[res.ID] = true
		if left := leftovers(e.Home())(res.ID); len(left) > 0 {
			t.Errorf("pooled run %s left: %v", res.ID, left)
		}
	}
	s, err := e.NewSession(context.Background(), &engine.SessionRequest{Manifest: class})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Info().Pooled {
		t.Errorf("session did not come from the session pool")
	}
	res := execWait(t, s, &engine.ExecRequest{Argv: []string{"echo", "pooled session"}})
	wantResult(t, res, result.Exited, 0)
	s.Close()
	if left := leftovers(e.Home())(s.ID()); len(left) > 0 {
		t.Errorf("pooled session %s left: %v", s.ID(), left)
	}
	if err := e.WaitPools(ctx); err != nil {
		t.Fatalf("pools did not refill: %v (%+v)", err, e.PoolStats())
	}
	waiting, _ := filepath.Glob(filepath.Join(e.Home(), "runs", "*"))
	if len(waiting) != 2 {
		t.Errorf("before Close, %d sandboxes hold run directories, want the 2 refilled: %v", len(waiting), waiting)
	}
	e.Close()
	closed = true
	for _, d := range waiting {
		if left := leftovers(e.Home())(filepath.Base(d)); len(left) > 0 {
			t.Errorf("after Close, pooled sandbox %s left: %v", filepath.Base(d), left)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(e.Home(), "runs", "*")); len(m) > 0 {
		t.Errorf("after Close, run directories remain: %v", m)
	}
}

// BenchmarkPooledVsCold measures a gvisor run of `python3 -c pass` from
// the request to the result, cold (cgroup, workspace, bundle, Sentry boot,
// command, teardown) and from a warm pool (a booted Sentry waiting, so
// only the command and the teardown are left), interleaved in one run, and
// reports the ratio pooled/cold. Each measured run starts with the pool
// full, so no refill competes with it.
func BenchmarkPooledVsCold(b *testing.B) {
	g := need(b)
	class := gvisorClass(b)
	cold := gvisorClass(b)
	cold.Resources.Memory = class.Resources.Memory / 2 // another class: never pooled
	if err := cold.Validate(); err != nil {
		b.Fatal(err)
	}
	e := poolEngine(b, g, class, engine.PoolConfig{Manifest: class, Size: 1})
	defer e.Close()
	if err := e.StartPools(); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	argv := []string{"python3", "-c", "pass"}
	var took [2]time.Duration
	for i := 0; i < b.N; i++ {
		for j, m := range []*manifest.Manifest{cold, class} {
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			err := e.WaitPools(wctx)
			cancel()
			if err != nil {
				b.Fatalf("pool did not fill: %v (%+v)", err, e.PoolStats())
			}
			start := time.Now()
			res, err := e.Run(ctx, &engine.Request{Manifest: m, Argv: argv})
			if err != nil {
				b.Fatal(err)
			}
			took[j] += time.Since(start)
			if res.Termination != result.Exited || res.ExitCode != 0 || res.Pooled != (j == 1) {
				b.Fatalf("run %d: %s exit %d pooled %v stderr %q", j, res.Termination, res.ExitCode, res.Pooled, res.Stderr.Data)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(took[0].Microseconds())/1000/n, "cold-ms/op")
	b.ReportMetric(float64(took[1].Microseconds())/1000/n, "pooled-ms/op")
	b.ReportMetric(float64(took[1])/float64(took[0]), "pooled/cold")
}
