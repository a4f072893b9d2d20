package tier

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/result"
)

// Exit is how a sandbox's program ended, as its tier learned it.
type Exit struct {
	Code   int // the exit status, when Signal is 0
	Signal int // the signal that killed the program, or 0
}

// Observed is everything a tier saw of one run's end, for Classify.
type Observed struct {
	// Exit is nil when the tier never learned how the program ended (the
	// process that reports it died first).
	Exit *Exit
	// Lost explains a nil Exit in the infra-error message.
	Lost string
	// TimedOut: the wall-clock timeout fired and the sandbox was killed.
	TimedOut bool
	// Stats are the run cgroup's counters after everything in it died.
	Stats cgroup.Stats
}

// Classify turns what a tier observed into the closed termination taxonomy
// shared by all tiers: it sets out's Termination, ExitCode, Signal and
// Error and appends the limit violations the counters show.
func Classify(out *Outcome, obs Observed, lim Limits) {
	st := obs.Stats
	if st.OOMKills > 0 {
		out.Violations = append(out.Violations, result.Violation{Kind: "memory", Detail: fmt.Sprintf("the kernel OOM-killed %d process(es) at the memory limit", st.OOMKills), Limit: fmt.Sprint(lim.MemoryBytes)})
	}
	if st.PidsMaxHits > 0 {
		out.Violations = append(out.Violations, result.Violation{Kind: "pids", Detail: fmt.Sprintf("process creation failed %d time(s) at the pids limit", st.PidsMaxHits), Limit: fmt.Sprint(lim.Pids)})
	}
	final := obs.Exit
	switch {
	case obs.TimedOut:
		out.Termination, out.ExitCode, out.Signal = result.Timeout, 124, int(unix.SIGKILL)
		out.Violations = append(out.Violations, result.Violation{Kind: "timeout", Detail: "wall-clock timeout reached; the whole sandbox was killed", Limit: lim.Timeout.String()})
	case final == nil:
		// The reporter died without reporting: only the kernel can have
		// done that (the OOM killer, or a crash).
		if st.OOMKills > 0 {
			out.Termination, out.ExitCode, out.Signal = result.OOM, 128+9, 9
		} else {
			out.Termination, out.ExitCode = result.InfraError, 125
			out.Error = obs.Lost
		}
	case final.Signal != 0:
		out.ExitCode, out.Signal = 128+final.Signal, final.Signal
		switch {
		case final.Signal == int(unix.SIGKILL) && st.OOMKills > 0:
			out.Termination = result.OOM
		case final.Signal == int(unix.SIGXCPU) || (final.Signal == int(unix.SIGKILL) && st.CPU >= lim.CPUTime):
			out.Termination = result.CPUTime
			out.Violations = append(out.Violations, result.Violation{Kind: "cpu-time", Detail: "CPU-time limit reached", Limit: lim.CPUTime.String()})
		case final.Signal == int(unix.SIGSYS):
			out.Termination = result.Policy
			out.Violations = append(out.Violations, result.Violation{Kind: "syscall", Detail: "killed by the seccomp filter (SIGSYS)"})
		default:
			out.Termination = result.Signaled
		}
	default:
		out.Termination, out.ExitCode = result.Exited, final.Code
		if final.Code != 0 && st.PidsMaxHits > 0 {
			out.Termination = result.Pids
		}
	}
}
