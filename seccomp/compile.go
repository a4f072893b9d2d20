package seccomp

import (
	"fmt"
	"math"

	"golang.org/x/sys/unix"
)

// BPF opcodes used by the compiler (linux/filter.h).
const (
	opLdAbsW  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	opAndK    = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	opJa      = unix.BPF_JMP | unix.BPF_JA
	opJeqK    = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	opJgeK    = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
	opJsetK   = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	opRetK    = unix.BPF_RET | unix.BPF_K
	maxInsns  = 4096 // BPF_MAXINSNS: the kernel refuses longer programs
	maxJumpTF = 255  // jt/jf are 8 bits
)

// Offsets into struct seccomp_data, whose fields are in native (little
// endian) byte order: a 64-bit value's low word comes first.
const (
	offNr           = 0
	offArch         = 4
	offArgs         = 16
	sizeSeccompData = 64
)

func argLow(i int) uint32  { return uint32(offArgs + 8*i) }
func argHigh(i int) uint32 { return uint32(offArgs + 8*i + 4) }

// Compile translates the policy into a seccomp filter (see the package
// comment for its layout). The program is checked against the kernel's rules
// for seccomp filters before it is returned.
func (p *Policy) Compile() ([]unix.SockFilter, error) {
	byNr, err := p.validate()
	if err != nil {
		return nil, err
	}
	defRet, _ := p.Default.ret(p.DefaultErrno)
	x32Ret, _ := p.x32Action()

	var prog []unix.SockFilter
	prog = append(prog,
		// The same process can enter the kernel through the i386 ABI
		// (int 0x80), where every number means a different syscall
		// (i386 11 is execve, amd64 11 is munmap): check the arch first and
		// kill, since no rule below is valid for another ABI.
		stmt(opLdAbsW, offArch),
		jump(opJeqK, unix.AUDIT_ARCH_X86_64, 1, 0),
		stmt(opRetK, retKillProcess),
		// x32 syscalls arrive with AUDIT_ARCH_X86_64 and bit 30 set in the
		// number. Exact comparisons below would never match them, but range
		// comparisons in the search tree could, so decide them here.
		stmt(opLdAbsW, offNr),
		jump(opJsetK, x32Bit, 0, 1),
		stmt(opRetK, x32Ret),
	)

	ivs, err := intervals(byNr, defRet)
	if err != nil {
		return nil, err
	}
	tree, err := searchTree(ivs)
	if err != nil {
		return nil, err
	}
	prog = append(prog, tree...)
	if err := checkFilter(prog); err != nil {
		return nil, fmt.Errorf("compiler produced a program the kernel would refuse: %w", err)
	}
	return prog, nil
}

func (p *Policy) x32Action() (uint32, error) {
	a, e := p.x32Decision()
	return a.ret(e)
}

func stmt(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }

func jump(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: code, Jt: jt, Jf: jf, K: k}
}

// interval is a range of system call numbers [lo, hi] with one leaf program:
// either a single return (ret valid) or argument rules for one syscall.
type interval struct {
	lo, hi uint32
	ret    uint32
	leaf   []unix.SockFilter // nil for a plain return
}

// intervals partitions the whole 32-bit number space into maximal runs of
// system calls that decide the same way, so the search tree compares against
// boundaries rather than against every number.
func intervals(byNr map[int][]Rule, defRet uint32) ([]interval, error) {
	var out []interval
	add := func(iv interval) {
		if n := len(out); n > 0 && iv.leaf == nil && out[n-1].leaf == nil && out[n-1].ret == iv.ret && out[n-1].hi+1 == iv.lo {
			out[n-1].hi = iv.hi
			return
		}
		out = append(out, iv)
	}
	for nr := 0; nr <= maxSyscall; nr++ {
		rules := byNr[nr]
		iv := interval{lo: uint32(nr), hi: uint32(nr), ret: defRet}
		switch {
		case len(rules) == 1 && len(rules[0].Args) == 0:
			iv.ret, _ = rules[0].Action.ret(rules[0].Errno)
		case len(rules) > 0:
			leaf, err := argLeaf(rules, defRet)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", rules[0].Name, err)
			}
			iv.leaf = leaf
		}
		add(iv)
	}
	add(interval{lo: uint32(maxSyscall + 1), hi: math.MaxUint32, ret: defRet})
	return out, nil
}

// searchTree emits a binary search over sorted, contiguous intervals. Each
// subtree is position independent (all jumps stay inside it), so subtrees
// can be concatenated; a node whose left subtree is too long for an 8-bit
// jump offset jumps through a JA, whose offset is 32 bits.
func searchTree(ivs []interval) ([]unix.SockFilter, error) {
	if len(ivs) == 1 {
		if ivs[0].leaf != nil {
			return ivs[0].leaf, nil
		}
		return []unix.SockFilter{stmt(opRetK, ivs[0].ret)}, nil
	}
	mid := len(ivs) / 2
	left, err := searchTree(ivs[:mid])
	if err != nil {
		return nil, err
	}
	right, err := searchTree(ivs[mid:])
	if err != nil {
		return nil, err
	}
	var out []unix.SockFilter
	if len(left) <= maxJumpTF {
		// nr >= pivot: skip the left subtree.
		out = append(out, jump(opJgeK, ivs[mid].lo, uint8(len(left)), 0))
	} else {
		// nr >= pivot: fall into the JA over the left subtree; else skip it.
		out = append(out, jump(opJgeK, ivs[mid].lo, 0, 1), stmt(opJa, uint32(len(left))))
	}
	out = append(out, left...)
	out = append(out, right...)
	if len(out) > maxInsns {
		return nil, fmt.Errorf("program longer than %d instructions", maxInsns)
	}
	return out, nil
}

