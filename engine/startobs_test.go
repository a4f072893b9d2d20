package engine

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
)

// TestObserveStarts: every sandbox take hands out is reported once, with
// its tier and whether a warm pool had it: a run of the pool's class
// takes the pooled sandbox (a hit), a run of another class is prepared on
// demand (a miss).
func TestObserveStarts(t *testing.T) {
	bin := nativeTestBin(t)
	pm := manifest.Default()
	pm.Resources.Timeout = manifest.Duration(30 * time.Second)
	pm.Resources.CPUTime = pm.Resources.Timeout
	if err := pm.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Exe: bin, NoAutoBuild: true, Pools: []PoolConfig{{Manifest: pm, Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	type start struct {
		tier string
		hit  bool
		d    time.Duration
	}
	var mu sync.Mutex
	var starts []start
	e.ObserveStarts(func(tier string, hit bool, d time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		starts = append(starts, start{tier, hit, d})
	})
	if err := e.StartPools(); err != nil {
		t.Fatal(err)
	}
	other := *pm
	other.Resources.Memory = pm.Resources.Memory / 2 // another class: no pool has it
	if err := other.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		m       *manifest.Manifest
		wantHit bool
	}{
		{"the pool's class is a hit", pm, true},
		{"another class is a miss", &other, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wantHit {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if err := e.WaitPools(ctx); err != nil {
					t.Fatalf("the pool never filled: %v %+v", err, e.PoolStats())
				}
			}
			mu.Lock()
			before := len(starts)
			mu.Unlock()
			res, err := e.Run(context.Background(), &Request{Manifest: tc.m, Argv: []string{"true"}})
			if err != nil {
				t.Fatal(err)
			}
			if res.Pooled != tc.wantHit {
				t.Fatalf("Pooled = %v, want %v", res.Pooled, tc.wantHit)
			}
			mu.Lock()
			got := append([]start(nil), starts[before:]...)
			mu.Unlock()
			if len(got) != 1 || got[0].tier != res.Tier || got[0].hit != tc.wantHit || got[0].d <= 0 {
				t.Fatalf("observed %+v; want one start of tier %s, hit %v", got, res.Tier, tc.wantHit)
			}
		})
	}
	e.ObserveStarts(nil)
	if _, err := e.Run(context.Background(), &Request{Manifest: &other, Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 2 {
		t.Errorf("observed %d starts after ObserveStarts(nil), want 2", len(starts))
	}
}

// nativeTestBin builds the moat binary that real native sandboxes of a
// test re-execute as their init, removed when the test ends; it skips
// without root.
func nativeTestBin(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: runs a real native sandbox")
	}
	bin, cleanup, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	return bin
}
