package manifest

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/pkgguard"
)

// rules are the numeric fields' ranges: the one source for Validate,
// Ranges and (through TestRangesDocumented) the table on Ranges.
var rules = []rule{
	sizeRule("workspace.size", 1*MiB, 64*GiB, func(m *Manifest) Size { return m.Workspace.Size }),
	intRule("workspace.files", 16, 10_000_000, func(m *Manifest) int { return m.Workspace.Files }),
	floatRule("resources.cpus", 0.01, 256, func(m *Manifest) float64 { return m.Resources.CPUs }),
	sizeRule("resources.memory", 4*MiB, 64*GiB, func(m *Manifest) Size { return m.Resources.Memory }),
	intRule("resources.pids", 1, 32768, func(m *Manifest) int { return m.Resources.Pids }),
	durationRule("resources.timeout", 10*time.Millisecond, 24*time.Hour, func(m *Manifest) Duration { return m.Resources.Timeout }),
	durationRule("resources.cpu_time", 10*time.Millisecond, 24*time.Hour, func(m *Manifest) Duration { return m.Resources.CPUTime }),
	intRule("resources.open_files", 16, 65536, func(m *Manifest) int { return m.Resources.OpenFiles }),
	sizeRule("resources.file_size", 1*KiB, 16*GiB, func(m *Manifest) Size { return m.Resources.FileSize }),
	sizeRule("resources.stdout_bytes", 0, 1*GiB, func(m *Manifest) Size { return m.Resources.StdoutBytes }),
	sizeRule("resources.stderr_bytes", 0, 1*GiB, func(m *Manifest) Size { return m.Resources.StderrBytes }),
	intRule("network.max_connections", 1, 1024, func(m *Manifest) int { return m.Network.MaxConnections }),
	intRule("network.connections_per_second", 1, 1000, func(m *Manifest) int { return m.Network.ConnectionsPerSecond }),
	sizeRule("network.max_bytes_out", 0, 64*GiB, func(m *Manifest) Size { return m.Network.MaxBytesOut }),
	sizeRule("network.max_bytes_in", 0, 64*GiB, func(m *Manifest) Size { return m.Network.MaxBytesIn }),
	intRule("network.names_per_second", 1, 1000, func(m *Manifest) int { return m.Network.NamesPerSecond }),
}

// Limits on the non-numeric parts of a manifest.
const (
	// MaxInputs bounds len(inputs).
	MaxInputs = 256
	// MaxEnvVars bounds len(env).
	MaxEnvVars = 256
	// MaxEnvBytes bounds the environment block: the sum over env of
	// len(key)+len(value)+2 (the '=' and the NUL), as execve counts it.
	MaxEnvBytes = 128 << 10
	// maxPathLen is PATH_MAX; maxNameLen is NAME_MAX.
	maxPathLen = 4096
	maxNameLen = 255
	maxImage   = 255
)

// Range is the accepted range of one numeric manifest field, written as it
// would be in a manifest.
type Range struct {
	Field    string // dotted path, e.g. "resources.memory"
	Min, Max string // inclusive bounds, e.g. "4MiB", "64GiB"
	Default  string // e.g. "512MiB"; for cpu_time, "resources.timeout"
}

// Ranges returns the accepted range and default of every numeric field, in
// manifest order, for generated documentation and `moat manifest ranges`.
// Bounds are inclusive; a value outside its range is refused, never
// clamped. A test checks that this table and the returned data agree.
//
//	field                   min    max       default
//	workspace.size          1MiB   64GiB     256MiB
//	workspace.files         16     10000000  10000
//	resources.cpus          0.01   256       1
//	resources.memory        4MiB   64GiB     512MiB
//	resources.pids          1      32768     128
//	resources.timeout       10ms   24h       30s
//	resources.cpu_time      10ms   24h       resources.timeout
//	resources.open_files    16     65536     256
//	resources.file_size     1KiB   16GiB     64MiB
//	resources.stdout_bytes  0      1GiB      1MiB
//	resources.stderr_bytes  0      1GiB      1MiB
//	network.max_connections         1  1024   16
//	network.connections_per_second  1  1000   20
//	network.max_bytes_out           0  64GiB  64MiB
//	network.max_bytes_in            0  64GiB  512MiB
//	network.names_per_second        1  1000   5
//
// The bounds are about what a sandbox can sensibly be asked for, not about
// this host: a manifest asking for more CPUs or memory than the host has is
// valid here and refused (or reported) by the engine, which knows the host.
// Other bounds: at most MaxInputs inputs, MaxEnvVars environment variables
// totalling MaxEnvBytes, paths of at most 4096 bytes with components of at
// most 255, an image name of at most 255 bytes.
func Ranges() []Range {
	def := Default()
	out := make([]Range, len(rules))
	for i, r := range rules {
		_, shown := r.check(def)
		if r.field == "resources.cpu_time" {
			shown = "resources.timeout"
		}
		out[i] = Range{Field: r.field, Min: r.min, Max: r.max, Default: shown}
	}
	return out
}

