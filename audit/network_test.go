package audit

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/result"
)

// floodThenExfiltrate is the result of issue 17 §4's attack as the engine
// reports it now: the proxy's log holds the first refused attempts and the
// allowed POST after them; its summary counts the refused ones it dropped.
func floodThenExfiltrate(denied, omitted int) *result.Result {
	res := &result.Result{Termination: result.Exited}
	for range denied {
		res.Network = append(res.Network, result.NetworkAttempt{Reason: "limit-rate"})
	}
	res.Network = append(res.Network, result.NetworkAttempt{Method: "POST", Host: "sink.example", Port: 80, Allowed: true, Reason: "allowed", BytesOut: 4096, BytesIn: 20})
	res.NetworkSummary = &result.NetworkSummary{
		Attempts: denied + omitted + 1, Allowed: 1, Denied: denied + omitted, BytesOut: 4096, BytesIn: 20,
		Omitted: omitted, OmittedReasons: map[string]int{"limit-rate": omitted},
		OmittedDestinations: []result.NetworkDestination{{Reason: "limit-rate", Count: omitted}},
	}
	return res
}

// TestFinishKeepsAllowedAttempts: the audit store kept the first
// MaxNetworkAttempts attempts, so the allowed one behind a flood of
// refusals was lost there too; policy suggest then proposed network mode
// none. Every allowed attempt is stored, the summary with it, and the
// report counts what was not stored one by one.
func TestFinishKeepsAllowedAttempts(t *testing.T) {
	tests := []struct {
		name    string
		res     *result.Result
		omitted int
		reasons map[string]int
	}{
		{name: "the proxy summarised the flood", res: floodThenExfiltrate(MaxNetworkAttempts, 50), omitted: 50, reasons: map[string]int{"limit-rate": 50}},
		{name: "the store folds what it does not keep", res: func() *result.Result {
			r := floodThenExfiltrate(MaxNetworkAttempts+7, 0)
			r.NetworkSummary = nil
			return r
		}(), omitted: 7, reasons: map[string]int{"limit-rate": 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			if err := s.Begin(Record{ID: "x", Kind: KindRun, Command: []string{"python3", "flood.py"}}); err != nil {
				t.Fatal(err)
			}
			if err := s.Finish("x", tc.res, nil); err != nil {
				t.Fatal(err)
			}
			r, err := s.Get("x")
			if err != nil {
				t.Fatal(err)
			}
			var allowed []result.NetworkAttempt
			for _, a := range r.Network {
				if a.Allowed {
					allowed = append(allowed, a)
				}
			}
			if len(allowed) != 1 || allowed[0].Host != "sink.example" || allowed[0].BytesOut != 4096 {
				t.Fatalf("allowed attempts stored: %+v; want the POST to sink.example with its 4096 bytes", allowed)
			}
			sum := r.NetworkSummary
			if r.NetworkOmitted != tc.omitted || sum == nil || sum.Omitted != tc.omitted || fmt.Sprint(sum.OmittedReasons) != fmt.Sprint(tc.reasons) {
				t.Fatalf("omitted %d, summary %+v; want %d omitted, reasons %v", r.NetworkOmitted, sum, tc.omitted, tc.reasons)
			}
			if sum.Attempts != len(r.Network)+tc.omitted || sum.Allowed != 1 || sum.BytesOut != 4096 {
				t.Fatalf("summary %+v does not account for %d stored and %d omitted attempts", sum, len(r.Network), tc.omitted)
			}

			rep, err := s.Report(Filter{}, reportPrices)
			if err != nil {
				t.Fatal(err)
			}
			attempts := len(r.Network) + tc.omitted
			if rep.NetworkAttempts != attempts || rep.NetworkDenied != attempts-1 || rep.NetworkOmitted != tc.omitted || rep.NetworkBytesOut != 4096 {
				t.Fatalf("report: %d attempts, %d denied, %d omitted, %d bytes out; want %d, %d, %d, 4096",
					rep.NetworkAttempts, rep.NetworkDenied, rep.NetworkOmitted, rep.NetworkBytesOut, attempts, attempts-1, tc.omitted)
			}
			if len(rep.NetworkOmittedReasons) != 1 || rep.NetworkOmittedReasons[0] != (Count{"limit-rate", tc.omitted}) {
				t.Fatalf("report omitted reasons %v", rep.NetworkOmittedReasons)
			}
			if len(rep.Denied) != 1 || rep.Denied[0].Count != attempts-1 || rep.DeniedElsewhere != 0 {
				t.Fatalf("report denied %+v, elsewhere %d; want every denied attempt at one destination", rep.Denied, rep.DeniedElsewhere)
			}
			var text bytes.Buffer
			if err := rep.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf("%d not stored one by one: limit-rate %d", tc.omitted, tc.omitted); !strings.Contains(text.String(), want) {
				t.Fatalf("report text lacks %q:\n%s", want, text.String())
			}

			sug, err := Suggest([]Record{r})
			if err != nil {
				t.Fatal(err)
			}
			if sug.Manifest.Network.Mode != "allowlist" || fmt.Sprint(sug.Manifest.Network.Allow) != "[sink.example:80]" && fmt.Sprint(sug.Manifest.Network.Allow) != "[sink.example]" {
				t.Fatalf("suggested network %+v; want the allowlist of the one destination reached", sug.Manifest.Network)
			}
		})
	}
}

// TestSuggestWarnsOfUnsummarisedRecords: a record written before network
// summaries may have lost allowed attempts; suggest says so instead of
// proposing network mode none as if it knew.
func TestSuggestWarnsOfUnsummarisedRecords(t *testing.T) {
	old := ok("old", 100, 100, mib, denied("evil.example", 443, "not-allowlisted"))
	old.NetworkOmitted = 3
	sug, err := Suggest([]Record{old})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sug.Reasons {
		if r.Field == "network.mode" && strings.Contains(r.Reason, "WARNING") && strings.Contains(r.Reason, "3 of record old") {
			return
		}
	}
	t.Fatalf("no warning about the unstored attempts: %+v", sug.Reasons)
}

// TestUpgradeToNetworkSummary opens a version 1 database (before admin keys and summaries): its records
// read as before, and a new record keeps its summary.
func TestUpgradeToNetworkSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Begin(Record{ID: "v1", Kind: KindRun}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish("v1", &result.Result{Termination: result.Exited, Network: []result.NetworkAttempt{allowed("pypi.org", 443)}}, nil); err != nil {
		t.Fatal(err)
	}
	// Back to the version 1 layout.
	if _, err := s.w.Exec(`ALTER TABLE records DROP COLUMN network_summary; ALTER TABLE keys DROP COLUMN admin; ALTER TABLE keys DROP COLUMN scope; UPDATE schema_version SET version = 1`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := s.Get("v1")
	if err != nil || len(r.Network) != 1 || r.NetworkSummary != nil {
		t.Fatalf("old record after the upgrade: %+v, %v", r, err)
	}
	if err := s.Begin(Record{ID: "v2", Kind: KindRun}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish("v2", floodThenExfiltrate(3, 2), nil); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get("v2"); err != nil || r.NetworkSummary == nil || r.NetworkSummary.Omitted != 2 {
		t.Fatalf("new record: %+v, %v", r.NetworkSummary, err)
	}
}
