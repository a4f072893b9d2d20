package engine

import (
	"context"
	"errors"
	"io"
	"time"
)

// BuildStep is one untrusted step of an image build (a Dockerfile RUN, a
// pip or npm install): it runs in a native-tier sandbox whose root is the
// image tree being built, writable, and never on the host.
type BuildStep struct {
	// Argv is the command; Argv[0] is looked up in the tree's PATH.
	Argv []string
	// Env is the complete environment (nothing is inherited).
	Env []string
	// Dir is the absolute working directory inside the tree; it must
	// exist.
	Dir string
	// UID is the user the step runs as inside its user namespace: 0 (the
	// namespace's root, what a Dockerfile RUN gets by default) or the
	// sandbox user 1000. Never host root.
	UID int
	// Hosts is the step's egress allowlist ("host" or "host:port", as the
	// manifest's network.allow). Empty: no network at all.
	Hosts []string
	// Stdout and Stderr receive the step's output as it runs (nil
	// discards).
	Stdout, Stderr io.Writer
	// Timeout bounds the step (0: DefaultBuildStepTimeout).
	Timeout time.Duration
}

// DefaultBuildStepTimeout bounds a build step that names no timeout.
const DefaultBuildStepTimeout = 30 * time.Minute

// errBuildStepUnimplemented is replaced by the implementation (issue 19 §2).
var errBuildStepUnimplemented = errors.New("build steps are not implemented yet")

// RunBuildStep runs one build step in a sandbox whose root is the host
// directory root, read-write, and returns the step's exit status. The
// error is for Moat's own failures and invalid steps; a step that ran and
// failed returns its non-zero status and a nil error. Files the step
// writes are owned, on the host, by the ids they have inside (uid 0
// inside: host root's files in the tree), so the tree can be hashed and
// published like any other.
func (e *Engine) RunBuildStep(ctx context.Context, root string, step BuildStep) (exitCode int, err error) {
	return -1, errBuildStepUnimplemented
}
