package audit

import (
	"cmp"
	"maps"
	"slices"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/result"
)

// MaxAllowedAttempts bounds the attempts let through that one record
// stores: as many as the egress proxy lets through in a run
// (egress.DefaultMaxAdmitted), so a result from the engine never loses one.
const MaxAllowedAttempts = egress.DefaultMaxAdmitted

// maxSummaryDestinations bounds the destinations a stored summary counts
// one by one, as the proxy's does.
const maxSummaryDestinations = 256

// splitNetwork returns the attempts a record stores one by one (every
// allowed attempt up to MaxAllowedAttempts, the denied ones up to
// MaxNetworkAttempts, in order) and the summary that accounts for the rest:
// the result's, with the attempts not stored here added to its omitted
// counts. Nothing an attempt list carries is lost, only folded into counts.
// The summary is nil only when the result had none and nothing was folded.
func splitNetwork(network []result.NetworkAttempt, sum *result.NetworkSummary) ([]result.NetworkAttempt, *result.NetworkSummary) {
	var kept []result.NetworkAttempt
	var folded []result.NetworkAttempt
	allowed, denied := 0, 0
	for _, a := range network {
		switch {
		case a.Allowed && allowed < MaxAllowedAttempts:
			allowed++
		case !a.Allowed && denied < MaxNetworkAttempts:
			denied++
		default:
			folded = append(folded, a)
			continue
		}
		kept = append(kept, a)
	}
	if sum == nil && len(folded) == 0 {
		return kept, nil
	}
	s := copySummary(sum, network)
	dests := map[result.NetworkDestination]int{}
	for _, d := range s.OmittedDestinations {
		dests[result.NetworkDestination{Host: d.Host, Port: d.Port, Reason: d.Reason}] += d.Count
	}
	for _, a := range folded {
		s.Omitted++
		reason := clip(a.Reason, maxFieldBytes)
		s.OmittedReasons[reason]++
		k := result.NetworkDestination{Host: clip(a.Host, maxFieldBytes), Port: a.Port, Reason: reason}
		if _, ok := dests[k]; ok || len(dests) < maxSummaryDestinations {
			dests[k]++
		} else {
			s.OmittedElsewhere++
		}
	}
	s.OmittedDestinations = s.OmittedDestinations[:0]
	for _, k := range slices.SortedFunc(maps.Keys(dests), func(a, b result.NetworkDestination) int {
		return cmp.Or(cmp.Compare(dests[b], dests[a]), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port), cmp.Compare(a.Reason, b.Reason))
	}) {
		k.Count = dests[k]
		s.OmittedDestinations = append(s.OmittedDestinations, k)
	}
	return kept, s
}

// copySummary copies sum (strings clipped, as every stored string from a
// sandbox is), or builds one from the attempt list when the result had
// none.
func copySummary(sum *result.NetworkSummary, network []result.NetworkAttempt) *result.NetworkSummary {
	s := &result.NetworkSummary{OmittedReasons: map[string]int{}, OmittedDestinations: []result.NetworkDestination{}}
	if sum == nil {
		for _, a := range network {
			s.Attempts++
			if a.Allowed {
				s.Allowed++
			} else {
				s.Denied++
			}
			s.BytesOut += a.BytesOut
			s.BytesIn += a.BytesIn
		}
		return s
	}
	*s = *sum
	s.OmittedReasons = map[string]int{}
	for r, n := range sum.OmittedReasons {
		s.OmittedReasons[clip(r, maxFieldBytes)] += n
	}
	s.OmittedDestinations = make([]result.NetworkDestination, 0, min(len(sum.OmittedDestinations), maxSummaryDestinations))
	for i, d := range sum.OmittedDestinations {
		if i >= maxSummaryDestinations {
			s.OmittedElsewhere += d.Count
			continue
		}
		d.Host, d.Reason = clip(d.Host, maxFieldBytes), clip(d.Reason, maxFieldBytes)
		s.OmittedDestinations = append(s.OmittedDestinations, d)
	}
	return s
}
