package service_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

var (
	keyA = audit.Key{ID: "ka", Quota: audit.DefaultQuota}
	keyB = audit.Key{ID: "kb", Quota: audit.DefaultQuota}
)

// newService is a Service over the fakes, shut down (and checked for
// leftovers) when the test ends.
func newService(t *testing.T, mod func(*service.Config)) (*service.Service, *servicetest.Backend, *servicetest.Auditor) {
	t.Helper()
	be := &servicetest.Backend{Dir: t.TempDir()}
	au := servicetest.NewAuditor()
	cfg := service.Config{Backend: be, Auditor: au, Logger: slog.New(slog.DiscardHandler), ReapInterval: 10 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	s, err := service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if live, _, _, _ := be.Counts(); live != 0 || s.Sessions() != 0 || s.HeldKeys() != 0 {
			t.Errorf("after Shutdown: %d fake sessions, %d registered, %d keys holding slots", live, s.Sessions(), s.HeldKeys())
		}
		if ids := au.Unfinished(); len(ids) > 0 {
			t.Errorf("audit records never finished: %v", ids)
		}
	})
	return s, be, au
}

// wantKind checks err is a *Error of kind k (naming field, when given).
func wantKind(t *testing.T, err error, k service.Kind, field string) {
	t.Helper()
	var e *service.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want a *service.Error of kind %s", err, err, k)
	}
	if e.Kind != k || (field != "" && e.Field != field) {
		t.Fatalf("error %+v, want kind %s field %q", e, k, field)
	}
}

// TestOwnership: every method that names a sandbox answers another key
// exactly as it answers an unknown id (NotFound, never Forbidden), and
// leaves the sandbox alone.
func TestOwnership(t *testing.T) {
	s, _, _ := newService(t, nil)
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"fake", "block"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteFile(ctx, keyA, sb.ID, "a.txt", strings.NewReader("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func(key audit.Key, id string) error
	}{
		{"GetSandbox", func(k audit.Key, id string) error { _, err := s.GetSandbox(ctx, k, id); return err }},
		{"SandboxManifest", func(k audit.Key, id string) error { _, err := s.SandboxManifest(ctx, k, id); return err }},
		{"SetTimeout", func(k audit.Key, id string) error { _, err := s.SetTimeout(ctx, k, id, time.Minute); return err }},
		{"StartExec", func(k audit.Key, id string) error {
			_, err := s.StartExec(ctx, k, id, service.ExecArgs{Argv: []string{"echo"}})
			return err
		}},
		{"ListExecs", func(k audit.Key, id string) error { _, err := s.ListExecs(ctx, k, id); return err }},
		{"GetExec", func(k audit.Key, id string) error { _, err := s.GetExec(ctx, k, id, ex.ID); return err }},
		{"Events", func(k audit.Key, id string) error { _, err := s.Events(ctx, k, id, ex.ID); return err }},
		{"WriteStdin", func(k audit.Key, id string) error {
			_, err := s.WriteStdin(ctx, k, id, ex.ID, strings.NewReader("x"), false)
			return err
		}},
		{"Signal", func(k audit.Key, id string) error { _, err := s.Signal(ctx, k, id, ex.ID, unix.SIGTERM); return err }},
		{"WriteFile", func(k audit.Key, id string) error {
			_, err := s.WriteFile(ctx, k, id, "b.txt", strings.NewReader("b"), 0o644)
			return err
		}},
		{"OpenFile", func(k audit.Key, id string) error {
			f, _, err := s.OpenFile(ctx, k, id, "a.txt")
			if f != nil {
				f.Close()
			}
			return err
		}},
		{"Stat", func(k audit.Key, id string) error { _, err := s.Stat(ctx, k, id, "a.txt"); return err }},
		{"ListDir", func(k audit.Key, id string) error { _, err := s.ListDir(ctx, k, id, "."); return err }},
		{"MakeDir", func(k audit.Key, id string) error { return s.MakeDir(ctx, k, id, "d") }},
		{"Rename", func(k audit.Key, id string) error { return s.Rename(ctx, k, id, "a.txt", "c.txt") }},
		{"Remove", func(k audit.Key, id string) error { return s.Remove(ctx, k, id, "a.txt") }},
		{"DeleteSandbox", func(k audit.Key, id string) error { _, err := s.DeleteSandbox(ctx, k, id); return err }},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			errOther := c.call(keyB, sb.ID)
			wantKind(t, errOther, service.NotFound, "")
			errUnknown := c.call(keyB, "no-such-sandbox")
			wantKind(t, errUnknown, service.NotFound, "")
			if strings.Contains(errOther.Error(), "forbidden") || strings.Replace(errOther.Error(), sb.ID, "no-such-sandbox", 1) != errUnknown.Error() {
				t.Errorf("another key's sandbox: %v; an unknown one: %v", errOther, errUnknown)
			}
			wantKind(t, c.call(audit.Key{}, sb.ID), service.NotFound, "")
		})
	}
	if got, err := s.GetSandbox(ctx, keyA, sb.ID); err != nil || got.State != service.StateRunning {
		t.Errorf("the owner's sandbox after another key's calls: %+v, %v", got, err)
	}
	if list, _ := s.ListSandboxes(ctx, keyB); len(list) != 0 {
		t.Errorf("another key lists %+v", list)
	}
	if list, _ := s.ListSandboxes(ctx, keyA); len(list) != 1 || list[0].ID != sb.ID {
		t.Errorf("the owner lists %+v", list)
	}
}