// rule checks one numeric field against its range.
type rule struct {
	field, min, max string
	// check reports whether m's value is in range, and the value as text.
	check func(m *Manifest) (ok bool, shown string)
}

func sizeRule(field string, lo, hi Size, get func(*Manifest) Size) rule {
	return rule{field, lo.String(), hi.String(), func(m *Manifest) (bool, string) {
		v := get(m)
		return v >= lo && v <= hi, v.String()
	}}
}

func durationRule(field string, lo, hi time.Duration, get func(*Manifest) Duration) rule {
	return rule{field, Duration(lo).String(), Duration(hi).String(), func(m *Manifest) (bool, string) {
		v := get(m)
		return v >= Duration(lo) && v <= Duration(hi), v.String()
	}}
}

func intRule(field string, lo, hi int, get func(*Manifest) int) rule {
	return rule{field, strconv.Itoa(lo), strconv.Itoa(hi), func(m *Manifest) (bool, string) {
		v := get(m)
		return v >= lo && v <= hi, strconv.Itoa(v)
	}}
}

func floatRule(field string, lo, hi float64, get func(*Manifest) float64) rule {
	format := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	return rule{field, format(lo), format(hi), func(m *Manifest) (bool, string) {
		v := get(m)
		return v >= lo && v <= hi, format(v) // false for NaN
	}}
}

// tiers are the accepted tier names. Validate only checks the name; the
// engine refuses a tier this build does not implement.
var tiers = []string{"native", "gvisor", "microvm", "wasm"}

// networkModes are the accepted network.mode values.
var networkModes = []string{"none", "allowlist"}

// maxAllow bounds network.allow and network.allow_addresses.
const maxAllow = 256

// allowMissing are the accepted security.allow_missing values: protections
// a run may explicitly go without when the host lacks them.
var allowMissing = []string{"landlock"}

// Validate reports every problem with m (up to a bound), each as a
// *FieldError joined with errors.Join, or nil. It does not apply defaults
// and does not touch the host: start from Default or Parse.
func (m *Manifest) Validate() error {
	var errs errorList
	m.validate(&errs)
	return errs.err()
}

func (m *Manifest) validate(errs *errorList) {
	m.validateImage(errs)
	if !slices.Contains(tiers, m.Tier) {
		errs.add("tier", m.Tier, "is not a known tier; accepted: "+strings.Join(tiers, ", "))
	}
	m.validateInputs(errs)
	for _, r := range rules {
		if ok, shown := r.check(m); !ok {
			errs.add(r.field, shown, "is out of range; accepted "+r.min+".."+r.max)
		}
	}
	m.validateNetwork(errs)
	m.validateInbound(errs)
	m.validatePackages(errs)
	m.validateEnv(errs)
	m.validateSecrets(errs)
	m.validateJustifications(errs)
	for i, a := range m.Security.AllowMissing {
		field := fmt.Sprintf("security.allow_missing[%d]", i)
		switch {
		case !slices.Contains(allowMissing, a):
			errs.add(field, a, "is not a protection that may be missing; accepted: "+strings.Join(allowMissing, ", "))
		case slices.Index(m.Security.AllowMissing, a) < i:
			errs.add(field, a, "is listed twice; list it once")
		}
	}
}

