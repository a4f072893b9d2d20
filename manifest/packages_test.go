package manifest

import (
	"strings"
	"testing"
)

func TestPackages(t *testing.T) {
	const net = "network: {mode: allowlist}\n"
	tests := []struct {
		name    string
		yaml    string
		field   string // "" for valid
		problem string
	}{
		{name: "pypi and npm granted", yaml: net + "packages: {pypi: {index: \"http://127.0.0.1:8080/simple\", allow: [\"requests==2.31.0\", idna]}, npm: {allow: [\"is-number@7.0.0\"]}, typosquat: warn, new_packages_days: 7, yanked: allow}\n"},
		{name: "packages alone satisfy allowlist", yaml: net + "packages: {pypi: {allow: [idna]}}\n"},
		{name: "needs allowlist", yaml: "packages: {pypi: {allow: [idna]}}\n", field: "packages", problem: "network.mode: allowlist"},
		{name: "bad requirement", yaml: net + "packages: {pypi: {allow: [\"requests~=2\"]}}\n", field: "packages.pypi.allow[0]", problem: "not supported"},
		{name: "bad npm name", yaml: net + "packages: {npm: {allow: [\"Not A Name\"]}}\n", field: "packages.npm.allow[0]", problem: "after the name"},
		{name: "duplicate", yaml: net + "packages: {pypi: {allow: [Requests, requests==1.0]}}\n", field: "packages.pypi.allow[1]", problem: "again"},
		{name: "bad index", yaml: net + "packages: {pypi: {index: \"ftp://x/simple\", allow: [idna]}}\n", field: "packages.pypi.index", problem: "http(s)"},
		{name: "index without allow", yaml: net + "network: {mode: allowlist, allow: [example.com]}\npackages: {pypi: {index: \"https://pypi.org/simple\"}}\n", field: "packages.pypi.allow", problem: "empty"},
		{name: "bad typosquat", yaml: net + "packages: {typosquat: ignore, pypi: {allow: [idna]}}\n", field: "packages.typosquat", problem: "refuse, warn"},
		{name: "bad yanked", yaml: net + "packages: {yanked: maybe, pypi: {allow: [idna]}}\n", field: "packages.yanked", problem: "refuse, allow"},
		{name: "bad days", yaml: net + "packages: {new_packages_days: -1, pypi: {allow: [idna]}}\n", field: "packages.new_packages_days", problem: "0..3650"},
		{name: "unknown key", yaml: net + "packages: {pypy: {allow: [idna]}}\n", field: "packages.pypy", problem: ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			y := tc.yaml
			if strings.Count(y, "network:") > 1 {
				y = strings.Replace(y, net, "", 1)
			}
			m, err := Parse([]byte(y), "m.yaml")
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				c, err := m.Canonical()
				if err != nil || !strings.Contains(string(c), "packages:") {
					t.Fatalf("canonical form lacks packages: %s %v", c, err)
				}
				m2, err := Parse(c, "c.yaml")
				if err != nil || m2.Digest() != m.Digest() {
					t.Fatalf("canonical round trip: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), tc.problem) {
				t.Fatalf("err %v, want one naming %s with %q", err, tc.field, tc.problem)
			}
		})
	}
	m, _ := Parse([]byte("image: python\n"), "m.yaml")
	if c, _ := m.Canonical(); strings.Contains(string(c), "packages") {
		t.Errorf("a manifest without packages shows them in its canonical form:\n%s", c)
	}
}
