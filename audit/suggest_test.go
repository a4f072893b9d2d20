package audit

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// ok is a finished, legitimate record: exited by itself with status 0.
func ok(id string, wallMS, cpuMS float64, peak int64, net ...result.NetworkAttempt) Record {
	return Record{ID: id, Kind: KindRun, Status: Done, Termination: result.Exited, Image: "python", Tier: "native",
		WallMS: wallMS, CPUMS: cpuMS, PeakMemoryBytes: peak, Network: net}
}

func with(r Record, f func(*Record)) Record {
	f(&r)
	return r
}

func TestSuggest(t *testing.T) {
	mixed := []Record{
		with(ok("ok1", 1200, 800, 100*mib, allowed("pypi.org", 443), allowed("files.pythonhosted.org", 443), denied("evil.example", 443, "not-allowlisted")),
			func(r *Record) { r.Kind = KindExec }),
		ok("ok2", 3400, 2100, 180*mib,
			result.NetworkAttempt{Method: "CONNECT", Host: "api.example.com", Port: 8443, Allowed: true, Reason: "allowed"},
			result.NetworkAttempt{Method: "GET", Host: "test.internal", Port: 80, Address: "10.0.0.5", Allowed: true, Reason: "allowed"},
			allowed("pypi.org", 443)),
		// What the limits stopped, or what failed, is not what the work needs.
		with(ok("bad-exit", 99000, 99000, 4*gib, allowed("exfil.example", 443)), func(r *Record) { r.ExitCode = 1 }),
		with(ok("timeout", 30000, 30000, 10*mib), func(r *Record) { r.Termination, r.ExitCode = result.Timeout, 124 }),
		with(ok("oom", 100, 100, 512*mib), func(r *Record) { r.Termination, r.ExitCode = result.OOM, 137 }),
		with(ok("failed", 100, 100, 1*gib), func(r *Record) { r.Status, r.Termination = Failed, result.InfraError }),
		with(ok("running", 0, 0, 0), func(r *Record) { r.Status, r.Termination = Running, "" }),
		with(ok("session", 3600e3, 10, 2*gib), func(r *Record) { r.Kind = KindSandbox }),
	}
	tests := []struct {
		name           string
		records        []Record
		memory         manifest.Size
		timeout, cpu   time.Duration
		mode           string
		allow, addrs   []string
		image          string
		considered     int
		ignored        []Count
		reasonContains map[string]string // field -> substring of its reason
	}{
		{
			name: "mixed runs", records: mixed,
			memory: 384 * manifest.MiB, timeout: 6 * time.Second, cpu: 4 * time.Second,
			mode: "allowlist", allow: []string{"api.example.com:8443", "files.pythonhosted.org", "pypi.org", "test.internal"}, addrs: []string{"10.0.0.5"},
			image: "python", considered: 2,
			ignored: []Count{{"ended by oom", 1}, {"ended by timeout", 1}, {ignoreNonZero, 1}, {ignoreFailed, 1}, {ignoreSandbox, 1}, {ignoreRunning, 1}},
			reasonContains: map[string]string{
				"resources.memory":        "largest peak 180.0MiB (record ok2) of 2 legitimate runs, +50% headroom = 270.0MiB, rounded up to 384MiB",
				"resources.timeout":       "longest wall time 3.400s (record ok2)",
				"resources.cpu_time":      "longest CPU time 2.100s (record ok2)",
				"network.allow":           "pypi.org (2 attempts)",
				"network.allow_addresses": "10.0.0.5 (1 attempt)",
				"network.mode":            "5 allowed attempts through the egress proxy by 2 of 2 legitimate runs",
			},
		},
		{
			name: "no network used", records: []Record{ok("a", 2000, 1000, 50*mib, denied("evil.example", 443, "not-allowlisted"))},
			memory: 96 * manifest.MiB, timeout: 3 * time.Second, cpu: 2 * time.Second, mode: "none", image: "python", considered: 1,
			ignored:        []Count{},
			reasonContains: map[string]string{"network.mode": "no legitimate run (of 1) was let through"},
		},
		{
			name: "tiny run stays at the minimums", records: []Record{ok("a", 5, 1, 1*mib)},
			memory: 4 * manifest.MiB, timeout: time.Second, cpu: time.Second, mode: "none", image: "python", considered: 1, ignored: []Count{},
			reasonContains: map[string]string{"resources.memory": "raised to the minimum 4MiB"},
		},
		{
			name: "huge run is capped at the maximums", records: []Record{ok("a", float64(23*time.Hour/time.Millisecond), 1000, 60*gib)},
			memory: 64 * manifest.GiB, timeout: 24 * time.Hour, cpu: 2 * time.Second, mode: "none", image: "python", considered: 1, ignored: []Count{},
			reasonContains: map[string]string{"resources.memory": "capped at the maximum 64GiB", "resources.timeout": "capped at the maximum 24h"},
		},
		{
			name: "exact multiple of a second is kept", records: []Record{ok("a", 2000, 4000, 0)},
			memory: 512 * manifest.MiB, timeout: 3 * time.Second, cpu: 6 * time.Second, mode: "none", image: "python", considered: 1, ignored: []Count{},
			reasonContains: map[string]string{"resources.memory": "kept the default 512MiB"},
		},
		{
			name: "most common image", records: []Record{ok("a", 1, 1, mib), ok("b", 1, 1, mib), with(ok("c", 1, 1, mib), func(r *Record) { r.Image = "node" })},
			memory: 4 * manifest.MiB, timeout: time.Second, cpu: time.Second, mode: "none", image: "python", considered: 3, ignored: []Count{},
			reasonContains: map[string]string{"image": "python 2, node 1"},
		},
		{
			name: "IP literals and port-80 tunnels", records: []Record{ok("a", 1, 1, mib,
				result.NetworkAttempt{Method: "GET", Host: "127.0.0.1", Port: 8080, Allowed: true},
				result.NetworkAttempt{Method: "CONNECT", Host: "example.com", Port: 80, Allowed: true},
				result.NetworkAttempt{Method: "GET", Host: "example.org", Port: 80, Address: "93.184.215.14", Allowed: true},
				result.NetworkAttempt{Method: "CONNECT", Host: "bad\nnetwork: {mode: allowlist}", Port: 443, Allowed: true},
			)},
			memory: 4 * manifest.MiB, timeout: time.Second, cpu: time.Second, mode: "allowlist",
			allow: []string{"example.com:80", "example.org"}, addrs: []string{"127.0.0.1"}, image: "python", considered: 1, ignored: []Count{},
			reasonContains: map[string]string{
				"network.allow_addresses": "127.0.0.1 on port 8080 also needs an allow entry naming port 8080",
				"network.allow":           `left out "bad\nnetwork: {mode: allowlist}"`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Suggest(tc.records)
			if err != nil {
				t.Fatal(err)
			}
			m := s.Manifest
			if err := m.Validate(); err != nil {
				t.Errorf("the suggestion does not validate: %v", err)
			}
			r := m.Resources
			if r.Memory != tc.memory || r.Timeout.D() != tc.timeout || r.CPUTime.D() != tc.cpu {
				t.Errorf("memory %s timeout %s cpu_time %s; want %s %s %s", r.Memory, r.Timeout, r.CPUTime, tc.memory, tc.timeout, tc.cpu)
			}
			if m.Network.Mode != tc.mode || !slices.Equal(m.Network.Allow, tc.allow) || !slices.Equal(m.Network.AllowAddresses, tc.addrs) {
				t.Errorf("network %s allow %q addresses %q; want %s %q %q", m.Network.Mode, m.Network.Allow, m.Network.AllowAddresses, tc.mode, tc.allow, tc.addrs)
			}
			if m.Image != tc.image {
				t.Errorf("image %q, want %q", m.Image, tc.image)
			}
			if s.Considered != tc.considered || !reflect.DeepEqual(s.Ignored, tc.ignored) {
				t.Errorf("considered %d ignored %v; want %d %v", s.Considered, s.Ignored, tc.considered, tc.ignored)
			}
			reasons := map[string]string{}
			for _, fr := range s.Reasons {
				if _, dup := reasons[fr.Field]; dup && fr.Field != "network.allow" {
					t.Errorf("two reasons for %s", fr.Field)
				}
				reasons[fr.Field] += fr.Reason
			}
			for _, f := range []string{"resources.memory", "resources.timeout", "resources.cpu_time", "network.mode"} {
				if reasons[f] == "" {
					t.Errorf("no reason for %s", f)
				}
			}
			for f, want := range tc.reasonContains {
				if !strings.Contains(reasons[f], want) {
					t.Errorf("reason for %s is %q, want it to contain %q", f, reasons[f], want)
				}
			}
			// Every field Suggest does not decide keeps its default.
			def := manifest.Default()
			def.Image, def.Tier, def.Resources.Memory, def.Resources.Timeout, def.Resources.CPUTime = m.Image, m.Tier, r.Memory, r.Timeout, r.CPUTime
			def.Network.Mode, def.Network.Allow, def.Network.AllowAddresses = m.Network.Mode, m.Network.Allow, m.Network.AllowAddresses
			if def.Digest() != m.Digest() {
				t.Errorf("fields beyond the decided ones changed:\n%s", m)
			}
		})
	}
}

