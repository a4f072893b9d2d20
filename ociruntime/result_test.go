package ociruntime

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/result"
)

func TestBuildResult(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rec := &record{ID: "c1", Rootfs: "/b/rootfs", Command: []string{"sh"}, Started: started}
	tests := []struct {
		name        string
		exit        *nswire.Status
		stats       *cgroup.Stats
		termination result.Termination
		code, sig   int
		oom         bool
		violations  int
	}{
		{"exited", &nswire.Status{Exited: true, Exit: 3, DurationNS: 2e6}, &cgroup.Stats{CPU: time.Millisecond}, result.Exited, 3, 0, false, 0},
		{"signalled program", &nswire.Status{Exited: true, Exit: 143, Signal: 15}, nil, result.Signaled, 143, 15, false, 0},
		{"init killed", nil, &cgroup.Stats{}, result.Signaled, 137, 9, false, 0},
		{"init OOM-killed", nil, &cgroup.Stats{OOMKills: 1}, result.OOM, 137, 9, true, 1},
		{"program OOM-killed, init reported", &nswire.Status{Exited: true, Exit: 137, Signal: 9}, &cgroup.Stats{OOMKills: 1}, result.OOM, 137, 9, true, 1},
		{"a child OOM-killed, program exited", &nswire.Status{Exited: true, Exit: 1}, &cgroup.Stats{OOMKills: 1}, result.Exited, 1, 0, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := buildResult(rec, tc.exit, tc.stats, started.Add(time.Second))
			if r.Termination != tc.termination || r.ExitCode != tc.code || r.Signal != tc.sig || r.OOMKilled != tc.oom || len(r.Violations) != tc.violations {
				t.Errorf("result %+v; want %s exit %d signal %d oom %v, %d violations", r, tc.termination, tc.code, tc.sig, tc.oom, tc.violations)
			}
			if r.ID != "c1" || r.Schema != result.SchemaVersion || !r.StartedAt.Equal(started) || r.Files == nil || r.Violations == nil {
				t.Errorf("result identity/shape: %+v", r)
			}
		})
	}
}

func TestReadExit(t *testing.T) {
	tests := []struct {
		name, content string
		ok            bool
	}{
		{"exit record", `{"exited":true,"exit":3,"duration_ns":5}` + "\n", true},
		{"not exited", `{"started":true,"exit":0}` + "\n", false},
		{"exit out of range", `{"exited":true,"exit":300}` + "\n", false},
		{"negative signal", `{"exited":true,"exit":1,"signal":-1}` + "\n", false},
		{"garbage", "\x00\x01", false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "exit.json")
			os.WriteFile(p, []byte(tc.content), 0o600)
			if got := readExit(p); (got != nil) != tc.ok {
				t.Errorf("readExit(%q) = %+v, want ok %v", tc.content, got, tc.ok)
			}
		})
	}
}

// FuzzParseExit: the exit record is written from inside the container.
func FuzzParseExit(f *testing.F) {
	f.Add([]byte(`{"exited":true,"exit":3,"duration_ns":5}` + "\n"))
	f.Add([]byte(`{"exited":true,"exit":137,"signal":9}`))
	f.Add([]byte(`{"exited":true,"exit":-1}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st := parseExit(b)
		if st == nil {
			return
		}
		if !st.Exited || st.Exit < 0 || st.Exit > 255 || st.Signal < 0 || st.Signal > 64 {
			t.Fatalf("accepted %+v", st)
		}
		r := buildResult(&record{ID: "x"}, st, nil, time.Time{})
		if r.ExitCode != st.Exit {
			t.Fatalf("exit %d became %d", st.Exit, r.ExitCode)
		}
	})
}
