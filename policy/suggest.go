package policy

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/pkgguard"
)

// Suggestion is a policy proposed from audit records (moat policy suggest
// --ceilings), with how many records each ceiling rests on.
type Suggestion struct {
	Policy *Policy `json:"policy"`
	// Records counts the records each key's ceiling rests on ("" is the
	// default ceiling: local runs).
	Records map[string]int `json:"records"`
	// Skipped counts records whose manifest could not be read (written
	// by an older Moat, or damaged).
	Skipped int `json:"skipped"`
}

// Suggest proposes, per key, the ceiling that admits every manifest the
// key's records were granted: the widest value of each numeric field,
// the union of tiers, hosts, addresses, secrets and packages. Memory,
// timeout and CPU time are also at least the largest use observed ×
// audit.MemoryHeadroom or audit.TimeHeadroom (rounded up, within the
// manifest's ranges), so a ceiling learnt from runs that used most of
// their grant leaves room. Runs of the local CLI (no key) make the
// default ceiling; keys not seen get it too. RequireJustifications is
// true: the records' manifests that widen defaults carry justifications,
// or must, once the policy is loaded.
func Suggest(records []audit.Record) (*Suggestion, error) {
	p := &Policy{RequireJustifications: true, Keys: map[string]Ceiling{}}
	s := &Suggestion{Policy: p, Records: map[string]int{}}
	ceilings := map[string]*manifest.Manifest{}
	tiers := map[string][]string{}
	pkgs := map[string]*Packages{}
	secrets := map[string][]string{}
	for _, r := range records {
		m, err := manifest.Parse([]byte(r.Manifest), "record.json")
		if err != nil || r.Manifest == "" {
			s.Skipped++
			continue
		}
		c := ceilings[r.KeyID]
		if c == nil {
			c = manifest.Default()
			c.Network.Mode = "none"
			ceilings[r.KeyID] = c
			pkgs[r.KeyID] = &Packages{}
		}
		s.Records[r.KeyID]++
		widen(c, m)
		// Use with headroom: what the grant must cover next time.
		if r.PeakMemoryBytes > 0 {
			c.Resources.Memory = max(c.Resources.Memory, roundSize(float64(r.PeakMemoryBytes)*audit.MemoryHeadroom))
		}
		if r.WallMS > 0 {
			c.Resources.Timeout = max(c.Resources.Timeout, roundSeconds(r.WallMS*audit.TimeHeadroom))
		}
		if r.CPUMS > 0 {
			c.Resources.CPUTime = max(c.Resources.CPUTime, roundSeconds(r.CPUMS*audit.TimeHeadroom))
		}
		tiers[r.KeyID] = addAll(tiers[r.KeyID], m.Tier)
		for _, sec := range m.Secrets {
			secrets[r.KeyID] = addAll(secrets[r.KeyID], sec.Name)
		}
		widenPackages(pkgs[r.KeyID], m.Packages)
	}
	if len(ceilings) == 0 {
		return nil, fmt.Errorf("%w: %d records, none with a readable manifest", audit.ErrNoLegitimateRuns, len(records))
	}
	for id, m := range ceilings {
		c := Ceiling{
			Tiers:     tiers[id],
			Workspace: m.Workspace,
			Resources: m.Resources,
			Network:   m.Network,
			Secrets:   secrets[id],
			Packages:  *pkgs[id],
			Security:  m.Security,
		}
		slices.Sort(c.Tiers)
		slices.Sort(c.Secrets)
		if id == "" {
			p.Default = c
		} else {
			p.Keys[id] = c
		}
	}
	if _, ok := ceilings[""]; !ok {
		p.Default = Ceiling{}
	}
	// Round-trip through the parser: what is printed must load.
	var buf bytes.Buffer
	if err := s.WriteYAML(&buf); err != nil {
		return nil, err
	}
	parsed, err := Parse(buf.Bytes(), "suggested-policy.yaml")
	if err != nil {
		return nil, fmt.Errorf("the suggested policy does not parse (a bug in moat, please report): %w", err)
	}
	s.Policy = parsed
	return s, nil
}

