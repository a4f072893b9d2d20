package egress

import "testing"

func TestRuleCovers(t *testing.T) {
	tests := []struct {
		name       string
		allow, sec string
		want       bool
	}{
		{"same host", "api.example.com", "api.example.com", true},
		{"same host and port", "api.example.com:8443", "api.example.com:8443", true},
		{"default ports cover 443", "api.example.com", "api.example.com:443", true},
		{"default ports do not cover 8443", "api.example.com", "api.example.com:8443", false},
		{"one port does not cover both defaults", "api.example.com:443", "api.example.com", false},
		{"other host", "api.example.com", "evil.example.com", false},
		{"wildcard covers a subdomain", "*.example.com", "api.example.com", true},
		{"wildcard does not cover its apex", "*.example.com", "example.com", false},
		{"wildcard covers a narrower wildcard", "*.example.com", "*.api.example.com", true},
		{"wildcard covers the same wildcard", "*.example.com", "*.example.com", true},
		{"host does not cover a wildcard", "api.example.com", "*.api.example.com", false},
		{"wildcard does not cover a lookalike suffix", "*.example.com", "*.evilexample.com", false},
		{"narrow wildcard does not cover a wider one", "*.api.example.com", "*.example.com", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MustParseRule(tc.allow).Covers(MustParseRule(tc.sec)); got != tc.want {
				t.Errorf("%q.Covers(%q) = %v, want %v", tc.allow, tc.sec, got, tc.want)
			}
		})
	}
}
