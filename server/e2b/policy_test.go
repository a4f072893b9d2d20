package e2b

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

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

// TestCommandLimits: an E2B sandbox's commands may run as long as the
// sandbox (E2B's envd bounds them by the request's timeoutMs only), within
// the key's policy ceiling; each command's own limit is its request's
// Connect-Timeout-Ms.
func TestCommandLimits(t *testing.T) {
	pol, err := policy.Parse([]byte("require_justifications: true\nkeys:\n  kb:\n    resources: {timeout: 10m, cpu_time: 5m}\n    network: {inbound: [\"1-65535\"]}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name         string
		pol          *policy.Policy
		key          string
		timeout, cpu time.Duration
	}{
		{"no policy: as long as a sandbox may live", nil, keyA, 24 * time.Hour, 24 * time.Hour},
		{"the default ceiling: Moat's default", pol, keyA, 30 * time.Second, 30 * time.Second},
		{"the key's ceiling", pol, keyB, 10 * time.Minute, 5 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvPolicy(t, []string{"python"}, nil, tc.pol)
			status, body := e.control("POST", "/v2/sandboxes", tc.key, `{"templateID":"base"}`)
			if status != http.StatusCreated {
				t.Fatalf("create: %d %s", status, body)
			}
			r := e.b.Sessions()[0].Manifest().Resources
			if r.Timeout.D() != tc.timeout || r.CPUTime.D() != tc.cpu {
				t.Errorf("resources.timeout %s cpu_time %s, want %s and %s", r.Timeout.D(), r.CPUTime.D(), tc.timeout, tc.cpu)
			}
		})
	}
}

func TestCommandTimeoutHeader(t *testing.T) {
	tests := []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"", 0, true},
		{"0", 0, true},
		{"1500", 1500 * time.Millisecond, true},
		{"86400000", 24 * time.Hour, true},
		{"86400001", 0, false},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999999999999999", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.header, func(t *testing.T) {
			h := http.Header{}
			if tc.header != "" {
				h.Set("Connect-Timeout-Ms", tc.header)
			}
			got, e := commandTimeout(h)
			if (e == nil) != tc.ok || got != tc.want {
				t.Errorf("commandTimeout(%q) = %s, %v; want %s ok %v", tc.header, got, e, tc.want, tc.ok)
			}
			if e != nil && (e.Code() != connect.CodeInvalidArgument || !strings.Contains(e.Message(), "Connect-Timeout-Ms")) {
				t.Errorf("error %v: want invalid_argument naming the header", e)
			}
		})
	}
}
