package testvm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if Guest() {
		// The VMs of the tests below: the last argument says what the
		// guest does instead of running tests.
		GuestMain(nil, func() int {
			switch os.Args[len(os.Args)-1] {
			case "status":
				for _, p := range []string{"/bin/sh", "/bin/sleep", "/proc/self/mountinfo", "/dev/null", "/tmp"} {
					if _, err := os.Stat(p); err != nil {
						fmt.Println("missing:", err)
					}
				}
				fmt.Println("guest ran")
				return 7
			case "panic":
				panic("guest panics")
			case "exit":
				os.Exit(3)
			case "orphans":
				// Orphans go to init, which must reap them: no zombie
				// may stay behind.
				for i := 0; i < 5; i++ {
					exec.Command("/bin/sh", "-c", "/bin/sleep 0.1 &").Run()
				}
				time.Sleep(time.Second)
				zombies := 0
				stats, _ := filepath.Glob("/proc/[0-9]*/stat")
				for _, st := range stats {
					if b, err := os.ReadFile(st); err == nil && strings.Contains(string(b), ") Z ") {
						zombies++
					}
				}
				fmt.Println("zombies:", zombies)
				return 0
			case "crash":
				// The kernel panics: the VM ends without a status.
				os.WriteFile("/proc/sysrq-trigger", []byte("c"), 0)
				time.Sleep(time.Minute)
			}
			return m.Run()
		})
	}
	os.Exit(m.Run())
}

func TestRun(t *testing.T) {
	Skip(t)
	tests := []struct {
		mode     string
		code     int
		want     string
		noStatus bool
	}{
		{mode: "status", code: 7, want: "guest ran"},
		{mode: "panic", code: 1, want: "testvm: panic: guest panics"},
		{mode: "exit", code: 3},
		{mode: "orphans", code: 0, want: "zombies: 0"},
		// A VM that ends before reporting is an error, never a pass.
		{mode: "crash", noStatus: true},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			before := leftovers(t)
			r, err := Run(context.Background(), []string{tc.mode}, Options{CPUs: 1, MemoryMiB: 256, Timeout: time.Minute})
			if after := leftovers(t); after != before {
				t.Errorf("%d moat-testvm-* directories in %s before Run, %d after", before, os.TempDir(), after)
			}
			if tc.noStatus {
				if err == nil || !strings.Contains(err.Error(), "without reporting a status") {
					t.Fatalf("Run = %v, want an error for the missing status; console:\n%s", err, r.Console)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\n%s", err, r.Console)
			}
			if r.Code != tc.code || !strings.Contains(r.Console, tc.want) || strings.Contains(r.Console, "missing:") {
				t.Errorf("code %d, want %d with %q; console:\n%s", r.Code, tc.code, tc.want, r.Console)
			}
		})
	}
}

func leftovers(t *testing.T) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(os.TempDir(), fmt.Sprintf("moat-testvm-%d-*", os.Getpid())))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

func TestRunRejectsBlanks(t *testing.T) {
	for _, a := range []string{"-test.run=a b", "x\ty", "\"q\""} {
		_, err := Run(context.Background(), []string{a}, Options{})
		if err == nil || !strings.Contains(err.Error(), "splits at blanks") {
			t.Errorf("Run(%q) = %v, want it refused", a, err)
		}
	}
}