// validateImage accepts names like "python", "python:3.12",
// "library/node@sha256:<hex>": the image store maps names to paths, so no
// component may be empty, "." or "..".
func (m *Manifest) validateImage(errs *errorList) {
	const fix = `; write a name such as "python" or "python:3.12"`
	img := m.Image
	switch {
	case img == "":
		errs.add("image", img, "is empty"+fix)
		return
	case len(img) > maxImage:
		errs.add("image", img, fmt.Sprintf("is longer than %d bytes%s", maxImage, fix))
		return
	}
	for _, c := range []byte(img) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-+:@/", c) >= 0) {
			errs.add("image", img, "contains "+strconv.QuoteRune(rune(c))+"; use letters, digits and . _ - + : @ /"+fix)
			return
		}
	}
	for _, part := range strings.Split(img, "/") {
		if part == "" || part == "." || part == ".." || !isAlnum(part[0]) {
			errs.add("image", img, "has an empty or dot path component, or one not starting with a letter or digit"+fix)
			return
		}
	}
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func (m *Manifest) validateInputs(errs *errorList) {
	if len(m.Inputs) > MaxInputs {
		errs.add("inputs", strconv.Itoa(len(m.Inputs))+" inputs", fmt.Sprintf("is too many; at most %d (copy a directory instead)", MaxInputs))
		return
	}
	type placed struct {
		dst string
		i   int
	}
	var ok []placed
	for i, in := range m.Inputs {
		src := fmt.Sprintf("inputs[%d].src", i)
		switch {
		case in.Src == "":
			errs.add(src, "", "is required; give the host path to copy")
		case !utf8.ValidString(in.Src):
			errs.add(src, in.Src, "is not valid UTF-8")
		case strings.IndexByte(in.Src, 0) >= 0:
			errs.add(src, in.Src, "contains a NUL byte")
		case len(in.Src) > maxPathLen:
			errs.add(src, in.Src, fmt.Sprintf("is longer than %d bytes", maxPathLen))
		}
		dstField := fmt.Sprintf("inputs[%d].dst", i)
		if problem := dstProblem(in.Dst); problem != "" {
			errs.add(dstField, in.Dst, problem)
			continue
		}
		for _, p := range ok {
			switch {
			case p.dst == in.Dst:
				errs.add(dstField, in.Dst, fmt.Sprintf("is also the dst of inputs[%d]; give each input its own dst", p.i))
			case strings.HasPrefix(in.Dst, p.dst+"/"):
				errs.add(dstField, in.Dst, fmt.Sprintf("is inside inputs[%d].dst %q; inputs may not nest", p.i, p.dst))
			case strings.HasPrefix(p.dst, in.Dst+"/"):
				errs.add(dstField, in.Dst, fmt.Sprintf("contains inputs[%d].dst %q; inputs may not nest", p.i, p.dst))
			default:
				continue
			}
			break
		}
		ok = append(ok, placed{in.Dst, i})
	}
}

// dstProblem says what is wrong with a dst, or "" if it is a clean,
// relative path that stays inside /workspace.
func dstProblem(dst string) string {
	const example = ` such as "task"`
	switch {
	case dst == "":
		return "is empty; give a path under /workspace" + example + " (the default, the base name of src, is not usable here)"
	case !utf8.ValidString(dst):
		return "is not valid UTF-8"
	case strings.IndexByte(dst, 0) >= 0:
		return "contains a NUL byte"
	case strings.IndexFunc(dst, isControl) >= 0:
		// Legal in Linux names, but a newline in a file name forges lines
		// in every file list and diff report downstream.
		return "contains a control character"
	case len(dst) > maxPathLen:
		return fmt.Sprintf("is longer than %d bytes", maxPathLen)
	case strings.HasPrefix(dst, "/"):
		return "is absolute; give a path relative to /workspace" + example
	}
	for _, part := range strings.Split(dst, "/") {
		if part == ".." {
			return `has a ".." component and could escape /workspace; give a path inside /workspace` + example
		}
		if len(part) > maxNameLen {
			return fmt.Sprintf("has a component longer than %d bytes", maxNameLen)
		}
	}
	clean := path.Clean(dst)
	switch {
	case clean == ".":
		return "names /workspace itself; give a name under it" + example
	case clean != dst:
		return fmt.Sprintf("is not a clean path; write %q", clean)
	}
	return ""
}

