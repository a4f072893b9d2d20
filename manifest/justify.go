package manifest

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Widenings and their justifications: what a manifest grants beyond
// Default, field by field, and the written reason for each. An operator
// policy (package policy) can require a reason per widening and bounds
// each widening with a ceiling; this file only says what a widening is.

// Limit is one numeric manifest field where a larger value grants more
// (more memory, more time, more bytes out). Limits lists them all.
type Limit struct {
	// Field is the dotted path, e.g. "resources.memory".
	Field string
	get   func(*Manifest) float64
	show  func(*Manifest) string
}

// Value returns m's value of the field as a number that orders like the
// grant (bytes, nanoseconds, a count, CPUs). Every accepted value is
// exact in a float64 (at most 64GiB bytes or 24h in nanoseconds).
func (l Limit) Value(m *Manifest) float64 { return l.get(m) }

// Show returns m's value as a manifest would write it ("512MiB", "30s").
func (l Limit) Show(m *Manifest) string { return l.show(m) }

func sizeLimit(field string, get func(*Manifest) Size) Limit {
	return Limit{field, func(m *Manifest) float64 { return float64(get(m)) }, func(m *Manifest) string { return get(m).String() }}
}

func intLimit(field string, get func(*Manifest) int) Limit {
	return Limit{field, func(m *Manifest) float64 { return float64(get(m)) }, func(m *Manifest) string { return strconv.Itoa(get(m)) }}
}

func durationLimit(field string, get func(*Manifest) Duration) Limit {
	return Limit{field, func(m *Manifest) float64 { return float64(get(m)) }, func(m *Manifest) string { return get(m).D().String() }}
}

// limits follows the order of the rules table, so errors come in the
// order a manifest is written.
var limits = []Limit{
	sizeLimit("workspace.size", func(m *Manifest) Size { return m.Workspace.Size }),
	intLimit("workspace.files", func(m *Manifest) int { return m.Workspace.Files }),
	{"resources.cpus", func(m *Manifest) float64 { return m.Resources.CPUs }, func(m *Manifest) string { return strconv.FormatFloat(m.Resources.CPUs, 'f', -1, 64) }},
	sizeLimit("resources.memory", func(m *Manifest) Size { return m.Resources.Memory }),
	intLimit("resources.pids", func(m *Manifest) int { return m.Resources.Pids }),
	durationLimit("resources.timeout", func(m *Manifest) Duration { return m.Resources.Timeout }),
	durationLimit("resources.cpu_time", func(m *Manifest) Duration { return m.Resources.CPUTime }),
	intLimit("resources.open_files", func(m *Manifest) int { return m.Resources.OpenFiles }),
	sizeLimit("resources.file_size", func(m *Manifest) Size { return m.Resources.FileSize }),
	sizeLimit("resources.stdout_bytes", func(m *Manifest) Size { return m.Resources.StdoutBytes }),
	sizeLimit("resources.stderr_bytes", func(m *Manifest) Size { return m.Resources.StderrBytes }),
	intLimit("network.max_connections", func(m *Manifest) int { return m.Network.MaxConnections }),
	intLimit("network.connections_per_second", func(m *Manifest) int { return m.Network.ConnectionsPerSecond }),
	sizeLimit("network.max_bytes_out", func(m *Manifest) Size { return m.Network.MaxBytesOut }),
	sizeLimit("network.max_bytes_in", func(m *Manifest) Size { return m.Network.MaxBytesIn }),
	intLimit("network.names_per_second", func(m *Manifest) int { return m.Network.NamesPerSecond }),
}

// Limits returns the numeric fields where a larger value grants more.
func Limits() []Limit { return slices.Clone(limits) }

// The non-numeric widenings, each justified under one key.
const (
	// WidenNetworkAllow is any network.allow entry.
	WidenNetworkAllow = "network.allow"
	// WidenAllowAddresses is any network.allow_addresses entry.
	WidenAllowAddresses = "network.allow_addresses"
	// WidenInbound is any network.inbound entry.
	WidenInbound = "network.inbound"
	// WidenSecrets is any secret.
	WidenSecrets = "secrets"
	// WidenPackages is any granted package, and typosquat: warn or
	// yanked: allow.
	WidenPackages = "packages"
	// WidenAllowMissing is any security.allow_missing entry.
	WidenAllowMissing = "security.allow_missing"
)

