package egress

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
)

// PlaceholderPrefix begins every placeholder.
const PlaceholderPrefix = "moat-secret-"

// placeholderRandomBytes is the randomness of a placeholder: 128 bits, so
// one run cannot guess another run's placeholder and a placeholder never
// collides with text the program writes by chance.
const placeholderRandomBytes = 16

// NewPlaceholder returns a fresh placeholder for the secret name:
//
//	moat-secret-<name>-<32 lower-case hex digits>
//
// The format is the contract with the proxy:
//   - only the characters [a-z0-9_-]: it survives, unquoted and unescaped,
//     an HTTP header value, a URL path or query, a form or JSON body, a
//     shell variable and a DNS label (names are [a-z0-9_-], at most 64);
//   - it is unique per call: the engine makes one per secret per run (or
//     sandbox session), so a placeholder is valid only while the proxy of
//     that run serves, and dies with it;
//   - it is recognisable: the prefix and the name say what it stands for
//     to a person reading a log. The proxy must not rely on the prefix: it
//     knows the run's exact placeholders (SecretBinding.Placeholder) and
//     is to search requests for each of them, as written, with its letters
//     in either case (DNS and some encoders change case), percent-encoded,
//     and base64- or base32-encoded at each of the encodings' alignments
//     (base64 of the placeholder at offsets 0, 1 and 2 of a 3-byte group).
//     Which of these forms the proxy recognises is the proxy's to state.
//
// name must be a valid manifest secret name; anything else is an error,
// never a placeholder the proxy could fail to recognise.
func NewPlaceholder(name string) (string, error) {
	if !validSecretName(name) {
		return "", fmt.Errorf("secret name %q: want 1 to 64 of a-z 0-9 _ -, starting with a letter or digit", name)
	}
	var b [placeholderRandomBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("placeholder for secret %s: %w", name, err)
	}
	return PlaceholderPrefix + name + "-" + hex.EncodeToString(b[:]), nil
}

// IsPlaceholder reports whether s has the form NewPlaceholder makes.
func IsPlaceholder(s string) bool {
	rest, ok := strings.CutPrefix(s, PlaceholderPrefix)
	if !ok || len(rest) < 2+2*placeholderRandomBytes {
		return false
	}
	name, hexPart := rest[:len(rest)-2*placeholderRandomBytes-1], rest[len(rest)-2*placeholderRandomBytes:]
	if rest[len(name)] != '-' || !validSecretName(name) {
		return false
	}
	for _, c := range []byte(hexPart) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// MaxSecretName bounds a secret's name.
const MaxSecretName = 64

// ValidSecretName reports whether name is a usable secret name: 1 to
// MaxSecretName of a-z 0-9 _ -, starting with a letter or digit. The
// manifest and the secret store use this one rule.
func ValidSecretName(name string) bool { return validSecretName(name) }

func validSecretName(name string) bool {
	if name == "" || len(name) > MaxSecretName {
		return false
	}
	for i, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '_' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}
