// Package fsrules is the Landlock ruleset a sandboxed program runs under,
// written once for the two places that apply it: the native tier's init
// (guest/nsinit) and the microVM guest agent (guest/vmagent).
package fsrules

import "github.com/landlock-lsm/go-landlock/landlock"

// Restrict confines the calling process (every thread) and what it execs
// to reading and executing everywhere, and writing only in /workspace,
// /tmp and the given device files, whatever the mounts and modes allow.
// Paths are resolved in the caller's root. It uses the newest Landlock ABI
// the kernel has (BestEffort); the caller checks that the kernel has one.
func Restrict(devices ...string) error {
	return landlock.V5.BestEffort().RestrictPaths(
		landlock.RODirs("/"),
		landlock.RWDirs("/workspace", "/tmp"),
		landlock.RWFiles(devices...),
	)
}
