package service_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// lifecycleService is a Service over the fakes that keeps snapshots in a
// directory the test checks for residue.
func lifecycleService(t *testing.T, mod func(*service.Config)) (*service.Service, *service.Config, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "snapshots")
	var cfg service.Config
	s, _, _ := newService(t, func(c *service.Config) {
		c.SnapshotDir = dir
		if mod != nil {
			mod(c)
		}
		cfg = *c
	})
	return s, &cfg, dir
}

// residue lists what is left under dir.
func residue(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read snapshot dir: %v", err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func writeFile(t *testing.T, s *service.Service, key audit.Key, id, path, data string) {
	t.Helper()
	if _, err := s.WriteFile(context.Background(), key, id, path, strings.NewReader(data), 0o640); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
}

func readFile(t *testing.T, s *service.Service, key audit.Key, id, path string) string {
	t.Helper()
	f, _, err := s.OpenFile(context.Background(), key, id, path)
	if err != nil {
		t.Fatalf("open %s in %s: %v", path, id, err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func newSandbox(t *testing.T, s *service.Service, key audit.Key) service.Sandbox {
	t.Helper()
	sb, err := s.CreateSandbox(context.Background(), key, service.SandboxArgs{Metadata: map[string]string{"team": "x"}})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	return sb
}

// TestPauseResume: a paused sandbox's processes stop and its files are
// kept; resume gives the same id with the same files; the wrong key or
// state is refused.
func TestPauseResume(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		run  func(t *testing.T, s *service.Service, id string)
	}{
		{"keeps files and id", func(t *testing.T, s *service.Service, id string) {
			writeFile(t, s, keyA, id, "a.txt", "alpha")
			writeFile(t, s, keyA, id, "dir/sub/b.txt", "beta")
			p, err := s.PauseSandbox(ctx, keyA, id)
			if err != nil {
				t.Fatal(err)
			}
			if p.State != service.StatePaused {
				t.Fatalf("state after pause %q, want paused", p.State)
			}
			if _, err := s.StartExec(ctx, keyA, id, service.ExecArgs{Argv: []string{"echo", "hi"}}); err == nil {
				t.Fatal("a paused sandbox started a command")
			}
			r, err := s.ResumeSandbox(ctx, keyA, id, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if r.ID != id || r.State != service.StateRunning || r.Metadata["team"] != "x" {
				t.Fatalf("resumed %+v, want id %s running with its metadata", r, id)
			}
			for p, want := range map[string]string{"a.txt": "alpha", "dir/sub/b.txt": "beta"} {
				if got := readFile(t, s, keyA, id, p); got != want {
					t.Errorf("%s after resume: %q, want %q", p, got, want)
				}
			}
			if fi, err := s.Stat(ctx, keyA, id, "a.txt"); err != nil || fi.Mode != "0640" {
				t.Errorf("a.txt mode after resume %q (%v), want 0640", fi.Mode, err)
			}
		}},
		{"resume of a running sandbox", func(t *testing.T, s *service.Service, id string) {
			_, err := s.ResumeSandbox(ctx, keyA, id, time.Minute)
			wantKind(t, err, service.Conflict, "")
		}},
		{"pause twice", func(t *testing.T, s *service.Service, id string) {
			if _, err := s.PauseSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
			_, err := s.PauseSandbox(ctx, keyA, id)
			wantKind(t, err, service.Conflict, "")
		}},
		{"another key's pause", func(t *testing.T, s *service.Service, id string) {
			_, err := s.PauseSandbox(ctx, keyB, id)
			wantKind(t, err, service.NotFound, "")
		}},
		{"another key's resume", func(t *testing.T, s *service.Service, id string) {
			if _, err := s.PauseSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
			_, err := s.ResumeSandbox(ctx, keyB, id, time.Minute)
			wantKind(t, err, service.NotFound, "")
		}},
		{"delete while paused", func(t *testing.T, s *service.Service, id string) {
			if _, err := s.PauseSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
			if _, err := s.DeleteSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
			_, err := s.ResumeSandbox(ctx, keyA, id, time.Minute)
			wantKind(t, err, service.NotFound, "")
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, dir := lifecycleService(t, nil)
			sb := newSandbox(t, s, keyA)
			tc.run(t, s, sb.ID)
			if _, err := s.DeleteSandbox(ctx, keyA, sb.ID); err != nil && service.KindOf(err) != service.NotFound {
				t.Fatal(err)
			}
			if left := residue(t, dir); len(left) > 0 {
				t.Errorf("left under the snapshot dir: %v", left)
			}
			if n := s.Held(keyA.ID); n != 0 {
				t.Errorf("key holds %d slots after delete", n)
			}
		})
	}
}

// TestSnapshots: create (named or not), list (all, per sandbox, by name),
// create sandboxes from one, delete; the files are gone after.
func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	s, _, dir := lifecycleService(t, nil)
	a := newSandbox(t, s, keyA)
	b := newSandbox(t, s, keyA)
	writeFile(t, s, keyA, a.ID, "state.json", `{"step":1}`)
	snapA, err := s.CreateSnapshot(ctx, keyA, a.ID, "first")
	if err != nil {
		t.Fatal(err)
	}
	snapB, err := s.CreateSnapshot(ctx, keyA, b.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if snapA.ID == "" || snapA.ID == snapB.ID || len(snapA.Names) != 1 || snapA.Names[0] != "first" || len(snapB.Names) != 0 {
		t.Fatalf("snapshots %+v %+v", snapA, snapB)
	}
	if _, err := s.CreateSnapshot(ctx, keyA, b.ID, "first"); service.KindOf(err) != service.Conflict {
		t.Errorf("a second snapshot named first: %v, want Conflict", err)
	}
	for _, bad := range []string{"-x", "a/b", strings.Repeat("n", 129), "sp ace"} {
		_, err := s.CreateSnapshot(ctx, keyA, a.ID, bad)
		wantKind(t, err, service.Invalid, "name")
	}
	if _, err := s.CreateSnapshot(ctx, keyB, a.ID, ""); service.KindOf(err) != service.NotFound {
		t.Errorf("another key's snapshot of a: %v, want NotFound", err)
	}

	lists := []struct {
		name             string
		key              audit.Key
		sandbox, snapNam string
		want             []string
	}{
		{"all", keyA, "", "", []string{snapA.ID, snapB.ID}},
		{"per sandbox", keyA, b.ID, "", []string{snapB.ID}},
		{"by name", keyA, "", "first", []string{snapA.ID}},
		{"unknown name", keyA, "", "nope", nil},
		{"another key", keyB, "", "", nil},
	}
	for _, tc := range lists {
		t.Run("list "+tc.name, func(t *testing.T) {
			got, err := s.ListSnapshots(ctx, tc.key, tc.sandbox, tc.snapNam)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, sn := range got {
				ids = append(ids, sn.ID)
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Errorf("listed %v, want %v", ids, tc.want)
			}
		})
	}

	// Three sandboxes from one snapshot (by id and by name), each with
	// its files, each its own.
	var made []string
	for i, ref := range []string{snapA.ID, "first", snapA.ID} {
		sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{Snapshot: ref})
		if err != nil {
			t.Fatalf("create %d from %s: %v", i, ref, err)
		}
		if got := readFile(t, s, keyA, sb.ID, "state.json"); got != `{"step":1}` {
			t.Errorf("sandbox %d from the snapshot has %q", i, got)
		}
		writeFile(t, s, keyA, sb.ID, "state.json", "mine")
		made = append(made, sb.ID)
	}
	if got := readFile(t, s, keyA, a.ID, "state.json"); got != `{"step":1}` {
		t.Errorf("the source changed to %q", got)
	}
	if _, err := s.CreateSandbox(ctx, keyB, service.SandboxArgs{Snapshot: snapA.ID}); service.KindOf(err) != service.NotFound {
		t.Errorf("another key's sandbox from snapshot: %v, want NotFound", err)
	}

	// Snapshots survive their sandbox's deletion, and go when deleted.
	if _, err := s.DeleteSandbox(ctx, keyA, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSnapshot(ctx, keyA, snapA.ID); err != nil {
		t.Errorf("snapshot gone with its sandbox: %v", err)
	}
	if err := s.DeleteSnapshot(ctx, keyB, snapA.ID); service.KindOf(err) != service.NotFound {
		t.Errorf("another key's delete: %v, want NotFound", err)
	}
	for _, ref := range []string{"first", snapB.ID} {
		if err := s.DeleteSnapshot(ctx, keyA, ref); err != nil {
			t.Errorf("delete %s: %v", ref, err)
		}
	}
	if err := s.DeleteSnapshot(ctx, keyA, snapA.ID); service.KindOf(err) != service.NotFound {
		t.Errorf("delete twice: %v, want NotFound", err)
	}
	if _, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{Snapshot: snapA.ID}); service.KindOf(err) != service.NotFound {
		t.Errorf("create from a deleted snapshot: %v, want NotFound", err)
	}
	if left := residue(t, dir); len(left) > 0 {
		t.Errorf("left under the snapshot dir: %v", left)
	}
	for _, id := range append(made, b.ID) {
		s.DeleteSandbox(ctx, keyA, id)
	}
	if n := s.Held(keyA.ID); n != 0 {
		t.Errorf("key holds %d slots", n)
	}
}

// TestFork: a bad count is refused before anything; good counts give that
// many sandboxes with the source's files; the fork's copy is not kept.
func TestFork(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		count int
		want  service.Kind // 0: success
	}{
		{"zero", 0, service.Invalid},
		{"negative", -1, service.Invalid},
		{"absurd", 1000, service.Invalid},
		{"one", 1, 0},
		{"three", 3, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, dir := lifecycleService(t, nil)
			src := newSandbox(t, s, keyA)
			writeFile(t, s, keyA, src.ID, "f", "data")
			forks, err := s.ForkSandbox(ctx, keyA, src.ID, tc.count, time.Minute)
			if tc.want != 0 {
				wantKind(t, err, tc.want, "count")
				if s.Held(keyA.ID) != 1 {
					t.Errorf("a refused fork holds slots: %d", s.Held(keyA.ID))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(forks) != tc.count {
				t.Fatalf("%d forks, want %d", len(forks), tc.count)
			}
			for _, f := range forks {
				if f.Err != nil {
					t.Fatal(f.Err)
				}
				if f.Sandbox.ID == src.ID || readFile(t, s, keyA, f.Sandbox.ID, "f") != "data" {
					t.Errorf("fork %s lacks the source's file", f.Sandbox.ID)
				}
				s.DeleteSandbox(ctx, keyA, f.Sandbox.ID)
			}
			if left := residue(t, dir); len(left) > 0 {
				t.Errorf("left under the snapshot dir: %v", left)
			}
		})
	}
	t.Run("another key", func(t *testing.T) {
		s, _, _ := lifecycleService(t, nil)
		src := newSandbox(t, s, keyA)
		_, err := s.ForkSandbox(ctx, keyB, src.ID, 1, 0)
		wantKind(t, err, service.NotFound, "")
	})
}

// TestLifecycleQuota: snapshots and paused sandboxes hold slots of the
// key's sandbox quota; a fork past the quota fails that fork only.
func TestLifecycleQuota(t *testing.T) {
	ctx := context.Background()
	key := audit.Key{ID: "kq", Quota: audit.Quota{MaxSandboxes: 2, CPUSecondsPerDay: 100}}
	s, _, _ := lifecycleService(t, nil)
	sb := newSandbox(t, s, key)
	snap, err := s.CreateSnapshot(ctx, key, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.Held(key.ID); n != 2 {
		t.Errorf("a sandbox and a snapshot hold %d slots, want 2", n)
	}
	_, err = s.CreateSandbox(ctx, key, service.SandboxArgs{})
	wantKind(t, err, service.Quota, "")
	_, err = s.CreateSnapshot(ctx, key, sb.ID, "")
	wantKind(t, err, service.Quota, "")
	forks, err := s.ForkSandbox(ctx, key, sb.ID, 1, 0)
	if err != nil || len(forks) != 1 || service.KindOf(forks[0].Err) != service.Quota {
		t.Errorf("fork past the quota: %v %+v, want one Quota error", err, forks)
	}
	if _, err := s.PauseSandbox(ctx, key, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := s.Held(key.ID); n != 2 {
		t.Errorf("a paused sandbox and a snapshot hold %d slots, want 2", n)
	}
	if err := s.DeleteSnapshot(ctx, key, snap.ID); err != nil {
		t.Fatal(err)
	}
	if n := s.Held(key.ID); n != 1 {
		t.Errorf("after deleting the snapshot %d slots, want 1 (the paused sandbox)", n)
	}
	if _, err := s.DeleteSandbox(ctx, key, sb.ID); err != nil {
		t.Fatal(err)
	}
	if n := s.Held(key.ID); n != 0 {
		t.Errorf("after deleting everything %d slots", n)
	}
}

// TestLifecycleExpiry: snapshots and paused sandboxes expire after
// SnapshotTTL, leaving nothing on disk, no slot held and finished audit
// records.
func TestLifecycleExpiry(t *testing.T) {
	ctx := context.Background()
	s, _, dir := lifecycleService(t, func(c *service.Config) { c.SnapshotTTL = 50 * time.Millisecond })
	a := newSandbox(t, s, keyA)
	b := newSandbox(t, s, keyA)
	writeFile(t, s, keyA, a.ID, "x", "1")
	writeFile(t, s, keyA, b.ID, "y", "2")
	snap, err := s.CreateSnapshot(ctx, keyA, a.ID, "n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PauseSandbox(ctx, keyA, b.ID); err != nil {
		t.Fatal(err)
	}
	if len(residue(t, dir)) != 2 {
		t.Fatalf("snapshot dir holds %v, want a snapshot and a paused copy", residue(t, dir))
	}
	deadline := time.Now().Add(20 * time.Second) // a loaded machine
	for {
		_, e1 := s.GetSnapshot(ctx, keyA, snap.ID)
		_, e2 := s.GetSandbox(ctx, keyA, b.ID)
		if service.KindOf(e1) == service.NotFound && service.KindOf(e2) == service.NotFound && len(residue(t, dir)) == 0 && s.Held(keyA.ID) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the TTL: snapshot %v, paused sandbox %v, residue %v, slots %d", e1, e2, residue(t, dir), s.Held(keyA.ID))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := s.GetSandbox(ctx, keyA, a.ID); err != nil {
		t.Errorf("the running sandbox expired with its snapshot: %v", err)
	}
}

// TestLifecycleAudit: a snapshot and a paused copy each have a record of
// kind snapshot naming their sandbox, finished when they go.
func TestLifecycleAudit(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "snapshots")
	s, _, au := newService(t, func(c *service.Config) { c.SnapshotDir = dir })
	sb := newSandbox(t, s, keyA)
	snap, err := s.CreateSnapshot(ctx, keyA, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PauseSandbox(ctx, keyA, sb.ID); err != nil {
		t.Fatal(err)
	}
	recs := au.Records(audit.KindSnapshot)
	if len(recs) != 2 {
		t.Fatalf("%d snapshot records, want 2", len(recs))
	}
	for _, r := range recs {
		if r.SandboxID != sb.ID || r.KeyID != keyA.ID || r.Status != audit.Running {
			t.Errorf("record %+v", r)
		}
	}
	if _, err := s.ResumeSandbox(ctx, keyA, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, keyA, snap.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range au.Records(audit.KindSnapshot) {
		if r.Status != audit.Done {
			t.Errorf("record %s is %s after resume and delete, want done", r.ID, r.Status)
		}
	}
}

// TestLifecycleOff: without a SnapshotDir every lifecycle call is
// Unavailable.
func TestLifecycleOff(t *testing.T) {
	ctx := context.Background()
	s, _, _ := newService(t, nil)
	sb := newSandbox(t, s, keyA)
	calls := []struct {
		name string
		call func() error
	}{
		{"pause", func() error { _, err := s.PauseSandbox(ctx, keyA, sb.ID); return err }},
		{"resume", func() error { _, err := s.ResumeSandbox(ctx, keyA, sb.ID, 0); return err }},
		{"snapshot", func() error { _, err := s.CreateSnapshot(ctx, keyA, sb.ID, ""); return err }},
		{"fork", func() error { _, err := s.ForkSandbox(ctx, keyA, sb.ID, 1, 0); return err }},
		{"from snapshot", func() error {
			_, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{Snapshot: "x"})
			return err
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) { wantKind(t, tc.call(), service.Unavailable, "") })
	}
}

// TestShutdownRemovesSnapshots: Shutdown leaves no snapshot or paused
// copy on disk.
func TestShutdownRemovesSnapshots(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "snapshots")
	s, _, _ := newService(t, func(c *service.Config) { c.SnapshotDir = dir })
	a := newSandbox(t, s, keyA)
	b := newSandbox(t, s, keyA)
	if _, err := s.CreateSnapshot(ctx, keyA, a.ID, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PauseSandbox(ctx, keyA, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if left := residue(t, dir); len(left) > 0 {
		t.Errorf("left after Shutdown: %v", left)
	}
}

// TestLifecycleKeepsFileMetadata: a file's metadata (user extended
// attributes, E2B's file metadata) comes back with the file after a
// resume, in a sandbox created from a snapshot, and in a fork.
func TestLifecycleKeepsFileMetadata(t *testing.T) {
	ctx := context.Background()
	md := map[string]string{"owner": "agent", "purpose": "test data"}
	tests := []struct {
		name string
		// copy returns the sandbox holding the copy of id's files.
		copy func(t *testing.T, s *service.Service, id string) string
	}{
		{"pause and resume", func(t *testing.T, s *service.Service, id string) string {
			if _, err := s.PauseSandbox(ctx, keyA, id); err != nil {
				t.Fatal(err)
			}
			if _, err := s.ResumeSandbox(ctx, keyA, id, time.Minute); err != nil {
				t.Fatal(err)
			}
			return id
		}},
		{"a sandbox from a snapshot", func(t *testing.T, s *service.Service, id string) string {
			sn, err := s.CreateSnapshot(ctx, keyA, id, "")
			if err != nil {
				t.Fatal(err)
			}
			sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{Snapshot: sn.ID})
			if err != nil {
				t.Fatal(err)
			}
			return sb.ID
		}},
		{"a fork", func(t *testing.T, s *service.Service, id string) string {
			forks, err := s.ForkSandbox(ctx, keyA, id, 1, time.Minute)
			if err != nil || len(forks) != 1 || forks[0].Err != nil {
				t.Fatalf("fork: %v %+v", err, forks)
			}
			return forks[0].Sandbox.ID
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := lifecycleService(t, nil)
			sb := newSandbox(t, s, keyA)
			writeFile(t, s, keyA, sb.ID, "dir/tagged.txt", "x")
			writeFile(t, s, keyA, sb.ID, "plain.txt", "y")
			if _, err := s.SetMetadata(ctx, keyA, sb.ID, "dir/tagged.txt", md); err != nil {
				t.Fatal(err)
			}
			id := tc.copy(t, s, sb.ID)
			fi, err := s.Stat(ctx, keyA, id, "dir/tagged.txt")
			if err != nil {
				t.Fatal(err)
			}
			if len(fi.Metadata) != len(md) || fi.Metadata["owner"] != "agent" || fi.Metadata["purpose"] != "test data" {
				t.Errorf("metadata in the copy %v, want %v", fi.Metadata, md)
			}
			if fi, err := s.Stat(ctx, keyA, id, "plain.txt"); err != nil || len(fi.Metadata) != 0 {
				t.Errorf("plain.txt in the copy: metadata %v (%v), want none", fi.Metadata, err)
			}
		})
	}
}
