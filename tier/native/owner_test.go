package native_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
)

// TestSandboxesOwnTheirIDs: concurrent sandboxes get distinct host id
// ranges, and each one's user namespace is owned by its own range's first
// id, not by the host's root: the kernel charges a namespace's inotify
// instances and queued signals to its owner, and keeps pipe pages and
// descriptors in flight per host id, so with one shared owner one run
// could spend root's budget or signal to another run (issue 17).
func TestSandboxesOwnTheirIDs(t *testing.T) {
	needRoot(t)
	n, img, _ := nativeTier(t)
	owners := map[int]bool{}
	for i := range 3 {
		sb, err := prepareSmall(t, n, img, fmt.Sprintf("owner-%d-%x", i, time.Now().UnixNano()))
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy()
		if err := sb.(tier.Readier).WaitReady(context.Background()); err != nil {
			t.Fatal(err)
		}
		pids, err := sb.(tier.ProcessLister).Procs()
		if err != nil || len(pids) != 1 {
			t.Fatalf("processes in the run's cgroup: %v, %v; want init alone", pids, err)
		}
		owner, err := userNSOwner(pids[0])
		if err != nil {
			t.Fatal(err)
		}
		base := sb.Workspace().UID - native.SandboxUID
		if owner != base {
			t.Errorf("sandbox %d: user namespace owned by host id %d, want its range's base %d", i, owner, base)
		}
		if owner < native.HostIDBase {
			t.Errorf("sandbox %d: user namespace owned by host id %d, below the native range", i, owner)
		}
		if owners[owner] {
			t.Errorf("sandbox %d: host id range %d is another live sandbox's too", i, owner)
		}
		owners[owner] = true
	}
}

// userNSOwner is the host uid owning pid's user namespace (NS_GET_OWNER_UID).
func userNSOwner(pid int) (int, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var uid uint32
	const nsGetOwnerUID = 0xb704
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&uid))); e != 0 {
		return 0, fmt.Errorf("NS_GET_OWNER_UID: %w", e)
	}
	return int(uid), nil
}
