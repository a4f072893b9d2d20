package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Evaluate runs a compiled filter in an interpreter for one system call and
// returns the decision, without privileges and without touching the kernel.
// arch is the AUDIT_ARCH_* value of the entry point (unix.AUDIT_ARCH_X86_64
// for a native syscall, unix.AUDIT_ARCH_I386 for int 0x80); nr includes the
// x32 bit when testing x32 entry.
func Evaluate(filter []unix.SockFilter, arch uint32, nr int, args [6]uint64) (Action, unix.Errno, error) {
	vm, err := newVM(filter)
	if err != nil {
		return 0, 0, err
	}
	return vm.eval(arch, nr, args)
}

// evaluator is a filter ready to run many times (benchmarks, exhaustive tests).
type evaluator struct{ vm *bpf.VM }

func newVM(filter []unix.SockFilter) (*evaluator, error) {
	if err := checkFilter(filter); err != nil {
		return nil, fmt.Errorf("evaluate seccomp filter: %w", err)
	}
	raw := make([]bpf.RawInstruction, len(filter))
	for i, in := range filter {
		raw[i] = bpf.RawInstruction{Op: in.Code, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	insns, ok := bpf.Disassemble(raw)
	if !ok {
		return nil, fmt.Errorf("evaluate seccomp filter: instruction the interpreter does not know")
	}
	vm, err := bpf.NewVM(insns)
	if err != nil {
		return nil, fmt.Errorf("evaluate seccomp filter: %w", err)
	}
	return &evaluator{vm: vm}, nil
}

func (e *evaluator) eval(arch uint32, nr int, args [6]uint64) (Action, unix.Errno, error) {
	ret, err := e.vm.Run(seccompData(arch, nr, args))
	if err != nil {
		return 0, 0, fmt.Errorf("evaluate seccomp filter: %w", err)
	}
	return actionOf(uint32(ret))
}

// seccompData builds the 64-byte struct seccomp_data as the interpreter must
// see it. The kernel loads each 32-bit word in native (little endian) order,
// while x/net/bpf, written for packets, loads words big endian; storing every
// word big endian at its native offset makes each load yield the value the
// kernel would load. A 64-bit field keeps its low word at the lower offset.
func seccompData(arch uint32, nr int, args [6]uint64) []byte {
	b := make([]byte, sizeSeccompData)
	be := binary.BigEndian
	be.PutUint32(b[offNr:], uint32(nr))
	be.PutUint32(b[offArch:], arch)
	// instruction_pointer (offset 8) stays zero: no rule looks at it.
	for i, a := range args {
		be.PutUint32(b[argLow(i):], uint32(a))
		be.PutUint32(b[argHigh(i):], uint32(a>>32))
	}
	return b
}