// JustifiableFields lists every key justifications accepts: the numeric
// limits and the grants that Default leaves empty.
func JustifiableFields() []string {
	fields := make([]string, 0, len(limits)+6)
	for _, l := range limits {
		fields = append(fields, l.Field)
	}
	return append(fields, WidenNetworkAllow, WidenAllowAddresses, WidenInbound, WidenSecrets, WidenPackages, WidenAllowMissing)
}

// Widening is one field where a manifest grants more than Default.
type Widening struct {
	// Field is the key its justification goes under.
	Field string
	// Value and Default describe the widening for a person, e.g. "2GiB"
	// and "512MiB", or "2 hosts" and "none".
	Value, Default string
}

// Widenings lists where m grants more than Default, in JustifiableFields'
// order. Choosing another tier or image, env and inputs are not
// widenings: they do not reach further out of the sandbox.
func (m *Manifest) Widenings() []Widening {
	d := Default()
	var w []Widening
	for _, l := range limits {
		if l.Value(m) > l.Value(d) {
			w = append(w, Widening{l.Field, l.Show(m), l.Show(d)})
		}
	}
	count := func(field string, n int, what string) {
		if n > 0 {
			w = append(w, Widening{field, fmt.Sprintf("%d %s", n, what), "none"})
		}
	}
	count(WidenNetworkAllow, len(m.Network.Allow), "hosts")
	count(WidenAllowAddresses, len(m.Network.AllowAddresses), "addresses")
	count(WidenInbound, m.Network.inboundPorts(), "inbound ports")
	count(WidenSecrets, len(m.Secrets), "secrets")
	if p := m.Packages; p.Granted() || p.Typosquat == "warn" || p.Yanked == "allow" {
		w = append(w, Widening{WidenPackages, fmt.Sprintf("%d packages", len(p.PyPI.Allow)+len(p.NPM.Allow)), "none"})
	}
	count(WidenAllowMissing, len(m.Security.AllowMissing), "protections")
	return w
}

// MaxJustificationBytes bounds one justification: a sentence or two for a
// reviewer, not a document.
const MaxJustificationBytes = 1024

// validateJustifications checks the keys and texts of justifications. A
// key must name a field that this manifest widens: a reason for a grant
// that is not there would tell a reviewer something false. The text is
// shown to people (CLI, audit, dashboard), so control and bidi
// formatting characters, which can hide or reorder what they read, are
// refused.
func (m *Manifest) validateJustifications(errs *errorList) {
	if len(m.Justifications) == 0 {
		return
	}
	widened := map[string]Widening{}
	for _, w := range m.Widenings() {
		widened[w.Field] = w
	}
	known := JustifiableFields()
	keys := make([]string, 0, len(m.Justifications))
	for k := range m.Justifications {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		text := m.Justifications[k]
		field := "justifications." + k
		if !slices.Contains(known, k) {
			errs.add(field, "", "is not a field that can be widened; accepted keys: "+strings.Join(known, ", "))
			continue
		}
		if _, ok := widened[k]; !ok {
			errs.add(field, "", "justifies "+k+", which this manifest does not widen beyond Moat's default; remove the justification")
			continue
		}
		switch {
		case strings.TrimSpace(text) == "":
			errs.add(field, "", "is empty; say in a sentence why the run needs this widening")
		case len(text) > MaxJustificationBytes:
			errs.add(field, text, fmt.Sprintf("is %d bytes long; at most %d are accepted", len(text), MaxJustificationBytes))
		case strings.IndexFunc(text, func(r rune) bool {
			return unicode.IsControl(r) && r != '\n' || unicode.Is(unicode.Bidi_Control, r)
		}) >= 0:
			errs.add(field, text, "holds a control or bidi formatting character; write plain text")
		}
	}
}
