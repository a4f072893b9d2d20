package manifest

import (
	"slices"
	"strings"
	"testing"
)

// TestInbound: network.inbound takes ports and ranges, as numbers or
// strings, in YAML and JSON, refuses anything else naming the entry, and
// is a widening.
func TestInbound(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		file    string
		allow   []int
		deny    []int
		wantErr string
	}{
		{"absent: nothing", "image: python\n", "m.yaml", nil, []int{1, 80, 8000, 65535}, ""},
		{"a port as a number", "network: {inbound: [8000]}\n", "m.yaml", []int{8000}, []int{7999, 8001}, ""},
		{"a port as a string", "network: {inbound: [\"8000\"]}\n", "m.yaml", []int{8000}, []int{8001}, ""},
		{"a range", "network: {inbound: [\"8000-8002\"]}\n", "m.yaml", []int{8000, 8001, 8002}, []int{7999, 8003}, ""},
		{"every port", "network: {inbound: [\"1-65535\"]}\n", "m.yaml", []int{1, 65535}, nil, ""},
		{"JSON numbers", `{"network": {"inbound": [3000, "5000-5001"]}}`, "m.json", []int{3000, 5000, 5001}, []int{3001}, ""},
		{"with mode allowlist", "network: {mode: allowlist, allow: [pypi.org], inbound: [8000]}\n", "m.yaml", []int{8000}, nil, ""},
		{"zero", "network: {inbound: [0]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"too large", "network: {inbound: [65536]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"negative", "network: {inbound: [-1]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"backwards range", "network: {inbound: [\"90-80\"]}\n", "m.yaml", nil, nil, "below its first"},
		{"leading zero", "network: {inbound: [\"080\"]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"words", "network: {inbound: [http]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"open range", "network: {inbound: [\"80-\"]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"a mapping", "network: {inbound: [{port: 80}]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"a bool", "network: {inbound: [true]}\n", "m.yaml", nil, nil, "network.inbound[0]"},
		{"too many", "network: {inbound: [" + strings.Repeat("80, ", maxInbound) + "80]}\n", "m.yaml", nil, nil, "too long"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.doc), tc.file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.allow {
				if !m.Network.InboundAllows(p) {
					t.Errorf("port %d not granted by %v", p, m.Network.Inbound)
				}
			}
			for _, p := range tc.deny {
				if m.Network.InboundAllows(p) {
					t.Errorf("port %d granted by %v", p, m.Network.Inbound)
				}
			}
			w := slices.ContainsFunc(m.Widenings(), func(w Widening) bool { return w.Field == WidenInbound })
			if w != (len(tc.allow) > 0) {
				t.Errorf("Widenings %v: network.inbound listed %v, want %v", m.Widenings(), w, len(tc.allow) > 0)
			}
		})
	}
}

// TestInboundDigest: 8000 and "8000" are one manifest, and the canonical
// form parses back to it.
func TestInboundDigest(t *testing.T) {
	a, err := Parse([]byte("network: {inbound: [8000, \"9000-9001\"]}\n"), "a.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte(`{"network": {"inbound": ["8000", "9000-9001"]}}`), "b.json")
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest() != b.Digest() {
		t.Error("8000 and \"8000\" give different digests")
	}
	if a.Digest() == Default().Digest() {
		t.Error("network.inbound does not change the digest")
	}
	out, err := a.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(out, "c.yaml")
	if err != nil || c.Digest() != a.Digest() {
		t.Errorf("canonical form %s parses to %v, %v", out, c, err)
	}
}
