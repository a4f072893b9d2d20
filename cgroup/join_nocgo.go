//go:build !cgo

package cgroup

// CanJoin reports whether Join works in this build (it needs
// AllThreadsSyscall, which a binary built without cgo has).
const CanJoin = true
