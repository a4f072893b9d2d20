// Package policy is the operator's policy file: per API key (and a default
// for every other key and for local runs), the widest manifest a run may
// ask for, and whether each widening beyond Moat's defaults must carry a
// written justification. Front doors load it (moat serve --policy, moat
// run --policy); the service and the CLI call Check before anything runs.
//
// It must never widen a manifest, never let a key without an entry fall
// through to no ceiling (such a key gets the default ceiling, whose absent
// fields are Moat's defaults), and never panic on any file.
package policy

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/pkgguard"
)

// EnvVar names the environment variable that gives the policy file when
// no --policy flag does.
const EnvVar = "MOAT_POLICY"

// MaxKeys bounds the per-key entries of one policy file.
const MaxKeys = 4096

// Policy is a parsed, validated operator policy. The zero value is not
// usable: obtain one from Parse or Load.
type Policy struct {
	// RequireJustifications: every widening beyond manifest.Default needs
	// an entry in the manifest's justifications (default true).
	RequireJustifications bool `json:"require_justifications" yaml:"require_justifications"`
	// Default is the ceiling of every key not in Keys, and of local runs.
	Default Ceiling `json:"default" yaml:"default"`
	// Keys are per-key ceilings by API key id. A key's entry replaces
	// Default; it does not add to it.
	Keys map[string]Ceiling `json:"keys" yaml:"keys"`

	// Source names the file, for messages ("policy /etc/moat/policy.yaml").
	Source string `json:"-" yaml:"-"`
}

// Ceiling is the widest manifest allowed. Every field that is absent (or
// zero) is Moat's default, so a ceiling only widens what it names.
type Ceiling struct {
	// Tiers are the tiers a run may choose. Absent: the default tier only.
	Tiers []string `json:"tiers" yaml:"tiers"`
	// Workspace and Resources bound each numeric field from above.
	Workspace manifest.Workspace `json:"workspace" yaml:"workspace"`
	Resources manifest.Resources `json:"resources" yaml:"resources"`
	// Network: mode allowlist permits a network; allow lists the rules a
	// requested entry must lie inside ("*.example.com" covers
	// "api.example.com"); allow_addresses the prefixes a requested
	// address or prefix must lie inside; the numeric limits bound the
	// proxy's budgets.
	Network manifest.Network `json:"network" yaml:"network"`
	// Secrets are the secret names a run may bind (the key must also be
	// granted each: moat keys grant).
	Secrets []string `json:"secrets" yaml:"secrets"`
	// Packages bound the guarded package index.
	Packages Packages `json:"packages" yaml:"packages"`
	// Security.AllowMissing lists the protections a run may go without.
	Security manifest.Security `json:"security" yaml:"security"`
}

// Packages is the ceiling of a manifest's packages section.
type Packages struct {
	PyPI Index `json:"pypi" yaml:"pypi"`
	NPM  Index `json:"npm" yaml:"npm"`
	// Typosquat "warn" permits runs to ask for typosquat: warn; absent or
	// "refuse": only the default.
	Typosquat string `json:"typosquat" yaml:"typosquat"`
	// Yanked "allow" permits yanked: allow; absent or "refuse": only the
	// default.
	Yanked string `json:"yanked" yaml:"yanked"`
}

// Index is the ceiling of one package index.
type Index struct {
	// Indexes are the upstreams a run may name. Absent: the default
	// upstream only.
	Indexes []string `json:"indexes" yaml:"indexes"`
	// Allow lists the package names a run may ask for (any version), or
	// "*" for every name. Absent: none.
	Allow []string `json:"allow" yaml:"allow"`
}

// Load reads and parses the policy file at path.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, manifest.MaxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read policy %s: %w", path, err)
	}
	return Parse(data, path)
}

// Parse parses and validates a policy file (YAML, or JSON by a .json
// name) with the manifest's strict rules: unknown keys, duplicate keys,
// quoted numbers are errors. Errors are *manifest.FieldError values
// naming the field ("keys.ci.resources.memory"), prefixed with filename.
func Parse(data []byte, filename string) (*Policy, error) {
	p := &Policy{RequireJustifications: true}
	if err := manifest.DecodeStrict(data, filename, p); err != nil {
		return nil, err
	}
	p.Source = filename
	var errs []error
	if len(p.Keys) > MaxKeys {
		errs = append(errs, &manifest.FieldError{Field: "keys", Problem: fmt.Sprintf("has %d entries; at most %d are accepted", len(p.Keys), MaxKeys)})
	}
	errs = append(errs, p.Default.normalize("default")...)
	ids := make([]string, 0, len(p.Keys))
	for id := range p.Keys {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := p.Keys[id]
		prefix := "keys." + id
		if id == "" || len(id) > 128 || strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			errs = append(errs, &manifest.FieldError{Field: "keys", Value: id, Problem: "is not a key id (1 to 128 printable characters, as moat keys list shows)"})
			continue
		}
		errs = append(errs, c.normalize(prefix)...)
		p.Keys[id] = c
	}
	if len(errs) > 0 {
		if len(errs) > 20 {
			errs = append(errs[:20], fmt.Errorf("and %d more problems", len(errs)-20))
		}
		return nil, fmt.Errorf("%s: %w", filename, errors.Join(errs...))
	}
	return p, nil
}

