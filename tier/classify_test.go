package tier

import (
	"testing"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/result"
)

func TestClassify(t *testing.T) {
	lim := Limits{MemoryBytes: 64 << 20, Pids: 64, Timeout: 10 * time.Second, CPUTime: 2 * time.Second}
	tests := []struct {
		name     string
		obs      Observed
		term     result.Termination
		code     int
		sig      int
		violates []string
	}{
		{"exit 0", Observed{Exit: &Exit{Code: 0}}, result.Exited, 0, 0, nil},
		{"exit 137 stays an exit", Observed{Exit: &Exit{Code: 137}}, result.Exited, 137, 0, nil},
		{"signal", Observed{Exit: &Exit{Signal: 15}}, result.Signaled, 143, 15, nil},
		{"timeout wins", Observed{Exit: &Exit{Code: 0}, TimedOut: true}, result.Timeout, 124, 9, []string{"timeout"}},
		{"oom kill", Observed{Exit: &Exit{Signal: 9}, Stats: cgroup.Stats{OOMKills: 1}}, result.OOM, 137, 9, []string{"memory"}},
		{"reporter lost to oom", Observed{Stats: cgroup.Stats{OOMKills: 1}}, result.OOM, 137, 9, []string{"memory"}},
		{"reporter lost", Observed{Lost: "gone"}, result.InfraError, 125, 0, nil},
		{"sigxcpu", Observed{Exit: &Exit{Signal: 24}}, result.CPUTime, 152, 24, []string{"cpu-time"}},
		{"sigkill past cpu time", Observed{Exit: &Exit{Signal: 9}, Stats: cgroup.Stats{CPU: 3 * time.Second}}, result.CPUTime, 137, 9, []string{"cpu-time"}},
		{"sigsys", Observed{Exit: &Exit{Signal: 31}}, result.Policy, 159, 31, []string{"syscall"}},
		{"failure at the pids limit", Observed{Exit: &Exit{Code: 1}, Stats: cgroup.Stats{PidsMaxHits: 3}}, result.Pids, 1, 0, []string{"pids"}},
		{"success despite pids hits", Observed{Exit: &Exit{Code: 0}, Stats: cgroup.Stats{PidsMaxHits: 3}}, result.Exited, 0, 0, []string{"pids"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := &Outcome{}
			Classify(out, tc.obs, lim)
			if out.Termination != tc.term || out.ExitCode != tc.code || out.Signal != tc.sig {
				t.Errorf("got %s/%d/%d, want %s/%d/%d", out.Termination, out.ExitCode, out.Signal, tc.term, tc.code, tc.sig)
			}
			if out.Termination == result.InfraError && out.Error != tc.obs.Lost {
				t.Errorf("error %q, want %q", out.Error, tc.obs.Lost)
			}
			var kinds []string
			for _, v := range out.Violations {
				kinds = append(kinds, v.Kind)
			}
			if len(kinds) != len(tc.violates) {
				t.Fatalf("violations %v, want %v", kinds, tc.violates)
			}
			for i := range kinds {
				if kinds[i] != tc.violates[i] {
					t.Errorf("violations %v, want %v", kinds, tc.violates)
				}
			}
		})
	}
}
