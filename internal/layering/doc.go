// Package layering holds the test that keeps Moat's package graph the
// shape docs/RATIONALE.md describes ("Tiers plug in", "Service layer under
// the front doors"): a forbidden import fails the build's tests, as
// Tailscale's deptest does, rather than waiting for a reviewer to notice.
package layering
