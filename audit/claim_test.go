package audit

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// TestClaim: one server per database. A second store on the same file
// cannot claim it, and its FailRunning (what a second `moat serve` runs at
// start-up) settles nothing of the first server's live records.
func TestClaim(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	first, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if err := first.Claim(); err != nil {
		t.Fatalf("first claim: %v", err)
	}
	if err := first.Claim(); err != nil {
		t.Fatalf("claiming twice: %v", err)
	}
	if err := first.Begin(Record{ID: "live", Kind: KindRun, KeyID: "k1"}); err != nil {
		t.Fatal(err)
	}

	second, err := Open(path)
	if err != nil {
		t.Fatalf("a reader (moat audit) must still open a claimed database: %v", err)
	}
	defer second.Close()
	tests := []struct {
		name string
		call func() error
	}{
		{"Claim", second.Claim},
		{"FailRunning", func() error { _, err := second.FailRunning("second server"); return err }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			if !errors.Is(err, ErrInUse) {
				t.Fatalf("got %v, want ErrInUse", err)
			}
			for _, want := range []string{path, "pid ", "one server per database"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
	if r, err := second.Get("live"); err != nil || r.Status != Running {
		t.Errorf("the live server's record after a second server's start-up: %+v, %v; want running", r, err)
	}
	if second.Claimed() || !first.Claimed() {
		t.Errorf("claimed: first %v second %v", first.Claimed(), second.Claimed())
	}
	// The live server finishes its run normally.
	if err := first.Finish("live", &result.Result{Termination: result.Exited, CPUMS: 42}, nil); err != nil {
		t.Fatalf("finish after the second server's start-up: %v", err)
	}

	// When the first server is gone, the next one claims the database.
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := second.Claim(); err != nil {
		t.Fatalf("claim after the holder closed: %v", err)
	}
}

// TestAccrue: usage recorded while a record runs survives a crash:
// FailRunning keeps it, ends the record at the last accrual rather than at
// the restart, and the daily CPU quota counts it.
func TestAccrue(t *testing.T) {
	s := newStore(t)
	started := time.Now().UTC()
	for _, id := range []string{"crashed", "finished", "never-accrued"} {
		if err := s.Begin(Record{ID: id, Kind: KindRun, KeyID: "k1", Started: started}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Finish("finished", &result.Result{Termination: result.Exited, DurationMS: 5, CPUMS: 3}, nil); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		in   []Accrual
	}{
		{"first", []Accrual{{ID: "crashed", WallMS: 10_000, CPUMS: 4_000}, {ID: "finished", WallMS: 9e9, CPUMS: 9e9}, {ID: "unknown", WallMS: 1, CPUMS: 1}}},
		{"later", []Accrual{{ID: "crashed", WallMS: 20_000, CPUMS: 7_000}}},
		{"never decreases", []Accrual{{ID: "crashed", WallMS: 1, CPUMS: 1}}},
		{"empty", nil},
	}
	for _, st := range steps {
		if err := s.Accrue(st.in); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}
	if used, err := s.CPUSecondsToday("k1"); err != nil || used != 7.003 {
		t.Errorf("CPU seconds today while running: %v, %v; want 7.003 (accrued 7 s + finished 3 ms)", used, err)
	}
	if r, _ := s.Get("finished"); r.CPUMS != 3 || r.WallMS != 5 {
		t.Errorf("Accrue changed a finished record: cpu %v wall %v", r.CPUMS, r.WallMS)
	}

	if _, err := s.FailRunning("crash"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		id        string
		wall, cpu float64
		ended     time.Time
	}{
		{"crashed", 20_000, 7_000, started.Add(20 * time.Second)},
		{"never-accrued", 0, 0, started},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			r, err := s.Get(tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != Failed || r.WallMS != tc.wall || r.CPUMS != tc.cpu {
				t.Errorf("status %s wall %v cpu %v; want failed, %v, %v", r.Status, r.WallMS, r.CPUMS, tc.wall, tc.cpu)
			}
			if !r.Ended.Equal(tc.ended) {
				t.Errorf("ended %v, want %v (the last accrual, not the restart)", r.Ended, tc.ended)
			}
		})
	}
	if used, _ := s.CPUSecondsToday("k1"); used != 7.003 {
		t.Errorf("CPU seconds today after the crash: %v, want 7.003", used)
	}
}
