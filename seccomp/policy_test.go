package seccomp

import (
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const (
	threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND |
		unix.CLONE_SYSVSEM | unix.CLONE_THREAD | unix.CLONE_SETTLS |
		unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	vforkFlags = unix.CLONE_VFORK | unix.CLONE_VM | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)

	readImpliesExec = 0x0400000 // READ_IMPLIES_EXEC
	addrNoRandomize = 0x0040000 // ADDR_NO_RANDOMIZE
	fionread        = 0x541b    // FIONREAD
	high            = 1 << 32
)

func mustCompile(t testing.TB, p *Policy) []unix.SockFilter {
	t.Helper()
	f, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func nr(t testing.TB, name string) int {
	t.Helper()
	n, ok := syscallNumber(name)
	if !ok {
		t.Fatalf("unknown syscall %q", name)
	}
	return n
}

func TestEvaluateDefault(t *testing.T) {
	filter := mustCompile(t, Default())
	native := uint32(unix.AUDIT_ARCH_X86_64)
	tests := []struct {
		name    string
		arch    uint32
		syscall string
		nrBits  int // ORed into the number (x32 bit)
		args    [6]uint64
		want    Action
		errno   unix.Errno
	}{
		{name: "read allowed", syscall: "read", want: Allow},
		{name: "futex allowed", syscall: "futex", want: Allow},
		{name: "execve allowed", syscall: "execve", want: Allow},
		{name: "seccomp allowed (adds restrictions only)", syscall: "seccomp", want: Allow},
		{name: "landlock allowed", syscall: "landlock_restrict_self", want: Allow},
		{name: "ptrace EPERM", syscall: "ptrace", want: Errno, errno: unix.EPERM},
		{name: "process_vm_writev EPERM", syscall: "process_vm_writev", want: Errno, errno: unix.EPERM},
		{name: "mount EPERM", syscall: "mount", want: Errno, errno: unix.EPERM},
		{name: "fsopen EPERM", syscall: "fsopen", want: Errno, errno: unix.EPERM},
		{name: "unshare EPERM", syscall: "unshare", want: Errno, errno: unix.EPERM},
		{name: "bpf EPERM", syscall: "bpf", want: Errno, errno: unix.EPERM},
		{name: "io_uring_setup EPERM", syscall: "io_uring_setup", want: Errno, errno: unix.EPERM},
		{name: "open_by_handle_at EPERM", syscall: "open_by_handle_at", want: Errno, errno: unix.EPERM},
		{name: "clone3 ENOSYS so libc falls back to clone", syscall: "clone3", want: Errno, errno: unix.ENOSYS},
		{name: "unlisted syscall gets default ENOSYS", syscall: "listmount", want: Errno, errno: unix.ENOSYS},

		{name: "clone thread flags allowed", syscall: "clone", args: [6]uint64{threadFlags}, want: Allow},
		{name: "clone os/exec vfork flags allowed", syscall: "clone", args: [6]uint64{vforkFlags}, want: Allow},
		{name: "clone fork (SIGCHLD only) allowed", syscall: "clone", args: [6]uint64{uint64(unix.SIGCHLD)}, want: Allow},
		{name: "clone CLONE_NEWUSER EPERM", syscall: "clone", args: [6]uint64{unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, want: Errno, errno: unix.EPERM},
		{name: "clone CLONE_NEWNET with thread flags EPERM", syscall: "clone", args: [6]uint64{threadFlags | unix.CLONE_NEWNET}, want: Errno, errno: unix.EPERM},
		{name: "clone CLONE_NEWCGROUP EPERM", syscall: "clone", args: [6]uint64{unix.CLONE_NEWCGROUP}, want: Errno, errno: unix.EPERM},
		{name: "clone CLONE_NEWNS with high bits set still EPERM", syscall: "clone", args: [6]uint64{high | unix.CLONE_NEWNS}, want: Errno, errno: unix.EPERM},
		{name: "clone high bits only allowed (kernel reads low 32)", syscall: "clone", args: [6]uint64{0xffffffff00000000 | uint64(unix.SIGCHLD)}, want: Allow},

		{name: "socket AF_INET allowed", syscall: "socket", args: [6]uint64{unix.AF_INET, unix.SOCK_STREAM}, want: Allow},
		{name: "socket AF_INET6 allowed", syscall: "socket", args: [6]uint64{unix.AF_INET6, unix.SOCK_DGRAM}, want: Allow},
		{name: "socket AF_UNIX allowed", syscall: "socket", args: [6]uint64{unix.AF_UNIX, unix.SOCK_STREAM}, want: Allow},
		{name: "socket AF_NETLINK denied", syscall: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, want: Errno, errno: unix.EAFNOSUPPORT},
		{name: "socket AF_VSOCK denied", syscall: "socket", args: [6]uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, want: Errno, errno: unix.EAFNOSUPPORT},
		{name: "socket AF_PACKET denied", syscall: "socket", args: [6]uint64{unix.AF_PACKET, unix.SOCK_RAW}, want: Errno, errno: unix.EAFNOSUPPORT},
		{name: "socket AF_ALG denied", syscall: "socket", args: [6]uint64{unix.AF_ALG, unix.SOCK_SEQPACKET}, want: Errno, errno: unix.EAFNOSUPPORT},
		{name: "socket AF_INET with high bits set not mistaken for allowed", syscall: "socket", args: [6]uint64{high | unix.AF_INET}, want: Errno, errno: unix.EAFNOSUPPORT},
		{name: "socketpair AF_UNIX allowed", syscall: "socketpair", args: [6]uint64{unix.AF_UNIX, unix.SOCK_STREAM}, want: Allow},
		{name: "socketpair AF_NETLINK denied", syscall: "socketpair", args: [6]uint64{unix.AF_NETLINK}, want: Errno, errno: unix.EAFNOSUPPORT},

		{name: "ioctl TIOCSTI denied", syscall: "ioctl", args: [6]uint64{0, tiocsti}, want: Errno, errno: unix.EPERM},
		{name: "ioctl TIOCSTI with high bits set still denied (CVE-2019-7303)", syscall: "ioctl", args: [6]uint64{0, high | tiocsti}, want: Errno, errno: unix.EPERM},
		{name: "ioctl TIOCLINUX denied", syscall: "ioctl", args: [6]uint64{0, tioclinux}, want: Errno, errno: unix.EPERM},
		{name: "ioctl TIOCSETD denied", syscall: "ioctl", args: [6]uint64{0, tiocsetd}, want: Errno, errno: unix.EPERM},
		{name: "ioctl TIOCSETD with high bits set still denied", syscall: "ioctl", args: [6]uint64{0, high | tiocsetd}, want: Errno, errno: unix.EPERM},
		{name: "ioctl FIONREAD allowed", syscall: "ioctl", args: [6]uint64{0, fionread}, want: Allow},
		{name: "ioctl TIOCSTI value in the fd argument allowed", syscall: "ioctl", args: [6]uint64{tiocsti, fionread}, want: Allow},

		{name: "personality PER_LINUX allowed", syscall: "personality", args: [6]uint64{0}, want: Allow},
		{name: "personality query allowed", syscall: "personality", args: [6]uint64{0xffffffff}, want: Allow},
		{name: "personality READ_IMPLIES_EXEC denied", syscall: "personality", args: [6]uint64{readImpliesExec}, want: Errno, errno: unix.EPERM},
		{name: "personality ADDR_NO_RANDOMIZE denied", syscall: "personality", args: [6]uint64{addrNoRandomize}, want: Errno, errno: unix.EPERM},
		{name: "personality with high bits set not mistaken for PER_LINUX", syscall: "personality", args: [6]uint64{high}, want: Errno, errno: unix.EPERM},

		{name: "x32 read denied", syscall: "read", nrBits: x32Bit, want: Errno, errno: unix.EPERM},
		{name: "x32 ptrace denied", syscall: "ptrace", nrBits: x32Bit, want: Errno, errno: unix.EPERM},
		{name: "i386 entry killed", arch: unix.AUDIT_ARCH_I386, syscall: "read", want: KillProcess},
		{name: "aarch64 entry killed", arch: unix.AUDIT_ARCH_AARCH64, syscall: "read", want: KillProcess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			arch := tc.arch
			if arch == 0 {
				arch = native
			}
			got, errno, err := Evaluate(filter, arch, nr(t, tc.syscall)|tc.nrBits, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || errno != tc.errno {
				t.Errorf("%s(%#x) = %v %v, want %v %v", tc.syscall, tc.args, got, errnoName(errno), tc.want, errnoName(tc.errno))
			}
		})
	}

	t.Run("numbers beyond the table get default ENOSYS", func(t *testing.T) {
		for _, n := range []int{maxSyscall + 1, 1000, 0x3fffffff} {
			got, errno, err := Evaluate(filter, native, n, [6]uint64{})
			if err != nil || got != Errno || errno != unix.ENOSYS {
				t.Errorf("nr %d = %v %v %v, want errno ENOSYS", n, got, errno, err)
			}
		}
	})
}

// TestRuleNamesAreSyscalls guards against typos: a rule for "mmap2" or
// "umount" (not amd64 names) would otherwise silently protect nothing.
func TestRuleNamesAreSyscalls(t *testing.T) {
	for _, r := range Default().Rules {
		if _, ok := syscallNumber(r.Name); !ok {
			t.Errorf("rule %q (%s) names no amd64 system call", r.Name, r.Reason)
		}
		if strings.TrimSpace(r.Reason) == "" {
			t.Errorf("rule %q has no Reason", r.Name)
		}
	}
}

// TestRequiredDenials pins the denials the native tier promises, so that
// editing the allow groups can never quietly allow one of them.
func TestRequiredDenials(t *testing.T) {
	filter := mustCompile(t, Default())
	eperm := []string{
		"ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
		"fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr",
		"bpf", "keyctl", "add_key", "request_key", "userfaultfd",
		"io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open",
		"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"unshare", "setns", "acct", "swapon", "swapoff", "reboot",
		"settimeofday", "clock_settime", "adjtimex", "syslog", "quotactl", "lookup_dcookie",
		"name_to_handle_at", "open_by_handle_at", "iopl", "ioperm", "vhangup", "nfsservctl", "uselib",
		"kcmp", "pidfd_getfd",
	}
	for _, name := range eperm {
		got, errno, err := Evaluate(filter, unix.AUDIT_ARCH_X86_64, nr(t, name), [6]uint64{})
		if err != nil || got != Errno || errno != unix.EPERM {
			t.Errorf("%s = %v %v %v, want errno EPERM", name, got, errnoName(errno), err)
		}
	}
}

// interestingArgs are argument values at and next to every constant the
// policy compares against, in either word, with the other word zero, equal
// or all ones.
func interestingArgs(p *Policy) []uint64 {
	seen := map[uint64]bool{}
	var out []uint64
	add := func(v uint64) {
		for _, w := range []uint64{v, v ^ 1, v + 1, v - 1, v << 32, v | high, v | 0xffffffff00000000, uint64(uint32(v))} {
			if !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
	}
	add(0)
	add(0xffffffff)
	for _, r := range p.Rules {
		for _, c := range r.Args {
			add(c.Value)
			add(c.Mask)
			add(c.Value | ^c.Mask)
			add(c.Mask & -c.Mask) // lowest mask bit alone
		}
	}
	return out
}

// TestCompiledMatchesPolicy checks the BPF program against the policy's
// reference semantics (Policy.decide) for every syscall number and entry
// point, and for syscalls with argument rules, a grid of argument values.
func TestCompiledMatchesPolicy(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    *Policy
	}{
		{"default", Default()},
		{"synthetic", syntheticPolicy(t)},
		{"alternating", alternatingPolicy()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := newVM(mustCompile(t, tc.p))
			if err != nil {
				t.Fatal(err)
			}
			check := func(arch uint32, n int, args [6]uint64) {
				t.Helper()
				got, gotErrno, err := ev.eval(arch, n, args)
				if err != nil {
					t.Fatal(err)
				}
				want, wantErrno := tc.p.decide(arch, n, args)
				if got != want || gotErrno != wantErrno {
					t.Fatalf("nr %d %s args %#x: filter says %v %v, policy says %v %v",
						n, SyscallName(n), args, got, gotErrno, want, wantErrno)
				}
			}
			for n := -1; n <= maxSyscall+2; n++ {
				check(unix.AUDIT_ARCH_X86_64, n, [6]uint64{})
				check(unix.AUDIT_ARCH_X86_64, n|x32Bit, [6]uint64{})
				check(unix.AUDIT_ARCH_I386, n, [6]uint64{})
			}
			vals := interestingArgs(tc.p)
			var conditional []int
			for _, e := range Table(tc.p) {
				if !e.Conditional() {
					continue
				}
				conditional = append(conditional, e.Nr)
				for i := range 6 {
					for _, v := range vals {
						var args [6]uint64
						args[i] = v
						check(unix.AUDIT_ARCH_X86_64, e.Nr, args)
					}
				}
			}
			// Rules with several conditions need combinations.
			rng := rand.New(rand.NewPCG(1, 2))
			for range 50000 {
				var args [6]uint64
				for i := range args {
					args[i] = vals[rng.IntN(len(vals))]
				}
				check(unix.AUDIT_ARCH_X86_64, conditional[rng.IntN(len(conditional))], args)
			}
		})
	}
}

// FuzzCompiledMatchesPolicy looks for inputs on which the compiled default
// policy and its reference semantics disagree.
func FuzzCompiledMatchesPolicy(f *testing.F) {
	p := Default()
	ev, err := newVM(mustCompile(f, p))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(56), uint64(unix.CLONE_NEWUSER), uint64(0), uint64(0))
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(16), uint64(0), uint64(high|tiocsti), uint64(0))
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(41), uint64(high|unix.AF_INET), uint64(1), uint64(0))
	f.Add(uint32(unix.AUDIT_ARCH_X86_64), uint32(135), uint64(0xffffffff), uint64(0), uint64(0))
	f.Add(uint32(unix.AUDIT_ARCH_I386), uint32(20), uint64(0), uint64(0), uint64(0))
	f.Fuzz(func(t *testing.T, arch, n uint32, a0, a1, a2 uint64) {
		args := [6]uint64{a0, a1, a2}
		got, gotErrno, err := ev.eval(arch, int(int32(n)), args)
		if err != nil {
			t.Fatal(err)
		}
		want, wantErrno := p.decide(arch, int(int32(n)), args)
		if got != want || gotErrno != wantErrno {
			t.Fatalf("arch %#x nr %d args %#x: filter %v %v, policy %v %v", arch, n, args, got, gotErrno, want, wantErrno)
		}
	})
}

