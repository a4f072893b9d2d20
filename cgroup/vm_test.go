package cgroup

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/testvm"
)

// v2HostTests are the tests that drive the real cgroupfs and take the v2
// branches there (limits, kill, OOM, CPU accounting, CLONE_INTO_CGROUP).
// TestV2InVM requires each to pass inside its VM.
var v2HostTests = []string{
	"TestHostDetect", "TestCreateDestroyLeavesNothing", "TestLimitsReadBack",
	"TestCreateRejects", "TestCreateUndoesPartialFailure", "TestCreateExistingFails",
	"TestKillAndDestroyKillProcess", "TestKillWhileForking", "TestForkBomb",
	"TestOOM", "TestStatsCPU", "TestFD", "TestOrphansRemove",
}

// TestV2InVM runs this package's tests again in a VM whose kernel has
// cgroup v2 with every controller: this host (v1 hybrid, like the CI
// machine) can only run the v2 code on the fake cgroupfs, and most
// production hosts are pure v2. Inside, init mounts cgroup2 as a v2-only
// host does; Detect, the controller delegation, limits, kill, OOM and
// CLONE_INTO_CGROUP then run on the real kernel.
func TestV2InVM(t *testing.T) {
	testvm.Skip(t)
	r, err := testvm.Run(context.Background(), []string{"-test.v", "-test.count=1", "-test.skip=^TestV2InVM$"}, testvm.Options{})
	if r != nil {
		t.Logf("VM console (%v):\n%s", r.Elapsed.Round(1e6), r.Console)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != 0 {
		t.Errorf("the tests inside the VM exited %d", r.Code)
	}
	if !strings.Contains(r.Console, "cgroup v2 in the VM: controllers ") {
		t.Error("the VM did not report its cgroup v2 set-up")
	}
	for _, name := range v2HostTests {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + name + ` `).MatchString(r.Console) {
			t.Errorf("%s did not pass inside the VM", name)
		}
	}
	// A skip inside would be a v2 path that did not run.
	for _, l := range regexp.MustCompile(`(?m)^\s*--- (SKIP|FAIL): .*$`).FindAllString(r.Console, -1) {
		t.Errorf("inside the VM: %s", strings.TrimSpace(l))
	}
}

// mountV2 is the VM's set-up: cgroup2 alone at /sys/fs/cgroup, as on a
// v2-only host, and Detect must see v2 there.
func mountV2() error {
	const mnt = "/sys/fs/cgroup"
	if err := unix.Mount("cgroup2", mnt, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
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
