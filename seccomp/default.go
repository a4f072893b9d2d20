package seccomp

import "golang.org/x/sys/unix"

// nsFlags are the clone/unshare flags that create a namespace. Creating one
// from inside the sandbox is the first step of most container escapes and
// kernel exploits that need CAP_SYS_ADMIN or CAP_NET_ADMIN "in a namespace"
// (a new user namespace grants every capability over the namespaces it owns).
//
// CLONE_NEWTIME (0x80) shares its bit with CSIGNAL, the exit signal in clone's
// low byte, so clone(2) cannot actually request it (only clone3 and unshare
// can, and both are blocked). Keeping it in the mask only refuses exit
// signals >= 128, which no valid signal number is.
const nsFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUSER | unix.CLONE_NEWPID |
	unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS |
	unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// Terminal ioctls that push bytes into the terminal's input queue or reach
// console internals: a sandboxed program sharing the caller's terminal could
// type commands into the parent shell (CVE-2017-5226 for bubblewrap,
// CVE-2016-7545 SELinux sandbox, CVE-2019-7303 snapd).
const (
	tiocsti   = 0x5412 // TIOCSTI
	tioclinux = 0x541c // TIOCLINUX
	tiocsetd  = 0x5423 // TIOCSETD
)

// personality(2) values a program may set; anything else changes the
// process's address space semantics (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE,
// ADDR_COMPAT_LAYOUT, MMAP_PAGE_ZERO), which weakens the mitigations the
// kernel applies to it (CVE-2009-1895: MMAP_PAGE_ZERO for NULL-dereference
// exploits).
const (
	perLinux     = 0x0        // PER_LINUX
	personaQuery = 0xffffffff // query the current persona without changing it
)

// Default returns the native tier policy for amd64.
//
// It is an allowlist modelled on Docker's default profile: the ordinary
// system calls a program needs (files, memory, signals, time, processes,
// threads, sockets, polling, System V and POSIX IPC), minus what the native
// tier runs without (new namespaces, mounts, ptrace, kernel modules,
// keyrings, BPF, io_uring, perf, clock setting, ...).
//
// Default action: ENOSYS. A system call that is not in the table, most often
// because it is newer than this policy, fails as if the kernel did not have
// it. Every libc and language runtime treats ENOSYS as "old kernel, use the
// fallback" (glibc clone3 -> clone, statx -> fstatat, faccessat2 -> faccessat,
// close_range -> a loop, getrandom -> /dev/urandom) while EPERM is an error
// they report, so ENOSYS keeps unknown programs working without widening the
// policy. Docker's profile returns EPERM by default and special-cases clone3
// with ENOSYS for exactly this reason; runc returns ENOSYS for syscalls newer
// than the profile. Known-dangerous system calls are listed explicitly and
// return EPERM ("the kernel has it and you may not use it"), so the two
// cases stay distinguishable in a trace and in the golden table.
func Default() *Policy {
	p := &Policy{
		Arch:         "amd64",
		Default:      Errno,
		DefaultErrno: unix.ENOSYS,
		// An x32 number cannot match a native rule (numbers compare exactly),
		// but filters that forgot the x32 bit have been bypassed through it
		// and most kernels are built without CONFIG_X86_X32_ABI. Deny
		// explicitly; EPERM also tells a trace that the filter, not the
		// kernel build, refused.
		X32:      Errno,
		X32Errno: unix.EPERM,
	}
	cond := conditionalRules()
	n := len(cond)
	for _, gs := range [][]group{allowGroups, denyGroups} {
		for _, g := range gs {
			n += len(g.names)
		}
	}
	p.Rules = make([]Rule, 0, n)
	for _, g := range allowGroups {
		for _, name := range g.names {
			p.Rules = append(p.Rules, Rule{Name: name, Action: Allow, Reason: g.reason})
		}
	}
	p.Rules = append(p.Rules, cond...)
	for _, g := range denyGroups {
		for _, name := range g.names {
			errno := g.errno
			if errno == 0 {
				errno = unix.EPERM
			}
			p.Rules = append(p.Rules, Rule{Name: name, Action: Errno, Errno: errno, Reason: g.reason})
		}
	}
	return p
}

type group struct {
	reason string
	errno  unix.Errno // deny groups only; zero means EPERM
	names  []string
}