// syntheticPolicy exercises every comparison, in both widths, with masks
// and values in either word.
func syntheticPolicy(t *testing.T) *Policy {
	t.Helper()
	p := &Policy{Arch: "amd64", Default: Errno, DefaultErrno: unix.ENOSYS, X32: KillThread}
	add := func(name string, a Action, e unix.Errno, conds ...ArgCond) {
		p.Rules = append(p.Rules, Rule{Name: name, Action: a, Errno: e, Args: conds, Reason: "test"})
	}
	add("read", Allow, 0, ArgCond{Index: 0, Op: Equal, Value: 0x1_0000_0002})
	add("read", Errno, unix.EIO, ArgCond{Index: 0, Op: Equal, Value: 2, Low32: true})
	add("write", Errno, unix.EBADF, ArgCond{Index: 5, Op: NotEqual, Value: 0xffffffff_00000001})
	add("write", Log, 0)
	add("openat", Trap, 0, ArgCond{Index: 2, Op: MaskedEqual, Mask: 0xf0000000_0000000f, Value: 0x10000000_00000001})
	add("openat", Allow, 0, ArgCond{Index: 2, Op: MaskedEqual, Mask: 0xff, Value: 0x40, Low32: true})
	add("close", KillProcess, 0, ArgCond{Index: 1, Op: AnySet, Mask: 0x1_0000_0000})
	add("close", Errno, unix.EACCES, ArgCond{Index: 1, Op: AnySet, Mask: 0x2_0000_0010})
	add("close", Allow, 0, ArgCond{Index: 1, Op: AnySet, Mask: 0x2_0000_0010, Low32: false}, ArgCond{Index: 3, Op: NotEqual, Value: 7, Low32: true})
	add("mmap", Allow, 0,
		ArgCond{Index: 0, Op: Equal, Value: 0}, ArgCond{Index: 1, Op: NotEqual, Value: 0},
		ArgCond{Index: 2, Op: MaskedEqual, Mask: 0x7, Value: 0x3}, ArgCond{Index: 3, Op: AnySet, Mask: 0x20, Low32: true})
	add("getpid", Allow, 0)
	add("rseq_slice_yield", Allow, 0) // the highest number: boundary of the last interval
	return p
}

