package gvinit

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	// The test binary is the guest when re-executed with Arg.
	if len(os.Args) > 1 && os.Args[1] == Arg {
		Main()
	}
	os.Exit(m.Run())
}

// guest runs this test binary as the guest with args.
func guest(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{Arg}, args...)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

func TestExec(t *testing.T) {
	tests := []struct {
		name string
		args []string
		out  string
		code int
	}{
		{"rlimits and no_new_privs reach the program", []string{"exec", "nofile=37", "core=0", "fsize=12345", "--", "sh", "-c", "ulimit -n; ulimit -c; ulimit -f; grep NoNewPrivs /proc/self/status"}, "37\n0\n24\nNoNewPrivs:\t1\n", 0},
		{"the program's status is its own", []string{"exec", "--", "sh", "-c", "exit 7"}, "", 7},
		{"a missing command is 127", []string{"exec", "--", "no-such-command-moat"}, "command not found", 127},
		{"a missing path is 127", []string{"exec", "--", "/no/such/file"}, "cannot execute", 127},
		{"a directory is 126", []string{"exec", "--", "/"}, "cannot execute", 126},
		{"an unknown rlimit is refused", []string{"exec", "stack=1", "--", "true"}, "bad rlimit", 125},
		{"no command", []string{"exec", "nofile=5"}, "no command", 125},
		{"unknown mode", []string{"frobnicate"}, "unknown mode", 2},
		{"kill wants a process group", []string{"kill", "9", "1"}, "bad arguments", 2},
		{"init wants a socket and a port or nothing", []string{"init", "/x"}, "want no arguments", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, code := guest(t, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.out) {
				t.Errorf("guest %q: exit %d output %q, want exit %d with %q", tc.args, code, out, tc.code, tc.out)
			}
		})
	}
}
