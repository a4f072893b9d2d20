package native_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

// TestWarmPool: runs whose manifest matches a pool's class take a prepared
// sandbox, once; other runs are prepared fresh; closing the engine
// destroys what still waits.
func TestWarmPool(t *testing.T) {
	needRoot(t)
	class := manifest.Default()
	if err := class.Validate(); err != nil {
		t.Fatal(err)
	}
	// A home of its own (sharing the built images), so that what is left
	// in it after Close is this engine's.
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	shared, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(shared.Home(), "images"), filepath.Join(home, "images")); err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{Home: home, Exe: moatBin, NoAutoBuild: true, Pools: []engine.PoolConfig{
		{Manifest: class, Size: 2},
		{Manifest: class, Size: 1, Session: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			e.Close()
		}
	})
	if err := e.StartPools(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.WaitPools(ctx); err != nil {
		t.Fatalf("pools did not fill: %v (%+v)", err, e.PoolStats())
	}

	ids := map[string]bool{}
	for i := 0; i < 3; i++ {
		// A fresh sandbox: an empty workspace, and no process but init
		// and this shell. The shell expands /proc's pids itself, after
		// the pipeline before it ended: counting with ls | grep raced
		// with grep's own start.
		res, err := e.Run(context.Background(), &engine.Request{Manifest: class, Argv: []string{"sh", "-c", "ls -A /workspace | wc -l; set -- /proc/[0-9]*; echo $#"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 || res.Stdout.Data != "0\n2\n" {
			t.Errorf("run %d: exit %d stdout %q (want an empty workspace and 2 processes: init and sh)", i, res.ExitCode, res.Stdout.Data)
		}
		if ids[res.ID] {
			t.Errorf("sandbox %s handed out twice", res.ID)
		}
		ids[res.ID] = true
		if i == 0 && !res.Pooled {
			t.Errorf("first run did not come from the pool")
		}
		if left := leftovers(e.Home())(res.ID); len(left) > 0 {
			t.Errorf("pooled run %s left: %v", res.ID, left)
		}
	}

	// Another class is prepared fresh.
	other := manifest.Default()
	other.Resources.Memory = 256 << 20
	if err := other.Validate(); err != nil {
		t.Fatal(err)
	}
	res, err := e.Run(context.Background(), &engine.Request{Manifest: other, Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Pooled {
		t.Errorf("a run of another resource class came from the pool")
	}

	s, err := e.NewSession(context.Background(), &engine.SessionRequest{Manifest: class})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Info().Pooled {
		t.Errorf("session did not come from the session pool")
	}
	s.Close()

	st := e.PoolStats()
	if len(st) != 2 || st[0].Taken < 1 || st[1].Taken != 1 {
		t.Errorf("pool stats %+v", st)
	}
	if err := e.WaitPools(ctx); err != nil {
		t.Fatalf("pools did not refill: %v (%+v)", err, e.PoolStats())
	}
	waiting, _ := filepath.Glob(filepath.Join(home, "runs", "*"))
	if len(waiting) != 3 {
		t.Errorf("before Close, %d sandboxes hold run directories, want the 3 refilled: %v", len(waiting), waiting)
	}
	e.Close()
	closed = true
	for _, d := range waiting {
		if left := leftovers(home)(filepath.Base(d)); len(left) > 0 {
			t.Errorf("after Close, pooled sandbox %s left: %v", filepath.Base(d), left)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(home, "runs", "*")); len(m) > 0 {
		t.Errorf("after Close, run directories remain: %v", m)
	}
}
