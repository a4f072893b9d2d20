package policy

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string // substrings of the error; nil: parses
	}{
		{"empty document", "", nil},
		{"example", mustRead(t, "testdata/example.yaml"), nil},
		{"json", `{"default": {"resources": {"memory": "1GiB"}}}`, nil},
		{"unknown top-level key", "defaults: {}\n", []string{"defaults", "is not a known key"}},
		{"unknown ceiling key", "default:\n  resources:\n    memroy: 1GiB\n", []string{"default.resources.memroy", "is not a known key"}},
		{"duplicate key with lines", "keys:\n  a: {}\n  a: {}\n", []string{"keys.a", "lines 2 and 3"}},
		{"quoted number", "default:\n  resources:\n    pids: \"10\"\n", []string{"default.resources.pids", "remove the quotes"}},
		{"memory out of range", "keys:\n  ci:\n    resources:\n      memory: 1TiB\n", []string{"keys.ci.resources.memory", "out of range"}},
		{"unknown tier", "default:\n  tiers: [docker]\n", []string{"default.tiers[0]", "docker"}},
		{"bad rule", "keys:\n  ci:\n    network:\n      mode: allowlist\n      allow: [\"*.com\"]\n", []string{"keys.ci.network.allow[0]"}},
		{"bad address", "default:\n  network:\n    mode: allowlist\n    allow_addresses: [nonsense]\n", []string{"default.network.allow_addresses[0]"}},
		{"bad mode", "default:\n  network:\n    mode: open\n", []string{"default.network.mode"}},
		{"bad secret name", "default:\n  secrets: [\"Bad Name\"]\n", []string{"default.secrets[0]"}},
		{"versioned package", "default:\n  packages:\n    pypi:\n      allow: [\"requests==2.31.0\"]\n", []string{"default.packages.pypi.allow[0]", "bare package name"}},
		{"bad index", "default:\n  packages:\n    npm:\n      indexes: [\"ftp://x\"]\n", []string{"default.packages.npm.indexes[0]"}},
		{"bad typosquat", "default:\n  packages:\n    typosquat: maybe\n", []string{"default.packages.typosquat", "maybe"}},
		{"not a mapping", "- a\n", []string{"expected a mapping"}},
		{"null key entry", "keys:\n  ci:\n", []string{"keys.ci", "has no value"}},
		{"anchor", "default: &a {}\nkeys:\n  x: *a\n", []string{"anchor"}},
		{"bool as string", "require_justifications: \"no\"\n", []string{"require_justifications", "true or false"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			name := "policy.yaml"
			if strings.HasPrefix(tc.doc, "{") {
				name = "policy.json"
			}
			p, err := Parse([]byte(tc.doc), name)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				if p.Source != name {
					t.Errorf("Source = %q, want %q", p.Source, name)
				}
				return
			}
			if err == nil {
				t.Fatalf("Parse accepted it; want an error with %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), name+": ") {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	p, err := Parse(nil, "p.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !p.RequireJustifications {
		t.Error("require_justifications defaults to false; want true")
	}
	d := manifest.Default()
	c := p.For("anyone")
	if c.Resources != d.Resources || c.Workspace != d.Workspace || c.Network.Mode != "none" || len(c.Tiers) != 1 || c.Tiers[0] != d.Tier {
		t.Errorf("empty policy's ceiling = %+v; want Moat's defaults", c)
	}
	if err := p.Check("anyone", d); err != nil {
		t.Errorf("the default manifest is refused by the default ceiling: %v", err)
	}
}

// manifestWith parses a manifest document, failing the test if it does
// not validate.
func manifestWith(t *testing.T, doc string) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Parse([]byte(doc), "m.yaml")
	if err != nil {
		t.Fatalf("manifest %q: %v", doc, err)
	}
	return m
}

func TestCheck(t *testing.T) {
	p, err := Parse([]byte(mustRead(t, "testdata/example.yaml")), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p.RequireJustifications = false
	tests := []struct {
		name     string
		key      string
		manifest string
		// wantField is the refused field; "" admits.
		wantField, wantText string
	}{
		{"default manifest, local", "", "", "", ""},
		{"memory within default ceiling", "", "resources: {memory: 768MiB}", "", ""},
		{"memory at default ceiling", "", "resources: {memory: 1GiB}", "", ""},
		{"memory beyond default ceiling", "", "resources: {memory: 2GiB}", "resources.memory", "resources.memory: 2GiB exceeds the default ceiling 1GiB (policy policy.yaml)"},
		{"unknown key gets default", "stranger", "resources: {memory: 2GiB}", "resources.memory", "exceeds this key's ceiling 1GiB"},
		{"memory at key ceiling", "ci", "resources: {memory: 2GiB}", "", ""},
		{"memory beyond key ceiling", "ci", "resources: {memory: 8GiB}", "resources.memory", "resources.memory: 8GiB exceeds this key's ceiling 2GiB"},
		{"cpus beyond", "ci", "resources: {cpus: 2.5}", "resources.cpus", "2.5 exceeds"},
		{"cpus at", "ci", "resources: {cpus: 2}", "", ""},
		{"timeout beyond default", "", "resources: {timeout: 3m}", "resources.timeout", "3m0s exceeds"},
		{"cpu_time beyond (defaults to ceiling timeout)", "ci", "resources: {timeout: 5m, cpu_time: 11m}", "resources.cpu_time", ""},
		{"pids beyond default (absent in ceiling)", "ci", "resources: {pids: 129}", "resources.pids", "129 exceeds this key's ceiling 128"},
		{"workspace beyond", "", "workspace: {size: 1GiB}", "workspace.size", ""},
		{"stdout beyond", "ci", "resources: {stdout_bytes: 2MiB}", "resources.stdout_bytes", ""},
		{"tier allowed", "ci", "tier: gvisor", "", ""},
		{"tier not allowed", "", "tier: gvisor", "tier", "gvisor exceeds the default ceiling [native]"},
		{"network where none", "", "network: {mode: allowlist, allow: [example.com]}", "network.mode", ""},
		{"network mode without hosts where none", "", "network: {mode: allowlist}\npackages: {pypi: {allow: [idna]}}", "network.mode", ""},
		{"host inside wildcard", "ci", "network: {mode: allowlist, allow: [api.example.com]}", "", ""},
		{"wildcard inside wildcard", "ci", "network: {mode: allowlist, allow: [\"*.api.example.com\"]}", "", ""},
		{"exact host", "ci", "network: {mode: allowlist, allow: [pypi.org]}", "", ""},
		{"bare domain outside wildcard", "ci", "network: {mode: allowlist, allow: [example.com]}", "network.allow[0]", "example.com exceeds"},
		{"other port", "ci", "network: {mode: allowlist, allow: [\"pypi.org:8080\"]}", "network.allow[0]", ""},
		{"second host beyond", "ci", "network: {mode: allowlist, allow: [pypi.org, evil.org]}", "network.allow[1]", ""},
		{"lookalike suffix", "ci", "network: {mode: allowlist, allow: [evilexample.com]}", "network.allow[0]", ""},
		{"address inside prefix", "ci", "network: {mode: allowlist, allow_addresses: [10.1.2.3]}", "", ""},
		{"prefix inside prefix", "ci", "network: {mode: allowlist, allow_addresses: [10.1.0.0/16]}", "", ""},
		{"wider prefix", "ci", "network: {mode: allowlist, allow_addresses: [10.0.0.0/7]}", "network.allow_addresses[0]", ""},
		{"address outside", "ci", "network: {mode: allowlist, allow_addresses: [127.0.0.1]}", "network.allow_addresses[0]", ""},
		{"inbound port inside", "ci", "network: {inbound: [8000]}", "", ""},
		{"inbound range across adjoining ranges", "ci", "network: {inbound: [\"8000-8081\", 3005]}", "", ""},
		{"inbound range beyond", "ci", "network: {inbound: [\"8000-8082\"]}", "network.inbound[0]", "8000-8082 exceeds this key's ceiling [3000-3010, 8000-8080, 8081]"},
		{"inbound in the gap", "ci", "network: {inbound: [3000, 3011]}", "network.inbound[1]", ""},
		{"inbound where the ceiling has none", "", "network: {inbound: [8000]}", "network.inbound[0]", "8000 exceeds the default ceiling none"},
		{"every port where the ceiling has none", "", "network: {inbound: [\"1-65535\"]}", "network.inbound[0]", ""},
		{"bytes out beyond", "ci", "network: {mode: allowlist, allow: [pypi.org], max_bytes_out: 65MiB}", "network.max_bytes_out", ""},
		{"secret granted", "ci", "network: {mode: allowlist, allow: [api.example.com]}\nsecrets: [{name: github-token, hosts: [api.example.com]}]", "", ""},
		{"secret not in ceiling", "ci", "network: {mode: allowlist, allow: [api.example.com]}\nsecrets: [{name: aws, hosts: [api.example.com]}]", "secrets[0].name", "aws exceeds this key's ceiling [github-token]"},
		{"package allowed", "ci", "network: {mode: allowlist}\npackages: {pypi: {allow: [\"Requests==2.31.0\"]}}", "", ""},
		{"package not allowed", "ci", "network: {mode: allowlist}\npackages: {pypi: {allow: [numpy]}}", "packages.pypi.allow[0]", ""},
		{"npm not allowed", "ci", "network: {mode: allowlist}\npackages: {npm: {allow: [is-number]}}", "packages.npm.allow[0]", "is-number exceeds this key's ceiling none"},
		{"other index", "ci", "network: {mode: allowlist}\npackages: {pypi: {index: \"https://mirror.example.com/simple\", allow: [idna]}}", "packages.pypi.index", ""},
		{"typosquat warn", "ci", "network: {mode: allowlist}\npackages: {typosquat: warn, pypi: {allow: [idna]}}", "packages.typosquat", ""},
		{"allow_missing", "ci", "security: {allow_missing: [landlock]}", "security.allow_missing[0]", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Check(tc.key, manifestWith(t, tc.manifest))
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("Check refused: %v", err)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("Check = %v; want a *Refusal of %s", err, tc.wantField)
			}
			if r.Field != tc.wantField || r.Unjustified {
				t.Errorf("refused %s (unjustified %v): %v; want %s beyond the ceiling", r.Field, r.Unjustified, err, tc.wantField)
			}
			if !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q does not contain %q", err, tc.wantText)
			}
		})
	}
}

