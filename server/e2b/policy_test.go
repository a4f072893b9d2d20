package e2b

import (
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// TestPolicyCeilings: an E2B sandbox request beyond the key's ceiling is
// refused with 403 naming the field and the ceiling, before a sandbox
// exists; within it, it is created. E2B requests carry no
// justifications, so this policy does not require them.
func TestPolicyCeilings(t *testing.T) {
	pol, err := policy.Parse([]byte("require_justifications: false\nkeys:\n  kb:\n    network:\n      mode: allowlist\n      allow: [\"*.example.com\"]\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvPolicy(t, []string{"python"}, nil, pol)
	tests := []struct {
		name, key, body string
		status          int
		text            string
	}{
		{"default manifest", keyA, `{"templateID":"base"}`, http.StatusCreated, ""},
		{"network beyond the default ceiling", keyA, `{"templateID":"base","network":{"allowOut":["api.example.com"]}}`, http.StatusForbidden, "network.mode: allowlist exceeds this key's ceiling none (policy policy.yaml)"},
		{"host within the key's ceiling", keyB, `{"templateID":"base","network":{"allowOut":["api.example.com"]}}`, http.StatusCreated, ""},
		{"host beyond the key's ceiling", keyB, `{"templateID":"base","network":{"allowOut":["example.org"]}}`, http.StatusForbidden, "network.allow[0]: example.org exceeds this key's ceiling [*.example.com]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.live()
			status, data := e.control("POST", "/v2/sandboxes", tc.key, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, data)
			}
			if tc.status != http.StatusCreated {
				if !strings.Contains(string(data), tc.text) {
					t.Errorf("body %s does not contain %q", data, tc.text)
				}
				if e.live() != before {
					t.Error("a refused request created a sandbox")
				}
			}
		})
	}
}
