package native_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/internal/testvm"
)

// v2Tests are the tests TestCgroupV2InVM runs inside its VM, each required
// to pass there: init born in the run's cgroup (CLONE_INTO_CGROUP), the
// program inside it, limits, OOM, pids, timeouts and the leftover checks
// of the conformance suite, on the kernel's real cgroup v2.
var v2Tests = []string{"TestInitJoinsCgroup", "TestMoatGuest", "TestExitStatusConvention", "TestConformance",
	"TestKilledMoatIsCleanedUp", "TestWarmPool", "TestSession", "TestSessionConcurrentAndSignals", "TestCancelForwardsSIGTERM", "TestOutputFloodMemory"}

// The guest's environment: the image's digest and what the VM holds.
const (
	vmImageEnv = "MOAT_TESTVM_IMAGE"
	vmHome     = "/moat-home"
	vmBin      = "/testbin"
)

// TestCgroupV2InVM runs the native tier's cgroup-dependent tests again in a
// VM whose kernel has cgroup v2 with every controller, mounted as on a
// v2-only host: this host (v1 hybrid, like the CI machine) runs only the
// v1 paths for real. The python image goes in as a read-only disk, moat and
// moat-guest in the initramfs.
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
	if err := ext4(img.Root, disk); err != nil {
		t.Fatal(err)
	}
	guestBin, cleanup, err := testbin.BuildGuest()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	r, err := testvm.Run(context.Background(),
		[]string{"-test.v", "-test.count=1", "-test.run=^(" + strings.Join(v2Tests, "|") + ")$"},
		testvm.Options{
			MemoryMiB: 2048, CPUs: 2, Timeout: 10 * time.Minute,
			Files: map[string]string{
				"image.json":              filepath.Join(filepath.Dir(img.Root), "image.json"),
				vmBin[1:] + "/moat":       moatBin,
				vmBin[1:] + "/moat-guest": guestBin,
			},
			Disks: []string{disk},
			Env:   map[string]string{vmImageEnv: strings.TrimPrefix(img.Digest, "sha256:")},
		})
	if r != nil {
		t.Logf("VM console (%v):\n%s", r.Elapsed.Round(time.Millisecond), r.Console)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != 0 {
		t.Errorf("the tests inside the VM exited %d", r.Code)
	}
	if !strings.Contains(r.Console, "native tier on cgroup v2 in the VM") {
		t.Error("the VM did not report its cgroup v2 set-up")
	}
	for _, name := range v2Tests {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + name + ` `).MatchString(r.Console) {
			t.Errorf("%s did not pass inside the VM", name)
		}
	}
	for _, l := range regexp.MustCompile(`(?m)^\s*--- (SKIP|FAIL): .*$`).FindAllString(r.Console, -1) {
		t.Errorf("inside the VM: %s", strings.TrimSpace(l))
	}
}

// ext4 writes root into a fresh ext4 file at out without mounting
// anything on the host (mkfs.ext4 -d), sized for root plus headroom.
func ext4(root, out string) error {
	var size, inodes int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		if fi, err := d.Info(); err == nil && fi.Mode().IsRegular() {
			size += (fi.Size() + 4095) &^ 4095
		}
		return nil
	})
	if err != nil {
		return err
	}
	blocks := (size+inodes*4096)/4096*5/4 + 8192
	cmd := exec.Command("mkfs.ext4", "-q", "-F", "-b", "4096", "-N", strconv.FormatInt(inodes+1024, 10),
		"-O", "^has_journal,^resize_inode", "-E", "root_owner=0:0", "-d", root, out, strconv.FormatInt(blocks, 10))
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4: %v: %s", err, b)
	}
	return nil
}

// setupV2VM is the VM's set-up: cgroup2 alone at /sys/fs/cgroup, as on a
// v2-only host, and an image store holding the python image from the disk.
func setupV2VM() error {
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount cgroup2: %w", err)
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
	fmt.Printf("native tier on cgroup v2 in the VM: image %s\n", digest)
	return nil
}
