package cgroup

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/testvm"
)

// v2HostTests are the tests that drive the real cgroupfs and take the v2
// branches there (limits, kill, OOM, CPU accounting, CLONE_INTO_CGROUP).
// TestV2InVM requires each to pass inside its VM.
var v2HostTests = []string{
	"TestHostDetect", "TestCreateDestroyLeavesNothing", "TestLimitsReadBack",
	"TestCreateRejects", "TestCreateUndoesPartialFailure", "TestCreateExistingFails",
	"TestKillAndDestroyKillProcess", "TestKillWhileForking", "TestForkBomb",
	"TestOOM", "TestStatsCPU", "TestFD", "TestOrphansRemove", "TestCreateAcrossProcesses",
	"TestDelegatedSubtree",
}

// TestV2InVM runs this package's tests again in a VM whose kernel has
// cgroup v2 with every controller: this host (v1 hybrid, like the CI
// machine) can only run the v2 code on the fake cgroupfs, and most
// production hosts are pure v2. Inside, init mounts cgroup2 as a v2-only
// host does; Detect, the controller delegation, limits, kill, OOM and
// CLONE_INTO_CGROUP then run on the real kernel.
func TestV2InVM(t *testing.T) {
	testvm.Skip(t)
	// TestIsDelegated reads xattrs of the host's file system, not
	// cgroupfs; the VM's tmpfs may lack user.* xattrs (before Linux 6.6).
	testvm.RunTests(t, []string{"-test.skip=^(TestV2InVM|TestIsDelegated)$"}, testvm.Options{},
		testvm.Expect{Ready: "cgroup v2 in the VM: controllers ", Tests: v2HostTests})
}

// mountV2 is the VM's set-up: cgroup2 alone at /sys/fs/cgroup, as on a
// v2-only host, and Detect must see v2 there.
func mountV2() error {
	const mnt = "/sys/fs/cgroup"
	if err := testvm.MountCgroup2(); err != nil {
		return err
	}
	h, err := Detect()
	if err != nil {
		return err
	}
	if h.Version != V2 {
		return fmt.Errorf("Detect found %v, want v2", h.Version)
	}
	b, err := os.ReadFile(mnt + "/cgroup.controllers")
	if err != nil {
		return err
	}
	fmt.Printf("cgroup v2 in the VM: controllers %s\n", strings.TrimSpace(string(b)))
	return nil
}
