package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"time"
)

// MigrationCost measures a cold cgroup v1 migration by pid (Cgroup.Add),
// the median of ten: the kernel's global cgroup_threadgroup_rwsem makes
// the first writer after a quiet spell wait for an RCU grace period. A
// run's init does not pay it: its main thread moves itself (Join), which
// skips that lock. It is 0 on cgroup v2, where a run's init is born in
// its cgroup. (moat doctor and moat bench report it.)
func (h *Host) MigrationCost() (time.Duration, error) {
	if h.Version != V1 {
		return 0, nil
	}
	var ts []time.Duration
	for i := 0; i < 10; i++ {
		cg, err := h.Create(fmt.Sprintf("bench-migration-%d-%d", os.Getpid(), i), Limits{})
		if err != nil {
			return 0, err
		}
		p := exec.Command("sleep", "10")
		if err := p.Start(); err != nil {
			cg.Destroy()
			return 0, err
		}
		time.Sleep(50 * time.Millisecond)
		t0 := time.Now()
		err = cg.Add(p.Process.Pid)
		ts = append(ts, time.Since(t0))
		p.Process.Kill()
		p.Wait()
		cg.Destroy()
		if err != nil {
			return 0, err
		}
	}
	h.Prune()
	slices.Sort(ts)
	return ts[(len(ts)-1)/2], nil
}
