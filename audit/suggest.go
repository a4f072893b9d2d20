package audit

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Headroom over the largest legitimate use, so a run that needs a little
// more next time is not killed for it. Memory gets more: running out of
// it is an OOM kill, and peaks vary with input more than times do.
const (
	MemoryHeadroom = 1.5
	TimeHeadroom   = 1.5
)

// Suggestion is a manifest proposed from audit records, with why.
type Suggestion struct {
	// Manifest is the proposal; it has passed Validate.
	Manifest *manifest.Manifest `json:"manifest"`
	// Reasons says, for each field Suggest decided, how it was chosen, in
	// manifest order. Fields not listed keep manifest.Default()'s value.
	Reasons []FieldReason `json:"reasons"`
	// Considered is the number of legitimate runs the proposal is based on;
	// Ignored counts the other records by why they were left out.
	Considered int     `json:"considered"`
	Ignored    []Count `json:"ignored"`
}

// FieldReason is why one manifest field has its suggested value.
type FieldReason struct {
	Field  string `json:"field"` // dotted path, e.g. "resources.memory"
	Reason string `json:"reason"`
}

// Reasons for leaving a record out of a suggestion.
const (
	ignoreSandbox  = "session records (kind sandbox; their commands count as exec records)"
	ignoreApproval = "approval records (a person's decision; the run or command it let through has its own record)"
	ignoreRunning  = "still running"
	ignoreFailed   = "failed (Moat itself failed, or was stopped while it ran)"
	ignoreNonZero  = "exited with a non-zero status"
	ignoreTerminal = "ended by "
)

// ErrNoLegitimateRuns is returned (wrapped, with what was ignored) by
// Suggest when no record qualifies.
var ErrNoLegitimateRuns = errors.New("no legitimate runs to base a policy on")

// Suggest proposes the tightest manifest that would have allowed what the
// records' runs legitimately did. Only finished runs and execs that exited
// by themselves with status 0 count: a run that timed out, was OOM-killed
// or failed shows what the limits stopped, not what the work needs.
//
// From manifest.Default(): the image and tier the runs used (the most
// common, if several); resources.memory from the largest peak ×
// MemoryHeadroom, rounded up to a readable size (4, 6, 8, 12, 16, 24 ...
// MiB: a power of two or 1.5 times one); resources.timeout and cpu_time
// from the longest wall and CPU time × TimeHeadroom, rounded up to whole
// seconds; network mode none when no legitimate run was let through the
// proxy, else an allowlist of exactly the destinations that were
// (host, or host:port when the port is not 80 or 443), with the private
// addresses they resolved to and the IP literals they asked for in
// allow_addresses. Nothing goes below the minimum of manifest.Ranges() or
// above its maximum. Other fields keep their defaults: the records do not
// say what would tighten them.
func Suggest(records []Record) (*Suggestion, error) {
	var legit []Record
	ignored := map[string]int{}
	for _, r := range records {
		switch {
		case r.Kind == KindSandbox:
			ignored[ignoreSandbox]++
		case r.Kind == KindApproval:
			ignored[ignoreApproval]++
		case r.Status == Running:
			ignored[ignoreRunning]++
		case r.Status == Failed:
			ignored[ignoreFailed]++
		case r.Termination != result.Exited:
			ignored[ignoreTerminal+orDash(string(r.Termination))]++
		case r.ExitCode != 0:
			ignored[ignoreNonZero]++
		default:
			legit = append(legit, r)
		}
	}
	s := &Suggestion{Considered: len(legit), Ignored: sortedCounts(ignored)}
	if len(legit) == 0 {
		if len(records) == 0 {
			return nil, fmt.Errorf("%w: no audit records match (widen --since or drop filters)", ErrNoLegitimateRuns)
		}
		return nil, fmt.Errorf("%w: none of the %d records exited by itself with status 0 (ignored: %s)",
			ErrNoLegitimateRuns, len(records), joinCounts(s.Ignored))
	}
	m := manifest.Default()
	s.Manifest = m
	n := len(legit)
	runs := plural(n, "legitimate run")

	if img, why := common(legit, func(r Record) string { return r.Image }); img != "" {
		m.Image = img
		s.reason("image", why)
	}
	if t, why := common(legit, func(r Record) string { return r.Tier }); t != "" {
		m.Tier = t
		s.reason("tier", why)
	}

	ranges, err := loadRanges()
	if err != nil {
		return nil, fmt.Errorf("suggest: %w (a bug in moat, please report)", err)
	}
	// Memory.
	peak, peakID := int64(0), ""
	for _, r := range legit {
		if r.PeakMemoryBytes > peak {
			peak, peakID = r.PeakMemoryBytes, r.ID
		}
	}
	if peak == 0 {
		s.reason("resources.memory", fmt.Sprintf("kept the default %s: none of the %s reported its memory use", m.Resources.Memory, runs))
	} else {
		lo, hi := ranges.memLo, ranges.memHi
		want := float64(peak) * MemoryHeadroom
		size := readableSize(want)
		note := ""
		switch {
		case size < lo:
			size, note = lo, ", raised to the minimum "+lo.String()
		case size > hi:
			size, note = hi, ", capped at the maximum "+hi.String()
		}
		m.Resources.Memory = size
		s.reason("resources.memory", fmt.Sprintf("largest peak %s (record %s) of %s, +%.0f%% headroom = %s, rounded up to %s%s",
			humanBytes(peak), Display(peakID), runs, (MemoryHeadroom-1)*100, humanBytes(int64(want)), manifest.Size(size), note))
	}

	// Wall and CPU time.
	wall, wallID, cpu, cpuID := 0.0, "", 0.0, ""
	for _, r := range legit {
		if r.WallMS > wall {
			wall, wallID = r.WallMS, r.ID
		}
		if r.CPUMS > cpu {
			cpu, cpuID = r.CPUMS, r.ID
		}
	}
	timeout, why := suggestDuration(ranges, "resources.timeout", "wall time", wall, wallID, runs)
	m.Resources.Timeout = timeout
	s.reason("resources.timeout", why)
	cpuTime, why := suggestDuration(ranges, "resources.cpu_time", "CPU time", cpu, cpuID, runs)
	m.Resources.CPUTime = cpuTime
	s.reason("resources.cpu_time", why)

	s.suggestNetwork(legit, runs)

	if err := m.Validate(); err != nil {
		// A bug here, not the user's: every value above was range-checked.
		return nil, fmt.Errorf("the suggested manifest does not validate (a bug in moat, please report): %w", err)
	}
	return s, nil
}

