package server

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/policy"
)

// TestPolicyRefusals: through /v1, a manifest beyond the key's ceiling
// is 403 forbidden and an unjustified widening 400 invalid_field, each
// naming the manifest field, the value and the ceiling.
func TestPolicyRefusals(t *testing.T) {
	pol, err := policy.Parse([]byte("default:\n  resources: {memory: 1GiB}\nkeys:\n  kb:\n    resources: {memory: 2GiB}\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) { c.Policy = pol })
	tests := []struct {
		name, token, path, body string
		status                  int
		code, field, text       string
	}{
		{"run beyond ceiling", tokenA, "/v1/runs", `{"argv":["echo"],"manifest":{"resources":{"memory":"2GiB"},"justifications":{"resources.memory":"x"}}}`,
			403, CodeForbidden, "manifest.resources.memory", "2GiB exceeds this key's ceiling 1GiB (policy policy.yaml)"},
		{"run at another key's ceiling", tokenB, "/v1/runs", `{"argv":["echo"],"manifest":{"resources":{"memory":"2GiB"},"justifications":{"resources.memory":"x"}}}`,
			200, "", "", ""},
		{"run unjustified", tokenA, "/v1/runs", `{"argv":["echo"],"manifest":{"resources":{"memory":"1GiB"}}}`,
			400, CodeInvalidField, "manifest.justifications.resources.memory", "without a justification"},
		{"sandbox beyond ceiling", tokenA, "/v1/sandboxes", `{"manifest":{"resources":{"memory":"2GiB"},"justifications":{"resources.memory":"x"}}}`,
			403, CodeForbidden, "manifest.resources.memory", "exceeds"},
		{"justification of nothing", tokenA, "/v1/runs", `{"argv":["echo"],"manifest":{"justifications":{"resources.memory":"x"}}}`,
			400, CodeInvalidField, "manifest.justifications.resources.memory", "does not widen"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: "POST", path: tc.path, token: tc.token, body: tc.body})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if tc.status == 200 {
				return
			}
			eb := r.errBody(t)
			if eb.Code != tc.code || eb.Field != tc.field || !strings.Contains(eb.Message, tc.text) {
				t.Errorf("error %+v; want code %s field %s message with %q", eb, tc.code, tc.field, tc.text)
			}
		})
	}
}
