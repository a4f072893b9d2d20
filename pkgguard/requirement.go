package pkgguard

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// Ecosystem names an index protocol.
type Ecosystem string

// The ecosystems the guard speaks.
const (
	PyPI Ecosystem = "pypi"
	NPM  Ecosystem = "npm"
)

// Requirement is one allowed package: a name, an optional version
// constraint, and optional digests that pin the files.
type Requirement struct {
	// Name is normalised: PEP 503 for PyPI (lower case, runs of -_. as
	// one -), lower case for npm (scoped names keep their @scope/).
	Name string
	// Constraint is a conjunction of comparisons; empty allows every
	// version.
	Constraint Constraint
	// Hashes pin the files: "sha256:HEX" for PyPI (pip's --hash syntax),
	// "sha512-BASE64" (Subresource Integrity, as in package-lock.json)
	// for npm. Empty: any file the upstream lists with a digest.
	Hashes []string
}

// maxRequirementLen bounds one allow entry.
const maxRequirementLen = 4096

var (
	pypiName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	npmName  = regexp.MustCompile(`^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*$`)
	pypiSep  = regexp.MustCompile(`[-_.]+`)
)

// NormalizePyPI is the PEP 503 normal form of a project name.
func NormalizePyPI(name string) string {
	return strings.ToLower(pypiSep.ReplaceAllString(name, "-"))
}

// ParseRequirement parses one allow entry of eco. PyPI entries are written
// as in a requirements file: "requests==2.31.0", "numpy>=1.26,<2", "idna",
// "requests==2.31.0 --hash=sha256:HEX". npm entries: "is-number@7.0.0",
// "lodash", "@types/node@>=20", "is-number@7.0.0 --hash=sha512-BASE64".
// Errors say what is wrong and how to write it.
func ParseRequirement(eco Ecosystem, s string) (Requirement, error) {
	var r Requirement
	if len(s) > maxRequirementLen {
		return r, fmt.Errorf("is longer than %d bytes", maxRequirementLen)
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return r, fmt.Errorf("is empty; write a package name, e.g. %s", example(eco))
	}
	spec := fields[0]
	for _, f := range fields[1:] {
		h, ok := strings.CutPrefix(f, "--hash=")
		if !ok {
			return r, fmt.Errorf("has %q after the name; only --hash=... options may follow, e.g. %s", f, example(eco))
		}
		if err := checkHash(eco, h); err != nil {
			return r, err
		}
		r.Hashes = append(r.Hashes, h)
	}
	var name, cons string
	switch eco {
	case PyPI:
		i := strings.IndexAny(spec, "=<>!~")
		if i < 0 {
			name = spec
		} else {
			name, cons = spec[:i], spec[i:]
		}
		if strings.ContainsAny(name, "[;@") {
			return r, fmt.Errorf("name %q: extras, markers and URLs are not supported; write name==version", name)
		}
		if !pypiName.MatchString(name) {
			return r, fmt.Errorf("%q is not a valid PyPI project name", name)
		}
		r.Name = NormalizePyPI(name)
	case NPM:
		at := strings.LastIndex(spec, "@")
		if at > 0 {
			name, cons = spec[:at], spec[at+1:]
			if cons == "" {
				return r, fmt.Errorf("ends in @ with no version; write %s@1.2.3 or just the name", spec[:at])
			}
		} else {
			name = spec
		}
		name = strings.ToLower(name)
		if !npmName.MatchString(name) || len(name) > 214 {
			return r, fmt.Errorf("%q is not a valid npm package name", name)
		}
		r.Name = name
		if cons != "" && cons[0] >= '0' && cons[0] <= '9' {
			cons = "==" + cons // a bare version is exact, as in npm
		}
	default:
		return r, fmt.Errorf("unknown ecosystem %q", eco)
	}
	c, err := ParseConstraint(cons)
	if err != nil {
		return r, err
	}
	r.Constraint = c
	if len(r.Hashes) > 0 && !c.Exact() {
		return r, fmt.Errorf("pins hashes but not one version; hashes need an exact version (==1.2.3)")
	}
	return r, nil
}

func example(eco Ecosystem) string {
	if eco == NPM {
		return `"is-number@7.0.0"`
	}
	return `"requests==2.31.0"`
}

func checkHash(eco Ecosystem, h string) error {
	switch eco {
	case PyPI:
		hx, ok := strings.CutPrefix(h, "sha256:")
		if b, err := hex.DecodeString(hx); !ok || err != nil || len(b) != 32 {
			return fmt.Errorf("--hash=%s: PyPI hashes are sha256:<64 hex digits>, as in pip's hash-checking mode", h)
		}
	case NPM:
		b64, ok := strings.CutPrefix(h, "sha512-")
		if b, err := base64.StdEncoding.DecodeString(b64); !ok || err != nil || len(b) != 64 {
			return fmt.Errorf("--hash=%s: npm hashes are sha512-<base64>, the integrity of package-lock.json", h)
		}
	}
	return nil
}

// Allows reports whether version v of r's package may be served, and for
// a file with the given digest (PyPI "sha256:HEX", npm "sha512-B64"; empty
// when only the version is asked about) whether its digest is pinned.
func (r Requirement) Allows(v, digest string) bool {
	if !r.Constraint.Match(v) {
		return false
	}
	if digest == "" || len(r.Hashes) == 0 {
		return true
	}
	for _, h := range r.Hashes {
		if h == digest || (strings.HasPrefix(h, "sha256:") && strings.EqualFold(h, digest)) {
			return true
		}
	}
	return false
}