// TestInvalidNamesTheField: a refused value is an Invalid error naming
// its field, before any sandbox or program is started.
func TestInvalidNamesTheField(t *testing.T) {
	s, be, _ := newService(t, func(c *service.Config) { c.MaxTTL = time.Hour; c.DefaultTTL = time.Minute })
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("v", 1025)
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"ttl above the maximum", func() error {
			_, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{TTL: 2 * time.Hour})
			return err
		}, "ttl"},
		{"negative ttl", func() error { _, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{TTL: -time.Second}); return err }, "ttl"},
		{"metadata value too long", func() error {
			_, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{Metadata: map[string]string{"team": long}})
			return err
		}, "metadata.team"},
		{"timeout above the maximum", func() error { _, err := s.SetTimeout(ctx, keyA, sb.ID, 2*time.Hour); return err }, "ttl"},
		{"no argv", func() error { _, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{}); return err }, "argv"},
		{"NUL in argv", func() error {
			_, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"a", "b\x00"}})
			return err
		}, "argv[1]"},
		{"bad env name", func() error {
			_, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo"}, Env: map[string]string{"1X": "a"}})
			return err
		}, "env.1X"},
		{"relative dir", func() error {
			_, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo"}, Dir: "src"})
			return err
		}, "dir"},
		{"command timeout above the manifest's", func() error {
			_, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo"}, Timeout: 24 * time.Hour})
			return err
		}, "timeout"},
		{"path outside the workspace", func() error {
			_, err := s.WriteFile(ctx, keyA, sb.ID, "../x", strings.NewReader("x"), 0o644)
			return err
		}, "path"},
		{"absolute path", func() error { _, err := s.Stat(ctx, keyA, sb.ID, "/etc/passwd"); return err }, "path"},
		{"rename source", func() error { return s.Rename(ctx, keyA, sb.ID, "a/../../b", "c") }, "source"},
		{"rename destination", func() error { return s.Rename(ctx, keyA, sb.ID, "a", "") }, "destination"},
		{"remove the workspace", func() error { return s.Remove(ctx, keyA, sb.ID, ".") }, "path"},
		{"run without argv", func() error { _, err := s.Run(ctx, keyA, service.RunArgs{}); return err }, "argv"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			wantKind(t, err, service.Invalid, tc.field)
			if !strings.HasPrefix(err.(*service.Error).Message, tc.field+": ") {
				t.Errorf("message %q does not start with the field %s", err.(*service.Error).Message, tc.field)
			}
		})
	}
	if _, created, runs, _ := be.Counts(); created != 1 || runs != 0 {
		t.Errorf("refused requests reached the backend: %d sessions, %d runs", created, runs)
	}
	if l, _ := s.ListExecs(ctx, keyA, sb.ID); len(l) != 0 {
		t.Errorf("refused commands were started: %+v", l)
	}
}

// TestCapTimeout: with CapTimeout, a command timeout above the sandbox's
// resources.timeout is that limit (E2B's timeoutMs is a deadline, not a
// request for more), not an error; 0 stays the manifest's.
func TestCapTimeout(t *testing.T) {
	s, be, _ := newService(t, nil)
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	limit := manifest.Default().Resources.Timeout.D()
	tests := []struct {
		asked, want time.Duration
	}{
		{24 * time.Hour, limit},
		{limit / 2, limit / 2},
		{0, 0},
	}
	for i, tc := range tests {
		if _, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo"}, Timeout: tc.asked, CapTimeout: true}); err != nil {
			t.Fatalf("timeout %s: %v", tc.asked, err)
		}
		procs := be.Sessions()[0].Processes()
		if got := procs[i].Timeout(); got != tc.want {
			t.Errorf("asked %s: the command got %s, want %s", tc.asked, got, tc.want)
		}
	}
}

