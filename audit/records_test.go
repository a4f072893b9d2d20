package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

var t0 = time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)

func TestBeginFinishRoundTrip(t *testing.T) {
	s := newStore(t)
	begin := Record{
		ID: "run-1", Kind: KindExec, KeyID: "k0123456789ab", SandboxID: "sb-1", Started: t0,
		Tier: "native", Image: "python", ImageDigest: "sha256:aa", ManifestDigest: "sha256:bb",
		Manifest: `{"image":"python"}`, Command: []string{"python3", "-c", "print(1)"}, MemoryLimit: 512 << 20,
		// Outcome fields given to Begin are ignored.
		Status: Done, Termination: result.OOM, CPUMS: 99,
	}
	if err := s.Begin(begin); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get("run-1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != Running || r.Termination != "" || r.CPUMS != 0 || !r.Ended.IsZero() {
		t.Errorf("after Begin: status %s termination %q cpu %v ended %v; want running and nothing else", r.Status, r.Termination, r.CPUMS, r.Ended)
	}
	if !r.Started.Equal(t0) || r.Started.Location() != time.UTC {
		t.Errorf("started %v, want %v in UTC", r.Started, t0)
	}

	res := &result.Result{
		Tier: "gvisor", Image: result.Image{Name: "node", Digest: "sha256:cc"}, Pooled: true,
		Termination: result.Exited, ExitCode: 3, DurationMS: 1500, CPUMS: 700, PeakMemoryBytes: 40 << 20,
		Files: []result.FileChange{{Path: "a"}, {Path: "b"}},
		Network: []result.NetworkAttempt{
			{Time: t0.Add(time.Second), Method: "CONNECT", Host: "pypi.org", Port: 443, Address: "151.101.0.223", Allowed: true, Reason: "allowed", BytesOut: 10, BytesIn: 2000},
			{Method: "GET", Host: "evil.example", Port: 80, Reason: "not-allowlisted"},
		},
		Violations: []result.Violation{{Kind: "file-size", Detail: "a write past 64MiB", Limit: "64MiB"}},
	}
	if err := s.Finish("run-1", res, nil); err != nil {
		t.Fatal(err)
	}
	r, err = s.Get("run-1")
	if err != nil {
		t.Fatal(err)
	}
	want := begin
	want.Status, want.Termination, want.CPUMS = Done, result.Exited, 700
	want.ExitCode, want.WallMS, want.PeakMemoryBytes, want.Files = 3, 1500, 40<<20, 2
	want.Pooled = true // learnt from the result; what Begin knew (tier, image) is kept
	want.Network, want.Violations = res.Network, res.Violations
	want.Ended = r.Ended
	if r.Ended.Before(r.Started) || time.Since(r.Ended) > time.Minute {
		t.Errorf("ended %v, want about now", r.Ended)
	}
	if !reflect.DeepEqual(r, want) {
		t.Errorf("record after Finish:\n got %+v\nwant %+v", r, want)
	}
	// The JSON form has lists, never null.
	r2 := Record{ID: "run-2", Kind: KindRun}
	if err := s.Begin(r2); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get("run-2")
	b, _ := json.Marshal(got)
	for _, k := range []string{`"command":[]`, `"network":[]`, `"violations":[]`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("JSON %s lacks %s", b, k)
		}
	}
	if got.Started.IsZero() || time.Since(got.Started) > time.Minute {
		t.Errorf("a zero Started should mean now, got %v", got.Started)
	}
}

