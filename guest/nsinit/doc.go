// Package nsinit is the half of the native tier that runs inside the
// sandbox: Moat's own PID 1. The host starts it (a re-exec of the moat
// binary) already inside new user, mount, PID, network, IPC and UTS
// namespaces; it builds the root filesystem, drops every privilege, starts
// the untrusted program, reaps zombies, forwards signals and reports how the
// program ended.
//
// The setup protocol between the host (tier/native) and this init:
//
//	host                                   init (pid 1 in the new namespaces)
//	----                                   ----------------------------------
//	create cgroup, detached workspace
//	clone(CLONE_NEW*) + uid/gid maps  --->  starts, blocks reading fd 3
//	  (v2: born in the cgroup;
//	   v1: its tasks files on fd 8...)
//	send Setup frame on fd 3          --->  (v1) the main thread moves itself into
//	                                        the cgroup; mounts, pivot_root,
//	                                        hostname, loopback;
//	                                        then blocks reading fd 3 again
//	send Start frame                  --->  unshare cgroupns, rlimits, drop caps,
//	                                        setuid, Landlock, seccomp;
//	(a warm pool's sandbox waits here)      then blocks reading fd 3 again
//	copy inputs into the workspace
//	send Command frame, close fd 3    --->  start program
//	read status (fd 4)                <---  {"started":true}
//	                                  <---  {"exited":true,"exit":N,"signal":N} or {"error":"..."}
//	wait for init to exit
//
// In session mode the Start frame says serve: init reports
// {"started":true} once confined, closes fd 3 and starts each command the
// host sends on SessionFD (see session.go), reporting {"proc":N,...}.
//
// Frames are a 4-byte little-endian length and that many bytes of JSON.
// Init is inside the run's cgroup before it does anything but read the
// Setup frame: on v2 it is born there; on v1 its main thread, from which
// every program is forked, moves itself through the tasks files the host
// opened (a thread moving itself skips the lock whose first writer waits
// for an RCU grace period, which a move by pid from the host pays on every
// cold run; see cgroup.JoinFiles).
// No program runs before the Command frame. Init confines itself before it
// knows the command, so a prepared sandbox has only fork and exec left.
//
// Everything this package sends back is read by the host as hostile input:
// the host bounds the size of each message and trusts nothing in it beyond
// the program's exit status.
//
// The frames, file descriptors and limits of this protocol are package
// nswire's, the one part the host side (tier/native) imports. This package
// must never be imported for anything but running as init: its entry
// point changes process-wide state irreversibly.
package nsinit
