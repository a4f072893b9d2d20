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
	return build("moat")
}

// BuildGuest compiles cmd/moat-guest, the in-sandbox half alone, the same
// way.
func BuildGuest() (path string, cleanup func(), err error) {
	return build("moat-guest")
}

// DirEnv names a directory holding moat and moat-guest already built, for
// test binaries run where no Go toolchain is (internal/testvm's VMs).
const DirEnv = "MOAT_TESTBIN_DIR"

func build(name string) (path string, cleanup func(), err error) {
	if dir := os.Getenv(DirEnv); dir != "" {
		path = filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			return "", nil, fmt.Errorf("$%s: %w", DirEnv, err)
		}
		return path, func() {}, nil
	}
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
	path = filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", path, "github.com/moat-sandbox/moat/cmd/"+name)
	// CGO_ENABLED=0: a static binary, which the gvisor and microvm tiers
	// run inside sandboxes whose libraries are not its own.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return "", nil, fmt.Errorf("build %s: %v\n%s", name, err, out)
	}
	return path, cleanup, nil
}
