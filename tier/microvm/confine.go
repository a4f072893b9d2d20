package microvm

// How the tier confines its VMM on the host (package jail does the work):
// the ids it runs as, the files it must be able to open, and the limits of
// the run's cgroup that holds it.

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// vmmOverheadMiB is the memory the VMM's cgroup allows beyond the VM's
// RAM: QEMU's own heap, thread stacks, its share of its libraries, TCG's
// translation cache (bounded by tcgCacheMiB), the page cache of what it
// reads (reclaimable) and the jailer's Go runtime before the exec.
// Measured here (QEMU 7.2, TCG, 1 vCPU, TestVMMMemory) with all of the
// VM's RAM touched (-mem-prealloc) and the program at its memory limit:
// 102-115 MiB of anonymous memory beyond the RAM, plus up to 30 MiB of
// page cache. 192 MiB leaves about 60 MiB of margin.
const vmmOverheadMiB = 192

// vmmPids bounds the VMM's tasks: QEMU's block-layer thread pool (up to
// 64 workers), one thread per vCPU, its main, RCU and migration threads,
// and the jailer's Go runtime threads before the exec, with room to spare.
// QEMU aborts when it cannot start a thread, so the limit stays well above
// what it can use; it is a bound for a VMM a guest took over.
func vmmPids(vcpus int) int { return 128 + vcpus }

// vmmLimits are the cgroup limits of a run's VMM. The CPU bandwidth is
// not among them: it is set when the program starts (Sandbox.Exec), so a
// VM's boot, Moat's own cost, is not slowed by a run granted a fraction
// of a CPU.
func (m *MicroVM) vmmLimits(ramMiB int64, vcpus int) cgroup.Limits {
	pids := vmmPids(vcpus)
	if m.vmmPids > 0 {
		pids = m.vmmPids
	}
	return cgroup.Limits{MemoryBytes: (ramMiB + m.vmmOverheadMiB) << 20, Pids: pids}
}

// checkJailIDs refuses a host where an account or group uses the jail's
// ids (jail.UIDBase .. jail.UIDLimit, jail.GID): a jailed VMM would own
// that account's files. Only the files are read; ids from a directory
// service (NSS) cannot be listed, which THREATS records.
func checkJailIDs(passwd, group string) error {
	check := func(path string, bad func(id uint64) bool) error {
		f, err := os.Open(path)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(sc.Text(), ":")
			if len(fields) < 3 {
				continue
			}
			id, err := strconv.ParseUint(fields[2], 10, 32)
			if err == nil && bad(id) {
				return fmt.Errorf("%s: %q has id %d, which Moat's VMM jail uses (uids %d..%d, gid %d); change that account's id", path, fields[0], id, jail.UIDBase+1, jail.UIDLimit, jail.GID)
			}
		}
		return sc.Err()
	}
	if err := check(passwd, func(id uint64) bool { return id > jail.UIDBase && id <= jail.UIDLimit }); err != nil {
		return err
	}
	return check(group, func(id uint64) bool { return id == jail.GID })
}

// jailReadable checks that a jailed VMM can open path by its path: the
// file is world-readable (a public kernel) or readable by the jails'
// group.
func jailReadable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Mode().Perm()&0o004 != 0 || st.Gid == jail.GID && fi.Mode().Perm()&0o040 != 0 {
		return nil
	}
	return fmt.Errorf("%s (mode %04o, group %d) is not readable by the VMM's jail: make it world-readable (chmod o+r; it is a public distribution kernel) or readable by group %d", path, fi.Mode().Perm(), st.Gid, jail.GID)
}
