package redteam

import (
	"os"
	"strings"
	"testing"
)

func TestPerTierValidation(t *testing.T) {
	base := func() Case {
		return Case{ID: "x", Category: "c", Severity: "low", Threat: "t", Sh: "true",
			Expect: Expect{Termination: []string{"exited"}}}
	}
	reason := "the tier serves this call in its own kernel; the host-side evidence is the runtime's confinement"
	tests := []struct {
		name string
		pt   map[string]TierExpect
		err  string // substring; "" for valid
	}{
		{"expect with reason", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{HostProcs: true}}}, ""},
		{"not applicable with reason", map[string]TierExpect{"gvisor": {Reason: reason, NotApplicable: true}}, ""},
		{"no reason", map[string]TierExpect{"gvisor": {Expect: &Expect{HostProcs: true}}}, "reason"},
		{"short reason", map[string]TierExpect{"gvisor": {Reason: "differs", NotApplicable: true}}, "reason"},
		{"both", map[string]TierExpect{"gvisor": {Reason: reason, NotApplicable: true, Expect: &Expect{HostProcs: true}}}, "exactly one"},
		{"neither", map[string]TierExpect{"gvisor": {Reason: reason}}, "exactly one"},
		{"empty expectation", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{}}}, "no expectation"},
		{"denied without host_procs", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{Denied: []string{"op"}}}}, "host_procs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			c.PerTier = tc.pt
			err := c.validate()
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("valid case refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error containing %q", err, tc.err)
			}
		})
	}
}

func TestForTier(t *testing.T) {
	c := Case{ID: "x", Expect: Expect{Denied: []string{"a", "b"}, HostProcs: true},
		PerTier: map[string]TierExpect{"gvisor": {Reason: "r", Expect: &Expect{Denied: []string{"b"}, HostProcs: true}}}}
	if cc, te := c.forTier("native"); te != nil || len(cc.Expect.Denied) != 2 {
		t.Errorf("native: got %v %v, want the default expectation", cc.Expect, te)
	}
	if cc, te := c.forTier("gvisor"); te == nil || len(cc.Expect.Denied) != 1 || len(c.Expect.Denied) != 2 {
		t.Errorf("gvisor: got %v %v (default now %v), want the tier's, default untouched", cc.Expect, te, c.Expect)
	}
}

// TestInspectRuntimeCanFail runs the runtime-process judgment on this test
// process, which is neither runsc nor seccomp-filtered: both must be found.
func TestInspectRuntimeCanFail(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, exe, want string
	}{
		{"not the runtime's executable", "/nonexistent/runsc", "not the runtime"},
		{"not seccomp-filtered", self, "not seccomp-filtered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := &procWatch{runtime: true, runtimeExe: tc.exe}
			w.inspectRuntime(os.Getpid())
			if ev := w.verdict(); !strings.Contains(ev, tc.want) {
				t.Errorf("verdict %q, want it to contain %q", ev, tc.want)
			}
		})
	}
}
