package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// The conformance cases that need more than a tier: a manifest, the output
// caps and their violations, inputs copied in and the workspace diff, the
// egress proxy. They were rows of tier/tiertest's table; that suite now
// tests tiers at the tier.Tier abstraction alone, and these run here, end
// to end through Engine.Run, on every registered tier this host can run.

// e2eCase is one row of the end-to-end table.
type e2eCase struct {
	Name string
	// Setup runs on the host before the run and returns values the
	// command and check use (canary paths, ports).
	Setup func(t *testing.T) map[string]string
	// Manifest adjusts the default manifest.
	Manifest func(m *manifest.Manifest, env map[string]string)
	// Argv is the command; "{key}" is replaced by Setup's values.
	Argv []string
	// Check inspects the result (and host state).
	Check func(t *testing.T, res *result.Result, env map[string]string)
	// Needs names the tier capabilities the case checks (tiertest.Needs).
	Needs []string
}

func TestConformanceEndToEnd(t *testing.T) {
	bin := nativeTestBin(t)
	e, err := New(Options{Exe: bin, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	for _, name := range tier.List() {
		t.Run(name, func(t *testing.T) {
			tr, err := e.Tier(name)
			if errors.Is(err, tier.ErrUnavailable) {
				t.Skipf("the %s tier is unavailable here: %v", name, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range e2eCases() {
				t.Run(tc.Name, func(t *testing.T) {
					tiertest.SkipUnless(t, name, tr.Capabilities(), tc.Needs)
					runE2E(t, e, name, tc)
				})
			}
		})
	}
}

func runE2E(t *testing.T, e *Engine, tierName string, tc e2eCase) {
	t.Helper()
	env := map[string]string{}
	if tc.Setup != nil {
		env = tc.Setup(t)
	}
	m := manifest.Default()
	m.Tier = tierName
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if tc.Manifest != nil {
		tc.Manifest(m, env)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("test manifest invalid: %v", err)
	}
	argv := make([]string, len(tc.Argv))
	for i, a := range tc.Argv {
		for k, v := range env {
			a = strings.ReplaceAll(a, "{"+k+"}", v)
		}
		argv[i] = a
	}
	res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: argv})
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	if res.Tier != tierName {
		t.Errorf("result tier = %q, want %q", res.Tier, tierName)
	}
	tc.Check(t, res, env)
	// Whatever the tier, the engine leaves no run directory, and no
	// cgroup or mount names the run.
	var left []string
	if _, err := os.Stat(filepath.Join(e.Home(), "runs", res.ID)); err == nil {
		left = append(left, "run directory")
	}
	for _, pat := range []string{"/sys/fs/cgroup/*/moat/" + res.ID, "/sys/fs/cgroup/moat/" + res.ID, "/sys/fs/cgroup/*/*/moat/" + res.ID} {
		m, _ := filepath.Glob(pat)
		left = append(left, m...)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), res.ID) {
		left = append(left, "a mount mentioning the run")
	}
	if len(left) > 0 {
		t.Errorf("run %s left residual state: %s", res.ID, strings.Join(left, "; "))
	}
	if t.Failed() {
		t.Logf("result: termination=%s exit=%d signal=%d stdout=%q stderr=%q violations=%v",
			res.Termination, res.ExitCode, res.Signal, clipE2E(res.Stdout.Data), clipE2E(res.Stderr.Data), res.Violations)
	}
}

func clipE2E(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

func secret() string {
	var b [12]byte
	rand.Read(b[:])
	return "moat-canary-" + hex.EncodeToString(b[:])
}

// py runs a Python snippet.
func py(code string) []string { return []string{"python3", "-c", code} }

func wantExit(t *testing.T, res *result.Result, code int) {
	t.Helper()
	if res.Termination != result.Exited || res.ExitCode != code {
		t.Errorf("termination=%s exit=%d, want exited with %d", res.Termination, res.ExitCode, code)
	}
}

func hasViolation(res *result.Result, kind string) bool {
	for _, v := range res.Violations {
		if v.Kind == kind {
			return true
		}
	}
	return false
}

// e2eCases is the end-to-end table.
func e2eCases() []e2eCase {
	return append([]e2eCase{
		{
			Name:  "stdout flood is capped and counted",
			Needs: []string{"linux-programs"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Resources.StdoutBytes = 1 * manifest.MiB
			},
			Argv: []string{"head", "-c", "100000000", "/dev/zero"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				wantExit(t, res, 0)
				if !res.Stdout.Truncated || res.Stdout.Bytes != 100000000 {
					t.Errorf("stdout truncated=%v bytes=%d, want truncated, 100000000", res.Stdout.Truncated, res.Stdout.Bytes)
				}
				if len(res.Stdout.Data) > 2<<20 { // base64 of 1 MiB is 1.33 MiB
					t.Errorf("captured %d bytes, cap is 1 MiB", len(res.Stdout.Data))
				}
				if !hasViolation(res, "output") {
					t.Errorf("no output violation: %v", res.Violations)
				}
			},
		},
		{
			Name:  "filling the disk stops at the workspace limit",
			Needs: []string{"linux-programs"},
			Manifest: func(m *manifest.Manifest, _ map[string]string) {
				m.Workspace.Size = 8 * manifest.MiB
			},
			Argv: []string{"sh", "-c", "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; ls -l /workspace/big"},
			Check: func(t *testing.T, res *result.Result, _ map[string]string) {
				if !strings.Contains(res.Stdout.Data, "No space left on device") {
					t.Errorf("dd did not hit ENOSPC: %q", res.Stdout.Data)
				}
				if !hasViolation(res, "disk") {
					t.Errorf("no disk violation: %v", res.Violations)
				}
				for _, f := range res.Files {
					if f.Path == "big" && f.Size > 8<<20 {
						t.Errorf("file grew to %d bytes past the 8 MiB workspace", f.Size)
					}
				}
			},
		},
		{
			Name:  "workspace diff and inputs",
			Needs: []string{"linux-programs"},
			Setup: func(t *testing.T) map[string]string {
				dir := t.TempDir()
				os.WriteFile(filepath.Join(dir, "keep.txt"), []byte("keep"), 0o644)
				os.WriteFile(filepath.Join(dir, "change.txt"), []byte("old"), 0o644)
				os.WriteFile(filepath.Join(dir, "gone.txt"), []byte("bye"), 0o644)
				return map[string]string{"dir": dir}
			},
			Manifest: func(m *manifest.Manifest, env map[string]string) {
				m.Inputs = []manifest.Input{{Src: env["dir"], Dst: "task"}}
			},
			Argv: []string{"sh", "-c", "cat task/keep.txt; echo new > task/change.txt; rm task/gone.txt; echo hi > made.txt"},
			Check: func(t *testing.T, res *result.Result, env map[string]string) {
				wantExit(t, res, 0)
				if res.Stdout.Data != "keep" {
					t.Errorf("input not copied in: stdout %q", res.Stdout.Data)
				}
				want := map[string]result.Change{"task/change.txt": result.Modified, "task/gone.txt": result.Deleted, "made.txt": result.Added}
				got := map[string]result.Change{}
				for _, f := range res.Files {
					got[f.Path] = f.Change
				}
				for p, c := range want {
					if got[p] != c {
						t.Errorf("diff[%s] = %q, want %q (diff %v)", p, got[p], c, res.Files)
					}
				}
				if _, ok := got["task/keep.txt"]; ok {
					t.Errorf("unchanged file reported in the diff")
				}
				// Copied, never mounted: the host original is untouched.
				if b, _ := os.ReadFile(filepath.Join(env["dir"], "change.txt")); string(b) != "old" {
					t.Errorf("host input was modified: %q", b)
				}
				if _, err := os.Stat(filepath.Join(env["dir"], "gone.txt")); err != nil {
					t.Errorf("host input was deleted: %v", err)
				}
			},
		},
	}, e2eEgressCases()...)
}

// e2eEgressCases need Moat's egress proxy: the sandbox reaches a granted host
// on the host's loopback through HTTP_PROXY, and nothing else, neither a
// host that is not granted nor anything without the proxy (TCP, UDP, raw
// sockets, its own DNS).
func e2eEgressCases() []e2eCase {
	var grantedHits, otherHits *atomic.Int64
	return []e2eCase{{
		Name:  "egress: only the granted host, only through the proxy",
		Needs: []string{"network-egress"},
		Setup: func(t *testing.T) map[string]string {
			env := map[string]string{"granted_body": secret(), "other_body": secret()}
			env["granted"], grantedHits = tiertest.HTTPServer(t, env["granted_body"], 0)
			env["other"], otherHits = tiertest.HTTPServer(t, env["other_body"], 0)
			return env
		},
		Manifest: func(m *manifest.Manifest, env map[string]string) {
			m.Network.Mode = "allowlist"
			m.Network.Allow = []string{"localhost:" + env["granted"]}
			// The test servers live on the host's loopback, which only
			// an explicit address grant opens.
			m.Network.AllowAddresses = tiertest.LoopbackAddresses
		},
		Argv: py(`
import socket, urllib.request
def get(port):
    try:
        return urllib.request.urlopen("http://localhost:%s/" % port, timeout=5).read().decode()
    except Exception as e:
        return "ERR " + type(e).__name__
print("granted", get({granted}))
print("other", get({other}))
for host in ["127.0.0.1", "10.0.2.2", "8.8.8.8"]:
    try:
        socket.create_connection((host, {granted}), timeout=2); print("DIRECT", host)
    except OSError as e:
        print("direct refused", host, e.errno)
# The grant opens the proxy and nothing else: no resolver, no UDP out, no
# raw sockets.
try:
    socket.getaddrinfo("example.com", 80); print("RESOLVED")
except OSError as e:
    print("no dns", e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)); print("DIRECT udp")
except OSError as e:
    print("udp refused", e.errno)
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("DIRECT raw")
except OSError as e:
    print("raw refused", e.errno)
`),
		Check: func(t *testing.T, res *result.Result, env map[string]string) {
			wantExit(t, res, 0)
			if !strings.Contains(res.Stdout.Data, "granted "+env["granted_body"]) {
				t.Errorf("the granted server was not reached through the proxy: %q", res.Stdout.Data)
			}
			if strings.Contains(res.Stdout.Data, env["other_body"]) || otherHits.Load() != 0 {
				t.Errorf("the server that is not granted was reached (%d hits)", otherHits.Load())
			}
			if strings.Contains(res.Stdout.Data, "DIRECT") {
				t.Errorf("a direct connection bypassed the proxy: %q", res.Stdout.Data)
			}
			if strings.Contains(res.Stdout.Data, "RESOLVED") {
				t.Errorf("the sandbox resolved a name itself: %q", res.Stdout.Data)
			}
			if grantedHits.Load() != 1 {
				t.Errorf("granted server hits = %d, want 1", grantedHits.Load())
			}
			var allowed, refused bool
			for _, a := range res.Network {
				switch {
				case a.Allowed && strconv.Itoa(a.Port) == env["granted"]:
					allowed = true
				case !a.Allowed && strconv.Itoa(a.Port) == env["other"]:
					refused = true
				}
			}
			if !allowed || !refused {
				t.Errorf("network log lacks the allowed (%v) or the refused (%v) attempt: %+v", allowed, refused, res.Network)
			}
		},
	}}
}
