package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/policy"
)

// What a caller may give a sandbox: its manifest and its metadata.

// ParseManifest parses a caller's manifest (JSON) with the manifest
// package's own strict parser and validates it; its errors keep their
// field names, prefixed "manifest." as the request names them. Absent or
// null is the default manifest. Host inputs are refused: a caller of the
// service must not name the server's files.
func ParseManifest(raw []byte) (*manifest.Manifest, *Error) {
	if len(raw) == 0 || string(raw) == "null" {
		return manifest.Default(), nil
	}
	// Inputs are refused before parsing, so that the answer is about the
	// grant, not about a detail of the host path.
	var peek struct {
		Inputs []json.RawMessage `json:"inputs"`
	}
	if json.Unmarshal(raw, &peek) == nil && len(peek.Inputs) > 0 {
		return nil, refusedInputs()
	}
	m, err := manifest.Parse(raw, "request.json")
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		return nil, manifestError(err)
	}
	if len(m.Inputs) > 0 {
		return nil, refusedInputs()
	}
	return m, nil
}

func refusedInputs() *Error {
	return InvalidField("manifest.inputs", "host paths cannot be granted through the API; upload the files with \"files\" instead")
}

// manifestError turns Parse's errors (the file name, then *FieldError
// values joined with errors.Join) into one invalid_field error naming the
// first field and listing every problem.
func manifestError(err error) *Error {
	inner := err
	if u := errors.Unwrap(err); u != nil && strings.HasPrefix(err.Error(), "request.json: ") {
		inner = u
	}
	parts := []error{inner}
	if j, ok := inner.(interface{ Unwrap() []error }); ok {
		parts = j.Unwrap()
	}
	field := ""
	msgs := make([]string, 0, len(parts))
	for _, p := range parts {
		var fe *manifest.FieldError
		if !errors.As(p, &fe) {
			msgs = append(msgs, "manifest: "+strings.TrimPrefix(p.Error(), "request.json: "))
			continue
		}
		f := *fe
		f.Field = ManifestField(fe.Field)
		if f.Field == "" {
			f.Field = "manifest"
		}
		if field == "" {
			field = f.Field
		}
		msgs = append(msgs, f.Error())
	}
	if field == "" {
		field = "manifest"
	}
	return &Error{Kind: Invalid, Field: field, Message: strings.Join(msgs, "; "), Err: err}
}

const (
	// MaxMetadata bounds a sandbox's metadata: it is labels, not storage.
	MaxMetadata         = 64
	maxMetadataKeyLen   = 128
	maxMetadataValueLen = 1024
)

// CheckMetadata refuses metadata that is not labels: too many entries,
// keys that are empty, long or not UTF-8, long values. Each refusal names
// the entry ("metadata.team").
func CheckMetadata(md map[string]string) *Error {
	if len(md) > MaxMetadata {
		return InvalidField("metadata", "has %d entries; at most %d are accepted", len(md), MaxMetadata)
	}
	for k, v := range md {
		field := strictjson.JoinField("metadata", k)
		switch {
		case k == "" || len(k) > maxMetadataKeyLen || !utf8.ValidString(k):
			return InvalidField(field, "is not a key of 1 to %d bytes of UTF-8", maxMetadataKeyLen)
		case len(v) > maxMetadataValueLen:
			return InvalidField(field, "is %d bytes long; at most %d are accepted", len(v), maxMetadataValueLen)
		}
	}
	return nil
}

// CheckSecretGrants refuses a manifest that names a secret the key was
// not granted (moat keys grant): a key uses only the host's secrets the
// operator gave it, whatever its manifest asks for. The refusal names the
// secret and the fix; it never says whether the host holds the secret.
func CheckSecretGrants(key audit.Key, m *manifest.Manifest) *Error {
	if m == nil {
		return nil
	}
	for i, s := range m.Secrets {
		if !slices.Contains(key.Secrets, s.Name) {
			return Errorf(Forbidden, ManifestField(fmt.Sprintf("secrets[%d].name", i)),
				"key %s is not granted secret %s; the operator grants it with: moat keys grant %s %s", key.ID, Quote(s.Name), key.ID, s.Name)
		}
	}
	return nil
}

// CheckPolicy refuses a manifest beyond the key's ceiling in the
// operator's policy (Forbidden: the caller cannot fix it but by asking
// for less) or widening Moat's defaults without a justification the
// policy requires (Invalid: the caller adds one). The refusal names the
// manifest field, the requested value and the ceiling. A nil policy
// admits everything.
func CheckPolicy(p *policy.Policy, key audit.Key, m *manifest.Manifest) *Error {
	if p == nil || m == nil {
		return nil
	}
	err := p.Check(key.ID, m)
	if err == nil {
		return nil
	}
	var r *policy.Refusal
	if !errors.As(err, &r) {
		return InternalError(fmt.Errorf("policy check: %w", err))
	}
	kind := Forbidden
	field := r.Field
	if r.Unjustified {
		kind, field = Invalid, "justifications."+r.Field
	}
	return &Error{Kind: kind, Field: ManifestField(field), Message: "manifest." + r.Error()}
}

// PolicyCeiling is key's ceiling in the operator's policy, and whether a
// policy is set at all (false: nothing limits key beyond the server's
// flags). A front door that grants more than Moat's defaults on its own
// (the E2B layer opens every port, as E2B does) narrows its grant to the
// ceiling rather than have every request refused.
func (s *Service) PolicyCeiling(key audit.Key) (policy.Ceiling, bool) {
	if s.cfg.Policy == nil {
		return policy.Ceiling{}, false
	}
	return s.cfg.Policy.For(key.ID), true
}
