package effects

import (
	"sort"
	"strings"
	"testing"
)

func kindsOf(es []Effect) []Kind {
	seen := map[Kind]bool{}
	var out []Kind
	for _, e := range es {
		if !seen[e.Kind] {
			seen[e.Kind] = true
			out = append(out, e.Kind)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func sortedKinds(ks []Kind) []Kind {
	out := append([]Kind(nil), ks...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func sameKinds(a, b []Kind) bool {
	a, b = sortedKinds(a), sortedKinds(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCorpusSize(t *testing.T) {
	composed, benign := 0, 0
	for _, c := range corpus {
		if len(c.want) == 0 {
			benign++
		} else {
			composed++
		}
	}
	if composed < 100 {
		t.Errorf("corpus has %d cases with effects, want at least 100", composed)
	}
	if benign < 30 {
		t.Errorf("corpus has %d benign cases, want at least 30", benign)
	}
}

func TestCorpus(t *testing.T) {
	names := map[string]bool{}
	for _, c := range corpus {
		if names[c.name] {
			t.Fatalf("corpus case name %q is used twice", c.name)
		}
		names[c.name] = true
		t.Run(c.name, func(t *testing.T) {
			got := AnalyseSession(c.cmds)
			if !sameKinds(kindsOf(got), c.want) {
				var lines []string
				for _, e := range got {
					lines = append(lines, e.String())
				}
				t.Errorf("%q:\n got kinds %v\nwant kinds %v\neffects:\n  %s", c.cmds, kindsOf(got), sortedKinds(c.want), strings.Join(lines, "\n  "))
			}
			for _, e := range got {
				if e.Detail == "" || len(e.Commands) == 0 || !e.Kind.Valid() {
					t.Errorf("effect %+v lacks a detail, commands or a valid kind", e)
				}
				for _, n := range e.Commands {
					if n < 1 || n > len(c.cmds) {
						t.Errorf("effect %q names command %d of a %d-command session", e.Detail, n, len(c.cmds))
					}
				}
			}
		})
	}
}

// TestCorpusSummary prints how the analyser does over the corpus: each
// expected kind found or missed, each unexpected kind a false alarm.
// Run with -v to read it (the closing note quotes it).
func TestCorpusSummary(t *testing.T) {
	found, missed, falseAlarms, exact, benignClean, benign := 0, 0, 0, 0, 0, 0
	for _, c := range corpus {
		got := kindsOf(AnalyseSession(c.cmds))
		want := map[Kind]bool{}
		for _, k := range c.want {
			want[k] = true
		}
		have := map[Kind]bool{}
		for _, k := range got {
			have[k] = true
			if !want[k] {
				falseAlarms++
			}
		}
		for k := range want {
			if have[k] {
				found++
			} else {
				missed++
			}
		}
		if sameKinds(got, c.want) {
			exact++
			if len(c.want) == 0 {
				benignClean++
			}
		}
		if len(c.want) == 0 {
			benign++
		}
	}
	t.Logf("corpus: %d cases (%d with effects, %d benign); expected effect kinds found %d, missed %d; false alarms %d (benign cases clean: %d of %d); cases exactly right %d of %d",
		len(corpus), len(corpus)-benign, benign, found, missed, falseAlarms, benignClean, benign, exact, len(corpus))
}