func TestCheckJustifications(t *testing.T) {
	p, err := Parse([]byte(mustRead(t, "testdata/example.yaml")), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		require   bool
		manifest  string
		wantField string // "" admits
	}{
		{"default needs none", true, "", ""},
		{"memory unjustified", true, "resources: {memory: 1GiB}", "resources.memory"},
		{"memory justified", true, "resources: {memory: 1GiB}\njustifications: {resources.memory: pandas on a 700MB frame}", ""},
		{"lower memory needs none", true, "resources: {memory: 64MiB}", ""},
		{"second widening unjustified", true, "resources: {memory: 1GiB, timeout: 1m}\njustifications: {resources.memory: pandas}", "resources.timeout"},
		{"network unjustified", true, "tier: gvisor\nnetwork: {mode: allowlist, allow: [pypi.org]}", "network.allow"},
		{"not required", false, "resources: {memory: 1GiB}", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p.RequireJustifications = tc.require
			err := p.Check("ci", manifestWith(t, tc.manifest))
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("Check refused: %v", err)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) || r.Field != tc.wantField || !r.Unjustified {
				t.Fatalf("Check = %v; want %s refused for want of a justification", err, tc.wantField)
			}
			if !strings.Contains(err.Error(), "justifications: {"+tc.wantField) {
				t.Errorf("error %q does not show the fix", err)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	p, err := Load("testdata/example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Source != "testdata/example.yaml" {
		t.Errorf("Source = %q", p.Source)
	}
	if _, err := Load("testdata/missing.yaml"); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load of a missing file = %v; want an error naming it", err)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
