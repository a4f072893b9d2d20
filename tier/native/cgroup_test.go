package native_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
)

// TestInitJoinsCgroup: a prepared sandbox's init, with every one of its
// threads, is inside the run's cgroup in every hierarchy Moat manages
// before the program starts: on v1 each thread moved itself in through
// the tasks files the host passed (cgroup.Join), on v2 init was born there.
// A thread left outside would let the program's memory or processes go
// uncounted.
func TestInitJoinsCgroup(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	n, err := native.New(native.Options{Exe: moatBin})
	if err != nil {
		t.Fatal(err)
	}
	host, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("cgjoin-%x", time.Now().UnixNano())
	state := t.TempDir()
	sb, err := n.Prepare(context.Background(), &tier.Spec{
		ID: id, ImageRoot: img.Root, ImageEnv: img.Env, StateDir: state,
		Limits: tier.Limits{CPUs: 1, MemoryBytes: 128 << 20, Pids: 32, Timeout: 10 * time.Second, CPUTime: 10 * time.Second,
			OpenFiles: 64, FileSizeBytes: 1 << 20, WorkspaceBytes: 1 << 20, WorkspaceFiles: 100, TmpBytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			sb.Destroy()
		}
	}()
	if err := sb.(tier.Readier).WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	pids, err := sb.(tier.ProcessLister).Procs()
	if err != nil || len(pids) != 1 {
		t.Fatalf("processes in the run's cgroup: %v, %v; want init alone", pids, err)
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/cgroup", pids[0]))
	if len(tasks) < 2 {
		t.Fatalf("init has %d threads; a Go init has several, and each must have moved", len(tasks))
	}
	want := "/moat/" + id
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		in := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) == 3 && strings.HasSuffix(f[2], want) {
				for _, c := range strings.Split(f[1], ",") {
					in[c] = true
				}
				if f[1] == "" {
					in["unified"] = true
				}
			}
		}
		var missing []string
		if host.Version == cgroup.V2 {
			if !in["unified"] {
				missing = append(missing, "the v2 cgroup")
			}
		} else {
			for _, c := range []string{"memory", "pids", "cpu"} {
				if !in[c] {
					missing = append(missing, c)
				}
			}
		}
		if len(missing) > 0 {
			t.Errorf("thread %s of init is not in %s's %v:\n%s", filepath.Base(filepath.Dir(p)), want, missing, b)
		}
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	destroyed = true
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("residue after Destroy: %v", left)
	}
}
