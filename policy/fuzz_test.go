package policy

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

// FuzzParse feeds the policy parser arbitrary files: it must never panic,
// and whatever it accepts must // check the default manifest without panicking, refusing (when it does)
// with a named field: a ceiling below a default is the operator's right.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("testdata/example.yaml"); err == nil {
		f.Add(b, "policy.yaml")
	}
	f.Add([]byte(""), "p.yaml")
	f.Add([]byte(`{"keys":{"a":{"resources":{"memory":"2GiB"}}}}`), "p.json")
	f.Add([]byte("keys:\n  a:\n    network:\n      mode: allowlist\n      allow: [\"*.example.com\"]\n      allow_addresses: [10.0.0.0/8]\n"), "p.yaml")
	f.Add([]byte("default:\n  packages:\n    pypi:\n      allow: [\"*\"]\n      indexes: [\"https://pypi.org/simple\"]\n"), "p.yaml")
	f.Fuzz(func(t *testing.T, data []byte, name string) {
		p, err := Parse(data, name)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("parser panicked: %v", err)
			}
			return
		}
		d := manifest.Default()
		for _, id := range append([]string{""}, keysOf(p)...) {
			err := p.Check(id, d)
			var r *Refusal
			if err != nil && (!errors.As(err, &r) || r.Field == "") {
				t.Fatalf("Check of the default manifest for %q = %v; want nil or a *Refusal naming a field", id, err)
			}
		}
	})
}

func keysOf(p *Policy) []string {
	var ids []string
	for id := range p.Keys {
		ids = append(ids, id)
	}
	return ids
}
