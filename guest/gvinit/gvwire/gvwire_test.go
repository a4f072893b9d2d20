package gvwire

import (
	"slices"
	"testing"
)

func TestArgs(t *testing.T) {
	tests := []struct {
		name      string
		got, want []string
	}{
		{"exec with rlimits in their order, absent ones left out",
			ExecArgs("/g", map[string]uint64{"cpu": 5, "nofile": 64, "core": 0}, []string{"sh", "-c", "x"}),
			[]string{"/g", Arg, "exec", "core=0", "nofile=64", "cpu=5", "--", "sh", "-c", "x"}},
		{"exec without rlimits", ExecArgs("/g", nil, []string{"true"}), []string{"/g", Arg, "exec", "--", "true"}},
		{"init", InitArgs("/g"), []string{"/g", Arg, "init"}},
		{"kill", KillArgs("/g", 15, 42), []string{"/g", Arg, "kill", "15", "42"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !slices.Equal(tc.got, tc.want) {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}
