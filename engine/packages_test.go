package engine

import (
	"testing"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

func TestIndexEnv(t *testing.T) {
	tests := []struct {
		name string
		pk   manifest.Packages
		want map[string]string
	}{
		{name: "none", want: map[string]string{}},
		{name: "pypi", pk: manifest.Packages{PyPI: manifest.PackageIndex{Allow: []string{"idna"}}},
			want: map[string]string{"PIP_INDEX_URL": "http://127.0.0.1:3128/moat-index/pypi/simple/", "PIP_TRUSTED_HOST": "127.0.0.1"}},
		{name: "npm", pk: manifest.Packages{NPM: manifest.PackageIndex{Allow: []string{"lodash"}}},
			want: map[string]string{"npm_config_registry": "http://127.0.0.1:3128/moat-index/npm/"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := indexEnv(tc.pk)
			if len(got) != len(tc.want) {
				t.Fatalf("indexEnv = %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestPackageViolations(t *testing.T) {
	tests := []struct {
		name string
		a    result.NetworkAttempt
		want int
	}{
		{"typosquat", result.NetworkAttempt{Reason: "typosquat", Package: "reqeusts", Resembles: "requests"}, 1},
		{"not allowed", result.NetworkAttempt{Reason: "package-not-allowed", Package: "x"}, 1},
		{"hash mismatch", result.NetworkAttempt{Reason: "hash-mismatch", Package: "x==1"}, 1},
		{"allowed", result.NetworkAttempt{Reason: "allowed", Allowed: true, Package: "x==1"}, 0},
		{"typosquat served under warn", result.NetworkAttempt{Reason: "typosquat", Allowed: true, Package: "x"}, 0},
		{"ordinary refusal", result.NetworkAttempt{Reason: "not-allowlisted", Host: "evil.test"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := packageViolations([]result.NetworkAttempt{tc.a}); len(got) != tc.want || (tc.want == 1 && got[0].Kind != "package") {
				t.Errorf("packageViolations = %+v, want %d of kind package", got, tc.want)
			}
		})
	}
}