func TestBeginFinishErrors(t *testing.T) {
	s := newStore(t)
	if err := s.Begin(Record{ID: "dup", Kind: KindRun}); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish("dup", &result.Result{Termination: result.Exited}, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		do      func() error
		is      error
		wantErr string
	}{
		{"duplicate Begin", func() error { return s.Begin(Record{ID: "dup", Kind: KindRun}) }, ErrExists, `"dup"`},
		{"finish twice", func() error { return s.Finish("dup", &result.Result{Termination: result.Exited}, nil) }, ErrFinished, `"dup" is done`},
		{"finish unknown", func() error { return s.Finish("nope", &result.Result{}, nil) }, ErrNotFound, `"nope"`},
		{"get unknown", func() error { _, err := s.Get("nope"); return err }, ErrNotFound, `"nope"`},
		{"empty id", func() error { return s.Begin(Record{Kind: KindRun}) }, nil, "record id is empty"},
		{"id with a space", func() error { return s.Begin(Record{ID: "a b", Kind: KindRun}) }, nil, "printable ASCII"},
		{"id with an escape", func() error { return s.Begin(Record{ID: "a\x1b", Kind: KindRun}) }, nil, "printable ASCII"},
		{"long id", func() error { return s.Begin(Record{ID: strings.Repeat("a", MaxIDLen+1), Kind: KindRun}) }, nil, "at most 256"},
		{"unknown kind", func() error { return s.Begin(Record{ID: "x", Kind: "job"}) }, nil, `kind "job"`},
		{"empty kind", func() error { return s.Begin(Record{ID: "x"}) }, nil, `kind ""`},
		{"bad key id", func() error { return s.Begin(Record{ID: "x", Kind: KindRun, KeyID: "k 1"}) }, nil, "key id"},
		{"negative limit", func() error { _, err := s.Query(Filter{Limit: -1}); return err }, nil, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			if err == nil {
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not say %q", err, tc.wantErr)
			}
		})
	}
	// A refused Begin left nothing behind.
	var n int
	s.r.QueryRow(`SELECT COUNT(*) FROM records`).Scan(&n)
	if n != 1 {
		t.Errorf("%d records, want only dup", n)
	}
}

func TestFinishStatus(t *testing.T) {
	tests := []struct {
		name      string
		res       *result.Result
		runErr    error
		status    Status
		term      result.Termination
		errorText string
	}{
		{"exit 0", &result.Result{Termination: result.Exited}, nil, Done, result.Exited, ""},
		{"non-zero exit is done", &result.Result{Termination: result.Exited, ExitCode: 1}, nil, Done, result.Exited, ""},
		{"timeout is done", &result.Result{Termination: result.Timeout, ExitCode: 124}, nil, Done, result.Timeout, ""},
		{"oom is done", &result.Result{Termination: result.OOM, ExitCode: 137}, nil, Done, result.OOM, ""},
		{"infra-error result is failed", &result.Result{Termination: result.InfraError, Error: "cgroup vanished"}, nil, Failed, result.InfraError, "cgroup vanished"},
		{"error without result", nil, errors.New("no image python"), Failed, result.InfraError, "no image python"},
		{"error with result", &result.Result{Termination: result.Exited}, errors.New("copy-out failed"), Failed, result.Exited, "copy-out failed"},
		{"neither", nil, nil, Failed, result.InfraError, "no result"},
		{"long error is bounded", &result.Result{Termination: result.InfraError, Error: strings.Repeat("x", 100_000)}, nil, Failed, result.InfraError, "...(truncated)"},
	}
	s := newStore(t)
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprint("r", i)
			if err := s.Begin(Record{ID: id, Kind: KindRun}); err != nil {
				t.Fatal(err)
			}
			if err := s.Finish(id, tc.res, tc.runErr); err != nil {
				t.Fatal(err)
			}
			r, err := s.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != tc.status || r.Termination != tc.term || !strings.Contains(r.Error, tc.errorText) {
				t.Errorf("status %s termination %q error %.60q; want %s %q containing %q", r.Status, r.Termination, r.Error, tc.status, tc.term, tc.errorText)
			}
			if tc.errorText == "" && r.Error != "" {
				t.Errorf("error %q, want none", r.Error)
			}
			if len(r.Error) > maxErrorBytes {
				t.Errorf("stored error is %d bytes, over %d", len(r.Error), maxErrorBytes)
			}
		})
	}
}

func TestFinishBoundsHostileResults(t *testing.T) {
	s := newStore(t)
	if err := s.Begin(Record{ID: "flood", Kind: KindRun, Command: []string{"sh", strings.Repeat("A", 200_000), "tail"}}); err != nil {
		t.Fatal(err)
	}
	res := &result.Result{Termination: result.Exited}
	for i := range MaxNetworkAttempts + 7 {
		res.Network = append(res.Network, result.NetworkAttempt{Host: fmt.Sprintf("h%d.example", i), Port: 443, Reason: "not-allowlisted"})
	}
	for range MaxViolations + 3 {
		res.Violations = append(res.Violations, result.Violation{Kind: "syscall", Detail: "\xff\xfe not UTF-8"})
	}
	if err := s.Finish("flood", res, nil); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get("flood")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Network) != MaxNetworkAttempts || r.NetworkOmitted != 7 || len(r.Violations) != MaxViolations || r.ViolationsOmitted != 3 {
		t.Errorf("stored %d attempts (%d omitted), %d violations (%d omitted)", len(r.Network), r.NetworkOmitted, len(r.Violations), r.ViolationsOmitted)
	}
	if r.Network[0].Host != "h0.example" || r.Network[MaxNetworkAttempts-1].Host != fmt.Sprintf("h%d.example", MaxNetworkAttempts-1) {
		t.Errorf("attempts out of order: first %s, last %s", r.Network[0].Host, r.Network[len(r.Network)-1].Host)
	}
	if !strings.HasPrefix(r.Violations[0].Detail, "\uFFFD") {
		t.Errorf("invalid UTF-8 stored as %q", r.Violations[0].Detail)
	}
	b, _ := json.Marshal(r.Command)
	if len(b) > maxCommandBytes+200 || r.Command[0] != "sh" || !strings.Contains(r.Command[len(r.Command)-1], "not recorded") {
		t.Errorf("command stored as %d bytes ending %q", len(b), r.Command[len(r.Command)-1])
	}
}

