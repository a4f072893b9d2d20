package manifest

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseSecrets(t *testing.T) {
	want := []Secret{
		{Name: "github-token", Hosts: []string{"api.github.com"}, Header: "Authorization", Env: "GITHUB_TOKEN"},
		{Name: "openai", Hosts: []string{"api.openai.com"}, PathPrefix: "/v1/", Query: true, Body: true, Env: "OPENAI_API_KEY"},
	}
	yml := readTestdata(t, "secrets.yaml")
	json := `{"network": {"mode": "allowlist", "allow": ["api.github.com", "*.openai.com", "localhost:8080"], "allow_addresses": ["127.0.0.1"]},
	  "secrets": [{"name": "github-token", "hosts": ["api.github.com"], "header": "Authorization"},
	              {"name": "openai", "hosts": ["api.openai.com"], "path_prefix": "/v1/", "query": true, "body": true, "env": "OPENAI_API_KEY"}]}`
	tests := []struct {
		name, filename, data string
	}{
		{"yaml", "m.yaml", yml},
		{"json", "m.json", json},
	}
	var digests []string
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data), tc.filename)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Secrets, want) {
				t.Errorf("secrets = %+v\nwant %+v", m.Secrets, want)
			}
			digests = append(digests, m.Digest())
			// The canonical form parses back to the same grant.
			c, err := m.Canonical()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(c, "c.yaml")
			if err != nil {
				t.Fatalf("canonical form does not parse: %v\n%s", err, c)
			}
			if back.Digest() != m.Digest() {
				t.Errorf("canonical round trip changed the digest:\n%s", c)
			}
		})
	}
	if len(digests) == 2 && digests[0] != digests[1] {
		t.Errorf("yaml and json digests differ: %s %s", digests[0], digests[1])
	}
}

func TestSecretsDoNotChangeOtherDigests(t *testing.T) {
	// A manifest without secrets keeps the digest it had before the
	// section existed: an empty list is left out of the canonical form.
	a := Default()
	b := Default()
	b.Secrets = []Secret{}
	if a.Digest() != b.Digest() {
		t.Errorf("empty secrets changed the digest")
	}
	if c, _ := a.Canonical(); strings.Contains(string(c), "secrets") {
		t.Errorf("canonical form without secrets mentions them:\n%s", c)
	}
}

