package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

func record(t *testing.T, id, key, doc string, peak int64, wallMS float64) audit.Record {
	t.Helper()
	m := manifestWith(t, doc)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return audit.Record{ID: id, KeyID: key, Kind: audit.KindRun, Manifest: string(b), Tier: m.Tier, PeakMemoryBytes: peak, WallMS: wallMS}
}

// TestSuggestAdmitsObservedRuns: the suggested policy, printed and loaded
// again, admits every manifest it learnt from (with justifications where
// they widen), keeps keys apart, and leaves room over the observed use.
func TestSuggestAdmitsObservedRuns(t *testing.T) {
	docs := []struct{ key, doc string }{
		{"", "resources: {memory: 1GiB}\njustifications: {resources.memory: pandas}"},
		{"ka", "tier: gvisor\nnetwork: {mode: allowlist, allow: [pypi.org, \"*.example.com\"], allow_addresses: [10.0.0.1]}\njustifications: {network.allow: wheels, network.allow_addresses: test server}"},
		{"ka", "resources: {timeout: 2m, cpus: 2}\njustifications: {resources.timeout: build, resources.cpu_time: build, resources.cpus: make -j2}"},
		{"ka", "network: {mode: allowlist, allow: [api.example.com]}\nsecrets: [{name: gh, hosts: [api.example.com]}]\njustifications: {network.allow: api, secrets: api}"},
		{"kb", "network: {mode: allowlist}\npackages: {pypi: {allow: [\"requests==2.31.0\"]}, npm: {allow: [is-number]}}\njustifications: {packages: deps}"},
		{"kb", ""},
		{"kd", "network: {inbound: [\"1-65535\"]}\njustifications: {network.inbound: from the E2B API}"},
		{"kd", "network: {inbound: [8080]}\njustifications: {network.inbound: a web app}"},
	}
	var recs []audit.Record
	for i, d := range docs {
		recs = append(recs, record(t, string(rune('a'+i)), d.key, d.doc, 0, 0))
	}
	// A run that used 900 MiB of a 1 GiB grant for 50s: the ceiling
	// leaves headroom over the use.
	recs = append(recs, record(t, "use", "kc", "", 900<<20, 50_000))
	recs = append(recs, audit.Record{ID: "old", KeyID: "kc", Manifest: "{not json"})

	s, err := Suggest(recs)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := s.WriteYAML(&out); err != nil {
		t.Fatal(err)
	}
	p, err := Parse(out.Bytes(), "suggested.yaml")
	if err != nil {
		t.Fatalf("the printed suggestion does not load: %v\n%s", err, out.String())
	}
	for i, d := range docs {
		if err := p.Check(d.key, manifestWith(t, d.doc)); err != nil {
			t.Errorf("observed run %d (key %q) is refused by the suggestion: %v\n%s", i, d.key, err, out.String())
		}
	}
	if s.Skipped != 1 || s.Records["ka"] != 3 || s.Records["kc"] != 1 {
		t.Errorf("Skipped %d, Records %v", s.Skipped, s.Records)
	}
	tests := []struct {
		name, key, doc, field string
	}{
		{"other key's host", "kb", "network: {mode: allowlist, allow: [pypi.org]}\njustifications: {network.allow: x}", "network.allow[0]"},
		{"default is not widened by a key", "", "tier: gvisor", "tier"},
		{"beyond observed memory", "", "resources: {memory: 2GiB}\njustifications: {resources.memory: x}", "resources.memory"},
		{"package not seen", "kb", "network: {mode: allowlist}\npackages: {pypi: {allow: [numpy]}}\njustifications: {packages: x}", "packages.pypi.allow[0]"},
		{"secret not seen", "ka", "network: {mode: allowlist, allow: [api.example.com]}\nsecrets: [{name: aws, hosts: [api.example.com]}]\njustifications: {network.allow: x, secrets: x}", "secrets[0].name"},
		{"unknown key gets the default", "kz", "resources: {memory: 2GiB}\njustifications: {resources.memory: x}", "resources.memory"},
		{"headroom over use", "kc", "resources: {memory: 1536MiB, timeout: 75s, cpu_time: 30s}\njustifications: {resources.memory: x, resources.timeout: x}", ""},
		{"beyond headroom", "kc", "resources: {memory: 2GiB}\njustifications: {resources.memory: x}", "resources.memory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := p.Check(tc.key, manifestWith(t, tc.doc))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var r *Refusal
			if !errors.As(err, &r) || r.Field != tc.field {
				t.Fatalf("Check = %v; want %s refused", err, tc.field)
			}
		})
	}
	if !strings.Contains(out.String(), "moat serve --policy") {
		t.Errorf("the suggestion does not say how to load it:\n%s", out.String())
	}
}

func TestSuggestNoRecords(t *testing.T) {
	_, err := Suggest([]audit.Record{{ID: "x", Manifest: ""}})
	if !errors.Is(err, audit.ErrNoLegitimateRuns) {
		t.Errorf("Suggest of unreadable records = %v; want ErrNoLegitimateRuns", err)
	}
}
