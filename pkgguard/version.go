package pkgguard

import (
	"fmt"
	"strconv"
	"strings"
)

// Constraint is a conjunction of version comparisons ("==1.2.3",
// ">=1.26,<2"). The zero Constraint matches every version.
//
// Versions are compared by their release segments (1.26.4 as 1, 26, 4;
// missing segments are 0); a version with anything after its release
// (a pre-release, 2.0rc1 or 2.0.0-beta.1) sorts before the bare release
// and is matched by == only when written exactly. Post releases and local
// versions (1.0.post1, 1.0+local) count as suffixes too, so they sort
// before their release rather than after: a bound meant to include them
// must name them. This is the common part
// of PEP 440 and semver; it is not either in full (no epochs, no ~=, no
// npm ^ or ~ ranges): the manifest refuses what it cannot compare exactly.
type Constraint struct {
	terms []term
}

type term struct {
	op string // ==, !=, >=, <=, >, <
	v  string
}

// ParseConstraint parses comma- or space-separated comparisons.
func ParseConstraint(s string) (Constraint, error) {
	var c Constraint
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		op := ""
		for _, o := range []string{"===", "==", "!=", ">=", "<=", "~=", ">", "<", "^", "~"} {
			if strings.HasPrefix(f, o) {
				op = o
				break
			}
		}
		v := strings.TrimPrefix(f, op)
		switch op {
		case "":
			return c, fmt.Errorf("version constraint %q has no operator; write ==%s (or >=, <=, >, <, !=)", f, f)
		case "===", "~=", "^", "~":
			return c, fmt.Errorf("version operator %q is not supported; write explicit bounds, e.g. >=1.2,<2", op)
		}
		if _, ok := parseVersion(v); !ok || strings.HasSuffix(v, ".*") {
			return c, fmt.Errorf("version %q in %q is not a version Moat can compare (digits and dots, e.g. 1.26.4)", v, f)
		}
		c.terms = append(c.terms, term{op: op, v: v})
	}
	return c, nil
}

// Exact reports whether c names exactly one version (==X).
func (c Constraint) Exact() bool {
	return len(c.terms) == 1 && c.terms[0].op == "=="
}

// String is the canonical form: terms joined by commas.
func (c Constraint) String() string {
	var b []string
	for _, t := range c.terms {
		b = append(b, t.op+t.v)
	}
	return strings.Join(b, ",")
}

// Match reports whether version v satisfies every term. A version the
// guard cannot parse matches only == written identically.
func (c Constraint) Match(v string) bool {
	for _, t := range c.terms {
		if !t.match(v) {
			return false
		}
	}
	return true
}

func (t term) match(v string) bool {
	if t.op == "==" {
		if v == t.v {
			return true
		}
		a, ok1 := parseVersion(v)
		b, ok2 := parseVersion(t.v)
		return ok1 && ok2 && a.pre == "" && b.pre == "" && compareVersions(a, b) == 0
	}
	a, ok := parseVersion(v)
	b, _ := parseVersion(t.v)
	if !ok {
		return false
	}
	n := compareVersions(a, b)
	switch t.op {
	case "!=":
		return n != 0 || a.pre != b.pre
	case ">=":
		return n >= 0
	case "<=":
		return n <= 0
	case ">":
		return n > 0
	case "<":
		return n < 0
	}
	return false
}

type version struct {
	release []int
	pre     string // anything after the release segments
}

// parseVersion reads the release segments of v (an optional leading v is
// accepted, as npm does) and keeps the rest as its suffix.
func parseVersion(s string) (version, bool) {
	var v version
	s = strings.TrimPrefix(s, "v")
	if s == "" || len(s) > 128 {
		return v, false
	}
	i := 0
	for {
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j-i > 9 {
			return v, false
		}
		n, _ := strconv.Atoi(s[i:j])
		v.release = append(v.release, n)
		i = j
		if i < len(s) && s[i] == '.' && i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
			i++
			continue
		}
		break
	}
	v.pre = s[i:]
	return v, true
}

func compareVersions(a, b version) int {
	for i := 0; i < max(len(a.release), len(b.release)); i++ {
		x, y := 0, 0
		if i < len(a.release) {
			x = a.release[i]
		}
		if i < len(b.release) {
			y = b.release[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	switch {
	case a.pre == "" && b.pre != "":
		return 1
	case a.pre != "" && b.pre == "":
		return -1
	}
	return strings.Compare(a.pre, b.pre)
}
