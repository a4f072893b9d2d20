package native

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestSetupStuck: a process that may queue no signal (RLIMIT_SIGPENDING
// 0, as under `prlimit --sigpending=0`) is seen as one whose setup can
// never finish; an ordinary one is not.
func TestSetupStuck(t *testing.T) {
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("needs prlimit (util-linux)")
	}
	tests := []struct {
		name  string
		argv  []string
		stuck bool
	}{
		{"no signal may be queued", []string{"prlimit", "--sigpending=0", "sleep", "10"}, true},
		{"ordinary process", []string{"sleep", "10"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(tc.argv[0], tc.argv[1:]...)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			// prlimit execs sleep with its limits; wait for the exec.
			var why string
			for range 100 {
				if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); strings.TrimSpace(string(b)) == "sleep" {
					why = setupStuck(cmd.Process.Pid)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := why != ""; got != tc.stuck {
				t.Errorf("setupStuck = %q, want stuck=%v", why, tc.stuck)
			}
			if tc.stuck && !strings.Contains(why, "RLIMIT_SIGPENDING") {
				t.Errorf("setupStuck = %q, want the limit named", why)
			}
		})
	}
}
