package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/result"
)

// TestRunPolicy: moat run --policy (or MOAT_POLICY) refuses a local run
// beyond the default ceiling, or widening without a justification, with
// exit 2 before anything starts, naming the field, value and ceiling.
func TestRunPolicy(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte("default:\n  resources:\n    memory: 1GiB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("default:\n  resources:\n    memroy: 1GiB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	justified := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(justified, []byte("resources: {memory: 2GiB}\njustifications: {resources.memory: pandas}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     []string
		wantErr []string
	}{
		{"beyond the ceiling", []string{"--policy", pol, "--manifest", justified, "--", "true"}, nil,
			[]string{"refused by policy", "manifest.resources.memory: 2GiB exceeds the default ceiling 1GiB (policy " + pol + ")"}},
		{"from MOAT_POLICY", []string{"--manifest", justified, "--", "true"}, []string{"MOAT_POLICY=" + pol},
			[]string{"manifest.resources.memory: 2GiB exceeds"}},
		{"unjustified flag", []string{"--policy", pol, "--memory", "1GiB", "--", "true"}, nil,
			[]string{"resources.memory: 1GiB widens Moat's default 512MiB without a justification", "justifications: {resources.memory:"}},
		{"policy file with an unknown key", []string{"--policy", bad, "--", "true"}, nil,
			[]string{bad, "default.resources.memroy", "not a known key"}},
		{"missing policy file", []string{"--policy", filepath.Join(dir, "none.yaml"), "--", "true"}, nil,
			[]string{"none.yaml"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if os.Geteuid() == 0 {
				watchLeftovers(t)
			}
			out := moat(t, invocation{args: append([]string{"run"}, tc.args...), env: tc.env})
			out.check(t, exitUsage, nil, tc.wantErr, nil)
			if out.stdout != "" {
				t.Errorf("a refused run printed on stdout: %q", out.stdout)
			}
		})
	}
}

// TestPolicySuggestCeilings: moat policy suggest --ceilings prints a
// policy that loads and admits every manifest it was learnt from.
func TestPolicySuggestCeilings(t *testing.T) {
	_, env := auditEnv(t)
	db := filepath.Join(t.TempDir(), "audit.db")
	st, err := audit.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{
		"r1": "resources: {memory: 1GiB}\njustifications: {resources.memory: pandas}",
		"r2": "network: {mode: allowlist, allow: [pypi.org]}\njustifications: {network.allow: wheels}",
	}
	keys := map[string]string{"r1": "kA", "r2": "kB"}
	for id, doc := range docs {
		m, err := manifest.Parse([]byte(doc), "m.yaml")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(m)
		rec := audit.Record{ID: id, KeyID: keys[id], Kind: audit.KindRun, Started: time.Now().UTC(), Tier: m.Tier, Image: m.Image, Manifest: string(b)}
		if err := st.Begin(rec); err != nil {
			t.Fatal(err)
		}
		if err := st.Finish(id, &result.Result{Termination: result.Exited, DurationMS: 1000, PeakMemoryBytes: 10 << 20}, nil); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	out := moat(t, invocation{args: []string{"policy", "suggest", "--ceilings", "--db", db}, env: env})
	out.check(t, 0, []string{"moat serve --policy", "kA:", "kB:", "- pypi.org"}, nil, nil)
	p, err := policy.Parse([]byte(out.stdout), "suggested.yaml")
	if err != nil {
		t.Fatalf("the suggestion does not load: %v\n%s", err, out.stdout)
	}
	for id, doc := range docs {
		m, _ := manifest.Parse([]byte(doc), "m.yaml")
		if err := p.Check(keys[id], m); err != nil {
			t.Errorf("record %s is refused by the suggestion: %v", id, err)
		}
		other := map[string]string{"kA": "kB", "kB": "kA"}[keys[id]]
		if err := p.Check(other, m); err == nil {
			t.Errorf("record %s of %s is admitted for %s too: ceilings are per key", id, keys[id], other)
		}
	}
	out = moat(t, invocation{args: []string{"policy", "suggest", "--ceilings", "--json", "--db", db}, env: env})
	out.check(t, 0, []string{`"policy"`, `"require_justifications": true`}, nil, nil)
}

// TestRunPolicyAdmits: a local run within the policy's ceiling, with its
// widening justified, runs, and its result carries the justification.
func TestRunPolicyAdmits(t *testing.T) {
	needSandbox(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	m := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(pol, []byte("default:\n  resources:\n    memory: 1GiB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m, []byte("resources: {memory: 1GiB}\njustifications: {resources.memory: pandas on a 700MB frame}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, out := runJSON(t, invocation{args: []string{"--policy", pol, "--manifest", m, "--", "true"}})
	if out.code != 0 || res.ExitCode != 0 {
		t.Fatalf("admitted run failed: %s", out)
	}
	if got := res.Justifications["resources.memory"]; got != "pandas on a 700MB frame" {
		t.Errorf("result justifications = %v", res.Justifications)
	}
}

// TestServePolicyInvalid: moat serve refuses to start with a policy file
// it cannot parse, naming the file and the field.
func TestServePolicyInvalid(t *testing.T) {
	_, env := auditEnv(t)
	bad := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(bad, []byte("keys:\n  ka:\n    tiers: [docker]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := moat(t, invocation{args: []string{"serve", "--listen", "127.0.0.1:0", "--pool", "0", "--session-pool", "0", "--policy", bad}, env: env})
	out.check(t, exitUsage, nil, []string{bad, "keys.ka.tiers[0]", "docker"}, nil)
}