// TestQuota: a key's sandbox slots (sandboxes and runs alike), its CPU
// seconds for the day, and the server-wide concurrency, each a Quota
// error with a RetryAfter.
func TestQuota(t *testing.T) {
	t.Run("sandboxes per key", func(t *testing.T) {
		s, _, _ := newService(t, nil)
		ctx := t.Context()
		small := audit.Key{ID: "ks", Quota: audit.Quota{MaxSandboxes: 1, CPUSecondsPerDay: 100}}
		first, err := s.CreateSandbox(ctx, small, service.SandboxArgs{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = s.CreateSandbox(ctx, small, service.SandboxArgs{})
		wantKind(t, err, service.Quota, "")
		_, err = s.Run(ctx, small, service.RunArgs{Argv: []string{"echo"}})
		wantKind(t, err, service.Quota, "")
		if err.(*service.Error).RetryAfter <= 0 {
			t.Errorf("no RetryAfter: %+v", err)
		}
		if n := s.Held("ks"); n != 1 {
			t.Errorf("key holds %d slots, want 1", n)
		}
		// Another key is not affected; deleting frees the slot.
		if _, err := s.CreateSandbox(ctx, keyB, service.SandboxArgs{}); err != nil {
			t.Errorf("another key: %v", err)
		}
		if _, err := s.DeleteSandbox(ctx, small, first.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateSandbox(ctx, small, service.SandboxArgs{}); err != nil {
			t.Errorf("after a delete: %v", err)
		}
	})
	t.Run("CPU seconds per day", func(t *testing.T) {
		s, _, au := newService(t, nil)
		ctx := t.Context()
		k := audit.Key{ID: "kc", Quota: audit.Quota{MaxSandboxes: 8, CPUSecondsPerDay: 2}}
		sb, err := s.CreateSandbox(ctx, k, service.SandboxArgs{})
		if err != nil {
			t.Fatal(err)
		}
		au.SetCPUToday("kc", 2)
		_, err = s.Run(ctx, k, service.RunArgs{Argv: []string{"echo"}})
		wantKind(t, err, service.Quota, "")
		_, err = s.CreateSandbox(ctx, k, service.SandboxArgs{})
		wantKind(t, err, service.Quota, "")
		_, err = s.StartExec(ctx, k, sb.ID, service.ExecArgs{Argv: []string{"echo"}})
		wantKind(t, err, service.Quota, "")
		if !strings.Contains(err.Error(), "CPU-seconds") {
			t.Errorf("message %v", err)
		}
	})
	t.Run("server-wide concurrency", func(t *testing.T) {
		s, _, _ := newService(t, func(c *service.Config) { c.MaxConcurrent = 1; c.QueueWait = 50 * time.Millisecond })
		ctx := t.Context()
		sb, ex := occupySlot(t, s)
		start := time.Now()
		_, err := s.Run(ctx, keyB, service.RunArgs{Argv: []string{"echo"}})
		wantKind(t, err, service.Quota, "")
		if time.Since(start) < 50*time.Millisecond {
			t.Error("refused without queueing")
		}
		if _, err := s.Signal(ctx, keyA, sb.ID, ex.ID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WaitExec(ctx, keyA, sb.ID, ex.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Run(ctx, keyB, service.RunArgs{Argv: []string{"echo"}}); err != nil {
			t.Errorf("after the slot freed: %v", err)
		}
	})
	t.Run("a queued run gets the slot when it frees up", func(t *testing.T) {
		s, _, _ := newService(t, func(c *service.Config) { c.MaxConcurrent = 1; c.QueueWait = 5 * time.Second })
		ctx := t.Context()
		sb, ex := occupySlot(t, s)
		done := make(chan error, 1)
		go func() { _, err := s.Run(ctx, keyB, service.RunArgs{Argv: []string{"echo"}}); done <- err }()
		time.Sleep(20 * time.Millisecond)
		if _, err := s.Signal(ctx, keyA, sb.ID, ex.ID, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Errorf("queued run: %v", err)
		}
	})
}

// occupySlot takes the service's only slot (MaxConcurrent 1) with a
// command of keyA's that blocks until signalled.
func occupySlot(t *testing.T, s *service.Service) (service.Sandbox, service.Exec) {
	t.Helper()
	sb, err := s.CreateSandbox(t.Context(), keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.StartExec(t.Context(), keyA, sb.ID, service.ExecArgs{Argv: []string{"fake", "block"}})
	if err != nil {
		t.Fatal(err)
	}
	return sb, ex
}

// TestConflict: a sandbox that is being or has been deleted, and a
// command that has ended, refuse what they can no longer do.
func TestConflict(t *testing.T) {
	s, be, _ := newService(t, nil)
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	if ended, err := s.WaitExec(ctx, keyA, sb.ID, ex.ID); err != nil || ended.State != service.ExecExited {
		t.Fatalf("wait: %+v, %v", ended, err)
	}
	_, err = s.Signal(ctx, keyA, sb.ID, ex.ID, unix.SIGTERM)
	wantKind(t, err, service.Conflict, "")
	_, err = s.WriteStdin(ctx, keyA, sb.ID, ex.ID, strings.NewReader("x"), true)
	wantKind(t, err, service.Conflict, "") // not started with stdin open

	// Deleting: Close held, so the sandbox stays "deleting" meanwhile.
	release := be.HoldClose()
	deleted := make(chan error, 1)
	go func() { _, err := s.DeleteSandbox(ctx, keyA, sb.ID); deleted <- err }()
	waitUntil(t, "the sandbox to be deleting", func() bool {
		got, _ := s.GetSandbox(ctx, keyA, sb.ID)
		return got.State == service.StateDeleting
	})
	tests := []struct {
		name string
		call func() error
	}{
		{"delete again", func() error { _, err := s.DeleteSandbox(ctx, keyA, sb.ID); return err }},
		{"set its timeout", func() error { _, err := s.SetTimeout(ctx, keyA, sb.ID, time.Minute); return err }},
		{"start a command", func() error {
			_, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"echo"}})
			return err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantKind(t, tc.call(), service.Conflict, "") })
	}
	release()
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
	// Deleted: it is gone.
	_, err = s.GetSandbox(ctx, keyA, sb.ID)
	wantKind(t, err, service.NotFound, "")
}

// TestEventsFeed: a command's events read through the service: output in
// order, then the exit event's id, and the final view with its result.
func TestEventsFeed(t *testing.T) {
	s, _, _ := newService(t, nil)
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.StartExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"fake", "cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	feed, err := s.Events(ctx, keyA, sb.ID, ex.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.WriteStdin(ctx, keyA, sb.ID, ex.ID, strings.NewReader("hello"), true); err != nil || n != 5 {
		t.Fatalf("stdin: %d, %v", n, err)
	}
	var out strings.Builder
	after := 0
	for {
		evs, exitID, notify := feed.Read(after)
		for _, ev := range evs {
			if ev.Stream != "stdout" || ev.ID != after+1 {
				t.Fatalf("event %+v after %d", ev, after)
			}
			out.Write(ev.Data)
			after = ev.ID
		}
		if exitID > 0 {
			if exitID != after+1 {
				t.Errorf("exit id %d after event %d", exitID, after)
			}
			break
		}
		select {
		case <-notify:
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
	}
	if out.String() != "hello" {
		t.Errorf("stdout %q", out.String())
	}
	if v := feed.Exec(); v.State != service.ExecExited || v.Result == nil || v.Result.Termination != result.Exited {
		t.Errorf("final view %+v", v)
	}
	_, err = s.WriteStdin(ctx, keyA, sb.ID, ex.ID, strings.NewReader("x"), false)
	wantKind(t, err, service.Conflict, "")
}

// TestClassify: the one classification of Moat's errors.
func TestClassify(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		kind  service.Kind
		field string
	}{
		{"usage", fmt.Errorf("%w: argv is empty", engine.ErrUsage), service.Invalid, ""},
		{"manifest field", &manifest.FieldError{Field: "resources.memory", Problem: "is too small"}, service.Invalid, "resources.memory"},
		{"workspace limit", &workspace.LimitError{Field: "workspace.size", Detail: "the files do not fit"}, service.TooLarge, "manifest.workspace.size"},
		{"too large", service.ErrTooLarge, service.TooLarge, ""},
		{"no space", unix.ENOSPC, service.TooLarge, ""},
		{"missing path", fmt.Errorf("open a: %w", fs.ErrNotExist), service.NotFound, ""},
		{"closed session", engine.ErrSessionClosed, service.Conflict, ""},
		{"tier unavailable", tier.ErrUnavailable, service.Unavailable, ""},
		{"service unavailable", service.ErrUnavailable, service.Unavailable, ""},
		{"cancelled", context.Canceled, service.Unavailable, ""},
		{"already classified", &service.Error{Kind: service.Conflict, Message: "x"}, service.Conflict, ""},
		{"anything else", errors.New("boom"), service.Internal, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := service.Classify(tc.err, "file \"a\"")
			if e.Kind != tc.kind || e.Field != tc.field {
				t.Errorf("service.Classify(%v) = %+v, want kind %s field %q", tc.err, e, tc.kind, tc.field)
			}
			if tc.kind == service.Internal && strings.Contains(e.Message, "boom") {
				t.Errorf("an internal error shows its cause: %q", e.Message)
			}
			if service.KindOf(e) != tc.kind {
				t.Errorf("service.KindOf = %s", service.KindOf(e))
			}
		})
	}
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
