package manifest

import (
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Byte units accepted in a Size. Three families, and one rule: a spelling
// is accepted only where every system that uses it means the same number
// of bytes (docs/RATIONALE.md, "Sizes in Kubernetes' and Docker's
// spellings"):
//
//   - binary, IEC and Kubernetes: KiB, MiB, GiB, TiB and Ki, Mi, Gi, Ti,
//     in any case ("512mib", "512Mi"): the "i" says binary everywhere;
//   - decimal, SI: kB or KB, MB, GB, TB exactly so spelled. The one
//     exception to the rule: Docker reads "MB" as MiB too; Moat read it
//     as SI does before it took Docker's spellings, and keeps that;
//   - Docker's one letter: b, and m, g, t (lowercase) for MiB, GiB, TiB.
//     Kubernetes has no g or t, and its m is milli, never a byte count.
//
// Refused as ambiguous, the error naming both readings: K, k, M, G, T
// (Kubernetes' k, M, G, T are powers of 1000, Docker's powers of 1024)
// and the decimal units in other cases ("mb", "Gb": Docker reads "mb" as
// MiB, SI as MB).
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

type sizeUnit struct {
	name  string
	bytes int64
}

// sizeUnits are matched case-insensitively. The first five are the binary
// units String writes (exactUnit indexes them).
var sizeUnits = []sizeUnit{
	{"B", 1},
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
}

// exactSizeUnits are matched exactly: their case is what tells them from
// another system's unit of the same letters.
var exactSizeUnits = []sizeUnit{
	{"b", 1},
	{"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
}

// ambiguousUnit says, for a spelling two systems read differently, its
// binary and decimal readings: the power of 1024 and 1000, and the units
// that say each without doubt. ok is false for any other spelling.
func ambiguousUnit(unit string) (exp int, binary, decimal string, ok bool) {
	switch strings.ToUpper(unit) {
	case "K", "KB":
		return 1, "Ki", "KB", true
	case "M", "MB":
		return 2, "Mi", "MB", true
	case "G", "GB":
		return 3, "Gi", "GB", true
	case "T", "TB":
		return 4, "Ti", "TB", true
	}
	return 0, "", "", false
}

// maxNumberLen bounds a size or duration string before any arithmetic, so a
// megabyte of digits costs nothing.
const maxNumberLen = 64

const sizeHint = "write whole bytes or a number with a unit: B, KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti), decimal KB, MB, GB, TB, or Docker's m, g, t (e.g. 512MiB, 512Mi, 512m)"

// ParseSize parses a byte count: a non-negative integer number of bytes
// ("1048576") or a decimal number with a unit ("512MiB", "512Mi", "512m",
// "1.5GiB", "10MB"; the units are listed above). Spaces between the number
// and the unit are allowed. A spelling Kubernetes and Docker read as
// different numbers ("512M") is refused, naming both. A fractional value
// must come to a whole number of bytes. The error is a *FieldError with an empty Field, for the caller to
// name the flag or key.
func ParseSize(s string) (Size, error) {
	bad := func(problem string) (Size, error) {
		return 0, newFieldError("", s, problem)
	}
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return bad("is empty; " + sizeHint)
	case len(t) > maxNumberLen:
		return bad("is too long to be a size; " + sizeHint)
	case t[0] == '-':
		return bad("is negative; sizes are 0 or more bytes")
	}
	// Split into digits [. digits] and the unit.
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	whole := t[:i]
	frac := ""
	if i < len(t) && t[i] == '.' {
		j := i + 1
		for j < len(t) && t[j] >= '0' && t[j] <= '9' {
			j++
		}
		frac = t[i+1 : j]
		if frac == "" {
			return bad("is not a size; " + sizeHint)
		}
		i = j
	}
	if whole == "" {
		return bad("is not a size; " + sizeHint)
	}
	unitName := strings.TrimLeft(t[i:], " ")
	unit := int64(1)
	if unitName != "" {
		found := false
		for _, u := range sizeUnits {
			if strings.EqualFold(unitName, u.name) {
				unit, found = u.bytes, true
				break
			}
		}
		for _, u := range exactSizeUnits {
			if !found && unitName == u.name {
				unit, found = u.bytes, true
			}
		}
		if !found {
			if exp, bin, dec, ok := ambiguousUnit(unitName); ok {
				n := t[:i]
				return bad("has an ambiguous unit " + strconv.Quote(unitName) + ": it is 1000^" +
					strconv.Itoa(exp) + " bytes to Kubernetes or SI, 1024^" + strconv.Itoa(exp) + " to Docker; write " + n + bin + " for binary or " + n + dec + " for decimal")
			}
			return bad("has an unknown unit " + strconv.Quote(unitName) + "; " + sizeHint)
		}
	}
	// Exact arithmetic: (whole.frac) * unit must be a whole number of bytes
	// that fits in int64. Both strings are at most maxNumberLen digits.
	num, ok := new(big.Int).SetString(whole+frac, 10)
	if !ok {
		return bad("is not a size; " + sizeHint)
	}
	num.Mul(num, big.NewInt(unit))
	den := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	q, r := new(big.Int).QuoRem(num, den, new(big.Int))
	if r.Sign() != 0 {
		return bad("is not a whole number of bytes; " + sizeHint)
	}
	if !q.IsInt64() {
		return bad("is too large to be a size")
	}
	return Size(q.Int64()), nil
}

// String renders s in the largest binary unit that divides it exactly
// ("512MiB", "1GiB"), else in bytes ("1000B", "0"). The result parses back
// to s.
func (s Size) String() string {
	if u, ok := s.exactUnit(); ok {
		return strconv.FormatInt(int64(s)/u.bytes, 10) + u.name
	}
	if s == 0 {
		return "0"
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// exactUnit returns the largest binary unit of at least KiB that divides s.
func (s Size) exactUnit() (sizeUnit, bool) {
	if s > 0 {
		for i := 4; i >= 1; i-- { // TiB, GiB, MiB, KiB
			if u := sizeUnits[i]; int64(s)%u.bytes == 0 {
				return u, true
			}
		}
	}
	return sizeUnits[0], false
}

// canonical is the value a Size marshals to: a unit string when a binary
// unit divides it exactly, else an integer number of bytes.
func (s Size) canonical() any {
	if _, ok := s.exactUnit(); ok {
		return s.String()
	}
	return int64(s)
}

// MarshalJSON writes "512MiB" when exact, else an integer of bytes.
func (s Size) MarshalJSON() ([]byte, error) { return json.Marshal(s.canonical()) }

// MarshalYAML writes 512MiB when exact, else an integer of bytes.
func (s Size) MarshalYAML() (any, error) { return s.canonical(), nil }

// UnmarshalYAML accepts an integer number of bytes or a size string; null
// leaves s unchanged.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if isNull(n) {
		return nil
	}
	v, err := sizeFromNode(n)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// UnmarshalJSON accepts an integer number of bytes or a size string; null
// leaves s unchanged.
func (s *Size) UnmarshalJSON(b []byte) error {
	n, err := parseJSON(b)
	if err != nil {
		return err
	}
	return s.UnmarshalYAML(n)
}

func sizeFromNode(n *yaml.Node) (Size, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, newFieldError("", "", "is "+describeNode(n)+"; expected a size such as 512MiB")
	}
	switch n.ShortTag() {
	case "!!str":
		return ParseSize(n.Value)
	case "!!int":
		v, err := parseDecimalInt(n.Value)
		if err != nil {
			return 0, newFieldError("", n.Value, "is not a size; "+sizeHint)
		}
		if v < 0 {
			return 0, newFieldError("", n.Value, "is negative; sizes are 0 or more bytes")
		}
		return Size(v), nil
	default:
		return 0, newFieldError("", n.Value, "is "+describeNode(n)+"; "+sizeHint)
	}
}

const durationHint = "write a Go duration such as 30s, 1m30s or 500ms"

// ParseDuration parses a Go duration string ("30s", "1m30s", "500ms").
// A bare number is refused rather than guessed at: "30" could mean seconds
// or nanoseconds. Negative durations are refused. The error is a
// *FieldError with an empty Field, for the caller to name the flag or key.
func ParseDuration(s string) (Duration, error) {
	t := strings.TrimSpace(s)
	switch {
	case t == "":
		return 0, newFieldError("", s, "is empty; "+durationHint)
	case len(t) > maxNumberLen:
		return 0, newFieldError("", s, "is too long to be a duration; "+durationHint)
	}
	if _, err := strconv.ParseFloat(t, 64); err == nil {
		return 0, newFieldError("", s, "has no unit; write "+t+"s for seconds")
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return 0, newFieldError("", s, "is not a duration; "+durationHint)
	}
	if d < 0 {
		return 0, newFieldError("", s, "is negative; durations are 0 or more")
	}
	return Duration(d), nil
}

// String renders d as a Go duration without trailing zero units: "30s",
// "1m", "1h30m", "500ms". The result parses back to d exactly.
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// MarshalJSON writes d as a duration string ("30s").
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// MarshalYAML writes d as a duration string (30s).
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML accepts a duration string; null leaves d unchanged.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if isNull(n) {
		return nil
	}
	v, err := durationFromNode(n)
	if err != nil {
		return err
	}
	*d = v
	return nil
}

