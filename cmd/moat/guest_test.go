package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBuildPairMatches: moat and moat-guest as scripts/build-pair builds
// them (what scripts/setup installs) are recognised as one source, so that
// moat runs moat-guest inside its sandboxes; and a run works with it.
// (With -trimpath Go leaves -ldflags out of the build information, and
// setup's pair silently fell back to moat itself.)
func TestBuildPairMatches(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	if os.Geteuid() != 0 {
		t.Skip("needs root: moat-guest must be root-owned, and a run needs the native tier")
	}
	// As scripts/setup's /usr/local/lib/moat: reachable by others, since
	// the sandbox's init executes it as an unprivileged host id.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	moat, guest := filepath.Join(dir, "moat"), filepath.Join(dir, "moat-guest")
	if out, err := exec.Command("../../scripts/build-pair", moat, guest).CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-pair: %v\n%s", err, out)
	}
	doctor := exec.Command(moat, "doctor")
	doctor.Env = append(os.Environ(), "MOAT_GUEST="+guest)
	out, _ := doctor.CombinedOutput()
	if want := "inside sandboxes: " + guest + " (built from the same source"; !strings.Contains(string(out), want) {
		t.Fatalf("moat doctor does not use the pair's moat-guest; want %q in:\n%s", want, out)
	}
	run := exec.Command(moat, "run", "--no-build", "--", "python3", "-c", "print(6*7)")
	run.Env = doctor.Env
	if out, err := run.CombinedOutput(); err != nil || string(out) != "42\n" {
		t.Errorf("moat run with moat-guest: %v: %q", err, out)
	}
}
