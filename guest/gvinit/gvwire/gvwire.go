// Package gvwire is what the gVisor tier's host side (tier/gvisor) and
// Moat's init inside a gVisor sandbox (guest/gvinit) agree on: the hidden
// argument that makes the moat binary that init, the line it writes once
// it serves, and the command lines of its exec and kill jobs.
//
// It holds names and command lines only, so that the host can start and
// drive the guest without importing the guest's code, which may only ever
// run inside the sandbox.
package gvwire

import "strconv"

// Arg is the hidden first argument that makes the moat binary the gVisor
// guest.
const Arg = "__moat_gvisor_guest"

// Ready is the line init writes on its stdout once it serves.
const Ready = "ready"

// RlimitNames are the rlimits exec applies, in the order ExecArgs writes
// them.
var RlimitNames = []string{"core", "nofile", "fsize", "nproc", "cpu"}

// InitArgs is the command line of the sandbox's init.
func InitArgs(guest string) []string { return []string{guest, Arg, "init"} }

// ExecArgs is the guest command line that starts argv with the given
// rlimits (name: soft limit; cpu's hard limit is one second more, so
// SIGXCPU comes first).
func ExecArgs(guest string, lim map[string]uint64, argv []string) []string {
	out := []string{guest, Arg, "exec"}
	for _, name := range RlimitNames {
		if v, ok := lim[name]; ok {
			out = append(out, name+"="+strconv.FormatUint(v, 10))
		}
	}
	return append(append(out, "--"), argv...)
}

// KillArgs is the guest command line that sends sig to the process group
// of the command whose pid (in the sandbox) is pid.
func KillArgs(guest string, sig, pid int) []string {
	return []string{guest, Arg, "kill", strconv.Itoa(sig), strconv.Itoa(pid)}
}