// For returns the ceiling of keyID ("" for local runs): its entry in
// Keys, or Default.
func (p *Policy) For(keyID string) Ceiling {
	if c, ok := p.Keys[keyID]; ok && keyID != "" {
		return c
	}
	return p.Default
}

// normalize fills absent fields with Moat's defaults and validates the
// ceiling as a manifest (so a ceiling can only say what a manifest can),
// returning errors whose fields start with prefix.
func (c *Ceiling) normalize(prefix string) []error {
	d := manifest.Default()
	if len(c.Tiers) == 0 {
		c.Tiers = []string{d.Tier}
	}
	// Zero means absent: the decoder starts map entries from zero values.
	fillZero(&c.Workspace.Size, d.Workspace.Size)
	fillZero(&c.Workspace.Files, d.Workspace.Files)
	r, dr := &c.Resources, d.Resources
	fillZero(&r.CPUs, dr.CPUs)
	fillZero(&r.Memory, dr.Memory)
	fillZero(&r.Pids, dr.Pids)
	fillZero(&r.Timeout, dr.Timeout)
	fillZero(&r.CPUTime, r.Timeout)
	fillZero(&r.OpenFiles, dr.OpenFiles)
	fillZero(&r.FileSize, dr.FileSize)
	fillZero(&r.StdoutBytes, dr.StdoutBytes)
	fillZero(&r.StderrBytes, dr.StderrBytes)
	n, dn := &c.Network, d.Network
	fillZero(&n.Mode, dn.Mode)
	fillZero(&n.MaxConnections, dn.MaxConnections)
	fillZero(&n.ConnectionsPerSecond, dn.ConnectionsPerSecond)
	fillZero(&n.MaxBytesOut, dn.MaxBytesOut)
	fillZero(&n.MaxBytesIn, dn.MaxBytesIn)
	fillZero(&n.NamesPerSecond, dn.NamesPerSecond)
	fillZero(&c.Packages.Typosquat, "refuse")
	fillZero(&c.Packages.Yanked, "refuse")

	var errs []error
	add := func(field, value, problem string) {
		errs = append(errs, &manifest.FieldError{Field: prefix + "." + field, Value: value, Problem: problem})
	}
	for i, t := range c.Tiers {
		if !slices.Contains(manifest.Tiers(), t) {
			add(fmt.Sprintf("tiers[%d]", i), t, "is not a known tier; accepted: "+strings.Join(manifest.Tiers(), ", "))
		}
	}
	// The manifest's own validation checks ranges, rules, addresses,
	// allow_missing: a ceiling is written in the manifest's terms.
	m := c.manifest()
	if err := m.Validate(); err != nil {
		var fe *manifest.FieldError
		for _, e := range unjoin(err) {
			if errors.As(e, &fe) {
				if fe.Field == "network.allow" && len(c.Network.Allow) == 0 {
					// A manifest in mode allowlist needs a host; a
					// ceiling may permit the mode for packages alone.
					continue
				}
				add(fe.Field, fe.Value, fe.Problem)
			} else {
				errs = append(errs, fmt.Errorf("%s: %w", prefix, e))
			}
		}
	}
	for i, s := range c.Secrets {
		if !egress.ValidSecretName(s) {
			add(fmt.Sprintf("secrets[%d]", i), s, "is not a secret name; give 1 to 64 of a-z 0-9 _ -, starting with a letter or digit")
		}
	}
	for _, ix := range []struct {
		field string
		eco   pkgguard.Ecosystem
		index *Index
	}{{"packages.pypi", pkgguard.PyPI, &c.Packages.PyPI}, {"packages.npm", pkgguard.NPM, &c.Packages.NPM}} {
		for i, a := range ix.index.Allow {
			if a == "*" {
				continue
			}
			req, err := pkgguard.ParseRequirement(ix.eco, a)
			switch {
			case err != nil:
				add(fmt.Sprintf("%s.allow[%d]", ix.field, i), a, err.Error())
			case req.Name != strings.TrimSpace(a) && !strings.EqualFold(req.Name, strings.TrimSpace(a)):
				add(fmt.Sprintf("%s.allow[%d]", ix.field, i), a, "is not a bare package name; a ceiling names packages (any version), or \"*\" for all")
			default:
				ix.index.Allow[i] = req.Name
			}
		}
		for i, u := range ix.index.Indexes {
			probe := manifest.Default()
			probe.Network.Mode = "allowlist"
			pi := manifest.PackageIndex{Index: u, Allow: []string{"x"}}
			if ix.eco == pkgguard.PyPI {
				probe.Packages.PyPI = pi
			} else {
				probe.Packages.NPM = pi
			}
			if u == "" || probe.Validate() != nil {
				add(fmt.Sprintf("%s.indexes[%d]", ix.field, i), u, "is not an http(s) URL of a package index, e.g. "+defaultIndex(ix.eco))
			}
		}
	}
	if t := c.Packages.Typosquat; t != "refuse" && t != "warn" {
		add("packages.typosquat", t, "is not refuse or warn")
	}
	if y := c.Packages.Yanked; y != "refuse" && y != "allow" {
		add("packages.yanked", y, "is not refuse or allow")
	}
	return errs
}

