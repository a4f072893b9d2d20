package guestkernel

import (
	"strings"
	"testing"
)

func TestCmdline(t *testing.T) {
	tests := []struct {
		verbose bool
		want    []string
		notWant []string
	}{
		{false, []string{"console=ttyS0", "panic=-1", "reboot=t", "rdinit=/init", "tsc=reliable", "no_timer_check", "quiet", "loglevel=1"}, []string{"loglevel=7"}},
		{true, []string{"console=ttyS0", "panic=-1", "reboot=t", "rdinit=/init", "tsc=reliable", "no_timer_check", "loglevel=7"}, []string{"quiet", "loglevel=1"}},
	}
	for _, tc := range tests {
		c := Cmdline(tc.verbose)
		words := strings.Fields(c)
		has := func(w string) bool {
			for _, x := range words {
				if x == w {
					return true
				}
			}
			return false
		}
		for _, w := range tc.want {
			if !has(w) {
				t.Errorf("Cmdline(%v) = %q lacks %q", tc.verbose, c, w)
			}
		}
		for _, w := range tc.notWant {
			if has(w) {
				t.Errorf("Cmdline(%v) = %q has %q", tc.verbose, c, w)
			}
		}
		// The boot hang it prevents is real on this host: the frequency
		// must be there whenever /proc/cpuinfo gives one.
		if khz := hostTSCkHz(); khz > 0 && !strings.Contains(c, "tsc_early_khz=") {
			t.Errorf("Cmdline(%v) = %q lacks tsc_early_khz (host: %d kHz)", tc.verbose, c, khz)
		}
	}
}