func (s *Suggestion) reason(field, why string) {
	s.Reasons = append(s.Reasons, FieldReason{Field: field, Reason: why})
}

// suggestNetwork sets the network grant from the legitimate runs' allowed
// attempts.
func (s *Suggestion) suggestNetwork(legit []Record, runs string) {
	m := s.Manifest
	allow := map[string]int{}          // allow entry -> attempts
	addresses := map[string]int{}      // allow_addresses entry -> attempts
	literalPorts := map[int][]string{} // IP-literal port not 80/443 -> addresses
	var dropped []string
	total, usedBy := 0, 0
	// unknown: records whose attempts were not all stored and that do not
	// say the missing ones were denied. Records carry every allowed
	// attempt since network summaries exist; older ones may have lost
	// some behind a flood of refusals (issue 17).
	var unknown []string
	for _, r := range legit {
		if r.NetworkOmitted > 0 && r.NetworkSummary == nil {
			unknown = append(unknown, fmt.Sprintf("%d of record %s", r.NetworkOmitted, Display(r.ID)))
		}
		used := false
		for _, a := range r.Network {
			if !a.Allowed {
				continue
			}
			used = true
			total++
			if ip, err := netip.ParseAddr(strings.Trim(a.Host, "[]")); err == nil {
				// An IP literal passes the proxy only when granted
				// explicitly, and on a port some allow entry names.
				addresses[ip.Unmap().String()]++
				if a.Port != 80 && a.Port != 443 {
					literalPorts[a.Port] = append(literalPorts[a.Port], ip.Unmap().String())
				}
				continue
			}
			entry := a.Host
			// A rule without a port grants 80 and 443, except that a
			// CONNECT tunnel to port 80 needs the port named (the proxy
			// refuses opaque port-80 tunnels otherwise).
			if a.Port != 80 && a.Port != 443 && a.Port != 0 || a.Port == 80 && strings.EqualFold(a.Method, "CONNECT") {
				entry = a.Host + ":" + strconv.Itoa(a.Port)
			}
			if _, err := egress.ParseRule(entry); err != nil {
				dropped = append(dropped, Display(entry))
				continue
			}
			allow[entry]++
			// A name that resolved to a private or loopback address was
			// let through only because that address was granted too.
			if ip, err := netip.ParseAddr(a.Address); err == nil && reserved(ip.Unmap()) {
				addresses[ip.Unmap().String()]++
			}
		}
		if used {
			usedBy++
		}
	}
	warn := ""
	if len(unknown) > 0 {
		warn = fmt.Sprintf("; WARNING: attempts not stored (%s) were recorded before moat kept every allowed attempt, and may have been allowed: review them", strings.Join(unknown, ", "))
	}
	if len(allow) == 0 && len(addresses) == 0 {
		m.Network.Mode = "none"
		why := fmt.Sprintf("no legitimate run (of %d) was let through the egress proxy", len(legit))
		if len(dropped) > 0 {
			why += fmt.Sprintf("; left out %s, which the allowlist cannot express", strings.Join(dropped, ", "))
		}
		s.reason("network.mode", why+warn)
		return
	}
	m.Network.Mode = "allowlist"
	s.reason("network.mode", fmt.Sprintf("%s through the egress proxy by %d of %s", plural(total, "allowed attempt"), usedBy, runs)+warn)
	if len(allow) > 0 {
		m.Network.Allow = sortedKeys(allow)
		why := "exactly the destinations the runs reached: " + describeUses(allow)
		if len(dropped) > 0 {
			why += fmt.Sprintf("; left out %s, which the allowlist cannot express", strings.Join(dropped, ", "))
		}
		s.reason("network.allow", why)
	}
	if len(addresses) > 0 {
		m.Network.AllowAddresses = sortedKeys(addresses)
		why := "addresses the proxy refuses unless granted, which the runs used: " + describeUses(addresses) +
			"; each widens the sandbox, see docs/THREATS.md"
		// The proxy lets an IP literal through on a port other than 80
		// and 443 only when some allow entry names that port.
		for _, port := range sortedInts(literalPorts) {
			named := false
			for _, e := range m.Network.Allow {
				if strings.HasSuffix(e, ":"+strconv.Itoa(port)) {
					named = true
				}
			}
			if !named {
				why += fmt.Sprintf("; WARNING: %s on port %d also needs an allow entry naming port %d, which no host the runs used has: add one, or the proxy refuses it",
					strings.Join(slices.Compact(slices.Sorted(slices.Values(literalPorts[port]))), ", "), port, port)
			}
		}
		s.reason("network.allow_addresses", why)
	}
	if len(m.Network.Allow) > manifestMaxAllow || len(m.Network.AllowAddresses) > manifestMaxAllow {
		// Validate will refuse it; say why rather than cut arbitrarily.
		s.reason("network.allow", fmt.Sprintf("the runs reached %d destinations, more than a manifest may list (%d): review them", len(m.Network.Allow)+len(m.Network.AllowAddresses), manifestMaxAllow))
	}
}

