package engine

import (
	"os"
	"testing"
	"time"
)

func TestStatTicks(t *testing.T) {
	tests := []struct {
		name string
		stat string
		want int64
	}{
		{"plain", "42 (sh) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 20 10 20 0 1 0 100 1000 10", 40},
		{"name with spaces and parens", "42 (a) b (c) R 1 42 42 0 -1 4194560 100 0 0 0 1 2 3 4 20 0 1 0 100 1000 10", 10},
		{"truncated", "42 (sh) S 1 42", 0},
		{"no name", "garbage", 0},
		{"negative", "42 (sh) S 1 42 42 0 -1 4194560 100 0 0 0 -7 3 20 10 20 0", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := statTicks([]byte(tc.stat)); got != tc.want {
				t.Errorf("statTicks = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestProcsCPU(t *testing.T) {
	// Burn some CPU so the test process has used at least a tick.
	for end := time.Now().Add(30 * time.Millisecond); time.Now().Before(end); {
	}
	if got := ProcsCPU([]int{os.Getpid()}); got < 10*time.Millisecond {
		t.Errorf("ProcsCPU(self) = %v after burning 30ms", got)
	}
	if got := ProcsCPU([]int{-1, 1 << 30}); got != 0 {
		t.Errorf("ProcsCPU(no such pids) = %v, want 0", got)
	}
}