func TestSecretsInvalid(t *testing.T) {
	const net = "network: {mode: allowlist, allow: [api.github.com, \"*.example.com\"]}\n"
	tests := []struct {
		name                  string
		data                  string
		field, value, problem string
	}{
		{"needs allowlist", "secrets: [{name: gh, hosts: [api.github.com]}]", "secrets", "1 secrets", "needs network.mode: allowlist"},
		{"bad name", net + "secrets: [{name: GitHub, hosts: [api.github.com]}]", "secrets[0].name", "GitHub", "is not a secret name"},
		{"empty name", net + "secrets: [{hosts: [api.github.com], env: X}]", "secrets[0].name", "", "is not a secret name"},
		{"name with slash", net + "secrets: [{name: a/b, hosts: [api.github.com], env: X}]", "secrets[0].name", "a/b", "is not a secret name"},
		{"duplicate name", net + "secrets: [{name: gh, hosts: [api.github.com]}, {name: gh, hosts: [api.github.com], env: GH2}]", "secrets[1].name", "gh", "is also the name of secrets[0]"},
		{"no hosts", net + "secrets: [{name: gh}]", "secrets[0].hosts", "", "is empty"},
		{"host not a rule", net + "secrets: [{name: gh, hosts: [\"http://api.github.com\"]}]", "secrets[0].hosts[0]", "http://api.github.com", ""},
		{"host not allowed", net + "secrets: [{name: gh, hosts: [evil.com]}]", "secrets[0].hosts[0]", "evil.com", "is not granted by network.allow"},
		{"port not allowed", net + "secrets: [{name: gh, hosts: [\"api.github.com:8443\"]}]", "secrets[0].hosts[0]", "api.github.com:8443", "is not granted by network.allow"},
		{"apex of a wildcard not allowed", net + "secrets: [{name: gh, hosts: [example.com]}]", "secrets[0].hosts[0]", "example.com", "is not granted by network.allow"},
		{"bad header", net + "secrets: [{name: gh, hosts: [api.github.com], header: \"X Api\"}]", "secrets[0].header", "X Api", "is not an HTTP header name"},
		{"proxy header", net + "secrets: [{name: gh, hosts: [api.github.com], header: Host}]", "secrets[0].header", "Host", "is a header the proxy controls"},
		{"relative path prefix", net + "secrets: [{name: gh, hosts: [api.github.com], path_prefix: v1}]", "secrets[0].path_prefix", "v1", `does not start with "/"`},
		{"path prefix with query", net + "secrets: [{name: gh, hosts: [api.github.com], path_prefix: \"/v1?a\"}]", "secrets[0].path_prefix", "/v1?a", "is not a plain URL path"},
		{"bad env", net + "secrets: [{name: gh, hosts: [api.github.com], env: 1X}]", "secrets[0].env", "1X", "is not a valid variable name"},
		{"proxy env", net + "secrets: [{name: gh, hosts: [api.github.com], env: HTTPS_PROXY}]", "secrets[0].env", "HTTPS_PROXY", "is set by moat"},
		{"env also in env", net + "env: {GH: x}\nsecrets: [{name: gh, hosts: [api.github.com]}]", "secrets[0].env", "GH", "is also set in env"},
		{"env twice", net + "secrets: [{name: a, hosts: [api.github.com], env: K}, {name: b, hosts: [api.github.com], env: K}]", "secrets[1].env", "K", "is also the env of secrets[0]"},
		{"query not a bool", net + "secrets: [{name: gh, hosts: [api.github.com], query: yes}]", "secrets[0].query", "yes", "true or false"},
		{"unknown key", net + "secrets: [{name: gh, hosts: [api.github.com], value: hunter2}]", "secrets[0].value", "", "is not a known key"},
		{"absolute file", net + "secrets: [{name: gh, hosts: [api.github.com], file: /etc/token}]", "secrets[0].file", "/etc/token", "is absolute; give a path relative to /workspace"},
		{"file escapes", net + "secrets: [{name: gh, hosts: [api.github.com], file: ../token}]", "secrets[0].file", "../token", `has a ".." component`},
		{"file not clean", net + "secrets: [{name: gh, hosts: [api.github.com], file: a//token}]", "secrets[0].file", "a//token", "is not a clean path"},
		{"file is the workspace", net + "secrets: [{name: gh, hosts: [api.github.com], file: .}]", "secrets[0].file", ".", "names /workspace itself"},
		{"file inside an input", net + "inputs: [{src: /etc/hostname, dst: conf}]\nsecrets: [{name: gh, hosts: [api.github.com], file: conf/token}]", "secrets[0].file", "conf/token", "is where inputs[0] (dst \"conf\") is copied"},
		{"file twice", net + "secrets: [{name: a, hosts: [api.github.com], env: A, file: t}, {name: b, hosts: [api.github.com], env: B, file: t}]", "secrets[1].file", "t", "is also the file of secrets[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.data), "m.yaml")
			wantFieldError(t, err, tc.field, tc.value, tc.problem)
		})
	}
}

func TestSecretsLimit(t *testing.T) {
	m := Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"a.example"}
	for i := 0; i <= MaxSecrets; i++ {
		m.Secrets = append(m.Secrets, Secret{Name: "s" + strings.Repeat("x", i), Hosts: []string{"a.example"}, Env: "S" + strings.Repeat("X", i)})
	}
	wantFieldError(t, m.Validate(), "secrets", "33 secrets", "is too many")
}

// TestSecretFile: secrets[].file is kept, in the canonical form too (it
// changes the digest: the program's workspace differs), and absent it
// leaves the canonical form as it was.
func TestSecretFile(t *testing.T) {
	const base = "network: {mode: allowlist, allow: [api.github.com]}\nsecrets: [{name: gh, hosts: [api.github.com]"
	plain, err := Parse([]byte(base+"}]"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	withFile, err := Parse([]byte(base+", file: .secrets/gh}]"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := withFile.Secrets[0]; got.File != ".secrets/gh" || got.Env != "GH" {
		t.Errorf("secret %+v, want file .secrets/gh and the default env GH", got)
	}
	if plain.Digest() == withFile.Digest() {
		t.Errorf("a placeholder file does not change the digest")
	}
	if c, _ := plain.Canonical(); strings.Contains(string(c), " file: ") {
		t.Errorf("canonical form without a file mentions one:\n%s", c)
	}
	c, err := withFile.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(c, "c.yaml")
	if err != nil || back.Digest() != withFile.Digest() || back.Secrets[0].File != ".secrets/gh" {
		t.Errorf("canonical round trip: %v, %+v\n%s", err, back, c)
	}
}
