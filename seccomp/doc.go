// Package seccomp holds the native tier's system call policy as data and
// compiles it to a classic BPF program for seccomp(2).
//
// A Policy is a table of Rules, one or more per system call, each with the
// reason it exists. Compile turns it into a filter; Evaluate runs that filter
// in an interpreter so the policy can be tested without privileges; Install
// applies it to every thread of the calling process; Table lists the decision
// for every amd64 system call number (checked in as testdata/policy_amd64.golden).
//
// The sandbox init calls Install(Default()...) as close to execve as it can,
// after every other piece of setup (namespaces, mounts, Landlock), so that as
// few of its own system calls as possible run under the filter.
//
// Layout of a compiled program:
//
//	ld  arch                  ; seccomp_data.arch
//	jeq AUDIT_ARCH_X86_64 ?   : ret KILL_PROCESS      (int 0x80 / i386 entry)
//	ld  nr                    ; seccomp_data.nr
//	jset 0x40000000 ?         : ret X32 action        (x32 ABI)
//	binary search on nr over ranges of equal decision (jge)
//	  leaf: ret action
//	  leaf for a syscall with argument rules: each rule in order,
//	       ld arg word, compare, ..., ret action; then ret Default
//
// This package must never weaken a policy silently: Compile rejects rules it
// cannot express exactly (unknown names, unreachable rules, invalid errnos),
// and Install fails rather than apply the filter to only some threads.
package seccomp

//go:generate go run gen_sysnum.go
