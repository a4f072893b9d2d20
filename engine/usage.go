package engine

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"time"

	"github.com/moat-sandbox/moat/tier"
)

// userHZ is the unit of the times in /proc/<pid>/stat: the kernel's
// USER_HZ, 100 on every architecture Linux exports it for (whatever the
// kernel's own HZ), and what glibc's sysconf(_SC_CLK_TCK) returns.
const userHZ = 100

var errNoProcs = errors.New("this tier cannot list its processes")

// ProcsCPU is the CPU time (user and system) that the host processes pids
// have used so far, with what the children they waited for used: for all
// the processes of a live sandbox (tier.ProcessLister), what its programs
// have used, but for processes that ended without being waited for and
// what ended since the listing. It is an estimate for accounting while a
// sandbox runs; the tiers' results, read from the cgroup, are the final
// numbers. A pid that is gone counts nothing.
func ProcsCPU(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		ticks += statTicks(b)
	}
	return time.Duration(ticks) * time.Second / userHZ
}

// statTicks sums utime, stime, cutime and cstime (fields 14 to 17) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and
// may hold spaces and parentheses itself: fields are counted after the
// last ')'.
func statTicks(stat []byte) int64 {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0
	}
	// After ") " comes field 3 (state); utime is field 14.
	f := bytes.Fields(stat[i+1:])
	if len(f) < 15 {
		return 0
	}
	var sum int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return 0
		}
		sum += n
	}
	return sum
}

// CPU is an estimate of the CPU time the session's sandbox has used so far
// (ProcsCPU of its processes, or of its runtime's on tiers whose programs
// run in a user-space kernel), for accounting while commands run. A tier
// that can list neither says so.
func (s *Session) CPU() (time.Duration, error) {
	if err := s.open(); err != nil {
		return 0, err
	}
	pids, err := s.procs()
	if err != nil {
		return 0, err
	}
	return ProcsCPU(pids), nil
}

// procs lists the host processes that do the sandbox's work: its
// runtime's on tiers whose programs run in a user-space kernel, else its
// own.
func (s *Session) procs() ([]int, error) {
	switch sb := s.p.sb.(type) {
	case tier.RuntimeLister:
		return sb.RuntimeProcs()
	case tier.ProcessLister:
		return sb.Procs()
	}
	return nil, errNoProcs
}

// endedWait bounds how long Ended waits for a dying sandbox's processes
// to be gone: when init exits, the kernel kills the rest of its PID
// namespace, which takes a moment.
const endedWait = 200 * time.Millisecond

// Ended reports whether the session's sandbox has no process left: its
// init has exited, so nothing can run in it any more (see
// ErrSandboxEnded). A closed session has ended; a tier that cannot list
// its processes never says so.
func (s *Session) Ended() bool {
	if s.open() != nil {
		return true
	}
	var list func() ([]int, error)
	switch sb := s.p.sb.(type) {
	case tier.RuntimeLister:
		list = sb.RuntimeProcs
	case tier.ProcessLister:
		list = sb.Procs
	default:
		return false
	}
	deadline := time.Now().Add(endedWait)
	for {
		pids, err := list()
		if err == nil && len(pids) == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
