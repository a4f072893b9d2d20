// Package sourceid holds the identity of the source tree this binary was
// built from, and nothing else: a leaf, so that the engine can read it
// without importing the guest code (nsinit, gvinit, vmagent) it matches.
package sourceid

// ID identifies the source tree this binary was built from, set at build
// time by scripts/build-pair for moat and moat-guest alike (-ldflags
// "-X github.com/moat-sandbox/moat/internal/sourceid.ID=..."): moat runs
// moat-guest only when both carry the same non-empty ID
// (engine.GuestBinary). Empty in any other build.
var ID string
