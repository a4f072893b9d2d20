package main

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// incidentHome is a temporary MOAT_HOME with one bundle in it, whose
// cleanup can remove the read-only bundle without root.
func incidentHome(t *testing.T) (env []string, sum incident.Summary) {
	t.Helper()
	home, env := auditEnv(t)
	// The home as the engine makes it (0711), so moat gc accepts it.
	if err := os.MkdirAll(home, 0o711); err != nil {
		t.Fatal(err)
	}
	os.Chmod(home, 0o711)
	dir := engine.IncidentDir(home)
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o700)
			}
			return nil
		})
	})
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"api.example.com"}
	m.Secrets = []manifest.Secret{{Name: "gh-token", Hosts: []string{"api.example.com"}}}
	m.Inputs = []manifest.Input{{Src: "/srv/data", Dst: "data"}}
	sum, err := incident.Open(dir, incident.Policy{}).Keep(&incident.Evidence{
		Key: "k0123456789ab", Manifest: m, Commands: [][]string{{"sh", "-c", "printf '\x1b]0;pwned\x07'"}},
		Result: &result.Result{ID: "r1", Tier: "native", Violations: []result.Violation{{Kind: "canary", Detail: "decoy in stdout \x1b[31m"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return env, sum
}

func TestIncidentCLI(t *testing.T) {
	env, sum := incidentHome(t)
	env = append(env, "MOAT_INCIDENTS=on")
	exportTo := filepath.Join(t.TempDir(), "bundle.tar.gz")
	existing := filepath.Join(t.TempDir(), "existing")
	os.WriteFile(existing, []byte("keep"), 0o644)
	tests := []struct {
		name             string
		args             []string
		code             int
		wantOut, wantErr []string
		notWant          []string
	}{
		{name: "list", args: []string{"incident", "list"}, wantOut: []string{"ID", "WHY", sum.ID, "r1", "k0123456789ab", "canary: decoy in stdout"}, notWant: []string{"\x1b"}},
		{name: "list --json", args: []string{"incident", "list", "--json"}, wantOut: []string{`"id": "` + sum.ID, `"run_id": "r1"`, `"reasons"`, `"bytes"`}},
		{name: "show", args: []string{"incident", "show", sum.ID}, wantOut: []string{"incident " + sum.ID, "why flagged", "canary", "result.json", "audit.json",
			"exposure", "/srv/data -> /workspace/data", "api.example.com", "gh-token -> api.example.com",
			"moat keys revoke k0123456789ab", "moat secrets rotate gh-token", "moat incident export " + sum.ID}, notWant: []string{"\x1b"}},
		{name: "show --json", args: []string{"incident", "show", "--json", sum.ID}, wantOut: []string{`"exposure"`, `"dir"`}},
		{name: "show unknown id", args: []string{"incident", "show", "20200101T000000Z-00000000"}, code: exitUsage, wantErr: []string{"no such incident", "moat incident list"}},
		{name: "show malformed id", args: []string{"incident", "show", "../../etc"}, code: exitUsage, wantErr: []string{"not an incident id"}},
		{name: "show without id", args: []string{"incident", "show"}, code: exitUsage, wantErr: []string{"want 1 argument"}},
		{name: "export", args: []string{"incident", "export", sum.ID, exportTo}, wantErr: []string{"exported incident " + sum.ID}},
		{name: "export refuses to overwrite", args: []string{"incident", "export", sum.ID, existing}, code: exitUsage, wantErr: []string{"exists", "never overwrites"}},
		{name: "export unknown id", args: []string{"incident", "export", "20200101T000000Z-00000000", filepath.Join(t.TempDir(), "x")}, code: exitUsage, wantErr: []string{"no such incident"}},
		{name: "rm unknown id", args: []string{"incident", "rm", "nope"}, code: exitUsage, wantErr: []string{"not an incident id"}},
		{name: "unknown subcommand", args: []string{"incident", "frob"}, code: exitUsage, wantErr: []string{"accepted: list, show, export, rm"}},
		{name: "rm", args: []string{"incident", "rm", sum.ID}, wantErr: []string{"removed incident " + sum.ID}},
		{name: "list after rm", args: []string{"incident", "list"}, wantErr: []string{"no incidents"}},
		{name: "show after rm", args: []string{"incident", "show", sum.ID}, code: exitUsage, wantErr: []string{"no such incident"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			moat(t, invocation{args: tc.args, env: env}).check(t, tc.code, tc.wantOut, tc.wantErr, tc.notWant)
		})
	}
	if fi, err := os.Stat(exportTo); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("export %s: %v, want mode 0600", exportTo, err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Errorf("export overwrote %s: %q", existing, b)
	}
}

func TestIncidentPolicyEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     string
		wantErr string
	}{
		{"bad size", "MOAT_INCIDENT_MAX_TOTAL=lots", "MOAT_INCIDENT_MAX_TOTAL=\"lots\" is not a positive size"},
		{"negative age", "MOAT_INCIDENT_MAX_AGE=-1h", "MOAT_INCIDENT_MAX_AGE=\"-1h\" is not a positive duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, env := auditEnv(t)
			moat(t, invocation{args: []string{"gc"}, env: append(env, tc.env)}).check(t, exitUsage, nil, []string{tc.wantErr}, nil)
		})
	}
	// gc prunes what is past the age.
	env, sum := incidentHome(t)
	moat(t, invocation{args: []string{"gc"}, env: append(env, "MOAT_INCIDENT_MAX_AGE=1ns")}).check(t, 0, []string{"pruned 1 incident bundles"}, nil, nil)
	moat(t, invocation{args: []string{"incident", "show", sum.ID}, env: env}).check(t, exitUsage, nil, []string{"no such incident"}, nil)
}

// TestRunKeepsIncident: a real moat run that prints a canary names its
// bundle in the result, and moat incident shows it; --no-incidents keeps
// none.
func TestRunKeepsIncident(t *testing.T) {
	needSandbox(t)
	res, _ := runJSON(t, invocation{args: []string{"--no-incidents", "--canaries", "--approve", "--", "cat", ".aws/credentials"}, env: []string{"MOAT_INCIDENTS=on"}})
	if res.Incident != "" {
		t.Errorf("--no-incidents kept incident %s", res.Incident)
	}
	on := []string{"MOAT_INCIDENTS=on"}
	res, _ = runJSON(t, invocation{args: []string{"--canaries", "--approve", "--", "cat", ".aws/credentials"}, env: on})
	if res.Incident == "" {
		t.Fatalf("a canary run kept no incident: violations %v degradations %v", res.Violations, res.Degradations)
	}
	t.Cleanup(func() {
		moat(t, invocation{args: []string{"incident", "rm", res.Incident}})
		os.Remove(engine.IncidentDir(engine.DefaultHome())) // only when empty
	})
	out := moat(t, invocation{args: []string{"incident", "show", "--json", res.Incident}})
	out.check(t, 0, []string{`"run_id": "` + res.ID + `"`, "canary"}, nil, nil)
	var sum incident.Summary
	if err := json.Unmarshal([]byte(out.stdout), &sum); err != nil || !strings.HasPrefix(sum.Reasons[0], "canary") {
		t.Errorf("show --json: %v %+v", err, sum)
	}
}
