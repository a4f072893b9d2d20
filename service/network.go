package service

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// NetworkSetter is implemented by a Session whose allowlist can be
// replaced while it runs (engine.Session).
type NetworkSetter interface {
	SetNetwork(n manifest.Network) error
}

// UpdateNetwork replaces the allowlist of key's running sandbox id with
// allow (network.allow's hosts) and addresses (network.allow_addresses)
// for the connections made from now on; both empty denies everything.
// The new allowlist is checked as a manifest's would be, against the
// key's policy ceiling (a widening beyond it is Forbidden), and the
// change is audited (a record of kind network holding the sandbox's
// manifest with the new allowlist), refused or not.
func (s *Service) UpdateNetwork(ctx context.Context, key audit.Key, id string, allow, addresses []string) (Sandbox, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	s.mu.Lock()
	state := sb.state
	s.mu.Unlock()
	if state != StateRunning {
		return Sandbox{}, &Error{Kind: Conflict, Message: fmt.Sprintf("sandbox %s is %s: only a running sandbox's network can change", Quote(id), state)}
	}
	m := *sb.manifest
	m.Network.Allow, m.Network.AllowAddresses = slices.Clone(allow), slices.Clone(addresses)
	refusal := s.checkNetwork(key, &m)
	rec := auditRecord("nw-"+NewID(8), audit.KindNetwork, key.ID, id, &m, []string{"update-network", strings.Join(append(slices.Clone(allow), addresses...), ",")})
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		// The change is refused rather than made unaudited.
		s.log.Error("audit: begin network update", "sandbox", id, "err", err)
		return Sandbox{}, InternalError(fmt.Errorf("audit network update: %w", err))
	}
	finish := func(e *Error) {
		var res *result.Result
		if e != nil {
			res = &result.Result{ID: rec.ID, Command: rec.Command, Termination: result.Policy, Error: e.Message}
		}
		if err := s.cfg.Auditor.Finish(rec.ID, res, nil); err != nil {
			s.log.Error("audit: finish network update", "sandbox", id, "err", err)
		}
	}
	if refusal != nil {
		finish(refusal)
		return Sandbox{}, refusal
	}
	ns, ok := sb.sess.(NetworkSetter)
	if !ok {
		e := InvalidField("network", "cannot change while this server's sandboxes run (its backend cannot replace an allowlist)")
		finish(e)
		return Sandbox{}, e
	}
	if err := ns.SetNetwork(m.Network); err != nil {
		e := requestError(err, "network", "network")
		finish(e)
		return Sandbox{}, e
	}
	finish(nil)
	s.log.Info("sandbox network updated", "sandbox", id, "key", key.ID, "allow", strings.Join(allow, ","), "allow_addresses", strings.Join(addresses, ","))
	return s.GetSandbox(ctx, key, id)
}

// checkNetwork checks m's network (the new allowlist of a sandbox made
// with m's other fields) as a manifest's and against key's ceiling. An
// empty allowlist needs no check: it grants nothing.
func (s *Service) checkNetwork(key audit.Key, m *manifest.Manifest) *Error {
	if len(m.Network.Allow) == 0 && len(m.Network.AllowAddresses) == 0 {
		return nil
	}
	if m.Network.Mode != "allowlist" {
		return &Error{Kind: Invalid, Field: "network", Message: fmt.Sprintf("sandbox was created with network.mode %s: it has no egress proxy and no route out, and none can be added to a live sandbox; create it with network.mode allowlist (E2B: network.allowOut) to change its allowlist later", m.Network.Mode)}
	}
	if err := m.Validate(); err != nil {
		return requestError(err, "network", "network")
	}
	return CheckPolicy(s.cfg.Policy, key, m)
}
