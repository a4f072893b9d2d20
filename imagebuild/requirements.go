package imagebuild

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"
)

// Requirement is one line of a pip requirements file that pins a package
// exactly: name==version with at least one hash.
type Requirement struct {
	// Line is the 1-based line the requirement starts on.
	Line int
	// Name is the project name as written, without extras.
	Name    string
	Version string
	// Hashes are "sha256:<hex>" (or sha384/sha512) in the order given.
	Hashes []string
}

// maxRequirements bounds a requirements file; a large application has a
// few hundred.
const maxRequirements = 10000

// pipName is PEP 508's project name.
var pipName = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)

// pipVersion is an exact PEP 440 version (no wildcard, no local segment
// with odd characters): what `pip freeze` writes.
var pipVersion = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9.+!_-]*$`)

// hashLens are the digests pip's --require-hashes accepts, by hex length.
var hashLens = map[string]int{"sha256": 64, "sha384": 96, "sha512": 128}

// ParseRequirements reads a pip requirements file in which every
// requirement is pinned (name==version) and hashed (--hash=sha256:...),
// the form `pip-compile --generate-hashes` and `pip hash` produce. It
// refuses everything pip would resolve or fetch beyond what the file
// pins: editable installs (-e), URLs and direct references (name @ url),
// includes (-r, -c), index and find-links options (the image file's pip
// section sets them), and version ranges. Comments (# at a line start or
// after a blank), blank lines, continuation lines (a trailing \), extras
// (name[extra]==1) and environment markers (; python_version < "3.12",
// evaluated by pip) are accepted. file names the file in errors, which
// read "file:line: problem; fix".
func ParseRequirements(data []byte, file string) ([]Requirement, error) {
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%s: is not valid UTF-8", file)
	}
	var reqs []Requirement
	seen := map[string]int{}
	lines := bytes.Split(data, []byte("\n"))
	for i := 0; i < len(lines); i++ {
		start := i + 1
		text := strings.TrimSuffix(string(lines[i]), "\r")
		// A trailing backslash joins the next line (pip's rule, applied
		// before comments are stripped).
		for strings.HasSuffix(text, `\`) && i+1 < len(lines) {
			i++
			text = strings.TrimSuffix(text, `\`) + " " + strings.TrimSuffix(string(lines[i]), "\r")
		}
		text = strings.TrimSuffix(text, `\`)
		text = stripComment(text)
		if strings.TrimSpace(text) == "" {
			continue
		}
		r, err := parseRequirementLine(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", file, start, err)
		}
		r.Line = start
		key := normalizePipName(r.Name)
		if first, dup := seen[key]; dup {
			return nil, fmt.Errorf("%s:%d: %s is already required on line %d; give each package once", file, start, r.Name, first)
		}
		seen[key] = start
		if len(reqs) >= maxRequirements {
			return nil, fmt.Errorf("%s:%d: more than %d requirements", file, start, maxRequirements)
		}
		reqs = append(reqs, r)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%s: has no requirements; list at least one as name==version --hash=sha256:HEX", file)
	}
	return reqs, nil
}

// stripComment removes a # comment: one at the start of the line or after
// whitespace (pip's rule: a # inside a token, as in a URL fragment, is
// not a comment).
func stripComment(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '#' && (i == 0 || s[i-1] == ' ' || s[i-1] == '\t') {
			return s[:i]
		}
	}
	return s
}

// normalizePipName is PEP 503's normalised name, for duplicate checks.
func normalizePipName(s string) string {
	s = strings.ToLower(s)
	return strings.NewReplacer("_", "-", ".", "-").Replace(s)
}

const requirementFix = "write name==version --hash=sha256:<hex> (pip-compile --generate-hashes writes this form)"

func parseRequirementLine(text string) (Requirement, error) {
	var r Requirement
	// Options start at the first " -" after the requirement; a marker may
	// contain no " -" (markers compare strings and versions).
	spec, opts := text, ""
	if i := strings.Index(text, " -"); i >= 0 {
		spec, opts = text[:i], text[i:]
	} else if j := strings.Index(text, "\t-"); j >= 0 {
		spec, opts = text[:j], text[j:]
	}
	spec = strings.TrimSpace(spec)
	if spec == "" || strings.HasPrefix(spec, "-") {
		opt := strings.Fields(strings.TrimSpace(text))[0]
		return r, fmt.Errorf("option %s is not accepted in a pinned requirements file: the image file's pip section sets the index and find_links, and every package must be listed here; %s", quoteShort(opt), requirementFix)
	}
	marker := ""
	if i := strings.IndexByte(spec, ';'); i >= 0 {
		spec, marker = strings.TrimSpace(spec[:i]), strings.TrimSpace(spec[i+1:])
		if marker == "" {
			return r, fmt.Errorf("%s has an empty environment marker after ';'; remove the ';'", quoteShort(spec))
		}
	}
	if strings.Contains(spec, "@") || strings.Contains(spec, "://") {
		return r, fmt.Errorf("%s is a URL or direct reference; only packages from the index or find_links are accepted: %s", quoteShort(spec), requirementFix)
	}
	name, rest, ok := strings.Cut(spec, "==")
	if !ok || strings.HasPrefix(rest, "=") {
		return r, fmt.Errorf("%s is not pinned to one version with ==; %s", quoteShort(spec), requirementFix)
	}
	name, version := strings.TrimSpace(name), strings.TrimSpace(rest)
	if i := strings.IndexByte(name, '['); i >= 0 {
		extras := name[i:]
		name = strings.TrimSpace(name[:i])
		if !strings.HasSuffix(extras, "]") || strings.ContainsAny(extras[1:len(extras)-1], "[]") {
			return r, fmt.Errorf("%s has malformed extras; write name[extra1,extra2]==version", quoteShort(spec))
		}
	}
	if !pipName.MatchString(name) {
		return r, fmt.Errorf("%s is not a valid package name (letters, digits, . _ -)", quoteShort(name))
	}
	if !pipVersion.MatchString(version) {
		return r, fmt.Errorf("%s: version %s is not one exact version (no wildcards, ranges or commas); %s", name, quoteShort(version), requirementFix)
	}
	r.Name, r.Version = name, version
	fields := strings.Fields(opts)
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		var h string
		switch {
		case strings.HasPrefix(f, "--hash="):
			h = strings.TrimPrefix(f, "--hash=")
		case f == "--hash" && i+1 < len(fields):
			i++
			h = fields[i]
		default:
			return r, fmt.Errorf("%s: option %s is not accepted; only --hash=sha256:<hex> may follow a requirement", name, quoteShort(f))
		}
		if err := checkHash(h); err != nil {
			return r, fmt.Errorf("%s: %w", name, err)
		}
		r.Hashes = append(r.Hashes, h)
	}
	if len(r.Hashes) == 0 {
		return r, fmt.Errorf("%s==%s has no --hash; add --hash=sha256:<hex> of each file pip may install (pip hash FILE prints it)", name, version)
	}
	return r, nil
}

func checkHash(h string) error {
	alg, hexs, ok := strings.Cut(h, ":")
	want, known := hashLens[alg]
	if !ok || !known {
		return fmt.Errorf("hash %s is not sha256:<hex> (sha384 and sha512 are accepted too)", quoteShort(h))
	}
	if len(hexs) != want {
		return fmt.Errorf("hash %s: a %s digest is %d hex digits, not %d", quoteShort(h), alg, want, len(hexs))
	}
	if _, err := hex.DecodeString(hexs); err != nil || strings.ToLower(hexs) != hexs {
		return fmt.Errorf("hash %s is not lower-case hex", quoteShort(h))
	}
	return nil
}

// quoteShort quotes s for a message, cut to 80 bytes so a hostile file
// cannot make a huge error.
func quoteShort(s string) string {
	const n = 80
	if len(s) > n {
		cut := n
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "..."
	}
	return fmt.Sprintf("%q", s)
}
