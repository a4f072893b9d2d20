package egress

import "github.com/moat-sandbox/moat/result"

// ResultSummary is the result's form of a Summary (result.NetworkSummary).
func ResultSummary(s Summary) *result.NetworkSummary {
	out := &result.NetworkSummary{
		Attempts: s.Attempts, Allowed: s.Allowed, Denied: s.Attempts - s.Allowed,
		BytesOut: s.BytesOut, BytesIn: s.BytesIn, Lookups: s.Lookups, LookupBytes: s.LookupBytes,
		Omitted: s.Unlogged, OmittedReasons: map[string]int{}, OmittedElsewhere: s.UnloggedElsewhere,
		OmittedDestinations: []result.NetworkDestination{},
	}
	for r, n := range s.UnloggedReasons {
		out.OmittedReasons[r] = n
	}
	for _, d := range s.UnloggedDestinations {
		out.OmittedDestinations = append(out.OmittedDestinations, result.NetworkDestination{Host: d.Host, Port: d.Port, Reason: d.Reason, Count: d.Count})
	}
	return out
}

// ResultAttempts is the result's form of the proxy's log (result.Result's
// network), never nil.
func ResultAttempts(as []Attempt) []result.NetworkAttempt {
	out := make([]result.NetworkAttempt, 0, len(as))
	for _, a := range as {
		out = append(out, result.NetworkAttempt{
			Time: a.Time, Method: a.Method, Host: a.Host, Port: a.Port, Address: a.Address,
			Allowed: a.Allowed, Reason: a.Reason, BytesOut: a.BytesOut, BytesIn: a.BytesIn,
			Package: a.Package, Resembles: a.Resembles,
		})
	}
	return out
}
