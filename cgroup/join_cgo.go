//go:build cgo

package cgroup

// CanJoin reports whether Join works in this build: the runtime cannot run
// a system call on every thread of a cgo binary (AllThreadsSyscall returns
// ENOTSUP there), so callers move processes with Add instead.
const CanJoin = false
