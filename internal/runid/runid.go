// Package runid owns the one rule for the ids of runs and sandboxes: the
// name of a run's directory (runs/<id>), of its cgroup (moat/<id>) and of
// gVisor's container. Every package that accepts such an id from outside
// checks it here, so no two of them can drift apart.
//
// It is a leaf: it imports nothing of Moat's, so cgroup can use it.
package runid

import "fmt"

// MaxLen is the longest id: cgroup and runsc container names stay short.
const MaxLen = 64

// Check says why id is not a valid run id, or nil. A run id is 1 to MaxLen
// characters of [a-z0-9-] that does not begin with '-':
// ^[a-z0-9][a-z0-9-]{0,63}$. That is the strictest rule every id Moat
// makes satisfies (the engine's random hex, "<sandbox>-e-N" exec ids,
// test ids such as "cgjoin-<hex>"), and it keeps ids from naming another
// directory ('/', '.'), from reading as a command-line flag (a leading
// '-' given to runsc), and from differing only in case.
func Check(id string) error {
	if id == "" || len(id) > MaxLen {
		return fmt.Errorf("run id %q: must be 1 to %d characters of [a-z0-9-]", clip(id), MaxLen)
	}
	if id[0] == '-' {
		return fmt.Errorf("run id %q: must not begin with '-'; begin with a letter or digit", id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-') {
			return fmt.Errorf("run id %q: character %q not allowed; use lower-case letters, digits and '-'", id, c)
		}
	}
	return nil
}

// clip shortens an over-long id for an error message.
func clip(id string) string {
	if len(id) > MaxLen+8 {
		return id[:MaxLen] + "..."
	}
	return id
}