// allowGroups are allowed unconditionally. The kernel still applies its own
// permission checks (capabilities, namespaces, rlimits, Landlock) to them.
var allowGroups = []group{
	{reason: "file and directory I/O on descriptors the program opened; confined by the mount namespace and Landlock", names: []string{
		"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2", "pwritev2",
		"open", "openat", "openat2", "creat", "close", "close_range", "lseek",
		"dup", "dup2", "dup3", "fcntl", "flock",
	}},
	{reason: "file metadata, links and directories; confined by the mount namespace and Landlock", names: []string{
		"stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
		"access", "faccessat", "faccessat2", "getdents", "getdents64", "getcwd", "chdir", "fchdir",
		"mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2",
		"link", "linkat", "symlink", "symlinkat", "readlink", "readlinkat",
		"chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask",
		"truncate", "ftruncate", "fallocate", "utime", "utimes", "futimesat", "utimensat",
		"mknod", "mknodat", // FIFOs and sockets; device nodes need CAP_MKNOD
		"fsync", "fdatasync", "sync", "syncfs", "sync_file_range", "fadvise64", "readahead",
	}},
	{reason: "extended attributes; the kernel checks ownership and CAP_SYS_ADMIN for trusted.*", names: []string{
		"getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr",
		"listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
		"getxattrat", "setxattrat", "listxattrat", "removexattrat",
	}},
	{reason: "zero-copy transfers between descriptors the program holds", names: []string{
		"sendfile", "splice", "tee", "vmsplice", "copy_file_range",
	}},
	{reason: "file change notification on files the program can already see (fanotify_init, which needs CAP_SYS_ADMIN, is denied)", names: []string{
		"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
	}},
	{reason: "descriptors for events, signals, timers and pipes (Go runtime, libuv, epoll loops)", names: []string{
		"pipe", "pipe2", "eventfd", "eventfd2", "signalfd", "signalfd4",
		"timerfd_create", "timerfd_settime", "timerfd_gettime", "memfd_create",
	}},
	{reason: "polling and readiness (Go netpoller uses epoll_pwait)", names: []string{
		"poll", "ppoll", "select", "pselect6",
		"epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
	}},
	{reason: "memory management of the process's own address space", names: []string{
		"brk", "mmap", "munmap", "mremap", "mprotect", "msync", "mincore", "madvise", "remap_file_pages",
		"mlock", "mlock2", "munlock", "mlockall", "munlockall", // bounded by RLIMIT_MEMLOCK
		"pkey_alloc", "pkey_free", "pkey_mprotect", "mseal", "map_shadow_stack",
		"get_mempolicy", "set_mempolicy", "mbind", "set_mempolicy_home_node",
		"membarrier", "cachestat",
	}},
	{reason: "threads and synchronisation (Go runtime, pthreads, glibc robust mutexes and rseq)", names: []string{
		"futex", "futex_waitv", "futex_wake", "futex_wait", "futex_requeue",
		"set_tid_address", "set_robust_list", "get_robust_list", "rseq",
		"arch_prctl", "get_thread_area", "set_thread_area", "gettid",
		"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam", "sched_setparam",
		"sched_getscheduler", "sched_setscheduler", "sched_get_priority_max", "sched_get_priority_min",
		"sched_rr_get_interval", "sched_getattr", "sched_setattr", "getcpu", // real-time classes need CAP_SYS_NICE
	}},
	{reason: "process lifecycle inside the sandbox's PID namespace (fork/exec/wait; os/exec uses clone(CLONE_VFORK|CLONE_VM|CLONE_PIDFD), pidfd_open, waitid(P_PIDFD))", names: []string{
		"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
		"kill", "tkill", "tgkill", "pidfd_open", "pidfd_send_signal",
		"getpid", "getppid", "getpgid", "setpgid", "getpgrp", "getsid", "setsid",
	}},
	{reason: "signals", names: []string{
		"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
		"rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack", "pause", "restart_syscall",
	}},
	{reason: "credentials and limits; changing them is checked by the kernel against the process's capabilities", names: []string{
		"getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups",
		"setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups",
		"capget", "capset", "prctl",
		"getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority", "ioprio_get", "ioprio_set",
	}},
	{reason: "reading clocks, sleeping and interval timers (setting clocks is denied)", names: []string{
		"clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep", "gettimeofday", "time", "times",
		"alarm", "getitimer", "setitimer",
		"timer_create", "timer_settime", "timer_gettime", "timer_getoverrun", "timer_delete",
	}},
	{reason: "system information and randomness", names: []string{
		"uname", "sysinfo", "getrandom",
	}},
	{reason: "sockets: the network namespace has only loopback and egress goes through the proxy; the address family is checked at socket()", names: []string{
		"connect", "accept", "accept4", "bind", "listen", "shutdown",
		"getsockname", "getpeername", "getsockopt", "setsockopt",
		"sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg",
	}},
	{reason: "System V and POSIX IPC, confined to the sandbox's IPC namespace", names: []string{
		"shmget", "shmat", "shmdt", "shmctl", "semget", "semop", "semtimedop", "semctl",
		"msgget", "msgsnd", "msgrcv", "msgctl",
		"mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
	}},
	{reason: "self-restriction: a program may add seccomp filters and Landlock rulesets, which can only reduce what it may do", names: []string{
		"seccomp", "landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
	}},
}

