package native_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
)

// TestSessionPid: a command's Pid is its pid inside the sandbox, one that
// another command of the same sandbox sees in /proc and can kill -9, and
// never init's (1).
func TestSessionPid(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, nil)
	victim, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	pid := victim.Pid()
	if pid <= 1 {
		t.Fatalf("Pid() = %d, want the command's pid in the sandbox (> 1)", pid)
	}
	tests := []struct {
		name string
		argv []string
		exit int
	}{
		{"the sandbox sees it as sleep", []string{"sh", "-c", "grep -q '^sleep$' /proc/" + strconv.Itoa(pid) + "/comm"}, 0},
		{"another command kills it (the shell's kill)", []string{"sh", "-c", "kill -9 " + strconv.Itoa(pid)}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := execWait(t, s, &engine.ExecRequest{Argv: tc.argv})
			if r.ExitCode != tc.exit {
				t.Errorf("%q: exit %d (%s), want %d; stderr %q", tc.argv, r.ExitCode, r.Termination, tc.exit, r.Stderr.Data)
			}
		})
	}
	select {
	case <-victim.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("kill -9 of the command's pid did not end it")
	}
	if r := victim.Result(); r.Termination != result.Signaled || r.Signal != 9 {
		t.Errorf("victim: %s signal %d, want signaled by 9", r.Termination, r.Signal)
	}
	// The sandbox lives on: its init was not what was killed.
	if r := execWait(t, s, &engine.ExecRequest{Argv: []string{"true"}}); r.ExitCode != 0 {
		t.Errorf("a command after the kill: %s %d", r.Termination, r.ExitCode)
	}
}
