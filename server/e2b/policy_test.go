package e2b

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
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

// TestPolicyNarrowsInbound: E2B grants every port of a sandbox; under an
// operator's policy an E2B sandbox gets only the inbound ports of the
// key's ceiling (none by default), and the create's notice says so,
// rather than every create being refused.
func TestPolicyNarrowsInbound(t *testing.T) {
	pol, err := policy.Parse([]byte("require_justifications: false\nkeys:\n  kb:\n    network:\n      inbound: [\"8000-8080\", 3000]\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, key string
		inbound   []manifest.PortRange
		notice    string
	}{
		{"the default ceiling opens none", keyA, nil, "opens no ports"},
		{"the key's ceiling opens its ports", keyB, []manifest.PortRange{"8000-8080", "3000"}, "opens only ports 8000-8080, 3000"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvPolicy(t, []string{"python"}, nil, pol)
			resp, body := e.do("POST", "/v2/sandboxes", map[string]string{"X-API-Key": tc.key, "Content-Type": "application/json"}, strings.NewReader(`{"templateID":"base"}`))
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("create: %d %s", resp.StatusCode, body)
			}
			if n := resp.Header.Get(NoticeHeader); !strings.Contains(n, tc.notice) {
				t.Errorf("%s %q, want %q", NoticeHeader, n, tc.notice)
			}
			m := e.b.Sessions()[0].Manifest()
			if !slices.Equal(m.Network.Inbound, tc.inbound) {
				t.Errorf("network.inbound %v, want %v", m.Network.Inbound, tc.inbound)
			}
		})
	}
}
