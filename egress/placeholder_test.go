package egress

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestNewPlaceholder(t *testing.T) {
	tests := []struct {
		name    string
		secret  string
		wantErr bool
	}{
		{"plain", "github", false},
		{"dashes and underscores", "openai_key-2", false},
		{"longest", strings.Repeat("a", MaxSecretName), false},
		{"empty", "", true},
		{"too long", strings.Repeat("a", MaxSecretName+1), true},
		{"upper case", "GitHub", true},
		{"leading dash", "-x", true},
		{"space", "a b", true},
		{"newline", "a\nb", true},
		{"slash", "a/b", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPlaceholder(tc.secret)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NewPlaceholder(%q) error = %v, wantErr %v", tc.secret, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if !strings.HasPrefix(p, PlaceholderPrefix+tc.secret+"-") || !IsPlaceholder(p) {
				t.Errorf("placeholder %q does not have the documented form", p)
			}
			// It survives a header, a URL and a query unchanged.
			h := http.Header{}
			h.Set("Authorization", "Bearer "+p)
			if got := h.Get("Authorization"); got != "Bearer "+p {
				t.Errorf("header changed it: %q", got)
			}
			if url.PathEscape(p) != p || url.QueryEscape(p) != p {
				t.Errorf("placeholder %q needs escaping in a URL", p)
			}
			q, err := NewPlaceholder(tc.secret)
			if err != nil || q == p {
				t.Errorf("two placeholders for %q are equal (%q) or failed: %v", tc.secret, q, err)
			}
		})
	}
}

func TestIsPlaceholder(t *testing.T) {
	good, _ := NewPlaceholder("gh")
	tests := []struct {
		s    string
		want bool
	}{
		{good, true},
		{"moat-secret-gh-0123456789abcdef0123456789abcdef", true},
		{"moat-secret-gh-0123456789ABCDEF0123456789abcdef", false},
		{"moat-secret-gh-0123456789abcdef0123456789abcde", false},
		{"moat-secret--0123456789abcdef0123456789abcdef", false},
		{"moat-secret-gh_0123456789abcdef0123456789abcdef", false},
		{"secret-gh-0123456789abcdef0123456789abcdef", false},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(tc.s, func(t *testing.T) {
			if got := IsPlaceholder(tc.s); got != tc.want {
				t.Errorf("IsPlaceholder(%q) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}