// UnmarshalJSON accepts a duration string; null leaves d unchanged.
func (d *Duration) UnmarshalJSON(b []byte) error {
	n, err := parseJSON(b)
	if err != nil {
		return err
	}
	return d.UnmarshalYAML(n)
}

func durationFromNode(n *yaml.Node) (Duration, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, newFieldError("", "", "is "+describeNode(n)+"; "+durationHint)
	}
	switch n.ShortTag() {
	case "!!str":
		return ParseDuration(n.Value)
	case "!!int", "!!float":
		return 0, newFieldError("", n.Value, "is a bare number; durations need a unit: write "+n.Value+"s for seconds")
	default:
		return 0, newFieldError("", n.Value, "is "+describeNode(n)+"; "+durationHint)
	}
}

// parseDecimalInt accepts only [+-]?[0-9]+ without leading zeros. YAML 1.1
// reads "010" as octal 8 and "0x10" as 16; a limit should mean what it
// looks like, so those spellings are refused instead.
func parseDecimalInt(s string) (int64, error) {
	digits := strings.TrimLeft(s, "+-")
	if len(s)-len(digits) > 1 || digits == "" || strings.Trim(digits, "0123456789") != "" ||
		(len(digits) > 1 && digits[0] == '0') {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseInt(s, 10, 64)
}