func defaultIndex(eco pkgguard.Ecosystem) string {
	if eco == pkgguard.NPM {
		return manifest.DefaultNPMIndex
	}
	return manifest.DefaultPyPIIndex
}

// manifest returns the ceiling's numeric and network fields as a
// manifest, so manifest.Limits compares them field by field.
func (c *Ceiling) manifest() *manifest.Manifest {
	m := manifest.Default()
	m.Workspace = c.Workspace
	m.Resources = c.Resources
	m.Network = c.Network
	m.Security = c.Security
	return m
}

func fillZero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func unjoin(err error) []error {
	for {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			return j.Unwrap()
		}
		u := errors.Unwrap(err)
		if u == nil {
			return []error{err}
		}
		err = u
	}
}

// Refusal is a manifest the policy refuses: a field beyond its ceiling,
// or a widening without a justification.
type Refusal struct {
	// Field is the manifest field ("resources.memory", "network.allow[1]").
	Field string
	// Requested and Ceiling are the values as a manifest writes them.
	Requested, Ceiling string
	// Unjustified: the field is within the ceiling but widens Moat's
	// default without a justification (Ceiling is then the default).
	Unjustified bool
	// KeyID is the key whose ceiling applied ("" for local runs) and
	// Source the policy file.
	KeyID, Source string
}

func (r *Refusal) Error() string {
	whose := "this key's ceiling"
	if r.KeyID == "" {
		whose = "the default ceiling"
	}
	if r.Unjustified {
		return fmt.Sprintf("%s: %s widens Moat's default %s without a justification; add justifications: {%s: \"why the run needs it\"} to the manifest (policy %s)", r.Field, r.Requested, r.Ceiling, justificationKey(r.Field), r.Source)
	}
	return fmt.Sprintf("%s: %s exceeds %s %s (policy %s)", r.Field, r.Requested, whose, r.Ceiling, r.Source)
}

// justificationKey maps a refused field to its justifications key:
// "network.allow[2]" is justified under "network.allow".
func justificationKey(field string) string {
	if i := strings.IndexByte(field, '['); i >= 0 {
		field = field[:i]
	}
	if strings.HasPrefix(field, "packages.") {
		return manifest.WidenPackages
	}
	return field
}

// Check returns a *Refusal for the first field of m (a validated
// manifest) beyond keyID's ceiling, then for the first widening without a
// justification when the policy requires them; nil when m is admitted.
func (p *Policy) Check(keyID string, m *manifest.Manifest) error {
	c := p.For(keyID)
	refuse := func(field, requested, ceiling string) error {
		return &Refusal{Field: field, Requested: requested, Ceiling: ceiling, KeyID: keyID, Source: p.Source}
	}
	if !slices.Contains(c.Tiers, m.Tier) {
		return refuse("tier", m.Tier, "["+strings.Join(c.Tiers, ", ")+"]")
	}
	cm := c.manifest()
	for _, l := range manifest.Limits() {
		if l.Value(m) > l.Value(cm) {
			return refuse(l.Field, l.Show(m), l.Show(cm))
		}
	}
	if m.Network.Mode != "none" && c.Network.Mode == "none" {
		return refuse("network.mode", m.Network.Mode, "none")
	}
	if err := checkNetwork(m, c, refuse); err != nil {
		return err
	}
	for i, s := range m.Secrets {
		if !slices.Contains(c.Secrets, s.Name) {
			return refuse(fmt.Sprintf("secrets[%d].name", i), s.Name, listOrNone(c.Secrets))
		}
	}
	if err := checkPackages(m, c, refuse); err != nil {
		return err
	}
	for i, a := range m.Security.AllowMissing {
		if !slices.Contains(c.Security.AllowMissing, a) {
			return refuse(fmt.Sprintf("security.allow_missing[%d]", i), a, listOrNone(c.Security.AllowMissing))
		}
	}
	if p.RequireJustifications {
		for _, w := range m.Widenings() {
			if strings.TrimSpace(m.Justifications[w.Field]) == "" {
				return &Refusal{Field: w.Field, Requested: w.Value, Ceiling: w.Default, Unjustified: true, KeyID: keyID, Source: p.Source}
			}
		}
	}
	return nil
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return "[" + strings.Join(l, ", ") + "]"
}

