package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"
)

// normalized returns a copy of m in which equal grants have equal values:
// empty and nil lists and maps are the same, and the order of
// security.allow_missing does not matter. The order of inputs is kept.
func (m *Manifest) normalized() *Manifest {
	c := *m
	c.Inputs = append([]Input{}, m.Inputs...)
	c.Env = maps.Clone(m.Env)
	if c.Env == nil {
		c.Env = map[string]string{}
	}
	c.Secrets = nil
	for _, sec := range m.Secrets {
		sec.Hosts = append([]string{}, sec.Hosts...)
		c.Secrets = append(c.Secrets, sec)
	}
	c.Security.AllowMissing = nil
	if len(m.Security.AllowMissing) > 0 {
		c.Security.AllowMissing = slices.Sorted(slices.Values(m.Security.AllowMissing))
	}
	return &c
}

// canonicalJSON is the byte string the digest is taken over: m normalized
// and encoded by encoding/json, which fixes the field order (struct order),
// sorts map keys and renders Size and Duration in their canonical forms.
func (m *Manifest) canonicalJSON() ([]byte, error) {
	return json.Marshal(m.normalized())
}

// Digest returns "sha256:<hex>" of the canonical JSON encoding of m. Two
// manifests that grant the same thing have the same digest, whatever their
// syntax, key order, spelling of sizes or formatting. It is meaningful for a
// validated manifest; after ResolveInputs it covers the absolute source
// paths. It returns "" for a manifest that cannot be encoded (NaN cpus),
// which Validate refuses.
func (m *Manifest) Digest() string {
	b, err := m.canonicalJSON()
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Canonical renders the effective manifest (every default filled in) as
// YAML, for `moat manifest check --print`. Parsing the output gives a
// manifest with the same digest.
func (m *Manifest) Canonical() ([]byte, error) {
	return yaml.Marshal(m.normalized())
}

// String returns Canonical as a string, or an error description.
func (m *Manifest) String() string {
	b, err := m.Canonical()
	if err != nil {
		return "<manifest: " + err.Error() + ">"
	}
	return string(b)
}
