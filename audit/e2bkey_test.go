package audit

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// The E2B SDKs 2.2x to 2.50 refuse a key that does not match this, before
// sending anything (API_KEY_PATTERN in the `e2b` npm package).
var e2bSDKKeyRE = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

func TestE2BToken(t *testing.T) {
	s := newStore(t)
	tok, k, err := s.CreateKey("e2b-user", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	e2b, ok := E2BToken(tok)
	if !ok || !e2bSDKKeyRE.MatchString(e2b) {
		t.Fatalf("E2BToken(%q) = %q, %v: not a key the E2B SDK accepts", tok, e2b, ok)
	}
	back, ok := FromE2BToken(e2b)
	if !ok || back != tok {
		t.Fatalf("FromE2BToken(%q) = %q, %v, want %q", e2b, back, ok, tok)
	}
	if got, err := s.Authenticate(back); err != nil || got.ID != k.ID {
		t.Errorf("the E2B spelling's Moat token authenticates as %q, %v", got.ID, err)
	}
	// Moat's own API keeps one spelling per key: the E2B form is the E2B
	// layer's to translate.
	if _, err := s.Authenticate(e2b); !errors.Is(err, ErrBadKey) {
		t.Errorf("Authenticate(E2B spelling) = %v, want ErrBadKey", err)
	}

	hex76 := strings.Repeat("0123456789abcdef", 5)[:76]
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"the E2B spelling", "e2b_" + hex76, true},
		{"E2B cloud key (40 hex)", "e2b_" + strings.Repeat("0", 40), false},
		{"one digit short", "e2b_" + hex76[:75], false},
		{"one digit long", "e2b_" + hex76 + "0", false},
		{"upper-case hex", "e2b_" + strings.ToUpper(hex76), false},
		{"not hex", "e2b_" + hex76[:75] + "g", false},
		{"no prefix", hex76, false},
		{"Moat token", tok, false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := FromE2BToken(tc.in)
			if ok != tc.ok {
				t.Fatalf("FromE2BToken(%q) = %q, %v, want ok %v", tc.in, got, ok, tc.ok)
			}
			if ok && !tokenRE.MatchString(got) {
				t.Errorf("FromE2BToken(%q) = %q, not a Moat token's form", tc.in, got)
			}
		})
	}
	for _, bad := range []string{"", "moat_x_y", "e2b_" + hex76, tok[:len(tok)-1]} {
		if got, ok := E2BToken(bad); ok {
			t.Errorf("E2BToken(%q) = %q, want refused", bad, got)
		}
	}
}
