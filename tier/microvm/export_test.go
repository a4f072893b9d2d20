package microvm

// Test hooks for package microvm_test.

// SetVMMOverheadMiB sets what the VMM's cgroup allows beyond the VM's RAM
// (a negative value puts the limit below the RAM: the VMM is OOM-killed).
func SetVMMOverheadMiB(m *MicroVM, mib int64) { m.vmmOverheadMiB = mib }

// SetVMMPids sets the VMM's pids limit.
func SetVMMPids(m *MicroVM, n int) { m.vmmPids = n }

// SetPrealloc makes every VM of m touch all its RAM at start.
func SetPrealloc(m *MicroVM) { m.prealloc = true }

// VMMOverheadMiB is the tier's default allowance beyond the VM's RAM.
const VMMOverheadMiB = vmmOverheadMiB

// GuestOverheadMiB is the VM's RAM beyond the program's memory limit.
const GuestOverheadMiB = vmOverheadMiB
