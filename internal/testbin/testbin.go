// Package testbin builds the moat binary for tests that need a real one:
// the native tier re-executes it as the sandbox's init, and CLI tests run
// it as a user would. Only tests import it.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Build compiles cmd/moat into a fresh directory and returns its path and
// a function that removes it.
func Build() (path string, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", "moat-test-bin-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	// init execs the binary as the sandbox's unprivileged root: the
	// directory must be traversable by others, as /usr/local/bin is.
	if err := os.Chmod(dir, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	path = filepath.Join(dir, "moat")
	cmd := exec.Command("go", "build", "-o", path, "github.com/moat-sandbox/moat/cmd/moat")
	// CGO_ENABLED=0: init changes credentials on all threads with
	// AllThreadsSyscall, which a cgo binary cannot do.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build moat: %v\n%s", err, out)
	}
	return path, cleanup, nil
}
