package egress

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

const testCanary = "AKIAQ2Z7XK4M5N6P7R8S"

// TestCanaryRefused: a canary goes nowhere, in any place of a request
// the proxy can see, in any form it recognises for a placeholder, and
// the proxy says it saw one; a request without one passes unmarked.
func TestCanaryRefused(t *testing.T) {
	tests := []struct {
		name   string
		method string
		url    string
		header http.Header
		body   string
		canary bool
	}{
		{name: "header", method: "GET", url: "http://allowed.test/", header: http.Header{"X-Key": {testCanary}}, canary: true},
		{name: "url path", method: "GET", url: "http://allowed.test/k/" + testCanary, canary: true},
		{name: "query lower-cased", method: "GET", url: "http://allowed.test/?k=" + strings.ToLower(testCanary), canary: true},
		{name: "base64 body", method: "POST", url: "http://allowed.test/up", body: base64.StdEncoding.EncodeToString([]byte("id=" + testCanary)), canary: true},
		{name: "hex body", method: "POST", url: "http://allowed.test/up", body: hex.EncodeToString([]byte(testCanary)), canary: true},
		{name: "dns label", method: "GET", url: "http://" + strings.ToLower(testCanary) + ".wild.test/", canary: true},
		{name: "base64url cookie", method: "GET", url: "http://allowed.test/", header: http.Header{"Cookie": {"c=" + base64.RawURLEncoding.EncodeToString([]byte("z"+testCanary))}}, canary: true},
		{name: "benign request", method: "POST", url: "http://allowed.test/up", body: "hello", canary: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol := testPolicy()
			pol.Canaries = []string{testCanary}
			h := newSecretHarnessPolicy(t, pol)
			req, err := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.header {
				req.Header[k] = v
			}
			resp, err := h.client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			a := h.last()
			if tc.canary {
				if resp.StatusCode != http.StatusForbidden || a.Reason != ReasonSecretExfiltration {
					t.Errorf("status %d reason %q, want 403 %s", resp.StatusCode, a.Reason, ReasonSecretExfiltration)
				}
			} else if a.Reason == ReasonSecretExfiltration {
				t.Errorf("benign request refused: %+v", a)
			}
			if got := h.p.CanarySeen(); got != tc.canary {
				t.Errorf("CanarySeen %v, want %v", got, tc.canary)
			}
		})
	}
}

func TestCanaryPolicyValidate(t *testing.T) {
	tests := []struct {
		name    string
		canary  string
		wantErr bool
	}{
		{"fine", testCanary, false},
		{"too short", "AKIA123", true},
		{"bad characters", "AKIA+/AAAAAAAAAAAAAAAA", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol := testPolicy()
			pol.Canaries = []string{tc.canary}
			err := pol.Validate()
			if (err != nil) != tc.wantErr {
				t.Errorf("Validate = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), tc.canary) {
				t.Errorf("error names the canary: %v", err)
			}
		})
	}
}