// conditionalRules decide by argument. Order matters: the first rule for a
// system call whose conditions hold wins.
func conditionalRules() []Rule {
	var rules []Rule

	rules = append(rules,
		Rule{Name: "clone", Action: Errno, Errno: unix.EPERM,
			Args:   []ArgCond{{Index: 0, Op: AnySet, Mask: nsFlags, Low32: true}},
			Reason: "no new namespaces: a user namespace grants full capabilities over new mount/net namespaces, the entry point of most container escapes and unprivileged kernel exploits (e.g. CVE-2022-0185, CVE-2024-1086); the kernel reads only the low 32 bits of clone flags"},
		Rule{Name: "clone", Action: Allow,
			Reason: "threads and processes (Go runtime newosproc, os/exec vfork, pthread_create, fork)"},
	)

	// The kernel's socket family argument is an int, but the allow rules
	// compare all 64 bits so anything unusual fails closed.
	for _, fam := range []struct {
		name string
		af   uint64
	}{{"AF_UNIX", unix.AF_UNIX}, {"AF_INET", unix.AF_INET}, {"AF_INET6", unix.AF_INET6}} {
		rules = append(rules, Rule{Name: "socket", Action: Allow,
			Args:   []ArgCond{{Index: 0, Op: Equal, Value: fam.af}},
			Reason: fam.name + " sockets: local IPC and loopback/proxied networking"})
	}
	rules = append(rules,
		Rule{Name: "socket", Action: Errno, Errno: unix.EAFNOSUPPORT,
			Reason: "every other address family: AF_NETLINK (rtnetlink/nf_tables, the surface of CVE-2022-2588, CVE-2023-32233, CVE-2024-1086; getifaddrs then fails and glibc's getaddrinfo falls back), AF_PACKET (CVE-2016-8655, CVE-2017-7308), AF_VSOCK (CVE-2021-26708, and a path to the host), AF_ALG (CVE-2015-8970), AF_KEY, AF_BLUETOOTH, AF_RDS (CVE-2010-3904) and the long tail of rarely audited protocols; EAFNOSUPPORT is what a kernel without the family says"},
		Rule{Name: "socketpair", Action: Allow,
			Args:   []ArgCond{{Index: 0, Op: Equal, Value: unix.AF_UNIX}},
			Reason: "AF_UNIX socket pairs (the only family that supports socketpair)"},
		Rule{Name: "socketpair", Action: Errno, Errno: unix.EAFNOSUPPORT,
			Reason: "other families, as for socket"},
	)

	// ioctl's request argument is an unsigned int in the kernel, so the deny
	// rules compare only the low 32 bits (CVE-2019-7303: snapd's TIOCSTI rule
	// was bypassed by setting bit 32).
	rules = append(rules,
		Rule{Name: "ioctl", Action: Errno, Errno: unix.EPERM,
			Args:   []ArgCond{{Index: 1, Op: Equal, Value: tiocsti, Low32: true}},
			Reason: "TIOCSTI injects input into a terminal shared with the caller (CVE-2017-5226, CVE-2016-7545, CVE-2019-7303)"},
		Rule{Name: "ioctl", Action: Errno, Errno: unix.EPERM,
			Args:   []ArgCond{{Index: 1, Op: Equal, Value: tioclinux, Low32: true}},
			Reason: "TIOCLINUX can paste the console selection into the input queue like TIOCSTI (restricted to CAP_SYS_ADMIN only since Linux 6.2) and reaches console internals"},
		Rule{Name: "ioctl", Action: Errno, Errno: unix.EPERM,
			Args:   []ArgCond{{Index: 1, Op: Equal, Value: tiocsetd, Low32: true}},
			Reason: "TIOCSETD switches a terminal of the sandbox's devpts to another line discipline (n_hdlc, n_gsm, slcan...), rarely used code with a history of races and use-after-frees (CVE-2017-2636, CVE-2023-6546); programs keep the default N_TTY"},
		Rule{Name: "ioctl", Action: Allow,
			Reason: "device and descriptor control (FIONREAD, TCGETS, FIOCLEX, ...); device nodes are limited by the mount namespace"},
	)

	rules = append(rules,
		Rule{Name: "personality", Action: Allow,
			Args:   []ArgCond{{Index: 0, Op: Equal, Value: perLinux}},
			Reason: "PER_LINUX, the normal persona"},
		Rule{Name: "personality", Action: Allow,
			Args:   []ArgCond{{Index: 0, Op: Equal, Value: personaQuery}},
			Reason: "0xffffffff queries the persona without changing it"},
		Rule{Name: "personality", Action: Errno, Errno: unix.EPERM,
			Reason: "other personas weaken memory protections (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, MMAP_PAGE_ZERO: CVE-2009-1895)"},
	)
	return rules
}

