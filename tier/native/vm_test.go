package native_test

import (
	"testing"

	"github.com/moat-sandbox/moat/tier/tiertest"
)

// TestCgroupV2InVM runs the native tier's cgroup-dependent tests again on a
// cgroup v2 kernel in a VM (tiertest.RunInCgroupV2VM), each required to
// pass there: init born in the run's cgroup (CLONE_INTO_CGROUP), the
// program inside it, limits, OOM, pids and timeouts, sessions, the warm
// pool, and the clean-up after a SIGKILLed moat.
func TestCgroupV2InVM(t *testing.T) {
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
	tiertest.RunInCgroupV2VM(t, img, moatBin, tiertest.VMRun{Tests: []string{
		"TestInitJoinsCgroup", "TestMoatGuest", "TestExitStatusConvention", "TestConformance",
		"TestKilledMoatIsCleanedUp", "TestWarmPool", "TestSession", "TestSessionConcurrentAndSignals",
		"TestCancelForwardsSIGTERM", "TestOutputFloodMemory",
	}})
}
