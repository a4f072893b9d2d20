// Package fsrules is the Landlock ruleset a sandboxed program runs under,
// written once for the two places that apply it: the native tier's init
// (guest/nsinit) and the microVM guest agent (guest/vmagent).
package fsrules

import (
	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

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

// terminalAccess is what a sandbox may do to the terminals of its own
// devpts instance: open /dev/pts/ptmx and the slaves, read, write, and use
// terminal ioctls (window size, job control). Never make or remove
// entries (devpts would refuse anyway).
const terminalAccess = ll.AccessFSReadFile | ll.AccessFSWriteFile | ll.AccessFSIoctlDev

// RestrictTerminals is Restrict plus the terminals below pts, the mount
// point of the sandbox's own devpts instance.
func RestrictTerminals(pts string, devices ...string) error {
	return landlock.V5.BestEffort().RestrictPaths(
		landlock.RODirs("/"),
		landlock.RWDirs("/workspace", "/tmp"),
		landlock.RWFiles(devices...),
		landlock.PathAccess(terminalAccess, pts),
	)
}

// buildAccess is every file access right but making character and block
// devices: a build step's tree is writable throughout, and device nodes
// are never part of an image (the user namespace denies mknod of devices
// already; this says so a second time).
const buildAccess = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile |
	ll.AccessFSReadDir | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeDir |
	ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeSym |
	ll.AccessFSRefer | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// RestrictBuild confines the calling process like Restrict, for an image
// build step whose root is the tree being built: reading and writing
// everywhere in its own root (which is all it can reach after pivot_root),
// never creating device nodes. What stays read-only (/proc/sys, /dev) is
// read-only by its mount.
func RestrictBuild() error {
	return landlock.V5.BestEffort().RestrictPaths(
		landlock.PathAccess(buildAccess, "/"),
	)
}