func checkNetwork(m *manifest.Manifest, c Ceiling, refuse func(string, string, string) error) error {
	var rules []egress.Rule
	for _, s := range c.Network.Allow {
		if r, err := egress.ParseRule(s); err == nil {
			rules = append(rules, r)
		}
	}
	for i, s := range m.Network.Allow {
		r, err := egress.ParseRule(s)
		// A validated manifest's rules parse; one that does not is
		// refused rather than waved through.
		if err != nil || !slices.ContainsFunc(rules, func(c egress.Rule) bool { return c.Covers(r) }) {
			return refuse(fmt.Sprintf("network.allow[%d]", i), s, listOrNone(c.Network.Allow))
		}
	}
	var prefixes []netip.Prefix
	for _, s := range c.Network.AllowAddresses {
		if p, ok := parsePrefix(s); ok {
			prefixes = append(prefixes, p)
		}
	}
	for i, s := range m.Network.AllowAddresses {
		p, ok := parsePrefix(s)
		if !ok || !slices.ContainsFunc(prefixes, func(c netip.Prefix) bool {
			return c.Addr().Is4() == p.Addr().Is4() && c.Bits() <= p.Bits() && c.Contains(p.Addr())
		}) {
			return refuse(fmt.Sprintf("network.allow_addresses[%d]", i), s, listOrNone(c.Network.AllowAddresses))
		}
	}
	for i, pr := range m.Network.Inbound {
		if !inboundCovered(pr, c.Network.Inbound) {
			ceiling := make([]string, len(c.Network.Inbound))
			for j, r := range c.Network.Inbound {
				ceiling[j] = string(r)
			}
			return refuse(fmt.Sprintf("network.inbound[%d]", i), string(pr), listOrNone(ceiling))
		}
	}
	return nil
}

// inboundCovered reports whether every port of pr lies in one of the
// ceiling's ranges (which may adjoin: 8000-8080 and 8081 cover 8000-8081).
func inboundCovered(pr manifest.PortRange, ceiling []manifest.PortRange) bool {
	first, last, err := pr.Bounds()
	if err != nil {
		return false // a validated manifest's ranges parse
	}
	for p := first; p <= last; {
		next := 0
		for _, c := range ceiling {
			if lo, hi, err := c.Bounds(); err == nil && lo <= p && p <= hi && hi+1 > next {
				next = hi + 1
			}
		}
		if next == 0 {
			return false
		}
		p = next
	}
	return true
}

// parsePrefix reads an allow_addresses entry: an address is its own
// single-address prefix.
func parsePrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), true
}

func checkPackages(m *manifest.Manifest, c Ceiling, refuse func(string, string, string) error) error {
	if m.Packages.Typosquat == "warn" && c.Packages.Typosquat != "warn" {
		return refuse("packages.typosquat", "warn", c.Packages.Typosquat)
	}
	if m.Packages.Yanked == "allow" && c.Packages.Yanked != "allow" {
		return refuse("packages.yanked", "allow", c.Packages.Yanked)
	}
	for _, ix := range []struct {
		field string
		eco   pkgguard.Ecosystem
		req   manifest.PackageIndex
		ceil  Index
	}{{"packages.pypi", pkgguard.PyPI, m.Packages.PyPI, c.Packages.PyPI}, {"packages.npm", pkgguard.NPM, m.Packages.NPM, c.Packages.NPM}} {
		if len(ix.req.Allow) == 0 {
			continue
		}
		index := ix.req.Index
		if index == "" {
			index = defaultIndex(ix.eco)
		}
		indexes := ix.ceil.Indexes
		if len(indexes) == 0 {
			indexes = []string{defaultIndex(ix.eco)}
		}
		if !slices.ContainsFunc(indexes, func(s string) bool { return strings.TrimSuffix(s, "/") == strings.TrimSuffix(index, "/") }) {
			return refuse(ix.field+".index", index, listOrNone(indexes))
		}
		for i, a := range ix.req.Allow {
			req, err := pkgguard.ParseRequirement(ix.eco, a)
			if err != nil || !slices.Contains(ix.ceil.Allow, "*") && !slices.Contains(ix.ceil.Allow, req.Name) {
				return refuse(fmt.Sprintf("%s.allow[%d]", ix.field, i), a, listOrNone(ix.ceil.Allow))
			}
		}
	}
	return nil
}