// alternatingPolicy makes every syscall number its own interval, so search
// subtrees exceed the 255-instruction reach of a conditional jump and the
// compiler must route through JA.
func alternatingPolicy() *Policy {
	p := &Policy{Arch: "amd64", Default: Errno, DefaultErrno: unix.ENOSYS}
	for i, s := range amd64Syscalls {
		r := Rule{Name: s.name, Action: Allow, Reason: "test"}
		if i%2 == 1 {
			r = Rule{Name: s.name, Action: Errno, Errno: unix.Errno(1 + i%100), Reason: "test"}
		}
		if i%7 == 0 {
			r.Args = []ArgCond{{Index: i % 6, Op: Equal, Value: uint64(i)}}
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}

func TestLongJumps(t *testing.T) {
	filter := mustCompile(t, alternatingPolicy())
	var ja int
	for _, in := range filter {
		if in.Code == opJa {
			ja++
		}
	}
	if ja == 0 {
		t.Fatalf("%d-instruction program has no JA: the long-jump path is untested", len(filter))
	}
	t.Logf("%d instructions, %d long jumps", len(filter), ja)
}

func TestCompileRejects(t *testing.T) {
	base := func() *Policy { return &Policy{Arch: "amd64", Default: Errno, DefaultErrno: unix.ENOSYS} }
	rule := func(r Rule) *Policy { p := base(); p.Rules = []Rule{r}; return p }
	tests := []struct {
		name string
		p    *Policy
		want string
	}{
		{"unknown arch", &Policy{Arch: "arm64", Default: Allow}, "only \"amd64\""},
		{"unset default", &Policy{Arch: "amd64"}, "invalid action 0"},
		{"default errno missing", &Policy{Arch: "amd64", Default: Errno}, "errno 0 out of range"},
		{"x32 errno too large", &Policy{Arch: "amd64", Default: Allow, X32: Errno, X32Errno: 5000}, "errno 5000"},
		{"typo in name", rule(Rule{Name: "mmap2", Action: Allow, Reason: "r"}), "unknown amd64 system call \"mmap2\""},
		{"unset action", rule(Rule{Name: "read", Reason: "r"}), "invalid action"},
		{"no reason", rule(Rule{Name: "read", Action: Allow}), "missing Reason"},
		{"errno on allow", rule(Rule{Name: "read", Action: Allow, Errno: unix.EPERM, Reason: "r"}), "Errno 1 set"},
		{"arg index", rule(Rule{Name: "read", Action: Allow, Reason: "r", Args: []ArgCond{{Index: 6, Op: Equal}}}), "index 6"},
		{"unset op", rule(Rule{Name: "read", Action: Allow, Reason: "r", Args: []ArgCond{{Index: 0}}}), "invalid op"},
		{"low32 with high value", rule(Rule{Name: "read", Action: Allow, Reason: "r", Args: []ArgCond{{Op: Equal, Value: high, Low32: true}}}), "bits above 32"},
		{"value outside mask", rule(Rule{Name: "read", Action: Allow, Reason: "r", Args: []ArgCond{{Op: MaskedEqual, Mask: 1, Value: 2}}}), "never hold"},
		{"zero mask", rule(Rule{Name: "read", Action: Allow, Reason: "r", Args: []ArgCond{{Op: AnySet}}}), "never hold"},
		{"unreachable rule", func() *Policy {
			p := base()
			p.Rules = []Rule{{Name: "read", Action: Allow, Reason: "r"}, {Name: "read", Action: Errno, Errno: unix.EPERM, Reason: "r"}}
			return p
		}(), "unreachable"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.p.Compile()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Compile() error = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestCheckFilterRejects(t *testing.T) {
	tests := []struct {
		name string
		prog []unix.SockFilter
	}{
		{"empty", nil},
		{"too long", make([]unix.SockFilter, maxInsns+1)},
		{"no return at end", []unix.SockFilter{stmt(opRetK, retAllow), stmt(opLdAbsW, 0)}},
		{"unaligned load", []unix.SockFilter{stmt(opLdAbsW, 2), stmt(opRetK, retAllow)}},
		{"load past seccomp_data", []unix.SockFilter{stmt(opLdAbsW, 64), stmt(opRetK, retAllow)}},
		{"jump past end", []unix.SockFilter{jump(opJeqK, 0, 1, 0), stmt(opRetK, retAllow)}},
		{"ja past end", []unix.SockFilter{stmt(opJa, 1), stmt(opRetK, retAllow)}},
		{"packet-only opcode", []unix.SockFilter{stmt(unix.BPF_LD|unix.BPF_B|unix.BPF_IND, 0), stmt(opRetK, retAllow)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkFilter(tc.prog); err == nil {
				t.Fatal("checkFilter accepted a program the kernel would refuse")
			}
		})
	}
}

func TestProgramFitsKernelLimits(t *testing.T) {
	filter := mustCompile(t, Default())
	if len(filter) > maxInsns {
		t.Fatalf("%d instructions, kernel limit %d", len(filter), maxInsns)
	}
	t.Logf("default policy: %d instructions; %v", len(filter), Summarize(Table(Default())))
}

func BenchmarkEvaluate(b *testing.B) {
	filter := mustCompile(b, Default())
	ev, err := newVM(filter)
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name string
		nr   int
		args [6]uint64
	}{
		{"read", nr(b, "read"), [6]uint64{}},
		{"futex", nr(b, "futex"), [6]uint64{}},
		{"socket-inet6", nr(b, "socket"), [6]uint64{unix.AF_INET6}},
		{"ioctl-fionread", nr(b, "ioctl"), [6]uint64{0, fionread}},
		{"unknown", 1000, [6]uint64{}},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := ev.eval(unix.AUDIT_ARCH_X86_64, tc.nr, tc.args); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(filter)), "insns")
		})
	}
	// The public entry point re-checks and disassembles the filter each call.
	b.Run("Evaluate-with-setup", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := Evaluate(filter, unix.AUDIT_ARCH_X86_64, 0, [6]uint64{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// run is a second, minimal interpreter for the opcodes the compiler emits,
// reading seccomp_data in native order as the kernel does. It counts the
// instructions executed, which is what the search tree is for.
func run(t testing.TB, prog []unix.SockFilter, arch uint32, n int, args [6]uint64) (ret uint32, steps int) {
	t.Helper()
	word := func(off uint32) uint32 {
		switch {
		case off == offNr:
			return uint32(n)
		case off == offArch:
			return arch
		case off >= offArgs:
			a := args[(off-offArgs)/8]
			if (off-offArgs)%8 == 4 {
				return uint32(a >> 32)
			}
			return uint32(a)
		}
		return 0 // instruction_pointer
	}
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		steps++
		in := prog[pc]
		switch in.Code {
		case opLdAbsW:
			acc = word(in.K)
		case opAndK:
			acc &= in.K
		case opRetK:
			return in.K, steps
		case opJa:
			pc += int(in.K)
		case opJeqK, opJgeK, opJsetK:
			cond := (in.Code == opJeqK && acc == in.K) || (in.Code == opJgeK && acc >= in.K) || (in.Code == opJsetK && acc&in.K != 0)
			if cond {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		default:
			t.Fatalf("pc %d: opcode %#x", pc, in.Code)
		}
	}
	t.Fatal("fell off the end")
	return 0, 0
}

// TestPathLength measures instructions executed per syscall: a linear chain
// of comparisons would average about half the number of rules (~180).
func TestPathLength(t *testing.T) {
	p := Default()
	filter := mustCompile(t, p)
	ev, err := newVM(filter)
	if err != nil {
		t.Fatal(err)
	}
	total, worst := 0, 0
	for n := 0; n <= maxSyscall; n++ {
		var args [6]uint64
		ret, steps := run(t, filter, unix.AUDIT_ARCH_X86_64, n, args)
		a, e, err := ev.eval(unix.AUDIT_ARCH_X86_64, n, args)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := a.ret(e); want != ret {
			t.Fatalf("nr %d: interpreters disagree: %#x vs x/net/bpf %#x", n, ret, want)
		}
		total += steps
		worst = max(worst, steps)
	}
	avg := float64(total) / float64(maxSyscall+1)
	t.Logf("%d instructions; executed per syscall: average %.1f, worst %d", len(filter), avg, worst)
	if worst > 40 {
		t.Errorf("worst path %d instructions: the search tree is not balanced", worst)
	}
}
