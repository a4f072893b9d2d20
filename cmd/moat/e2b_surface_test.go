package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// The checks surface.cjs runs; each must print "ok <name>".
var e2bSurfaceChecks = []string{"metadata", "watch-entry", "getMetrics", "updateNetwork", "kill-by-pid", "git"}

// TestServeE2BSurface drives `moat serve --e2b` with the newest e2b
// release (testdata/e2b/surface.cjs) through the parts of issue 22 §4
// that envd 0.6.4 implies (file metadata, watch entries), getMetrics,
// updateNetwork, process ids a sandbox's own kill reaches, and git in
// the default template; then checks the network change was audited.
func TestServeE2BSurface(t *testing.T) {
	needRoot(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node (scripts/setup installs nodejs): " + err.Error())
	}
	if v, err := exec.Command(node, "-p", "process.versions.node").Output(); err != nil || !nodeAtLeast(strings.TrimSpace(string(v)), 20, 18) {
		t.Skipf("the e2b SDK needs node 20.18 or newer; %s is %q (%v)", node, strings.TrimSpace(string(v)), err)
	}
	sdk := e2bSDK(t, e2bReleases[0].dir)
	if _, err := os.Stat(sdk + "/e2b/package.json"); err != nil {
		t.Skipf("the e2b npm package %s is not installed at %s (scripts/setup installs it): %v", e2bReleases[0].version, sdk, err)
	}
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--e2b", "--pool", "0", "--session-pool", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/e2b/surface.cjs")
	cmd.Env = append(os.Environ(), "NODE_PATH="+sdk, "E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url, "E2B_API_KEY="+key)
	out, err := cmd.CombinedOutput()
	t.Logf("surface.cjs:\n%s", out)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	for _, name := range e2bSurfaceChecks {
		if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(name) + `$`).Match(out) {
			t.Errorf("check %s did not pass", name)
		}
	}
	if err != nil || !bytes.Contains(out, []byte("\nPASS\n")) {
		t.Fatalf("surface.cjs failed: %v", err)
	}
	main := regexp.MustCompile(`(?m)^sandbox (\S+)$`).FindSubmatch(out)
	s.terminate(t, time.Minute)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("residue after the E2B sandboxes ended:\n%s", strings.Join(left, "\n"))
	}
	if main == nil {
		t.Fatal("surface.cjs did not name its sandbox")
	}
	recs := s.auditRecords(t)
	// One update let through, one refused by the manifest's rules: both
	// in the audit log, against the sandbox.
	n := 0
	for _, r := range recs {
		if r.Kind == audit.KindNetwork && r.SandboxID == string(main[1]) {
			n++
			if r.Ended.IsZero() || !slices.Contains(strings.Split(r.Manifest, `"`), "example.org") {
				t.Errorf("network record %+v", r)
			}
		}
	}
	if n < 1 {
		t.Errorf("%d network updates of sandbox %s audited, want at least the one made", n, main[1])
	}
}
