package audit

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// seed is one record for the report and suggestion tests: Begin, then
// Finish with res unless res is nil.
type seed struct {
	rec Record
	res *result.Result
}

func load(t *testing.T, s *Store, seeds []seed) {
	t.Helper()
	for _, sd := range seeds {
		if err := s.Begin(sd.rec); err != nil {
			t.Fatal(err)
		}
		if sd.res != nil {
			if err := s.Finish(sd.rec.ID, sd.res, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

const (
	mib = 1 << 20
	gib = 1 << 30
)

func denied(host string, port int, reason string) result.NetworkAttempt {
	return result.NetworkAttempt{Host: host, Port: port, Reason: reason}
}

func allowed(host string, port int) result.NetworkAttempt {
	return result.NetworkAttempt{Host: host, Port: port, Allowed: true, Reason: "allowed"}
}

// reportSeeds have hand-computed costs at reportPrices (see TestReport).
var reportSeeds = []seed{
	{Record{ID: "a", KeyID: "kA", Kind: KindRun, Started: t0, MemoryLimit: gib, Command: []string{"python3", "main.py"}},
		&result.Result{Termination: result.Exited, DurationMS: 2000, CPUMS: 1000, PeakMemoryBytes: 512 * mib}},
	{Record{ID: "b", KeyID: "kA", Kind: KindRun, Started: t0.Add(1 * time.Minute), Command: []string{"sleep", "100"}},
		&result.Result{Termination: result.Timeout, ExitCode: 124, DurationMS: 10000,
			Network: []result.NetworkAttempt{denied("evil.example", 443, "not-allowlisted"), allowed("pypi.org", 443), denied("evil.example", 443, "not-allowlisted")}}},
	// A fork bomb: two CPUs busy for 30 s, memory full, then the pids limit.
	{Record{ID: "c", KeyID: "kB", Kind: KindRun, Started: t0.Add(2 * time.Minute), MemoryLimit: gib, Command: []string{"bash", "-c", ":(){ :|:& };:"}},
		&result.Result{Termination: result.Pids, ExitCode: 137, DurationMS: 30000, CPUMS: 60000, PeakMemoryBytes: gib,
			Violations: []result.Violation{{Kind: "pids", Limit: "128"}, {Kind: "memory", Limit: "1GiB"}},
			Network:    []result.NetworkAttempt{denied("169.254.169.254", 80, "private-address"), denied("evil.example", 443, "limit-rate")}}},
	{Record{ID: "d", KeyID: "kB", Kind: KindRun, Started: t0.Add(3 * time.Minute), Command: []string{"sleep", "100"}},
		&result.Result{Termination: result.Timeout, ExitCode: 124, DurationMS: 10000, Violations: []result.Violation{{Kind: "timeout"}}}},
	{Record{ID: "e", Kind: KindRun, Started: t0.Add(4 * time.Minute), Command: []string{"python3", "-c", "while True: pass"}},
		&result.Result{Termination: result.Timeout, ExitCode: 124, DurationMS: 5000, CPUMS: 5000, Violations: []result.Violation{{Kind: "timeout"}}}},
	{Record{ID: "f", KeyID: "kB", Kind: KindSandbox, Started: t0.Add(5 * time.Minute)}, nil},
}

var reportPrices = Prices{CPUSecond: 0.01, GiBSecond: 0.001, WallSecond: 0.0001}

func TestReport(t *testing.T) {
	s := newStore(t)
	load(t, s, reportSeeds)
	rep, err := s.Report(Filter{}, reportPrices)
	if err != nil {
		t.Fatal(err)
	}
	// Costs by hand, at 0.01/CPU-s, 0.001/GiB-s, 0.0001/wall-s:
	//   a: 1 CPU-s, 0.5 GiB × 2 s = 1 GiB-s, 2 wall-s  -> 0.0112
	//   b: 10 wall-s                                    -> 0.001
	//   c: 60 CPU-s, 1 GiB × 30 s = 30 GiB-s, 30 wall-s -> 0.633
	//   d: 10 wall-s                                    -> 0.001
	//   e: 5 CPU-s, 5 wall-s                            -> 0.0505
	//   f: running, nothing yet                         -> 0
	cost := func(cpu, gibs, wall, reserved, price float64) Cost {
		return Cost{CPUSeconds: cpu, GiBSeconds: gibs, WallSeconds: wall, ReservedGiBSeconds: reserved, Price: price}
	}
	want := &Report{
		First: t0, Last: t0.Add(5 * time.Minute), Records: 6,
		Kinds:           []Count{{"run", 5}, {"sandbox", 1}},
		Statuses:        []Count{{"done", 5}, {"running", 1}},
		Terminations:    []Count{{"timeout", 3}, {"exited", 1}, {"pids", 1}},
		NetworkAttempts: 5, NetworkDenied: 4, NetworkOmittedReasons: []Count{},
		Denied: []Destination{
			{Host: "evil.example", Port: 443, Count: 3, Reasons: []Count{{"not-allowlisted", 2}, {"limit-rate", 1}}},
			{Host: "169.254.169.254", Port: 80, Count: 1, Reasons: []Count{{"private-address", 1}}},
		},
		Limits:    []Limit{{"timeout", 2, 2}, {"memory", 1, 1}, {"pids", 1, 1}},
		TimedOut:  []CommandCount{{[]string{"sleep", "100"}, 2}, {[]string{"python3", "-c", "while True: pass"}, 1}},
		Prices:    reportPrices,
		Total:     cost(66, 31, 57, 32, 0.6967),
		PerRecord: cost(66.0/6, 31.0/6, 57.0/6, 32.0/6, 0.6967/6),
		Costliest: []RecordCost{
			{ID: "c", Kind: KindRun, KeyID: "kB", Termination: result.Pids, Command: []string{"bash", "-c", ":(){ :|:& };:"}, Cost: cost(60, 30, 30, 30, 0.633)},
			{ID: "e", Kind: KindRun, Termination: result.Timeout, Command: []string{"python3", "-c", "while True: pass"}, Cost: cost(5, 0, 5, 0, 0.0505)},
			{ID: "a", Kind: KindRun, KeyID: "kA", Termination: result.Exited, Command: []string{"python3", "main.py"}, Cost: cost(1, 1, 2, 2, 0.0112)},
			{ID: "b", Kind: KindRun, KeyID: "kA", Termination: result.Timeout, Command: []string{"sleep", "100"}, Cost: cost(0, 0, 10, 0, 0.001)},
			{ID: "d", Kind: KindRun, KeyID: "kB", Termination: result.Timeout, Command: []string{"sleep", "100"}, Cost: cost(0, 0, 10, 0, 0.001)},
			{ID: "f", Kind: KindSandbox, KeyID: "kB", Command: []string{}, Cost: cost(0, 0, 0, 0, 0)},
		},
		PerKey: []KeyCost{
			{KeyID: "kB", Records: 3, Cost: cost(60, 30, 40, 30, 0.634)},
			{KeyID: "", Records: 1, Cost: cost(5, 0, 5, 0, 0.0505)},
			{KeyID: "kA", Records: 2, Cost: cost(1, 1, 12, 2, 0.0122)},
		},
	}
	want.Generated = rep.Generated
	if d := diffReport(rep, want); d != "" {
		t.Errorf("report differs: %s\n got %+v\nwant %+v", d, rep, want)
	}

	t.Run("filtered", func(t *testing.T) {
		tests := []struct {
			name    string
			f       Filter
			records int
			price   float64
		}{
			{"by key", Filter{KeyID: "kA"}, 2, 0.0122},
			{"by termination", Filter{Termination: result.Timeout}, 3, 0.0525},
			{"newest two", Filter{Limit: 2}, 2, 0.0505},
			{"since", Filter{Since: t0.Add(2 * time.Minute)}, 4, 0.6845},
			{"nothing", Filter{KeyID: "kZ"}, 0, 0},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				rep, err := s.Report(tc.f, reportPrices)
				if err != nil {
					t.Fatal(err)
				}
				if rep.Records != tc.records || !near(rep.Total.Price, tc.price) {
					t.Errorf("%d records costing %v, want %d costing %v", rep.Records, rep.Total.Price, tc.records, tc.price)
				}
			})
		}
	})

	t.Run("bad prices", func(t *testing.T) {
		for _, p := range []Prices{{CPUSecond: -1}, {GiBSecond: math.NaN()}, {WallSecond: math.Inf(1)}} {
			if _, err := s.Report(Filter{}, p); err == nil {
				t.Errorf("prices %+v accepted", p)
			}
		}
		if _, err := s.Report(Filter{Limit: -1}, DefaultPrices); err == nil {
			t.Error("a negative limit was accepted")
		}
	})
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

// diffReport compares reports, floats within rounding; "" when equal.
func diffReport(got, want *Report) string {
	costEq := func(a, b Cost) bool {
		return near(a.CPUSeconds, b.CPUSeconds) && near(a.GiBSeconds, b.GiBSeconds) && near(a.WallSeconds, b.WallSeconds) &&
			near(a.ReservedGiBSeconds, b.ReservedGiBSeconds) && near(a.Price, b.Price)
	}
	if !costEq(got.Total, want.Total) {
		return "total"
	}
	if !costEq(got.PerRecord, want.PerRecord) {
		return "per record"
	}
	if len(got.Costliest) != len(want.Costliest) {
		return "costliest"
	}
	for i := range got.Costliest {
		g, w := got.Costliest[i], want.Costliest[i]
		if !costEq(g.Cost, w.Cost) {
			return "costliest[" + g.ID + "]"
		}
		g.Cost, w.Cost = Cost{}, Cost{}
		if !reflect.DeepEqual(g, w) {
			return "costliest " + g.ID + " vs " + w.ID
		}
	}
	if len(got.PerKey) != len(want.PerKey) {
		return "per key"
	}
	for i := range got.PerKey {
		g, w := got.PerKey[i], want.PerKey[i]
		if !costEq(g.Cost, w.Cost) || g.KeyID != w.KeyID || g.Records != w.Records {
			return "per key " + g.KeyID + " vs " + w.KeyID
		}
	}
	g, w := *got, *want
	g.Total, g.PerRecord, g.Costliest, g.PerKey = Cost{}, Cost{}, nil, nil
	w.Total, w.PerRecord, w.Costliest, w.PerKey = Cost{}, Cost{}, nil, nil
	if !reflect.DeepEqual(g, w) {
		return "counts"
	}
	return ""
}

func TestReportText(t *testing.T) {
	s := newStore(t)
	hostile := append(reportSeeds[:len(reportSeeds):len(reportSeeds)], seed{
		Record{ID: "x", Kind: KindRun, Started: t0.Add(10 * time.Minute), Command: []string{"printf", "\x1b]52;c;SGVsbG8=\x07"}},
		&result.Result{Termination: result.Timeout, DurationMS: 1,
			Network:    []result.NetworkAttempt{denied("\x1b[2Jevil", 443, "bad-request")},
			Violations: []result.Violation{{Kind: "\u202ememory"}}},
	})
	load(t, s, hostile)
	rep, err := s.Report(Filter{}, reportPrices)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteText(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"Audit report: 7 records",
		"evil.example:443", "not-allowlisted 2, limit-rate 1",
		"169.254.169.254:80",
		"timeout", "pids",
		`sleep 100`, `python3 -c "while True: pass"`,
		"$0.01/CPU-second", "$0.001/GiB-second", "$0.0001/wall-second", "peak × wall",
		"$0.697", // the total
		"$0.633", // the fork bomb
		"(local)",
		`"\x1b[2Jevil:443"`, `"\u202ememory"`, `printf "\x1b]52;c;SGVsbG8=\a"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if strings.ContainsAny(out, "\x1b\x07\u202e") {
		t.Errorf("report holds raw control characters:\n%q", out)
	}
	if t.Failed() {
		t.Logf("report:\n%s", out)
	}

	var empty bytes.Buffer
	rep, err = s.Report(Filter{KeyID: "nobody"}, DefaultPrices)
	if err != nil {
		t.Fatal(err)
	}
	rep.WriteText(&empty)
	if !strings.Contains(empty.String(), "No audit records match") {
		t.Errorf("empty report says %q", empty.String())
	}
}

func TestMoney(t *testing.T) {
	tests := []struct {
		v    float64
		want string
	}{{0, "$0"}, {12.3, "$12.30"}, {0.000337, "$0.000337"}, {1234.5678, "$1234.57"}, {0.5, "$0.50"}, {0.0112, "$0.0112"}, {0.01, "$0.01"}, {0.0001, "$0.0001"}, {1e-7, "$0.0000001"}}
	for _, tc := range tests {
		if got := money(tc.v); got != tc.want {
			t.Errorf("money(%v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}