func TestSuggestNoLegitimateRuns(t *testing.T) {
	tests := []struct {
		name    string
		records []Record
		want    string
	}{
		{"no records", nil, "no audit records match"},
		{"only failures", []Record{
			with(ok("a", 1, 1, 1), func(r *Record) { r.ExitCode = 2 }),
			with(ok("b", 1, 1, 1), func(r *Record) { r.Termination = result.Timeout }),
		}, "none of the 2 records exited by itself with status 0 (ignored: ended by timeout 1, exited with a non-zero status 1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Suggest(tc.records)
			if !errors.Is(err, ErrNoLegitimateRuns) || s != nil {
				t.Fatalf("Suggest = %v, %v; want ErrNoLegitimateRuns", s, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestWriteYAML(t *testing.T) {
	recs := []Record{
		ok("ok1", 3400, 2100, 180*mib, allowed("pypi.org", 443),
			// A host the allowlist cannot hold, written to break out of a comment.
			result.NetworkAttempt{Host: "x\nnetwork: {mode: allowlist, allow: [evil.example]}\n#", Port: 443, Allowed: true}),
		with(ok("bad", 1, 1, 1), func(r *Record) { r.ExitCode = 1 }),
	}
	s, err := Suggest(recs)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.WriteYAML(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	parsed, err := manifest.Parse(buf.Bytes(), "suggested.yaml")
	if err != nil {
		t.Fatalf("the YAML does not parse as a manifest: %v\n%s", err, out)
	}
	if parsed.Digest() != s.Manifest.Digest() {
		t.Errorf("parsed back to another manifest:\n%s\nwant\n%s", parsed, s.Manifest)
	}
	if slices.Contains(parsed.Network.Allow, "evil.example") {
		t.Error("a host name injected an allow entry through a comment")
	}
	for _, want := range []string{
		"# Suggested by moat policy suggest from 1 legitimate run",
		"# Ignored 1: exited with a non-zero status.",
		"# largest peak 180.0MiB",
		"memory: 384MiB",
		"timeout: 6s",
		"cpu_time: 4s",
		"- pypi.org",
		"# exactly the destinations the runs reached: pypi.org (1 attempt)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("YAML lacks %q", want)
		}
	}
	for i, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "evil.example") && !strings.HasPrefix(strings.TrimSpace(line), "#") {
			t.Errorf("line %d carries the injected text outside a comment: %q", i+1, line)
		}
	}
	if t.Failed() {
		t.Logf("YAML:\n%s", out)
	}
}

func TestReadableSize(t *testing.T) {
	tests := []struct {
		in   float64
		want manifest.Size
	}{
		{0, manifest.MiB}, {mib, manifest.MiB}, {mib + 1, 1536 * manifest.KiB},
		{270 * mib, 384 * manifest.MiB}, {384 * mib, 384 * manifest.MiB}, {385 * mib, 512 * manifest.MiB},
		{1.2 * gib, 1536 * manifest.MiB}, {1.6 * gib, 2 * manifest.GiB}, {3 * gib, 3 * manifest.GiB},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.in), func(t *testing.T) {
			if got := readableSize(tc.in); got != tc.want {
				t.Errorf("readableSize(%v) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestSuggestFromStore runs Suggest on what Query returns, as the CLI does.
func TestSuggestFromStore(t *testing.T) {
	st := newStore(t)
	load(t, st, reportSeeds)
	recs, err := st.Query(Filter{Limit: MaxQueryLimit})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Suggest(recs)
	if err != nil {
		t.Fatal(err)
	}
	// Only "a" exited 0: 512MiB peak -> 768MiB, 2 s wall -> 3 s, 1 s CPU -> 2 s.
	r := s.Manifest.Resources
	if s.Considered != 1 || r.Memory != 768*manifest.MiB || r.Timeout.D() != 3*time.Second || r.CPUTime.D() != 2*time.Second || s.Manifest.Network.Mode != "none" {
		t.Errorf("considered %d, memory %s timeout %s cpu %s network %s", s.Considered, r.Memory, r.Timeout, r.CPUTime, s.Manifest.Network.Mode)
	}
}

// TestSuggestIgnoresApprovals: an approval record (a person's decision,
// termination exited when approved) is not a run to learn from: the run
// it let through has its own record.
func TestSuggestIgnoresApprovals(t *testing.T) {
	tests := []struct {
		name       string
		records    []Record
		considered int
		ignored    []Count
	}{
		{"approval beside its run", []Record{ok("run", 1000, 500, 20*mib), with(ok("ap", 9000, 9000, 900*mib), func(r *Record) { r.Kind = KindApproval })},
			1, []Count{{ignoreApproval, 1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Suggest(tc.records)
			if err != nil {
				t.Fatal(err)
			}
			if s.Considered != tc.considered || !reflect.DeepEqual(s.Ignored, tc.ignored) {
				t.Errorf("considered %d ignored %v; want %d %v", s.Considered, s.Ignored, tc.considered, tc.ignored)
			}
		})
	}
}
