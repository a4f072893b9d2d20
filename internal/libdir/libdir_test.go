package libdir

import (
	"slices"
	"testing"
)

func TestFind(t *testing.T) {
	tests := []struct {
		name   string
		exe    string
		file   string
		exists []string
		want   string
	}{
		{name: "the .deb's layout", exe: "/usr/bin/moat", file: "moat-guest", exists: []string{"/usr/lib/moat/moat-guest", "/usr/local/lib/moat/moat-guest"}, want: "/usr/lib/moat/moat-guest"},
		{name: "scripts/setup's layout", exe: "/usr/local/bin/moat", file: "moat-guest", exists: []string{"/usr/local/lib/moat/moat-guest"}, want: "/usr/local/lib/moat/moat-guest"},
		{name: "a release archive unpacked in /opt", exe: "/opt/moat/bin/moat", file: "wasm", exists: []string{"/opt/moat/lib/moat/wasm"}, want: "/opt/moat/lib/moat/wasm"},
		{name: "nothing beside it: the default", exe: "/usr/bin/moat", file: "wasm", exists: []string{"/usr/local/lib/moat/wasm"}, want: "/usr/local/lib/moat/wasm"},
		{name: "a test binary in a temp dir", exe: "/tmp/go-build1/b001/moat.test", file: "moat-guest", want: "/usr/local/lib/moat/moat-guest"},
		{name: "executable unknown", exe: "", file: "moat-guest", exists: []string{"/lib/moat/moat-guest"}, want: "/usr/local/lib/moat/moat-guest"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := find(tc.exe, tc.file, func(p string) bool { return slices.Contains(tc.exists, p) })
			if got != tc.want {
				t.Errorf("find(%q, %q) = %q, want %q", tc.exe, tc.file, got, tc.want)
			}
		})
	}
}

func TestCandidates(t *testing.T) {
	tests := []struct {
		exe  string
		want []string
	}{
		{exe: "/usr/bin/moat", want: []string{"/usr/lib/moat", Default}},
		{exe: "/usr/local/bin/moat", want: []string{Default}},
		{exe: "moat", want: []string{Default}},
	}
	for _, tc := range tests {
		t.Run(tc.exe, func(t *testing.T) {
			if got := Candidates(tc.exe); !slices.Equal(got, tc.want) {
				t.Errorf("Candidates(%q) = %q, want %q", tc.exe, got, tc.want)
			}
		})
	}
}

func TestPaths(t *testing.T) {
	tests := []struct {
		exe  string
		want []string
	}{
		{exe: "/usr/bin/moat", want: []string{"/usr/lib/moat/moat-guest", Default + "/moat-guest"}},
		{exe: "/usr/local/bin/moat", want: []string{Default + "/moat-guest"}},
		{exe: "", want: []string{Default + "/moat-guest"}},
	}
	for _, tc := range tests {
		t.Run(tc.exe, func(t *testing.T) {
			if got := paths(tc.exe, "moat-guest"); !slices.Equal(got, tc.want) {
				t.Errorf("paths(%q) = %q, want %q", tc.exe, got, tc.want)
			}
		})
	}
}
