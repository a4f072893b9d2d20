package egress

import (
	"cmp"
	"slices"
)

// maxSummaryDestinations bounds the destinations a Summary counts one by
// one; unlogged attempts to others are counted in UnloggedElsewhere. A
// hostile program can name as many hosts as it can send requests.
const maxSummaryDestinations = 256

// Destination is where a refused attempt that the log does not hold was
// headed, and why it was refused. Host is "" (and Port 0) for an attempt
// refused before its request was read (limit-rate, limit-conns) or one
// whose request named no valid destination.
type Destination struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason"`
}

// DestinationCount is a Destination and how many attempts went there.
type DestinationCount struct {
	Destination
	Count int `json:"count"`
}

// Summary accounts for every attempt over the proxy's life, whether its
// log stores the attempt or not. Every attempt let through is in the log
// (Limits.MaxAdmitted), so Allowed, BytesOut and BytesIn are exact; refused
// attempts past Limits.MaxLogEntries are counted here only, as Unlogged,
// by reason and, up to a bound, by destination.
type Summary struct {
	// Attempts is every attempt: logged, and counted in Unlogged.
	Attempts int `json:"attempts"`
	// Allowed is the attempts let through to their destination.
	Allowed int `json:"allowed"`
	// BytesOut and BytesIn are the bytes forwarded each way, over every
	// attempt (those still open count what they moved when they ended).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Lookups is the host names resolved that only a wildcard rule
	// allows, each counted once; LookupBytes their lengths, which were
	// charged to Limits.MaxBytesOut: the names left the host as DNS
	// queries.
	Lookups     int   `json:"lookups"`
	LookupBytes int64 `json:"lookup_bytes"`
	// Unlogged is the refused attempts the log does not hold;
	// UnloggedReasons counts them by reason, UnloggedDestinations by
	// destination (at most maxSummaryDestinations of them, most first),
	// and UnloggedElsewhere the rest.
	Unlogged             int                `json:"unlogged"`
	UnloggedReasons      map[string]int     `json:"unlogged_reasons"`
	UnloggedDestinations []DestinationCount `json:"unlogged_destinations"`
	UnloggedElsewhere    int                `json:"unlogged_elsewhere"`
	SecretsUsed          []SecretUse        `json:"secrets_used,omitempty"`
}

// Since returns what happened after prev, a Summary taken earlier from the
// same proxy (the commands of a session share their sandbox's proxy).
func (s Summary) Since(prev Summary) Summary {
	out := Summary{
		Attempts:          s.Attempts - prev.Attempts,
		Allowed:           s.Allowed - prev.Allowed,
		BytesOut:          s.BytesOut - prev.BytesOut,
		BytesIn:           s.BytesIn - prev.BytesIn,
		Lookups:           s.Lookups - prev.Lookups,
		LookupBytes:       s.LookupBytes - prev.LookupBytes,
		Unlogged:          s.Unlogged - prev.Unlogged,
		UnloggedReasons:   map[string]int{},
		UnloggedElsewhere: s.UnloggedElsewhere - prev.UnloggedElsewhere,
	}
	for r, n := range s.UnloggedReasons {
		if d := n - prev.UnloggedReasons[r]; d > 0 {
			out.UnloggedReasons[r] = d
		}
	}
	before := map[Destination]int{}
	for _, d := range prev.UnloggedDestinations {
		before[d.Destination] = d.Count
	}
	dests := map[Destination]int{}
	for _, d := range s.UnloggedDestinations {
		if n := d.Count - before[d.Destination]; n > 0 {
			dests[d.Destination] = n
		}
	}
	out.UnloggedDestinations = sortedDestinations(dests)
	out.SecretsUsed = secretUsesSince(s.SecretsUsed, prev.SecretsUsed)
	return out
}

// tally counts the refused attempts the log does not hold.
type tally struct {
	n         int
	reasons   map[string]int
	dests     map[Destination]int
	elsewhere int
}

func (t *tally) add(a Attempt) {
	if t.reasons == nil {
		t.reasons, t.dests = map[string]int{}, map[Destination]int{}
	}
	t.n++
	t.reasons[a.Reason]++
	d := Destination{Host: a.Host, Port: a.Port, Reason: a.Reason}
	if _, ok := t.dests[d]; ok || len(t.dests) < maxSummaryDestinations {
		t.dests[d]++
		return
	}
	t.elsewhere++
}

// sortedDestinations lists counts most first, then by host, port, reason.
func sortedDestinations(m map[Destination]int) []DestinationCount {
	out := make([]DestinationCount, 0, len(m))
	for d, n := range m {
		out = append(out, DestinationCount{Destination: d, Count: n})
	}
	slices.SortFunc(out, func(a, b DestinationCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Reason, b.Reason))
	})
	return out
}

// Summary accounts for every attempt so far. After Close it is final.
func (p *Proxy) Summary() Summary {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Summary{
		Attempts:          len(p.log) + p.unlogged.n,
		Lookups:           p.lookups,
		LookupBytes:       p.lookupBytes,
		Unlogged:          p.unlogged.n,
		UnloggedReasons:   map[string]int{},
		UnloggedElsewhere: p.unlogged.elsewhere,
	}
	for _, a := range p.log {
		if a.Allowed {
			s.Allowed++
		}
		s.BytesOut += a.BytesOut
		s.BytesIn += a.BytesIn
	}
	for r, n := range p.unlogged.reasons {
		s.UnloggedReasons[r] = n
	}
	s.UnloggedDestinations = sortedDestinations(p.unlogged.dests)
	if len(p.secretUses) > 0 {
		s.SecretsUsed = secretUsesSorted(p.secretUses)
	}
	return s
}
