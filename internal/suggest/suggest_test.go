package suggest

import (
	"strings"
	"testing"
)

func TestEditDistance(t *testing.T) {
	tests := []struct {
		name string
		a, b string
		want int
	}{
		{"equal", "run", "run", 0},
		{"both empty", "", "", 0},
		{"from empty", "", "gc", 2},
		{"to empty", "image", "", 5},
		{"one insertion", "imge", "image", 1},
		{"one deletion", "imagee", "image", 1},
		{"one replacement", "rum", "run", 1},
		{"adjacent swap is one edit", "rnu", "run", 1},
		{"swap inside a word", "memroy", "memory", 1},
		{"swap and a replacement", "memroi", "memory", 2},
		{"swapped letters are not edited again (optimal string alignment)", "ca", "abc", 3},
		{"distant swap is two edits", "abcd", "dbca", 2},
		{"unrelated", "serve", "gc", 5},
		{"case counts", "Image", "image", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := EditDistance(tc.a, tc.b); got != tc.want {
				t.Errorf("EditDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
			}
			if got := EditDistance(tc.b, tc.a); got != tc.want {
				t.Errorf("EditDistance(%q, %q) = %d, want %d (the distance is symmetric)", tc.b, tc.a, got, tc.want)
			}
		})
	}
}

func TestClosest(t *testing.T) {
	commands := []string{"run", "manifest", "image", "gc", "redteam", "bench", "serve", "keys", "audit", "policy", "doctor", "version"}
	resources := []string{"cpu_time", "cpus", "file_size", "memory", "open_files", "pids", "stderr_bytes", "stdout_bytes", "timeout"}
	tests := []struct {
		name       string
		word       string
		candidates []string
		want       string
		wantOK     bool
	}{
		{"exact", "run", commands, "run", true},
		{"swap", "rnu", commands, "run", true},
		{"two edits", "imaeg", commands, "image", true},
		{"three edits is too far", "vxrsxn", []string{"version"}, "", false},
		{"nearer beats earlier", "keysx", []string{"key", "keys"}, "keys", true},
		{"nested key with a swap", "memroy", resources, "memory", true},
		{"tie goes to the earlier candidate", "aa", []string{"ab", "ba"}, "ab", true},
		{"tie goes to the earlier candidate, other order", "aa", []string{"ba", "ab"}, "ba", true},
		{"nothing close", "network", resources, "", false},
		{"no candidates", "run", nil, "", false},
		{"empty word is far from long names", "", commands, "gc", true},
		{"a long word is skipped unmeasured", strings.Repeat("x", 1<<20), commands, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Closest(tc.word, tc.candidates)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("Closest(%.20q, ...) = %q, %v; want %q, %v", tc.word, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
