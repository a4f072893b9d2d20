package tiertest

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
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/internal/testvm"
)

// A tier's tests run again inside a VM whose kernel has cgroup v2 with
// every controller, mounted as on a v2-only host (internal/testvm): this
// host, like the CI machine, is v1 hybrid and runs only the v1 paths for
// real. The image goes in as a read-only disk; moat, moat-guest and the
// tier's own binaries in the initramfs.

// The guest's environment: the image's digest and where things are.
const (
	vmImageEnv = "MOAT_TESTVM_IMAGE"
	vmHome     = "/moat-home"
	vmBin      = "/testbin"
	vmReady    = "on cgroup v2 in the VM: image "
)

// NotApplicable begins the reason of a conformance case a tier's
// capabilities rule out.
const NotApplicable = "not applicable on "

// VMBin is where the VM holds the binaries given to RunInCgroupV2VM.
func VMBin(name string) string { return vmBin + "/" + name }

// VMRun is what RunInCgroupV2VM runs.
type VMRun struct {
	Tests []string          // top-level tests, each required to pass
	Skip  string            // -test.skip pattern, with the reason beside it
	Bins  map[string]string // name to host path, at VMBin(name) inside
	Env   map[string]string // the guest's environment
}

// RunInCgroupV2VM runs the calling test binary's tests in a cgroup v2 VM
// with img, moat and moat-guest, and requires every one of them to pass
// there; the only skips allowed are the conformance cases a tier's
// capabilities rule out, which skip on the host too.
func RunInCgroupV2VM(t *testing.T, img *image.Image, moatBin string, run VMRun) {
	t.Helper()
	testvm.Skip(t)
	disk := filepath.Join(t.TempDir(), "image.ext4")
	if err := ext4(img.Root, disk); err != nil {
		t.Fatal(err)
	}
	guestBin, cleanup, err := testbin.BuildGuest()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	files := map[string]string{
		"image.json":            filepath.Join(filepath.Dir(img.Root), "image.json"),
		VMBin("moat")[1:]:       moatBin,
		VMBin("moat-guest")[1:]: guestBin,
	}
	for name, p := range run.Bins {
		files[VMBin(name)[1:]] = p
	}
	vmEnv := map[string]string{vmImageEnv: strings.TrimPrefix(img.Digest, "sha256:")}
	for k, v := range run.Env {
		vmEnv[k] = v
	}
	args := []string{"-test.v", "-test.count=1", "-test.run=^(" + strings.Join(run.Tests, "|") + ")$"}
	if run.Skip != "" {
		args = append(args, "-test.skip="+run.Skip)
	}
	r, err := testvm.Run(context.Background(), args,
		testvm.Options{MemoryMiB: 2048, CPUs: 2, Timeout: 10 * time.Minute, Files: files, Disks: []string{disk}, Env: vmEnv})
	if r != nil {
		t.Logf("VM console (%v):\n%s", r.Elapsed.Round(time.Millisecond), r.Console)
	}
	if err != nil {
		t.Fatal(err)
	}
	if r.Code != 0 {
		t.Errorf("the tests inside the VM exited %d", r.Code)
	}
	if !strings.Contains(r.Console, vmReady) {
		t.Error("the VM did not report its cgroup v2 set-up")
	}
	for _, name := range run.Tests {
		if !regexp.MustCompile(`(?m)^--- PASS: ` + name + ` `).MatchString(r.Console) {
			t.Errorf("%s did not pass inside the VM", name)
		}
	}
	// Any other skip inside would be a v2 path that did not run. go test
	// -v prints a test's skip reason after its "=== RUN" line.
	notApplicable := map[string]bool{}
	var running string
	for _, l := range strings.Split(r.Console, "\n") {
		l = strings.TrimSpace(l)
		if name, ok := strings.CutPrefix(l, "=== RUN   "); ok {
			running = name
		} else if strings.Contains(l, NotApplicable) {
			notApplicable[running] = true
		}
		if strings.HasPrefix(l, "--- FAIL: ") {
			t.Errorf("inside the VM: %s", l)
		}
		if name, ok := strings.CutPrefix(l, "--- SKIP: "); ok {
			if name, _, _ = strings.Cut(name, " ("); !notApplicable[name] {
				t.Errorf("inside the VM: %s", l)
			}
		}
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

// SetupCgroupV2VM is the VM's set-up, for testvm.GuestMain: cgroup2 alone
// at /sys/fs/cgroup, as on a v2-only host, an image store ($MOAT_HOME)
// holding the image from the disk, and the prebuilt moat binaries for
// internal/testbin.
func SetupCgroupV2VM() error {
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
	fmt.Printf("%s: %s%s\n", filepath.Base(os.Args[0]), vmReady, digest)
	return nil
}
