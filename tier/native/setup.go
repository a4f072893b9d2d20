package native

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// SetupTimeout bounds how long init may take to confine itself (namespaces,
// mounts, credentials, Landlock, seccomp) before the program starts. The
// run's own timeout is the program's and starts after; a setup that does
// not finish is Moat's failure (infra-error), never the program's timeout.
const SetupTimeout = 30 * time.Second

// setupStuck says why init, still setting itself up, never will finish, or
// "" while it may. Init changes its credentials on every thread (Go's
// AllThreadsSyscall signals each thread with tgkill); when no signal may
// be queued for it (RLIMIT_SIGPENDING spent or zero), tgkill fails with
// EAGAIN and the runtime retries forever at 100% CPU. /proc/<pid>/status's
// SigQ ("queued/limit") shows that state.
func setupStuck(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		v, ok := bytes.CutPrefix(line, []byte("SigQ:"))
		if !ok {
			continue
		}
		q, l, ok := strings.Cut(strings.TrimSpace(string(v)), "/")
		queued, err1 := strconv.ParseUint(q, 10, 64)
		limit, err2 := strconv.ParseUint(l, 10, 64)
		if ok && err1 == nil && err2 == nil && queued >= limit {
			return fmt.Sprintf("init cannot finish its setup: no signal can be queued for it (SigQ %d/%d: the pending-signal limit, RLIMIT_SIGPENDING, is spent)", queued, limit)
		}
	}
	return ""
}

// wantSigpending is the RLIMIT_SIGPENDING moat gives itself where it is
// lower, and so each sandbox's user namespace, which takes its creator's
// limit as the bound of what the whole namespace may queue; init's setup
// queues one signal per thread, so needSigpending is enough to run.
const (
	wantSigpending = 1024
	needSigpending = 64
)

// ensureSigpending raises this process's RLIMIT_SIGPENDING towards
// wantSigpending, and refuses the tier, saying how to fix it, when even
// needSigpending cannot be had: a moat started with `prlimit
// --sigpending=0` made every sandbox's init spin in its setup.
func ensureSigpending() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_SIGPENDING, &lim); err != nil {
		return err
	}
	if lim.Cur >= wantSigpending {
		return nil
	}
	raised := unix.Rlimit{Cur: wantSigpending, Max: max(lim.Max, wantSigpending)}
	if unix.Setrlimit(unix.RLIMIT_SIGPENDING, &raised) == nil {
		return nil
	}
	// Without CAP_SYS_RESOURCE only the soft limit can rise, to the hard.
	if lim.Max >= needSigpending {
		raised = unix.Rlimit{Cur: min(lim.Max, wantSigpending), Max: lim.Max}
		return unix.Setrlimit(unix.RLIMIT_SIGPENDING, &raised)
	}
	return fmt.Errorf("moat's RLIMIT_SIGPENDING is %d (hard limit %d) and cannot be raised: each sandbox's init must queue signals while it sets up; raise it to at least %d (ulimit -i %d, or LimitSIGPENDING= in moat's service unit)", lim.Cur, lim.Max, needSigpending, wantSigpending)
}

// waitSetup waits until ready is closed, init is found stuck, or
// SetupTimeout passes; done ends the wait early with "" (the caller looks
// at why).
func waitSetup(pid int, ready <-chan struct{}, done <-chan struct{}) (stuck string) {
	deadline := time.NewTimer(SetupTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ready:
			return ""
		case <-done:
			return ""
		case <-deadline.C:
			return fmt.Sprintf("init did not finish its setup in %s", SetupTimeout)
		case <-tick.C:
			if why := setupStuck(pid); why != "" {
				return why
			}
		}
	}
}
