// Package incident keeps the evidence of a flagged run — one whose result
// says it tried something a sandbox exists to stop (a canary seen, a
// secret sent to the wrong host, a policy kill, a typosquat) — as a
// read-only bundle under $MOAT_HOME/incidents/<id>/, sized and retained by
// an operator policy, and reads, exports and removes those bundles.
//
// A bundle holds hostile data (the program's output and files). This
// package must never execute, interpret or follow anything in it: files
// are written 0400 in 0500 directories, workspace files are stored under
// numbered names (their sandbox names are only data in workspace.json),
// symlinks and special files of the workspace are recorded, never copied,
// and nothing is ever read back from a bundle except its own JSON.
package incident
