package seccomp

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// Entry is the policy's decision for one amd64 system call number.
type Entry struct {
	Nr int
	// Name is the kernel name, or "" for an unassigned number.
	Name string
	// Rules are the policy rules for this system call, in evaluation order;
	// empty when the policy Default decides.
	Rules []Rule
	// Action and Errno are the decision when no argument condition is
	// involved: the single unconditional rule, or the Default.
	Action Action
	Errno  unix.Errno
}

// Conditional reports whether the decision depends on the arguments.
func (e Entry) Conditional() bool {
	return len(e.Rules) > 1 || (len(e.Rules) == 1 && len(e.Rules[0].Args) > 0)
}

// Decision renders the entry's decision on one line, e.g. "allow",
// "errno EPERM", or for argument rules
// "errno EPERM if uint32(arg1) == 0x5412; allow".
func (e Entry) Decision() string {
	if len(e.Rules) == 0 {
		return "default: " + decisionString(e.Action, e.Errno)
	}
	parts := make([]string, 0, len(e.Rules)+1)
	for _, r := range e.Rules {
		parts = append(parts, r.String())
	}
	if last := e.Rules[len(e.Rules)-1]; len(last.Args) > 0 {
		parts = append(parts, "default: "+decisionString(e.Action, e.Errno))
	}
	return strings.Join(parts, "; ")
}

func decisionString(a Action, errno unix.Errno) string {
	return Rule{Action: a, Errno: errno}.decision()
}

// Table lists the decision for every amd64 system call number from 0 to the
// highest one golang.org/x/sys knows, assigned or not. It reads the policy
// data; tests check that the compiled filter agrees with it. Rules naming
// unknown system calls are not listed (Compile rejects them).
func Table(p *Policy) []Entry {
	byNr := make(map[int][]Rule)
	for _, r := range p.Rules {
		if nr, ok := syscallNumber(r.Name); ok {
			byNr[nr] = append(byNr[nr], r)
		}
	}
	out := make([]Entry, 0, maxSyscall+1)
	for nr := 0; nr <= maxSyscall; nr++ {
		e := Entry{Nr: nr, Name: SyscallName(nr), Rules: byNr[nr], Action: p.Default, Errno: p.DefaultErrno}
		if len(e.Rules) == 1 && len(e.Rules[0].Args) == 0 {
			e.Action, e.Errno = e.Rules[0].Action, e.Rules[0].Errno
		}
		out = append(out, e)
	}
	return out
}

// Summary counts a table's decisions: unconditional allows, unconditional
// explicit denials, argument-dependent system calls, and named system calls
// left to the default.
type Summary struct {
	Allowed, Denied, Conditional, Defaulted, Unassigned int
}

// Summarize counts the entries of a table.
func Summarize(t []Entry) Summary {
	var s Summary
	for _, e := range t {
		switch {
		case e.Name == "":
			s.Unassigned++
		case e.Conditional():
			s.Conditional++
		case len(e.Rules) == 0:
			s.Defaulted++
		case e.Action == Allow || e.Action == Log:
			s.Allowed++
		default:
			s.Denied++
		}
	}
	return s
}

func (s Summary) String() string {
	return fmt.Sprintf("%d allowed, %d denied explicitly, %d decided by arguments, %d left to the default, %d numbers unassigned",
		s.Allowed, s.Denied, s.Conditional, s.Defaulted, s.Unassigned)
}