// block assembles a leaf with forward jumps to labels.
type block struct {
	ins    []unix.SockFilter
	fixes  []fixup
	labels []int // label -> instruction index, -1 until bound
}

type fixup struct {
	at, label int
	onTrue    bool
}

// next means "fall through": a jump offset of zero.
const next = -1

func (b *block) label() int {
	b.labels = append(b.labels, -1)
	return len(b.labels) - 1
}

func (b *block) bind(l int) { b.labels[l] = len(b.ins) }

func (b *block) stmt(code uint16, k uint32) { b.ins = append(b.ins, stmt(code, k)) }

func (b *block) jump(code uint16, k uint32, jt, jf int) {
	at := len(b.ins)
	b.ins = append(b.ins, jump(code, k, 0, 0))
	if jt != next {
		b.fixes = append(b.fixes, fixup{at: at, label: jt, onTrue: true})
	}
	if jf != next {
		b.fixes = append(b.fixes, fixup{at: at, label: jf})
	}
}

func (b *block) resolve() ([]unix.SockFilter, error) {
	for _, f := range b.fixes {
		to := b.labels[f.label]
		off := to - (f.at + 1)
		if to < 0 || off < 0 || off > maxJumpTF {
			return nil, fmt.Errorf("argument rules too long: jump of %d instructions", off)
		}
		if f.onTrue {
			b.ins[f.at].Jt = uint8(off)
		} else {
			b.ins[f.at].Jf = uint8(off)
		}
	}
	return b.ins, nil
}

// argLeaf emits the rules of one system call in order; each rule's
// conditions jump to the next rule on the first that fails.
func argLeaf(rules []Rule, defRet uint32) ([]unix.SockFilter, error) {
	var b block
	for _, r := range rules {
		fail := b.label()
		for _, c := range r.Args {
			emitCond(&b, c, fail)
		}
		ret, _ := r.Action.ret(r.Errno)
		b.stmt(opRetK, ret)
		b.bind(fail)
	}
	if len(rules[len(rules)-1].Args) != 0 {
		b.stmt(opRetK, defRet)
	}
	return b.resolve()
}

// emitCond falls through when c holds and jumps to fail otherwise. A 64-bit
// comparison is done on the high word, then the low word; the high word is
// skipped when it cannot change the outcome (Low32, or a zero mask word).
func emitCond(b *block, c ArgCond, fail int) {
	lo, hi := argLow(c.Index), argHigh(c.Index)
	vlo, vhi := uint32(c.Value), uint32(c.Value>>32)
	mlo, mhi := uint32(c.Mask), uint32(c.Mask>>32)
	wide := !c.Low32
	switch c.Op {
	case Equal:
		if wide {
			b.stmt(opLdAbsW, hi)
			b.jump(opJeqK, vhi, next, fail)
		}
		b.stmt(opLdAbsW, lo)
		b.jump(opJeqK, vlo, next, fail)
	case NotEqual:
		holds := b.label()
		if wide {
			b.stmt(opLdAbsW, hi)
			b.jump(opJeqK, vhi, next, holds)
		}
		b.stmt(opLdAbsW, lo)
		b.jump(opJeqK, vlo, fail, next)
		b.bind(holds)
	case MaskedEqual:
		if wide && mhi != 0 {
			b.stmt(opLdAbsW, hi)
			b.stmt(opAndK, mhi)
			b.jump(opJeqK, vhi, next, fail)
		}
		b.stmt(opLdAbsW, lo)
		b.stmt(opAndK, mlo)
		b.jump(opJeqK, vlo, next, fail)
	case AnySet:
		if mlo == 0 { // only high bits in the mask (validate rules out Low32 here)
			b.stmt(opLdAbsW, hi)
			b.jump(opJsetK, mhi, next, fail)
			return
		}
		holds := b.label()
		if wide && mhi != 0 {
			b.stmt(opLdAbsW, hi)
			b.jump(opJsetK, mhi, holds, next)
		}
		b.stmt(opLdAbsW, lo)
		b.jump(opJsetK, mlo, next, fail)
		b.bind(holds)
	}
}

// checkFilter applies the checks the kernel makes before accepting a seccomp
// filter (bpf_check_classic and seccomp_check_filter), so that a bad program
// fails in unit tests rather than at Install time in a sandbox.
func checkFilter(prog []unix.SockFilter) error {
	n := len(prog)
	if n == 0 || n > maxInsns {
		return fmt.Errorf("program has %d instructions, want 1..%d", n, maxInsns)
	}
	for i, in := range prog {
		switch in.Code {
		case opLdAbsW:
			// seccomp only lets a filter read aligned words of seccomp_data.
			if in.K%4 != 0 || in.K >= sizeSeccompData {
				return fmt.Errorf("instruction %d: load of seccomp_data offset %d", i, in.K)
			}
		case opAndK, opRetK:
		case opJa:
			if uint64(in.K) >= uint64(n-i-1) {
				return fmt.Errorf("instruction %d: ja %d jumps past the end", i, in.K)
			}
		case opJeqK, opJgeK, opJsetK:
			if int(in.Jt) >= n-i-1 || int(in.Jf) >= n-i-1 {
				return fmt.Errorf("instruction %d: jump (%d, %d) past the end", i, in.Jt, in.Jf)
			}
		default:
			// Other classic BPF is legal in seccomp, but this package does
			// not emit it, so its presence means a bug.
			return fmt.Errorf("instruction %d: unexpected opcode %#x", i, in.Code)
		}
	}
	if prog[n-1].Code != opRetK {
		return fmt.Errorf("program does not end with a return")
	}
	return nil
}
