package e2b

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRulesRefused: every network.rules shape is refused with a 400 that
// names the exact field, and a secret in a header points at Moat's
// manifest secrets.
func TestRulesRefused(t *testing.T) {
	tests := []struct {
		name, rules, field string
	}{
		{"secret header", `{"api.openai.com":[{"transform":{"headers":{"Authorization":"Bearer {{secrets.OPENAI}}"}}}]}`, `network.rules["api.openai.com"][0].transform.headers.Authorization`},
		{"plain header", `{"b.example":[{"transform":{"headers":{"X-Trace":"on"}}}],"a.example":[{"transform":{"headers":{"X-A":"1","X-B":"2"}}}]}`, `network.rules["a.example"][0].transform.headers.X-A`},
		{"rule without transform", `{"a.example":[{}]}`, `network.rules["a.example"][0]`},
		{"empty rule list", `{"a.example":[]}`, `network.rules["a.example"]`},
		{"not a map", `["a.example"]`, `network.rules`},
		{"empty map", `{}`, `network.rules`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"templateID":"base","network":{"allowOut":["api.openai.com"],"rules":` + tc.rules + `}}`
			var req newSandbox
			if err := json.Unmarshal([]byte(body), &req); err != nil {
				t.Fatal(err)
			}
			_, _, _, e := sandboxManifest(&req)
			if e == nil || e.Code != 400 || !strings.HasPrefix(e.Message, tc.field+": ") {
				t.Fatalf("refusal %+v, want 400 naming %s", e, tc.field)
			}
			if tc.field != "network.rules" && !strings.Contains(e.Message, "secrets:") {
				t.Errorf("message %q does not point at Moat's manifest secrets", e.Message)
			}
		})
	}
}