func (m *Manifest) validateEnv(errs *errorList) {
	if len(m.Env) > MaxEnvVars {
		errs.add("env", strconv.Itoa(len(m.Env))+" variables", fmt.Sprintf("is too many; at most %d", MaxEnvVars))
		return
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(m.Env)) {
		v := m.Env[k]
		total += len(k) + len(v) + 2
		if !isEnvName(k) {
			errs.add("env", k, "is not a valid variable name; names match [A-Za-z_][A-Za-z0-9_]*")
			continue
		}
		switch {
		case !utf8.ValidString(v):
			errs.add("env."+k, v, "is not valid UTF-8")
		case strings.IndexByte(v, 0) >= 0:
			errs.add("env."+k, v, "contains a NUL byte, which cannot be passed to a program")
		}
	}
	if total > MaxEnvBytes {
		errs.add("env", strconv.Itoa(total)+" bytes", fmt.Sprintf("is too large; at most %d bytes of names and values (pass large data as an input file)", MaxEnvBytes))
	}
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// validateNetwork checks the network grant. Entries are parsed by the
// egress proxy's own rule parser, so what validates is exactly what the
// proxy will enforce.
func (m *Manifest) validateNetwork(errs *errorList) {
	n := m.Network
	if !slices.Contains(networkModes, n.Mode) {
		errs.add("network.mode", n.Mode, "is not a network mode; accepted: "+strings.Join(networkModes, ", "))
		return
	}
	if n.Mode == "none" {
		if len(n.Allow) > 0 {
			errs.add("network.allow", strings.Join(n.Allow, ","), "needs network.mode: allowlist (mode none grants no destination)")
		}
		if len(n.AllowAddresses) > 0 {
			errs.add("network.allow_addresses", strings.Join(n.AllowAddresses, ","), "needs network.mode: allowlist")
		}
		return
	}
	if len(n.Allow) == 0 && len(n.AllowAddresses) == 0 && !m.Packages.Granted() {
		errs.add("network.allow", "", "is empty: mode allowlist needs at least one destination, e.g. allow: [pypi.org, \"*.pythonhosted.org\"]")
	}
	if len(n.Allow) > maxAllow {
		errs.add("network.allow", fmt.Sprint(len(n.Allow), " entries"), fmt.Sprintf("is too long; at most %d entries", maxAllow))
		return
	}
	for i, s := range n.Allow {
		if _, err := egress.ParseRule(s); err != nil {
			errs.add(fmt.Sprintf("network.allow[%d]", i), s, ruleProblem(err))
		}
	}
	if len(n.AllowAddresses) > maxAllow {
		errs.add("network.allow_addresses", fmt.Sprint(len(n.AllowAddresses), " entries"), fmt.Sprintf("is too long; at most %d entries", maxAllow))
		return
	}
	for i, s := range n.AllowAddresses {
		if _, err := netip.ParsePrefix(s); err == nil {
			continue
		}
		if _, err := netip.ParseAddr(s); err != nil {
			errs.add(fmt.Sprintf("network.allow_addresses[%d]", i), s, "is not an IP address or prefix (e.g. 127.0.0.1 or 10.0.0.0/24)")
		}
	}
}

// ruleProblem is the rule parser's explanation without the entry it
// already names (the field error shows the value).
func ruleProblem(err error) string {
	var re *egress.RuleError
	if errors.As(err, &re) && re.Reason != "" {
		return re.Reason
	}
	return err.Error()
}

// Package-index defaults and choices (manifest packages:).
const (
	DefaultPyPIIndex = "https://pypi.org/simple"
	DefaultNPMIndex  = "https://registry.npmjs.org"
)

var packagePolicies = []string{"", "refuse", "warn"}
var yankedPolicies = []string{"", "refuse", "allow"}

// validatePackages checks the packages grant. Allow entries are parsed by
// the guard's own parser, so what validates is what the guard enforces.
func (m *Manifest) validatePackages(errs *errorList) {
	p := m.Packages
	if !slices.Contains(packagePolicies, p.Typosquat) {
		errs.add("packages.typosquat", p.Typosquat, "is not a typosquat policy; accepted: refuse, warn")
	}
	if !slices.Contains(yankedPolicies, p.Yanked) {
		errs.add("packages.yanked", p.Yanked, "is not a yanked policy; accepted: refuse, allow")
	}
	if p.NewPackagesDays < 0 || p.NewPackagesDays > 3650 {
		errs.add("packages.new_packages_days", fmt.Sprint(p.NewPackagesDays), "is out of range; accepted 0..3650")
	}
	for _, ix := range []struct {
		eco   pkgguard.Ecosystem
		index PackageIndex
	}{{pkgguard.PyPI, p.PyPI}, {pkgguard.NPM, p.NPM}} {
		field := "packages." + string(ix.eco)
		if ix.index.Index != "" {
			u, err := url.Parse(ix.index.Index)
			if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
				errs.add(field+".index", ix.index.Index, "is not an http(s) URL without user info, query or fragment; e.g. "+map[pkgguard.Ecosystem]string{pkgguard.PyPI: DefaultPyPIIndex, pkgguard.NPM: DefaultNPMIndex}[ix.eco])
			}
			if len(ix.index.Allow) == 0 {
				errs.add(field+".allow", "", "is empty: an index grants nothing without allowed packages; list them, e.g. [\"requests==2.31.0\"]")
			}
		}
		if len(ix.index.Allow) > maxAllow {
			errs.add(field+".allow", fmt.Sprint(len(ix.index.Allow), " entries"), fmt.Sprintf("is too long; at most %d entries", maxAllow))
			continue
		}
		seen := map[string]int{}
		for i, s := range ix.index.Allow {
			f := fmt.Sprintf("%s.allow[%d]", field, i)
			r, err := pkgguard.ParseRequirement(ix.eco, s)
			if err != nil {
				errs.add(f, s, err.Error())
				continue
			}
			if j, dup := seen[r.Name]; dup {
				errs.add(f, s, fmt.Sprintf("names %s again (also %s.allow[%d]); write one entry per package", r.Name, field, j))
			}
			seen[r.Name] = i
		}
	}
	if p.Granted() && m.Network.Mode != "allowlist" {
		errs.add("packages", "", "needs network.mode: allowlist (the guarded index is served by the egress proxy); the index itself needs no network.allow entry")
	}
}

// Tiers returns the accepted tier names.
func Tiers() []string { return slices.Clone(tiers) }
