package egress

import (
	"net/netip"
	"testing"
)

// TestAddressGrantIsNotEveryPort: an address grant lets IP-literal
// requests through only on ports the allow rules name (found by the
// red-team case net-egress-address-grant-ports).
func TestAddressGrantIsNotEveryPort(t *testing.T) {
	tests := []struct {
		name  string
		allow []string
		port  int
		want  bool
	}{
		{"rule's explicit port", []string{"localhost:8080"}, 8080, true},
		{"another port on the granted address", []string{"localhost:8080"}, 22, false},
		{"default ports of a rule without port", []string{"pypi.org"}, 443, true},
		{"other port with default-port rules", []string{"pypi.org"}, 5432, false},
		{"no rules: only 80 and 443", nil, 80, true},
		{"no rules: nothing else", nil, 6379, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var p Policy
			for _, s := range tc.allow {
				p.Allow = append(p.Allow, MustParseRule(s))
			}
			p.AllowAddresses = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
			c := compilePolicy(p)
			if got := c.allowsLiteralPort(tc.port); got != tc.want {
				t.Errorf("allowsLiteralPort(%d) with %v = %v, want %v", tc.port, tc.allow, got, tc.want)
			}
		})
	}
}
