package service

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/moat-sandbox/moat/audit"
)

// The operator's views across keys: what the dashboard (package dashboard)
// shows an admin key. Every method refuses a tenant's key with Forbidden;
// a tenant's own views (ListSandboxes, GetRun, ListApprovals) stay
// limited to its key.

// KeyedSandbox is a sandbox with the key that owns it.
type KeyedSandbox struct {
	Sandbox
	KeyID string `json:"key_id"`
}

// KeyedApproval is a pending approval with the key whose command it holds.
type KeyedApproval struct {
	Approval
	KeyID string `json:"key_id"`
}

// requireAdmin refuses every key but an admin one.
func requireAdmin(key audit.Key, what string) *Error {
	if key.ID == "" || !key.Admin {
		return &Error{Kind: Forbidden, Message: fmt.Sprintf("%s shows every key's work and needs an admin key; key %s is a tenant's (moat keys create --admin)", what, Quote(key.ID))}
	}
	return nil
}

// AllSandboxes is every key's live sandboxes, oldest first: for admin
// keys only.
func (s *Service) AllSandboxes(ctx context.Context, admin audit.Key) ([]KeyedSandbox, error) {
	if e := requireAdmin(admin, "the list of every sandbox"); e != nil {
		return nil, e
	}
	s.mu.Lock()
	list := []KeyedSandbox{}
	for _, sb := range s.sandboxes {
		list = append(list, KeyedSandbox{Sandbox: s.viewLocked(sb), KeyID: sb.key})
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b KeyedSandbox) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return list, nil
}

// AnyRun returns the stored result of run id, whichever key ran it (the
// last KeepRuns runs are kept): for admin keys only.
func (s *Service) AnyRun(ctx context.Context, admin audit.Key, id string) (json.RawMessage, error) {
	if e := requireAdmin(admin, "another key's run"); e != nil {
		return nil, e
	}
	s.runs.mu.Lock()
	defer s.runs.mu.Unlock()
	sr, ok := s.runs.byID[id]
	if !ok {
		return nil, notFound("run " + Quote(id))
	}
	return sr.json, nil
}

// AllApprovals is every key's pending approvals, oldest first: for admin
// keys only.
func (s *Service) AllApprovals(ctx context.Context, admin audit.Key) ([]KeyedApproval, error) {
	if e := requireAdmin(admin, "the list of every pending approval"); e != nil {
		return nil, e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []KeyedApproval{}
	for _, p := range s.approvals {
		out = append(out, KeyedApproval{Approval: p.view, KeyID: p.key.ID})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// DecideAnyApproval approves or denies any key's pending approval id: for
// admin keys only (the operator deciding for a tenant). The command runs
// as the key that asked for it (its quota, its sandbox, its audit
// records); the approval's audit record names the admin key that decided.
func (s *Service) DecideAnyApproval(ctx context.Context, admin audit.Key, id string, d Decision) (ApprovalOutcome, error) {
	if e := requireAdmin(admin, "deciding another key's approval"); e != nil {
		return ApprovalOutcome{}, e
	}
	if len(d.Reason) > 4096 {
		return ApprovalOutcome{}, InvalidField("reason", "is %d bytes, more than 4096: say it shorter", len(d.Reason))
	}
	s.mu.Lock()
	p, ok := s.approvals[id]
	s.mu.Unlock()
	if !ok {
		return ApprovalOutcome{}, notFound("approval " + Quote(id))
	}
	if p.key.ID != admin.ID {
		d.Reason = fmt.Sprintf("by admin key %s: %s", admin.ID, d.Reason)
	}
	return s.DecideApproval(ctx, p.key, id, d)
}

// AnyExec describes command eid of any key's live sandbox id (its output
// while the sandbox keeps it: the last KeepExecs ended commands): for
// admin keys only.
func (s *Service) AnyExec(ctx context.Context, admin audit.Key, id, eid string) (Exec, error) {
	if e := requireAdmin(admin, "another key's command"); e != nil {
		return Exec{}, e
	}
	s.mu.Lock()
	sb := s.sandboxes[id]
	s.mu.Unlock()
	if sb == nil {
		return Exec{}, notFound("sandbox " + Quote(id))
	}
	return s.GetExec(ctx, audit.Key{ID: sb.key}, id, eid)
}
