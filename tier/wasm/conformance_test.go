package wasm_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/tier/tiertest"
	"github.com/moat-sandbox/moat/tier/wasm"
)

// TestConformance runs the shared table. Cases that need Linux programs (a
// shell, coreutils, /proc) or the kernel's CPU-time accounting are printed
// as not applicable; this package's own tests cover their WebAssembly
// counterparts (TestIsolation, TestLimits).
func TestConformance(t *testing.T) {
	w, err := wasm.New(wasm.Options{})
	if err != nil {
		if os.Getenv("MOAT_REQUIRE_WASM") == "" {
			t.Skipf("wasm tier unavailable: %v", err)
		}
		t.Fatal(err)
	}
	defer w.Close()
	// The wasm tier runs its own guests, not an image's programs: it
	// reads only the image's environment, so none is given.
	tiertest.Run(t, tiertest.Target{Tier: w, Leftovers: leftovers(t.TempDir())})
}

// leftovers lists what run id left: its run directory, and any file this
// process still holds open below it.
func leftovers(home string) tiertest.Leftovers {
	return func(id string) []string {
		var left []string
		dir := filepath.Join(home, "runs", id)
		if _, err := os.Stat(dir); err == nil {
			left = append(left, "run directory "+dir)
		}
		fds, _ := filepath.Glob("/proc/self/fd/*")
		for _, fd := range fds {
			if target, err := os.Readlink(fd); err == nil && strings.Contains(target, id) {
				left = append(left, fmt.Sprintf("open file %s -> %s", fd, target))
			}
		}
		return left
	}
}
