package tier

import (
	"time"

	"github.com/moat-sandbox/moat/result"
)

// CancelGrace is how long a cancelled run's program has, after SIGTERM,
// before the whole sandbox is killed. It is one rule for every tier and for
// the engine (which applies it to a run served through a session sandbox),
// so that a caller's cancel gives a program the same time whichever way
// the run went.
const CancelGrace = 2 * time.Second

// CancelledKind is the result.Violation kind of a program that a caller's
// cancel, or the destruction of its sandbox, ended.
const CancelledKind = "cancelled"

// Cancelled is the violation recorded when a caller's cancel or the
// sandbox's destruction ended the program; detail says which, and what
// the program was sent (it is part of the result, so each tier's wording
// stays as it is).
func Cancelled(detail string) result.Violation {
	return result.Violation{Kind: CancelledKind, Detail: detail}
}
