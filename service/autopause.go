package service

import "github.com/moat-sandbox/moat/result"

// Why a sandbox ends or pauses (the reason closeSession records and
// logs), and what a command it killed reports (Exec.Interrupted).

// The reasons a sandbox's session is closed that a client can act on.
const (
	reasonDeleted    = "deleted by its key"
	reasonExpired    = "ttl expired"
	reasonAutoPaused = "paused on timeout (auto_pause)"
	reasonPaused     = "paused"
	reasonShutdown   = "server shutting down"
	reasonInitExited = "its init exited"
)

// Exec.Interrupted values: why a command was killed by the end of its
// sandbox rather than by its own program or Moat's limits. A closed set,
// so that front doors can map each onto their protocol's error.
const (
	// InterruptDeleted: the sandbox was deleted (or destroyed by Moat
	// for a reason other than those below).
	InterruptDeleted = "sandbox-deleted"
	// InterruptExpired: the sandbox's TTL passed; it was destroyed.
	InterruptExpired = "sandbox-expired"
	// InterruptAutoPaused: the sandbox's TTL passed and it was paused
	// (SandboxArgs.AutoPause): its files are kept, its processes are not.
	InterruptAutoPaused = "sandbox-auto-paused"
	// InterruptPaused: the sandbox was paused by its key.
	InterruptPaused = "sandbox-paused"
	// InterruptShutdown: the server shut down.
	InterruptShutdown = "server-shutdown"
	// InterruptEnded: the sandbox's init exited (a program killed it).
	InterruptEnded = "sandbox-ended"
)

// interruptOf is the Interrupt* value of a close reason.
func interruptOf(reason string) string {
	switch reason {
	case reasonExpired:
		return InterruptExpired
	case reasonAutoPaused:
		return InterruptAutoPaused
	case reasonPaused:
		return InterruptPaused
	case reasonShutdown:
		return InterruptShutdown
	case reasonInitExited:
		return InterruptEnded
	}
	return InterruptDeleted
}

// interrupted is the Interrupt* value for a command of sb that ended with
// res, or "": a command that exited on its own is not interrupted, even
// if its sandbox was closing by then.
func (sb *sandbox) interrupted(res *result.Result) string {
	if res != nil && res.Termination == result.Exited {
		return ""
	}
	sb.mu.Lock()
	reason := sb.closing
	sb.mu.Unlock()
	if reason == "" {
		return ""
	}
	return interruptOf(reason)
}

// autoPauseExpired pauses sb, whose TTL has passed, if it was created
// with AutoPause, and reports whether it is now paused. The paused
// sandbox then lives Config.SnapshotTTL, as one its key paused. A pause
// that fails (e.g. a workspace beyond its limits, or no snapshot
// directory) leaves the sandbox to be destroyed as any expired one: the
// TTL is a promise about resources, kept either way.
func (s *Service) autoPauseExpired(sb *sandbox) bool {
	s.mu.Lock()
	running := sb.state == StateRunning
	s.mu.Unlock()
	if !sb.autoPause || !running {
		return false // a paused one past the snapshot TTL is destroyed
	}
	if _, err := s.pause(sb, reasonAutoPaused); err != nil {
		s.log.Warn("auto-pause of an expired sandbox failed: destroying it", "sandbox", sb.id, "err", err)
		return false
	}
	return true
}
