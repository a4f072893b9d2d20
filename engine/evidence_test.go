package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/manifest"
)

// TestIncidentEvidenceNative runs real native sandboxes: a run that
// prints a canary is flagged and leaves a bundle with the expected files
// (and its stolen file), and nothing else of the sandbox (no run
// directory, cgroup or mount); a clean run and an engine with evidence
// turned off leave no bundle.
func TestIncidentEvidenceNative(t *testing.T) {
	bin := nativeTestBin(t)
	st := incident.Open(filepath.Join(t.TempDir(), "incidents"), incident.Policy{})
	on, err := New(Options{Exe: bin, NoAutoBuild: true, Incidents: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { on.Close() })
	if _, err := on.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	off, err := New(Options{Exe: bin, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { off.Close() })

	tests := []struct {
		name     string
		e        *Engine
		script   string
		session  bool
		withhold bool
		flagged  bool
		bundle   bool
	}{
		{name: "canary printed", e: on, script: "cp .aws/credentials loot.txt; cat .aws/credentials", flagged: true, bundle: true},
		{name: "canary printed, output withheld from the caller", e: on, script: "cp .aws/credentials loot.txt; cat .aws/credentials", withhold: true, flagged: true, bundle: true},
		{name: "canary printed through a session sandbox", e: on, script: "cat .netrc", session: true, flagged: true, bundle: true},
		{name: "clean run", e: on, script: "echo hello > out.txt"},
		{name: "evidence off", e: off, script: "cat .aws/credentials", flagged: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			m.Output.Canaries = true
			m.Output.WithholdFlagged = tc.withhold
			before, _ := st.List()
			res, err := tc.e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"sh", "-c", tc.script}, Session: tc.session,
				Evidence: Evidence{Key: "ktest", Audit: json.RawMessage(`{"id":"audit-of-the-run"}`)}})
			if err != nil {
				t.Fatal(err)
			}
			if got := incident.Flagged(res); got != tc.flagged {
				t.Fatalf("flagged = %v, want %v (violations %v)", got, tc.flagged, res.Violations)
			}
			after, _ := st.List()
			if !tc.bundle {
				if res.Incident != "" || len(after) != len(before) {
					t.Fatalf("incident %q kept, bundles %d -> %d; want none", res.Incident, len(before), len(after))
				}
				return
			}
			if res.Incident == "" || len(after) != len(before)+1 {
				t.Fatalf("incident %q, bundles %d -> %d; want one new (degradations %v)", res.Incident, len(before), len(after), res.Degradations)
			}
			sum, err := st.Get(res.Incident)
			if err != nil {
				t.Fatal(err)
			}
			if sum.RunID != res.ID || sum.Key != "ktest" || len(sum.Reasons) == 0 || !strings.HasPrefix(sum.Reasons[0], "canary") {
				t.Errorf("summary %+v", sum)
			}
			dir, _ := st.Path(sum.ID)
			for _, f := range []string{"manifest.json", "commands.json", "result.json", "network.json", "processes.json", "audit.json", "workspace.json", "summary.json"} {
				fi, err := os.Stat(filepath.Join(dir, f))
				if err != nil || fi.Mode().Perm() != 0o400 {
					t.Errorf("%s: %v %v, want a 0400 file", f, fi.Mode(), err)
				}
				if !slices.Contains(sum.Files, f) {
					t.Errorf("summary does not list %s", f)
				}
			}
			if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o500 {
				t.Errorf("bundle directory: %v %v, want 0500", fi.Mode(), err)
			}
			b, _ := os.ReadFile(filepath.Join(dir, "result.json"))
			if !strings.Contains(string(b), `"kind": "canary"`) {
				t.Errorf("result.json lacks the canary violation: %.500s", b)
			}
			// The evidence holds the output, even what the caller was not
			// given.
			if !strings.Contains(string(b), "aws_access_key_id") && !tc.session {
				t.Errorf("result.json lacks the printed credentials: %.800s", b)
			}
			if tc.withhold && (!res.Withheld || strings.Contains(res.Stdout.Data, "aws_access_key_id") || len(res.Files) != 0) {
				t.Errorf("the caller's result is not withheld: withheld=%v stdout=%q files=%v", res.Withheld, res.Stdout.Data, res.Files)
			}
			b, _ = os.ReadFile(filepath.Join(dir, "audit.json"))
			if string(b) != `{"id":"audit-of-the-run"}` {
				t.Errorf("audit.json = %q", b)
			}
			b, _ = os.ReadFile(filepath.Join(dir, "processes.json"))
			if !strings.Contains(string(b), `"processes"`) {
				t.Errorf("processes.json = %q", b)
			}
			if !tc.session {
				b, _ = os.ReadFile(filepath.Join(dir, "workspace", "1"))
				if !strings.Contains(string(b), "aws_access_key_id") {
					t.Errorf("workspace/1 = %q, want the stolen credentials file", b)
				}
			}
			// Everything else of the sandbox is gone.
			var left []string
			if _, err := os.Stat(filepath.Join(on.Home(), "runs", res.ID)); err == nil {
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
				t.Errorf("flagged run %s left residual state: %s", res.ID, strings.Join(left, "; "))
			}
		})
	}
}

// TestIncidentEvidenceSession: a session's command that ends flagged
// (here by SIGSYS, which the result reports as a seccomp kill) keeps a
// bundle with its file while the session goes on; a clean command of the
// same session keeps none.
func TestIncidentEvidenceSession(t *testing.T) {
	bin := nativeTestBin(t)
	st := incident.Open(filepath.Join(t.TempDir(), "incidents"), incident.Policy{})
	e, err := New(Options{Exe: bin, NoAutoBuild: true, Incidents: st})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	s, err := e.NewSession(context.Background(), &SessionRequest{Manifest: manifest.Default()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	tests := []struct {
		name   string
		script string
		bundle bool
	}{
		{"clean command", "echo fine > ok.txt", false},
		{"seccomp-style kill", "echo loot > loot.txt; kill -SYS $$", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := s.Start(context.Background(), &ExecRequest{Argv: []string{"sh", "-c", tc.script}, Evidence: Evidence{Key: "ksession"}})
			if err != nil {
				t.Fatal(err)
			}
			<-pr.Done()
			res := pr.Result()
			if (res.Incident != "") != tc.bundle {
				t.Fatalf("incident %q, want one: %v (violations %v, degradations %v)", res.Incident, tc.bundle, res.Violations, res.Degradations)
			}
			if !tc.bundle {
				return
			}
			sum, err := st.Get(res.Incident)
			if err != nil {
				t.Fatal(err)
			}
			if sum.Key != "ksession" || !strings.HasPrefix(sum.Reasons[0], "syscall") {
				t.Errorf("summary %+v", sum)
			}
			dir, _ := st.Path(sum.ID)
			if b, err := os.ReadFile(filepath.Join(dir, "workspace", "1")); err != nil || string(b) != "loot\n" {
				t.Errorf("workspace/1 = %q (%v), want the command's file", b, err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "processes.json")); !strings.Contains(string(b), `"pid"`) {
				t.Errorf("processes.json = %s, want the session's live processes (its init at least)", b)
			}
		})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(e.Home(), "runs", s.ID())); err == nil {
		t.Errorf("session %s left its run directory", s.ID())
	}
}
