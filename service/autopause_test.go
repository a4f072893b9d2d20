package service_test

import (
	"context"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/service"
)

// TestAutoPause: a sandbox created with AutoPause is paused, not
// destroyed, when its TTL passes: same id, files kept, living the
// snapshot TTL, resumable (and auto-pausing again); one without is
// destroyed as before.
func TestAutoPause(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		autoPause bool
		// wantPaused: paused after the TTL, else gone.
		wantPaused bool
	}{
		{"auto pause", true, true},
		{"destroyed", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, dir := lifecycleService(t, func(c *service.Config) { c.SnapshotTTL = time.Hour })
			sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{TTL: 100 * time.Millisecond, AutoPause: tc.autoPause, Metadata: map[string]string{"m": "1"}})
			if err != nil {
				t.Fatal(err)
			}
			if sb.AutoPause != tc.autoPause {
				t.Errorf("view AutoPause %v, want %v", sb.AutoPause, tc.autoPause)
			}
			writeFile(t, s, keyA, sb.ID, "kept.txt", "kept")
			deadline := time.Now().Add(20 * time.Second) // a loaded machine
			var got service.Sandbox
			for {
				got, err = s.GetSandbox(ctx, keyA, sb.ID)
				if tc.wantPaused && err == nil && got.State == service.StatePaused {
					break
				}
				if !tc.wantPaused && service.KindOf(err) == service.NotFound {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the TTL: %+v, %v; want paused %v", got, err, tc.wantPaused)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !tc.wantPaused {
				if left := residue(t, dir); len(left) > 0 {
					t.Errorf("an expired sandbox left %v", left)
				}
				return
			}
			// It lives the snapshot TTL now, not its own.
			if left := time.Until(got.ExpiresAt); left < 50*time.Minute {
				t.Errorf("a paused sandbox expires in %s, want about the snapshot TTL (1h)", left)
			}
			if s.Held(keyA.ID) != 1 {
				t.Errorf("the paused sandbox holds %d slots, want 1", s.Held(keyA.ID))
			}
			r, err := s.ResumeSandbox(ctx, keyA, sb.ID, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if r.ID != sb.ID || !r.AutoPause || r.Metadata["m"] != "1" {
				t.Errorf("resumed %+v, want the same id, auto_pause and metadata", r)
			}
			if got := readFile(t, s, keyA, sb.ID, "kept.txt"); got != "kept" {
				t.Errorf("kept.txt after resume: %q", got)
			}
			// The resumed sandbox pauses again when its new TTL passes.
			for {
				got, err = s.GetSandbox(ctx, keyA, sb.ID)
				if err == nil && got.State == service.StatePaused {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the resumed sandbox after its TTL: %+v, %v; want paused", got, err)
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := s.DeleteSandbox(ctx, keyA, sb.ID); err != nil {
				t.Fatal(err)
			}
			if left := residue(t, dir); len(left) > 0 {
				t.Errorf("a deleted auto-paused sandbox left %v", left)
			}
		})
	}
	t.Run("paused past the snapshot TTL is destroyed", func(t *testing.T) {
		s, _, dir := lifecycleService(t, func(c *service.Config) { c.SnapshotTTL = 300 * time.Millisecond })
		sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{TTL: 50 * time.Millisecond, AutoPause: true})
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, s, keyA, sb.ID, "x", "1")
		sawPaused := false
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			got, err := s.GetSandbox(ctx, keyA, sb.ID)
			sawPaused = sawPaused || err == nil && got.State == service.StatePaused
			if service.KindOf(err) == service.NotFound && len(residue(t, dir)) == 0 && s.Held(keyA.ID) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after both TTLs: %+v %v, residue %v", got, err, residue(t, dir))
			}
		}
		if !sawPaused {
			t.Error("the sandbox was never seen paused")
		}
	})
	t.Run("needs a snapshot directory", func(t *testing.T) {
		s, _, _ := newService(t, nil)
		_, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{AutoPause: true})
		wantKind(t, err, service.Invalid, "auto_pause")
	})
}

// TestInterrupted: a command killed because its sandbox was deleted,
// expired, paused or auto-paused says so (Exec.Interrupted); one that
// ended on its own, or was signalled, does not.
func TestInterrupted(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name      string
		ttl       time.Duration
		autoPause bool
		argv      []string
		end       func(t *testing.T, s *service.Service, id, eid string)
		want      string
	}{
		{"deleted", time.Minute, false, []string{"fake", "block"}, func(t *testing.T, s *service.Service, id, _ string) {
			if _, err := s.DeleteSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
		}, service.InterruptDeleted},
		{"paused", time.Minute, false, []string{"fake", "block"}, func(t *testing.T, s *service.Service, id, _ string) {
			if _, err := s.PauseSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
		}, service.InterruptPaused},
		{"expired", 150 * time.Millisecond, false, []string{"fake", "block"}, nil, service.InterruptExpired},
		{"auto paused", 150 * time.Millisecond, true, []string{"fake", "block"}, nil, service.InterruptAutoPaused},
		{"signalled", time.Minute, false, []string{"fake", "block"}, func(t *testing.T, s *service.Service, id, eid string) {
			if _, err := s.Signal(ctx, keyA, id, eid, 15); err != nil {
				t.Fatal(err)
			}
		}, ""},
		{"exited before the delete", time.Minute, false, []string{"fake", "out:x"}, func(t *testing.T, s *service.Service, id, eid string) {
			if _, err := s.WaitExec(ctx, keyA, id, eid); err != nil {
				t.Fatal(err)
			}
			if _, err := s.DeleteSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := lifecycleService(t, nil)
			sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{TTL: tc.ttl, AutoPause: tc.autoPause})
			if err != nil {
				t.Fatal(err)
			}
			ex, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: tc.argv})
			if err != nil {
				t.Fatal(err)
			}
			feed, err := s.Events(ctx, keyA, sb.ID, ex.ID)
			if err != nil {
				t.Fatal(err)
			}
			if tc.end != nil {
				tc.end(t, s, sb.ID, ex.ID)
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, exitID, notify := feed.Read(0)
				if exitID > 0 {
					break
				}
				select {
				case <-notify:
				case <-time.After(time.Until(deadline)):
					t.Fatal("the command never ended")
				}
			}
			if got := feed.Exec().Interrupted; got != tc.want {
				t.Errorf("Interrupted %q, want %q", got, tc.want)
			}
		})
	}
}
