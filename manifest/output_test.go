package manifest

import (
	"strings"
	"testing"
)

func TestOutputGuard(t *testing.T) {
	plain, err := Parse([]byte("image: python\n"), "m.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		data    string
		want    OutputGuard
		wantErr string
		sameAs  bool // digest equals the plain manifest's
	}{
		{name: "absent", data: "image: python\n", sameAs: true},
		{name: "empty section", data: "image: python\noutput: {}\n", sameAs: true},
		{name: "canaries", data: "image: python\noutput:\n  canaries: true\n", want: OutputGuard{Canaries: true}},
		{name: "withhold", data: "image: python\noutput:\n  canaries: true\n  withhold_flagged: true\n", want: OutputGuard{Canaries: true, WithholdFlagged: true}},
		{name: "json", data: `{"image":"python","output":{"canaries":true}}`, want: OutputGuard{Canaries: true}},
		{name: "unknown field", data: "image: python\noutput:\n  canary: true\n", wantErr: "canary"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse([]byte(tc.data), "m.yaml")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.Output != tc.want {
				t.Errorf("Output %+v, want %+v", m.Output, tc.want)
			}
			if (m.Digest() == plain.Digest()) != tc.sameAs {
				t.Errorf("digest same as a manifest without output: %v, want %v", m.Digest() == plain.Digest(), tc.sameAs)
			}
			if c, err := m.Canonical(); err != nil {
				t.Fatal(err)
			} else if back, err := Parse(c, "c.yaml"); err != nil || back.Digest() != m.Digest() {
				t.Errorf("canonical form does not parse back to the same digest: %v\n%s", err, c)
			}
		})
	}
}
