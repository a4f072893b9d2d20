package e2b

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/moat-sandbox/moat/service"
)

// An E2B process id is the command's pid in the sandbox's PID namespace
// (service.Exec.Pid, reported by the tier): the number `ps` shows inside,
// which another command of the same sandbox can `kill -9`, and never the
// sandbox's init (1). Where the tier cannot tell a pid, the command gets
// a number above PID_MAX_LIMIT instead: the SDK can still address it, and
// a `kill` inside the sandbox fails (ESRCH) rather than reach whichever
// process has that pid, init included.

// noPidBase is PID_MAX_LIMIT (include/linux/threads.h): no process of any
// sandbox has a pid at or above it.
const noPidBase = 1 << 22

// maxPids bounds the pids a sandbox's record remembers; beyond it the
// pids of commands the service no longer keeps are forgotten.
const maxPids = 4096

// commandNumber is n of a command id "e-n".
func commandNumber(execID string) (uint32, bool) {
	n, err := strconv.ParseUint(strings.TrimPrefix(execID, "e-"), 10, 32)
	if err != nil || !strings.HasPrefix(execID, "e-") || n >= noPidBase {
		return 0, false
	}
	return uint32(n), true
}

// pidOf is the E2B pid of command ex, remembered so that the pid names
// the command from then on (the newest command with a pid, if the kernel
// gave it again after an earlier one ended).
func (b *box) pidOf(ex service.Exec) uint32 {
	var pid uint32
	switch n, ok := commandNumber(ex.ID); {
	case ex.Pid > 1 && ex.Pid < noPidBase:
		pid = uint32(ex.Pid)
	case ok:
		pid = noPidBase + n
	default:
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pids == nil {
		b.pids = map[uint32]string{}
	}
	if len(b.pids) >= maxPids {
		// The oldest commands first: their numbers are the smallest.
		var oldest, on uint32
		for p, id := range b.pids {
			if n, _ := commandNumber(id); oldest == 0 || n < on {
				oldest, on = p, n
			}
		}
		delete(b.pids, oldest)
	}
	b.pids[pid] = ex.ID
	return pid
}

// execOf is the command E2B pid names, or "" (which no command is).
func (b *box) execOf(pid uint32) string {
	b.mu.Lock()
	id, ok := b.pids[pid]
	b.mu.Unlock()
	if ok {
		return id
	}
	if pid >= noPidBase && pid-noPidBase > 0 {
		return fmt.Sprintf("e-%d", pid-noPidBase)
	}
	return ""
}
