package seccomp

import (
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Action is what the kernel does with a system call the filter has matched.
// The zero value is not an action: a Rule or Policy that leaves it unset is
// rejected by Compile instead of defaulting to anything.
type Action int

const (
	// Allow runs the system call.
	Allow Action = iota + 1
	// Errno fails the system call with the rule's errno, without running it.
	Errno
	// KillProcess kills the whole thread group with SIGSYS (core dump).
	KillProcess
	// KillThread kills only the calling thread with SIGSYS.
	KillThread
	// Trap sends SIGSYS to the calling thread, which may handle it.
	Trap
	// Log runs the system call and records it in the audit log.
	Log
)

// Kernel return values (SECCOMP_RET_*), highest precedence first.
const (
	retKillProcess = unix.SECCOMP_RET_KILL_PROCESS
	retKillThread  = unix.SECCOMP_RET_KILL_THREAD
	retTrap        = unix.SECCOMP_RET_TRAP
	retErrno       = unix.SECCOMP_RET_ERRNO
	retLog         = unix.SECCOMP_RET_LOG
	retAllow       = unix.SECCOMP_RET_ALLOW

	retActionMask = 0xffff0000 // SECCOMP_RET_ACTION_FULL
	retDataMask   = 0x0000ffff // SECCOMP_RET_DATA

	// maxErrno is the kernel's MAX_ERRNO: larger values are clamped to it.
	maxErrno = 4095
)

func (a Action) String() string {
	switch a {
	case Allow:
		return "allow"
	case Errno:
		return "errno"
	case KillProcess:
		return "kill-process"
	case KillThread:
		return "kill-thread"
	case Trap:
		return "trap"
	case Log:
		return "log"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ret is the filter's return value for an action.
func (a Action) ret(errno unix.Errno) (uint32, error) {
	switch a {
	case Allow:
		return retAllow, nil
	case Errno:
		if errno <= 0 || errno > maxErrno {
			return 0, fmt.Errorf("errno %d out of range 1..%d", int(errno), maxErrno)
		}
		return retErrno | uint32(errno), nil
	case KillProcess:
		return retKillProcess, nil
	case KillThread:
		return retKillThread, nil
	case Trap:
		return retTrap, nil
	case Log:
		return retLog, nil
	}
	return 0, fmt.Errorf("invalid action %d (set Action to Allow, Errno, KillProcess, KillThread, Trap or Log)", int(a))
}

// actionOf decodes a filter return value.
func actionOf(ret uint32) (Action, unix.Errno, error) {
	switch ret & retActionMask {
	case retAllow:
		return Allow, 0, nil
	case retErrno:
		return Errno, unix.Errno(ret & retDataMask), nil
	case retKillProcess:
		return KillProcess, 0, nil
	case retKillThread:
		return KillThread, 0, nil
	case retTrap:
		return Trap, 0, nil
	case retLog:
		return Log, 0, nil
	}
	return 0, 0, fmt.Errorf("unknown seccomp return value %#x", ret)
}

// Op is a comparison of one system call argument.
type Op int

const (
	// Equal holds when arg == Value.
	Equal Op = iota + 1
	// NotEqual holds when arg != Value.
	NotEqual
	// MaskedEqual holds when arg&Mask == Value.
	MaskedEqual
	// AnySet holds when arg&Mask != 0.
	AnySet
)

// ArgCond is a condition on one argument of a system call. The kernel passes
// every argument to the filter as 64 bits; Low32 chooses how many the
// comparison looks at.
type ArgCond struct {
	// Index is the argument position, 0..5.
	Index int
	Op    Op
	Value uint64
	// Mask is used by MaskedEqual and AnySet.
	Mask uint64
	// Low32 compares only the low 32 bits. Set it for arguments the kernel
	// declares as int or unsigned int: the kernel truncates those, so a deny
	// rule that also compared the high half could be bypassed by setting it
	// (ioctl(fd, TIOCSTI|1<<32) in CVE-2019-7303). Leave it unset on allow
	// rules that must fail closed: all 64 bits must then match.
	Low32 bool
}

func (c ArgCond) String() string {
	arg := fmt.Sprintf("arg%d", c.Index)
	if c.Low32 {
		arg = fmt.Sprintf("uint32(arg%d)", c.Index)
	}
	switch c.Op {
	case Equal:
		return fmt.Sprintf("%s == %#x", arg, c.Value)
	case NotEqual:
		return fmt.Sprintf("%s != %#x", arg, c.Value)
	case MaskedEqual:
		return fmt.Sprintf("%s&%#x == %#x", arg, c.Mask, c.Value)
	case AnySet:
		return fmt.Sprintf("%s&%#x != 0", arg, c.Mask)
	}
	return fmt.Sprintf("%s Op(%d)", arg, int(c.Op))
}

// holds is the reference semantics of the condition, which the compiled
// filter must reproduce exactly.
func (c ArgCond) holds(args [6]uint64) bool {
	v, val, mask := args[c.Index], c.Value, c.Mask
	if c.Low32 {
		v, val, mask = uint64(uint32(v)), uint64(uint32(val)), uint64(uint32(mask))
	}
	switch c.Op {
	case Equal:
		return v == val
	case NotEqual:
		return v != val
	case MaskedEqual:
		return v&mask == val
	case AnySet:
		return v&mask != 0
	}
	return false
}

func (c ArgCond) validate() error {
	if c.Index < 0 || c.Index > 5 {
		return fmt.Errorf("argument index %d out of range 0..5", c.Index)
	}
	if c.Low32 && (c.Value>>32 != 0 || c.Mask>>32 != 0) {
		return fmt.Errorf("%v: Low32 condition has bits above 32 in Value or Mask", c)
	}
	switch c.Op {
	case Equal, NotEqual:
	case MaskedEqual:
		if c.Value&^c.Mask != 0 {
			return fmt.Errorf("%v: Value has bits outside Mask, the condition can never hold", c)
		}
	case AnySet:
		if c.Mask == 0 {
			return fmt.Errorf("%v: zero Mask, the condition can never hold", c)
		}
	default:
		return fmt.Errorf("invalid op %d (use Equal, NotEqual, MaskedEqual or AnySet)", int(c.Op))
	}
	return nil
}

// Rule is the decision for one system call, optionally only when all of Args
// hold. Several rules may name the same system call: they are tried in
// policy order and the first whose Args all hold decides; if none does, the
// policy Default applies.
type Rule struct {
	// Name is the kernel's name for the system call ("openat", "clone").
	Name   string
	Action Action
	// Errno is returned when Action is Errno.
	Errno unix.Errno
	// Args must all hold for the rule to apply; none means always.
	Args []ArgCond
	// Reason says why the rule exists: the CVE, the kernel behaviour or the
	// program that needs it.
	Reason string
}

func (r Rule) decision() string {
	s := r.Action.String()
	if r.Action == Errno {
		s += " " + errnoName(r.Errno)
	}
	return s
}

func (r Rule) String() string {
	if len(r.Args) == 0 {
		return r.decision()
	}
	conds := make([]string, len(r.Args))
	for i, c := range r.Args {
		conds[i] = c.String()
	}
	return r.decision() + " if " + strings.Join(conds, " && ")
}

// Policy is a system call filter for one architecture.
type Policy struct {
	// Arch is the Go name of the architecture; only "amd64" is supported.
	// System calls entering through any other ABI (i386 int 0x80) kill the
	// process: the filter's numbers mean nothing there.
	Arch string
	// Default decides system calls no rule matches.
	Default      Action
	DefaultErrno unix.Errno
	// X32 decides x32-ABI system calls (number with bit 0x40000000), which
	// share AUDIT_ARCH_X86_64 with native ones. Zero means Default.
	X32      Action
	X32Errno unix.Errno
	Rules    []Rule
}

// x32Decision resolves the documented zero value of X32.
func (p *Policy) x32Decision() (Action, unix.Errno) {
	if p.X32 == 0 {
		return p.Default, p.DefaultErrno
	}
	return p.X32, p.X32Errno
}

// x32Bit is __X32_SYSCALL_BIT.
const x32Bit = 0x40000000

// decide is the reference semantics of a policy, independent of BPF. The
// compiled filter must agree with it on every input; tests check that.
func (p *Policy) decide(arch uint32, nr int, args [6]uint64) (Action, unix.Errno) {
	if arch != unix.AUDIT_ARCH_X86_64 {
		return KillProcess, 0
	}
	if uint32(nr)&x32Bit != 0 {
		return p.x32Decision()
	}
	for _, r := range p.Rules {
		n, ok := syscallNumber(r.Name)
		if !ok || uint32(n) != uint32(nr) {
			continue
		}
		if all(r.Args, args) {
			return r.Action, r.Errno
		}
	}
	return p.Default, p.DefaultErrno
}

func all(conds []ArgCond, args [6]uint64) bool {
	for _, c := range conds {
		if !c.holds(args) {
			return false
		}
	}
	return true
}

// validate checks everything Compile relies on and returns the rules grouped
// by system call number, in policy order.
func (p *Policy) validate() (map[int][]Rule, error) {
	if p.Arch != "amd64" {
		return nil, fmt.Errorf("policy arch %q: only \"amd64\" is supported", p.Arch)
	}
	if _, err := p.Default.ret(p.DefaultErrno); err != nil {
		return nil, fmt.Errorf("policy default: %w", err)
	}
	if a, e := p.x32Decision(); a != 0 {
		if _, err := a.ret(e); err != nil {
			return nil, fmt.Errorf("policy x32: %w", err)
		}
	}
	byNr := make(map[int][]Rule, len(p.Rules))
	for i, r := range p.Rules {
		nr, ok := syscallNumber(r.Name)
		if !ok {
			return nil, fmt.Errorf("rule %d: unknown amd64 system call %q", i, r.Name)
		}
		if _, err := r.Action.ret(r.Errno); err != nil {
			return nil, fmt.Errorf("rule %d (%s): %w", i, r.Name, err)
		}
		if r.Action != Errno && r.Errno != 0 {
			return nil, fmt.Errorf("rule %d (%s): Errno %d set but action is %v", i, r.Name, int(r.Errno), r.Action)
		}
		if strings.TrimSpace(r.Reason) == "" {
			return nil, fmt.Errorf("rule %d (%s): missing Reason", i, r.Name)
		}
		for _, c := range r.Args {
			if err := c.validate(); err != nil {
				return nil, fmt.Errorf("rule %d (%s): %w", i, r.Name, err)
			}
		}
		if prev := byNr[nr]; len(prev) > 0 && len(prev[len(prev)-1].Args) == 0 {
			return nil, fmt.Errorf("rule %d (%s): unreachable, an earlier rule for %s has no conditions", i, r.Name, r.Name)
		}
		if prev := byNr[nr]; prev == nil {
			byNr[nr] = p.Rules[i : i+1 : i+1] // most numbers have one rule: no copy
		} else {
			byNr[nr] = append(prev, r)
		}
	}
	return byNr, nil
}

func errnoName(e unix.Errno) string {
	if n := unix.ErrnoName(e); n != "" {
		return n
	}
	return fmt.Sprintf("%d", int(e))
}

type sysnum struct {
	name string
	nr   int
}

// The lookup tables are built on first use, not at start: init (which
// installs a filter but never compiles one) and every moat process that
// runs no seccomp code would pay for them.
var syscallByName = sync.OnceValue(func() map[string]int {
	m := make(map[string]int, len(amd64Syscalls))
	for _, s := range amd64Syscalls {
		m[s.name] = s.nr
	}
	return m
})

// syscallNumber returns the amd64 number of a system call by kernel name.
func syscallNumber(name string) (int, bool) {
	nr, ok := syscallByName()[name]
	return nr, ok
}

var syscallByNumber = sync.OnceValue(func() map[int]string {
	m := make(map[int]string, len(amd64Syscalls))
	for _, s := range amd64Syscalls {
		m[s.nr] = s.name
	}
	return m
})

// maxSyscall is the highest amd64 system call number this package knows.
var maxSyscall = amd64Syscalls[len(amd64Syscalls)-1].nr

// SyscallName returns the kernel name of an amd64 system call number, or ""
// if the number is unassigned.
func SyscallName(nr int) string { return syscallByNumber()[nr] }
