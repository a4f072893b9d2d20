package audit

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// newStore opens a fresh store in the test's temporary directory.
func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func TestOpen(t *testing.T) {
	t.Run("creates the file 0600 and its parents 0700", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "a", "b")
		path := filepath.Join(dir, "audit.db")
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Begin(Record{ID: "r1", Kind: KindRun}); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700, filepath.Dir(dir): 0o700, path + "-wal": 0o600} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Mode().Perm(); got != want {
				t.Errorf("%s: mode %v, want %v", p, got, want)
			}
		}
	})
	t.Run("tightens an existing file readable by others", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "audit.db")
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o644); err != nil {
			t.Fatal(err)
		}
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		fi, _ := os.Stat(path)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", fi.Mode().Perm())
		}
	})
	t.Run("a path with URI characters names that file", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "odd?name#%20.db")
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Begin(Record{ID: "r1", Kind: KindRun}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the database is not at %s: %v", path, err)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("directory holds %q, want only the database", names)
		}
	})
	t.Run("reopening keeps the data and the schema version", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "audit.db")
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Begin(Record{ID: "r1", Kind: KindRun}); err != nil {
			t.Fatal(err)
		}
		s.Close()
		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Get("r1"); err != nil {
			t.Errorf("after reopening: %v", err)
		}
		var v int
		if err := s.r.QueryRow(`SELECT version FROM schema_version`).Scan(&v); err != nil || v != SchemaVersion {
			t.Errorf("schema version %d (%v), want %d", v, err, SchemaVersion)
		}
		var mode string
		if err := s.r.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
			t.Errorf("journal mode %q (%v), want wal", mode, err)
		}
		for _, db := range []*sql.DB{s.w, s.r} {
			var fk, busy int
			if err := db.QueryRow(`PRAGMA foreign_keys`).Scan(&fk); err != nil || fk != 1 {
				t.Errorf("foreign_keys %d (%v), want 1", fk, err)
			}
			if err := db.QueryRow(`PRAGMA busy_timeout`).Scan(&busy); err != nil || busy != int(busyTimeout/time.Millisecond) {
				t.Errorf("busy_timeout %d (%v), want %d", busy, err, busyTimeout/time.Millisecond)
			}
		}
		if _, err := s.w.Exec(`INSERT INTO violations (record_id, seq, kind, detail, limit_value) VALUES ('nope', 0, '', '', '')`); err == nil {
			t.Error("a violation without its record was accepted: foreign keys are off")
		}
	})
	t.Run("refuses a newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "audit.db")
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.w.Exec(`UPDATE schema_version SET version = ?`, SchemaVersion+1); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if s, err := Open(path); err == nil {
			s.Close()
			t.Fatal("Open accepted a schema newer than it knows")
		} else if want := fmt.Sprintf("schema version %d is newer", SchemaVersion+1); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	})
	t.Run("refuses a directory", func(t *testing.T) {
		if s, err := Open(t.TempDir()); err == nil {
			s.Close()
			t.Fatal("Open accepted a directory")
		}
	})
	t.Run("readers cannot write", func(t *testing.T) {
		s := newStore(t)
		if _, err := s.r.Exec(`DELETE FROM records`); err == nil {
			t.Error("a reader connection deleted records")
		}
	})
}

// TestConcurrentBeginFinish is what a server with 32 clients does: every
// record must end up stored exactly once, finished, with its own values.
func TestConcurrentBeginFinish(t *testing.T) {
	s := newStore(t)
	const workers, each = 32, 100
	key, secretKey := mustKey(t, s, "load")
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				id := fmt.Sprintf("w%02d-%03d", w, i)
				if err := s.Begin(Record{ID: id, Kind: KindRun, KeyID: key.ID, Command: []string{"echo", id}}); err != nil {
					errs <- err
					return
				}
				// Readers run alongside the writer, as the API
				// authenticates every request.
				if _, err := s.Authenticate(secretKey); err != nil {
					errs <- fmt.Errorf("authenticate during load: %w", err)
					return
				}
				res := &result.Result{Termination: result.Exited, ExitCode: i % 3, CPUMS: float64(i), DurationMS: 1,
					Network: []result.NetworkAttempt{{Host: "pypi.org", Port: 443, Allowed: true, Reason: "allowed"}}}
				if err := s.Finish(id, res, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	elapsed := time.Since(start)
	t.Logf("%d Begin+Finish pairs in %v (%.0f writes/s)", workers*each, elapsed, float64(2*workers*each)/elapsed.Seconds())

	var total, distinct, done, net int
	if err := s.r.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT id), SUM(status = 'done') FROM records`).Scan(&total, &distinct, &done); err != nil {
		t.Fatal(err)
	}
	if err := s.r.QueryRow(`SELECT COUNT(*) FROM network_attempts`).Scan(&net); err != nil {
		t.Fatal(err)
	}
	if total != workers*each || distinct != total || done != total || net != total {
		t.Errorf("%d records, %d distinct ids, %d done, %d network rows; want %d of each", total, distinct, done, net, workers*each)
	}
	for w := range workers {
		for i := range each {
			id := fmt.Sprintf("w%02d-%03d", w, i)
			r, err := s.Get(id)
			if err != nil {
				t.Fatalf("record %s: %v", id, err)
			}
			if r.ExitCode != i%3 || r.CPUMS != float64(i) || len(r.Command) != 2 || r.Command[1] != id {
				t.Fatalf("record %s holds another's values: %+v", id, r)
			}
		}
	}
	// Everything started before this line counts toward today's quota
	// unless the test straddled midnight UTC.
	if cpu, err := s.CPUSecondsToday(key.ID); err != nil {
		t.Error(err)
	} else if want := float64(workers*each*(each-1)/2) / 1000; cpu != want && time.Now().UTC().YearDay() == start.UTC().YearDay() {
		t.Errorf("CPUSecondsToday = %v, want %v", cpu, want)
	}
}

func BenchmarkBeginFinish(b *testing.B) {
	s := newStore(b)
	res := &result.Result{Termination: result.Exited, Network: []result.NetworkAttempt{{Host: "pypi.org", Port: 443, Allowed: true}},
		Violations: []result.Violation{{Kind: "memory"}}}
	var n int
	var mu sync.Mutex
	b.SetParallelism(4) // 4 × GOMAXPROCS goroutines, as many clients
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			mu.Lock()
			n++
			id := fmt.Sprint("r", n)
			mu.Unlock()
			if err := s.Begin(Record{ID: id, Kind: KindRun}); err != nil {
				b.Error(err)
				return
			}
			if err := s.Finish(id, res, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func mustKey(t testing.TB, s *Store, name string) (Key, string) {
	t.Helper()
	tok, k, err := s.CreateKey(name, Quota{})
	if err != nil {
		t.Fatal(err)
	}
	return k, tok
}
