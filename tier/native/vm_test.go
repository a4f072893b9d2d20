package native_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/internal/testvm"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// The VM's environment: the image's digest and where things are.
const (
	vmImageEnv = "MOAT_TESTVM_IMAGE"
	vmHome     = "/moat-home"
	vmBin      = "/testbin"
	vmReady    = "on cgroup v2 in the VM: image "
)

// TestCgroupV2InVM runs the native tier's cgroup-dependent tests again in a
// VM whose kernel has cgroup v2 with every controller, mounted as on a
// v2-only host (internal/testvm): this host, like the CI machine, is v1
// hybrid and runs only the v1 paths for real. Each must pass there: init
// born in the run's cgroup (CLONE_INTO_CGROUP), the program inside it,
// limits, OOM, pids and timeouts, sessions, the warm pool, and the
// clean-up after a SIGKILLed moat. The python image goes in as a
// read-only disk, moat and moat-guest in the initramfs; the only skips
// allowed are the conformance cases the tier's capabilities rule out,
// which skip on the host too.
func TestCgroupV2InVM(t *testing.T) {
	needRoot(t)
	testvm.Skip(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(t.TempDir(), "image.ext4")
	if err := image.WriteExt4(img.Root, disk); err != nil {
		t.Fatal(err)
	}
	guestBin, cleanup, err := testbin.BuildGuest()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	tests := []string{
		"TestInitJoinsCgroup", "TestMoatGuest", "TestExitStatusConvention", "TestConformance",
		"TestKilledMoatIsCleanedUp", "TestWarmPool", "TestSession", "TestSessionConcurrentAndSignals",
		"TestCancelForwardsSIGTERM", "TestOutputFloodMemory", "TestParallelMoatRuns",
		"TestSandboxesOwnTheirIDs", "TestSessionInitSurvivesKill",
	}
	env := map[string]string{vmImageEnv: strings.TrimPrefix(img.Digest, "sha256:")}
	if v := os.Getenv(parallelRunsEnv); v != "" {
		env[parallelRunsEnv] = v // a longer soak, asked for on the host
	}
	testvm.RunTests(t, []string{"-test.run=^(" + strings.Join(tests, "|") + ")$"},
		testvm.Options{
			MemoryMiB: 2048, CPUs: 2, Timeout: 10 * time.Minute,
			Files: map[string]string{
				"image.json":              filepath.Join(filepath.Dir(img.Root), "image.json"),
				vmBin[1:] + "/moat":       moatBin,
				vmBin[1:] + "/moat-guest": guestBin,
			},
			Disks: []string{disk},
			Env:   env,
		},
		testvm.Expect{Ready: vmReady, Tests: tests, SkipReason: tiertest.NotApplicable})
}

// setupCgroupV2VM is the VM's set-up, for testvm.GuestMain: cgroup2 alone
// at /sys/fs/cgroup, as on a v2-only host, an image store ($MOAT_HOME)
// holding the image from the disk, and the prebuilt moat binaries for
// internal/testbin.
func setupCgroupV2VM() error {
	if err := testvm.MountCgroup2(); err != nil {
		return err
	}
	h, err := cgroup.Detect()
	if err != nil {
		return err
	}
	if h.Version != cgroup.V2 {
		return fmt.Errorf("cgroup.Detect found %v, want v2", h.Version)
	}
	digest := os.Getenv(vmImageEnv)
	dir := filepath.Join(vmHome, "images", "python", digest)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755); err != nil {
		return err
	}
	// As the engine lays out a home: traversable, writable by root only.
	for _, d := range []string{vmHome, filepath.Join(vmHome, "images")} {
		if err := os.Chmod(d, 0o711); err != nil {
			return err
		}
	}
	b, err := os.ReadFile("/image.json")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "image.json"), b, 0o644); err != nil {
		return err
	}
	if err := unix.Mount("/dev/vda", filepath.Join(dir, "rootfs"), "ext4", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mount the image disk: %w", err)
	}
	if err := os.Symlink(digest, filepath.Join(vmHome, "images", "python", "current")); err != nil {
		return err
	}
	os.Setenv("MOAT_HOME", vmHome)
	os.Setenv(testbin.DirEnv, vmBin)
	fmt.Printf("%s: %s%s\n", filepath.Base(os.Args[0]), vmReady, digest)
	return nil
}