// widen raises c to admit m.
func widen(c, m *manifest.Manifest) {
	cw, mw := &c.Workspace, m.Workspace
	cw.Size, cw.Files = max(cw.Size, mw.Size), max(cw.Files, mw.Files)
	cr, mr := &c.Resources, m.Resources
	cr.CPUs = max(cr.CPUs, mr.CPUs)
	cr.Memory = max(cr.Memory, mr.Memory)
	cr.Pids = max(cr.Pids, mr.Pids)
	cr.Timeout = max(cr.Timeout, mr.Timeout)
	cr.CPUTime = max(cr.CPUTime, mr.CPUTime)
	cr.OpenFiles = max(cr.OpenFiles, mr.OpenFiles)
	cr.FileSize = max(cr.FileSize, mr.FileSize)
	cr.StdoutBytes = max(cr.StdoutBytes, mr.StdoutBytes)
	cr.StderrBytes = max(cr.StderrBytes, mr.StderrBytes)
	cn, mn := &c.Network, m.Network
	if mn.Mode != "none" {
		cn.Mode = mn.Mode
	}
	cn.MaxConnections = max(cn.MaxConnections, mn.MaxConnections)
	cn.ConnectionsPerSecond = max(cn.ConnectionsPerSecond, mn.ConnectionsPerSecond)
	cn.MaxBytesOut = max(cn.MaxBytesOut, mn.MaxBytesOut)
	cn.MaxBytesIn = max(cn.MaxBytesIn, mn.MaxBytesIn)
	cn.NamesPerSecond = max(cn.NamesPerSecond, mn.NamesPerSecond)
	cn.Allow = addAll(cn.Allow, mn.Allow...)
	cn.AllowAddresses = addAll(cn.AllowAddresses, mn.AllowAddresses...)
	for _, r := range mn.Inbound {
		if !slices.Contains(cn.Inbound, r) {
			cn.Inbound = append(cn.Inbound, r)
		}
	}
	c.Security.AllowMissing = addAll(c.Security.AllowMissing, m.Security.AllowMissing...)
}

func widenPackages(c *Packages, m manifest.Packages) {
	for _, ix := range []struct {
		eco  pkgguard.Ecosystem
		req  manifest.PackageIndex
		ceil *Index
	}{{pkgguard.PyPI, m.PyPI, &c.PyPI}, {pkgguard.NPM, m.NPM, &c.NPM}} {
		if len(ix.req.Allow) == 0 {
			continue
		}
		index := ix.req.Index
		if index == "" {
			index = defaultIndex(ix.eco)
		}
		ix.ceil.Indexes = addAll(ix.ceil.Indexes, index)
		for _, a := range ix.req.Allow {
			if req, err := pkgguard.ParseRequirement(ix.eco, a); err == nil {
				ix.ceil.Allow = addAll(ix.ceil.Allow, req.Name)
			}
		}
	}
	if m.Typosquat == "warn" {
		c.Typosquat = "warn"
	}
	if m.Yanked == "allow" {
		c.Yanked = "allow"
	}
}

// addAll adds the values not yet in list, keeping it sorted.
func addAll(list []string, vs ...string) []string {
	for _, v := range vs {
		if !slices.Contains(list, v) {
			list = append(list, v)
		}
	}
	sort.Strings(list)
	return list
}

// roundSize rounds up to a power of two MiB or 1.5 times one, within the
// manifest's memory range.
func roundSize(bytes float64) manifest.Size {
	for s := manifest.MiB; s <= 64*manifest.GiB; s *= 2 {
		if float64(s) >= bytes {
			return s
		}
		if mid := s + s/2; float64(mid) >= bytes {
			return mid
		}
	}
	return 64 * manifest.GiB
}

// roundSeconds rounds ms up to whole seconds, at most 24h.
func roundSeconds(ms float64) manifest.Duration {
	s := math.Ceil(ms / 1000)
	return manifest.Duration(time.Duration(min(s, 24*3600)) * time.Second)
}

// WriteYAML prints the suggested policy, ready for moat serve --policy,
// with a comment saying what each ceiling rests on.
func (s *Suggestion) WriteYAML(w io.Writer) error {
	doc := struct {
		RequireJustifications bool               `yaml:"require_justifications"`
		Default               Ceiling            `yaml:"default"`
		Keys                  map[string]Ceiling `yaml:"keys,omitempty"`
	}{s.Policy.RequireJustifications, s.Policy.Default, s.Policy.Keys}
	var n yaml.Node
	if err := n.Encode(doc); err != nil {
		return err
	}
	total := 0
	for _, c := range s.Records {
		total += c
	}
	n.HeadComment = fmt.Sprintf("Moat operator policy suggested from %d audit records (%d skipped): each key's\nceiling admits every manifest its records were granted, and the largest use\nwith headroom. Load it with: moat serve --policy FILE", total, s.Skipped)
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch n.Content[i].Value {
		case "default":
			n.Content[i].HeadComment = fmt.Sprintf("Local runs and keys not listed below: from %d records.", s.Records[""])
		case "keys":
			keys := n.Content[i+1]
			for j := 0; j+1 < len(keys.Content); j += 2 {
				keys.Content[j].HeadComment = fmt.Sprintf("from %d records", s.Records[keys.Content[j].Value])
			}
		}
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return err
	}
	_, err := io.WriteString(w, strings.TrimRight(buf.String(), "\n")+"\n")
	return err
}