func TestFailRunning(t *testing.T) {
	s := newStore(t)
	for _, id := range []string{"a", "b", "c"} {
		if err := s.Begin(Record{ID: id, Kind: KindRun}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish("b", &result.Result{Termination: result.Exited}, nil); err != nil {
		t.Fatal(err)
	}
	n, err := s.FailRunning("server restarted")
	if err != nil || n != 2 {
		t.Fatalf("FailRunning = %d, %v; want 2", n, err)
	}
	for id, want := range map[string]Status{"a": Failed, "b": Done, "c": Failed} {
		r, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != want {
			t.Errorf("%s: status %s, want %s", id, r.Status, want)
		}
		if want == Failed && (r.Error != "server restarted" || r.Termination != result.InfraError || r.Ended.IsZero()) {
			t.Errorf("%s: error %q termination %q ended %v", id, r.Error, r.Termination, r.Ended)
		}
	}
	if err := s.Finish("a", &result.Result{Termination: result.Exited}, nil); !errors.Is(err, ErrFinished) {
		t.Errorf("finishing a record FailRunning ended: %v, want ErrFinished", err)
	}
	if n, err := s.FailRunning(""); err != nil || n != 0 {
		t.Errorf("second FailRunning = %d, %v; want 0", n, err)
	}
	if err := s.Begin(Record{ID: "d", Kind: KindRun}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.FailRunning(""); err != nil {
		t.Fatal(err)
	}
	if r, _ := s.Get("d"); r.Error != DefaultFailReason {
		t.Errorf("empty reason recorded as %q, want %q", r.Error, DefaultFailReason)
	}
}

func TestQueryFilters(t *testing.T) {
	s := newStore(t)
	type rec struct {
		id, key, sandbox string
		kind             Kind
		at               time.Duration // after t0
		term             result.Termination
		finish           bool
	}
	recs := []rec{
		{"r1", "kA", "", KindRun, 0, result.Exited, true},
		{"r2", "kA", "", KindRun, time.Hour, result.Timeout, true},
		{"r3", "kB", "", KindRun, 2 * time.Hour, result.OOM, true},
		{"s1", "kB", "", KindSandbox, 3 * time.Hour, "", false},
		{"e1", "kB", "s1", KindExec, 3*time.Hour + time.Minute, result.Exited, true},
		{"e2", "kB", "s1", KindExec, 3*time.Hour + 2*time.Minute, result.InfraError, true},
		{"l1", "", "", KindRun, 4 * time.Hour, result.Exited, true},
	}
	for _, r := range recs {
		if err := s.Begin(Record{ID: r.id, KeyID: r.key, SandboxID: r.sandbox, Kind: r.kind, Started: t0.Add(r.at)}); err != nil {
			t.Fatal(err)
		}
		if r.finish {
			if err := s.Finish(r.id, &result.Result{Termination: r.term}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name string
		f    Filter
		want []string // newest first
	}{
		{"everything, newest first", Filter{}, []string{"l1", "e2", "e1", "s1", "r3", "r2", "r1"}},
		{"by key", Filter{KeyID: "kA"}, []string{"r2", "r1"}},
		{"by sandbox", Filter{SandboxID: "s1"}, []string{"e2", "e1"}},
		{"by kind", Filter{Kind: KindExec}, []string{"e2", "e1"}},
		{"running", Filter{Status: Running}, []string{"s1"}},
		{"failed", Filter{Status: Failed}, []string{"e2"}},
		{"by termination", Filter{Termination: result.Exited}, []string{"l1", "e1", "r1"}},
		{"since is inclusive", Filter{Since: t0.Add(time.Hour)}, []string{"l1", "e2", "e1", "s1", "r3", "r2"}},
		{"until is exclusive", Filter{Until: t0.Add(2 * time.Hour)}, []string{"r2", "r1"}},
		{"window in another zone", Filter{Since: t0.Add(time.Hour).In(time.FixedZone("x", 5*3600)), Until: t0.Add(3 * time.Hour)}, []string{"r3", "r2"}},
		{"combined", Filter{KeyID: "kB", Kind: KindRun, Termination: result.OOM}, []string{"r3"}},
		{"limit", Filter{Limit: 2}, []string{"l1", "e2"}},
		{"no match", Filter{KeyID: "kZ"}, []string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Query(tc.f)
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{}
			for _, r := range got {
				ids = append(ids, r.ID)
			}
			if !reflect.DeepEqual(ids, tc.want) {
				t.Errorf("Query(%+v) = %v, want %v", tc.f, ids, tc.want)
			}
		})
	}
}

func TestQueryLimitDefaults(t *testing.T) {
	s := newStore(t)
	for i := range DefaultQueryLimit + 5 {
		if err := s.Begin(Record{ID: fmt.Sprint("r", i), Kind: KindRun, Started: t0.Add(time.Duration(i) * time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		limit, want int
	}{{0, DefaultQueryLimit}, {MaxQueryLimit * 10, DefaultQueryLimit + 5}, {3, 3}} {
		got, err := s.Query(Filter{Limit: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != tc.want {
			t.Errorf("limit %d: %d records, want %d", tc.limit, len(got), tc.want)
		}
	}
	if l, _ := (Filter{Limit: MaxQueryLimit + 1}).limit(); l != MaxQueryLimit {
		t.Errorf("limit above the maximum gives %d, want %d", l, MaxQueryLimit)
	}
}

func TestCPUSecondsToday(t *testing.T) {
	s := newStore(t)
	y, m, d := time.Now().UTC().Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	for _, r := range []struct {
		id, key string
		started time.Time
		cpuMS   float64
	}{
		{"today-1", "kA", midnight, 1500},
		{"today-2", "kA", midnight.Add(time.Nanosecond), 250},
		{"yesterday", "kA", midnight.Add(-time.Nanosecond), 1e6},
		{"other-key", "kB", midnight.Add(time.Minute), 1e6},
		{"running", "kA", midnight.Add(time.Minute), -1},
	} {
		if err := s.Begin(Record{ID: r.id, KeyID: r.key, Kind: KindRun, Started: r.started}); err != nil {
			t.Fatal(err)
		}
		if r.cpuMS >= 0 {
			if err := s.Finish(r.id, &result.Result{Termination: result.Exited, CPUMS: r.cpuMS}, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := s.CPUSecondsToday("kA")
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().UTC().Day() != d {
		t.Skip("the UTC day changed during the test")
	}
	if got != 1.75 {
		t.Errorf("CPUSecondsToday(kA) = %v, want 1.75 (today's two finished records)", got)
	}
	if got, _ := s.CPUSecondsToday("kNone"); got != 0 {
		t.Errorf("a key without records used %v", got)
	}
}

// TestApprovalRecord: an approval is a record kind the store accepts, and
// its decision (termination, error text, the effects as violations)
// round-trips.
func TestApprovalRecord(t *testing.T) {
	tests := []struct {
		name string
		term result.Termination
		text string
	}{
		{"approved", result.Exited, "approved: read the script"},
		{"denied", result.Policy, "denied: no"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			id := "ap-" + tc.name
			if err := s.Begin(Record{ID: id, Kind: KindApproval, KeyID: "k0123456789ab", Command: []string{"bash", "x.sh"}}); err != nil {
				t.Fatal(err)
			}
			res := &result.Result{Termination: tc.term, Error: tc.text, Violations: []result.Violation{{Kind: "effect", Detail: "exec-fetched: command 2 runs x.sh"}}}
			if err := s.Finish(id, res, nil); err != nil {
				t.Fatal(err)
			}
			r, err := s.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			if r.Kind != KindApproval || r.Status != Done || r.Termination != tc.term || r.Error != tc.text || len(r.Violations) != 1 || r.Violations[0].Kind != "effect" {
				t.Errorf("record %+v", r)
			}
		})
	}
}