// manifestMaxAllow is the manifest's bound on network.allow entries.
const manifestMaxAllow = 256

// reserved approximates the egress proxy's refusal of non-public
// addresses, to know which resolved addresses needed an explicit grant.
func reserved(ip netip.Addr) bool {
	cgnat := netip.MustParsePrefix("100.64.0.0/10")
	return !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || cgnat.Contains(ip)
}

func describeUses(uses map[string]int) string {
	keys := sortedKeys(uses)
	parts := make([]string, 0, min(len(keys), 8))
	for i, k := range keys {
		if i == 8 {
			parts = append(parts, fmt.Sprintf("and %d more", len(keys)-8))
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", Display(k), plural(uses[k], "attempt")))
	}
	return strings.Join(parts, ", ")
}

// common returns the most frequent non-empty value of field among recs and
// why it was chosen, or "" when no record says.
func common(recs []Record, field func(Record) string) (string, string) {
	seen := map[string]int{}
	for _, r := range recs {
		if v := field(r); v != "" {
			seen[v]++
		}
	}
	if len(seen) == 0 {
		return "", ""
	}
	cs := sortedCounts(seen)
	best := cs[0]
	if len(cs) == 1 {
		if best.Count == len(recs) {
			return best.Name, fmt.Sprintf("every legitimate run used %s", Display(best.Name))
		}
		return best.Name, fmt.Sprintf("the %d legitimate runs that recorded one used %s", best.Count, Display(best.Name))
	}
	return best.Name, fmt.Sprintf("the most common: %s; one manifest cannot cover the others, so review them", joinCounts(cs))
}

// suggestDuration is longest × TimeHeadroom rounded up to whole seconds,
// within the field's range.
func suggestDuration(ranges ranges, field, what string, longestMS float64, id string, runs string) (manifest.Duration, string) {
	lo, hi := ranges.duration(field)
	d := max(time.Duration(math.Ceil(longestMS*TimeHeadroom/1000))*time.Second, time.Second)
	note := ""
	switch {
	case manifest.Duration(d) < lo:
		d, note = lo.D(), ", raised to the minimum "+lo.String()
	case manifest.Duration(d) > hi:
		d, note = hi.D(), ", capped at the maximum "+hi.String()
	}
	if longestMS == 0 {
		return manifest.Duration(d), fmt.Sprintf("none of the %s reported its %s; the shortest whole second", runs, what)
	}
	return manifest.Duration(d), fmt.Sprintf("longest %s %s (record %s) of %s, +%.0f%% headroom = %s, rounded up to whole seconds%s",
		what, seconds(longestMS), Display(id), runs, (TimeHeadroom-1)*100, seconds(longestMS*TimeHeadroom), note)
}

func seconds(ms float64) string {
	return strconv.FormatFloat(ms/1000, 'f', 3, 64) + "s"
}

// readableSize rounds bytes up to the next size of the form 2^n MiB or
// 1.5 × 2^n MiB (4MiB, 6MiB, 8MiB, 12MiB ... 1GiB, 1536MiB, 2GiB).
func readableSize(bytes float64) manifest.Size {
	for s := manifest.MiB; s <= 64*manifest.GiB; s *= 2 {
		if float64(s) >= bytes {
			return s
		}
		if mid := s + s/2; float64(mid) >= bytes {
			return mid
		}
	}
	return manifest.Size(math.MaxInt64)
}

func humanBytes(b int64) string {
	const mib = 1 << 20
	if b >= mib {
		return strconv.FormatFloat(float64(b)/mib, 'f', 1, 64) + "MiB"
	}
	return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) + "KiB"
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

func sortedCounts(m map[string]int) []Count {
	out := make([]Count, 0, len(m))
	for k, v := range m {
		out = append(out, Count{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func sortedInts[V any](m map[int]V) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// ranges are the bounds Suggest keeps to, from manifest.Ranges.
type ranges struct {
	memLo, memHi         manifest.Size
	timeoutLo, timeoutHi manifest.Duration
	cpuLo, cpuHi         manifest.Duration
}

func loadRanges() (ranges, error) {
	var rs ranges
	found := 0
	for _, r := range manifest.Ranges() {
		var err1, err2 error
		switch r.Field {
		case "resources.memory":
			rs.memLo, err1 = manifest.ParseSize(r.Min)
			rs.memHi, err2 = manifest.ParseSize(r.Max)
		case "resources.timeout":
			rs.timeoutLo, err1 = manifest.ParseDuration(r.Min)
			rs.timeoutHi, err2 = manifest.ParseDuration(r.Max)
		case "resources.cpu_time":
			rs.cpuLo, err1 = manifest.ParseDuration(r.Min)
			rs.cpuHi, err2 = manifest.ParseDuration(r.Max)
		default:
			continue
		}
		if err := errors.Join(err1, err2); err != nil {
			return rs, fmt.Errorf("manifest range of %s: %w", r.Field, err)
		}
		found++
	}
	if found != 3 {
		return rs, errors.New("manifest.Ranges lacks resources.memory, timeout or cpu_time")
	}
	return rs, nil
}

func (rs ranges) duration(field string) (lo, hi manifest.Duration) {
	if field == "resources.cpu_time" {
		return rs.cpuLo, rs.cpuHi
	}
	return rs.timeoutLo, rs.timeoutHi
}

// WriteYAML writes the suggested manifest as YAML, each decided field
// preceded by its reason as a comment, and a header saying what the
// suggestion is based on. Reasons are flattened to one printable line
// each, so nothing a record held can end a comment and become YAML.
func (s *Suggestion) WriteYAML(w io.Writer) error {
	canon, err := s.Manifest.Canonical()
	if err != nil {
		return fmt.Errorf("render suggested manifest: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(canon, &doc); err != nil {
		return fmt.Errorf("render suggested manifest: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return errors.New("render suggested manifest: unexpected YAML shape")
	}
	root := doc.Content[0]
	for _, fr := range s.Reasons {
		if key := findKey(root, strings.Split(fr.Field, ".")); key != nil {
			key.HeadComment = joinComment(key.HeadComment, commentLine(fr.Reason))
		}
	}
	head := []string{
		fmt.Sprintf("Suggested by moat policy suggest from %s (exited by itself with status 0).", plural(s.Considered, "legitimate run")),
	}
	for _, c := range s.Ignored {
		head = append(head, fmt.Sprintf("Ignored %d: %s.", c.Count, commentLine(c.Name)))
	}
	head = append(head, "Fields without a comment keep Moat's defaults: the audit log does not say what would tighten them.")
	doc.HeadComment = strings.Join(head, "\n")

	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return fmt.Errorf("write suggested manifest: %w", err)
	}
	return enc.Close()
}

func findKey(m *yaml.Node, path []string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Value != path[0] {
			continue
		}
		if len(path) == 1 {
			return k
		}
		if v.Kind == yaml.MappingNode {
			return findKey(v, path[1:])
		}
		return nil
	}
	return nil
}

func joinComment(a, b string) string {
	if a == "" {
		return b
	}
	return a + "\n" + b
}

// commentLine makes s one printable line: Display escapes control
// characters (a newline included) and the surrounding quotes it adds are
// harmless inside a comment.
func commentLine(s string) string {
	return Display(s)
}