// denyGroups are refused with EPERM unless a group says otherwise.
var denyGroups = []group{
	{reason: "ptrace and cross-process memory access: read or rewrite another process (even with a PID namespace, the init and its children share it)", names: []string{
		"ptrace", "process_vm_readv", "process_vm_writev",
	}},
	{reason: "pidfd_getfd steals a descriptor from another process (ptrace-level access); process_madvise acts on another process's memory", names: []string{
		"pidfd_getfd", "process_madvise",
	}},
	{reason: "kcmp compares kernel objects of two processes, a ptrace-level probe used only by checkpoint/restore (it leaks kernel pointer ordering)", names: []string{
		"kcmp",
	}},
	{reason: "move_pages and migrate_pages move another process's memory between NUMA nodes (CAP_SYS_NICE; info leak CVE-2017-14140)", names: []string{
		"move_pages", "migrate_pages",
	}},
	{reason: "mounting and changing the root: rearranging the mount namespace undoes the sandbox's filesystem view", names: []string{
		"mount", "umount2", "pivot_root", "chroot",
	}},
	{reason: "the new mount API (fsopen/fsconfig: CVE-2022-0185 heap overflow reachable from a user namespace)", names: []string{
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "open_tree_attr", "mount_setattr",
	}},
	{reason: "namespaces: unshare and setns would leave or create namespaces (clone is checked by flag)", names: []string{
		"unshare", "setns",
	}},
	{reason: "clone3 passes its flags in memory, which seccomp cannot inspect; ENOSYS makes glibc and Go fall back to clone, whose flags the filter checks", errno: unix.ENOSYS, names: []string{
		"clone3",
	}},
	{reason: "eBPF: a large kernel attack surface (verifier bugs CVE-2021-3490, CVE-2021-31440, CVE-2022-23222) with no use in the sandbox", names: []string{
		"bpf",
	}},
	{reason: "kernel keyrings are not namespaced: keys are shared with the host user (CVE-2016-0728 refcount overflow)", names: []string{
		"keyctl", "add_key", "request_key",
	}},
	{reason: "userfaultfd lets an exploit pause the kernel mid-copy_from_user to widen race windows (why vm.unprivileged_userfaultfd defaults to 0)", names: []string{
		"userfaultfd",
	}},
	{reason: "the kernel's AIO contexts come from one host-wide pool (fs.aio-max-nr, not per user, namespace or cgroup): eight io_setup calls from one sandbox took all 65536 and every host process got EAGAIN, and its fill level is a channel between runs; ENOSYS, so libaio users (databases) take their thread-based fallback as on a kernel without AIO", errno: unix.ENOSYS, names: []string{
		"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
	}},
	{reason: "io_uring bypasses per-syscall seccomp checks for the operations it queues and has had a stream of privilege escalations (CVE-2021-41073, CVE-2022-29582, CVE-2023-2598)", names: []string{
		"io_uring_setup", "io_uring_enter", "io_uring_register",
	}},
	{reason: "perf events expose kernel addresses and hardware counters (side channels) and have had escalations (CVE-2013-2094, CVE-2023-6931)", names: []string{
		"perf_event_open",
	}},
	{reason: "loading kernels and kernel modules changes the host kernel", names: []string{
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
	}},
	{reason: "host-wide administration: process accounting, swap, reboot, kernel log, quotas", names: []string{
		"acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "quotactl_fd",
	}},
	{reason: "setting the clock is not namespaced: it changes time for the host", names: []string{
		"settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
	}},
	{reason: "sethostname/setdomainname: the sandbox's hostname is set by the init, not by the program", names: []string{
		"sethostname", "setdomainname",
	}},
	{reason: "lookup_dcookie reveals host paths (profiling interface)", names: []string{
		"lookup_dcookie",
	}},
	{reason: "file handles open files by inode number, bypassing the mount namespace and path checks (the 2014 \"shocker\" Docker escape)", names: []string{
		"name_to_handle_at", "open_by_handle_at",
	}},
	{reason: "iopl/ioperm grant raw I/O port access; modify_ldt installs 16-bit segments (CVE-2015-5157, CVE-2017-17053)", names: []string{
		"iopl", "ioperm", "modify_ldt",
	}},
	{reason: "vhangup hangs up the controlling terminal, which may be shared with the caller", names: []string{
		"vhangup",
	}},
	{reason: "obsolete interfaces with a history of bugs: uselib (CVE-2004-1235), nfsservctl", names: []string{
		"uselib", "nfsservctl",
	}},
	{reason: "fanotify_init needs CAP_SYS_ADMIN and can watch the whole filesystem", names: []string{
		"fanotify_init",
	}},
}
