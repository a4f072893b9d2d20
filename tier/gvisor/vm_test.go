package gvisor_test

import (
	"testing"

	"github.com/moat-sandbox/moat/tier/tiertest"
)

// TestCgroupV2InVM runs the gVisor tier's tests of what the run's cgroup
// bounds (runsc is pointed at it: memory and OOM, the process bomb, CPU
// time, timeouts and the kill, the clean-up after a SIGKILLed moat) again
// on a cgroup v2 kernel in a VM (tiertest.RunInCgroupV2VM), with this
// host's runsc. Not the conformance suite: under TCG gVisor is too slow
// for its per-case timeouts (in one of two tries the workspace case timed
// out at 20 s, the fork bomb always at 3 s); TestOutcomes' cases give
// emulation the time they need.
func TestCgroupV2InVM(t *testing.T) {
	g := need(t)
	e := newEngine(t, g)
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	tiertest.RunInCgroupV2VM(t, img, moatBin, tiertest.VMRun{
		Tests: []string{"TestOutcomes", "TestKilledMoatIsCollected"},
		Bins:  map[string]string{"runsc": g.Runsc()},
		Env:   map[string]string{"MOAT_RUNSC": tiertest.VMBin("runsc")},
	})
}
