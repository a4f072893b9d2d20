// Package pkgguard is the guarded package index of a run: an HTTP handler,
// served by the run's egress proxy, that speaks the PyPI simple API (PEP
// 503 HTML and PEP 691 JSON) and the npm registry protocol (packuments and
// tarballs) to the sandbox, fetches from the operator's upstream index
// itself, and lets through only the packages, versions and files the
// manifest allows. Every file it serves was hashed by the guard and
// matched the upstream's (and, where pinned, the manifest's) digest before
// its first byte reached the sandbox.
//
// It must never serve a file it has not verified, never hand the sandbox
// an upstream URL (every file and tarball URL is rewritten to the guard's
// own paths), and never dial anything itself: its upstream transport comes
// from the egress proxy, which applies the run's address policy and budget.
// It imports nothing of Moat's, so the manifest can use its parsers.
package pkgguard
