package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// The approval flow: every command is analysed for its effects
// (package effects) before it starts, composed with what earlier commands
// of the same sandbox did; the operator's effects policy allows it,
// refuses it, or holds it until a person approves or denies it (or the
// approval times out, which denies). The analysis is advice on top of the
// sandbox, never a substitute for it (docs/THREATS.md).

// MaxPendingApprovals bounds the approvals one key can have waiting: a
// held command keeps its arguments (stdin included) in memory.
const MaxPendingApprovals = 64

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalExpired  = "expired"
)

// ViolationEffect is the result.Violation kind under which an approval's
// audit record lists the effects it was asked about.
const ViolationEffect = "effect"

// Approval is a command held until a person decides: what the API returns
// with 202 and lists under GET /v1/approvals.
type Approval struct {
	ID    string `json:"id"`
	State string `json:"state"`
	// SandboxID is the session of a held command; "" for a one-shot run.
	SandboxID string           `json:"sandbox_id,omitempty"`
	Argv      []string         `json:"argv"`
	Effects   []effects.Effect `json:"effects"`
	// Reasons are the policy's reasons for asking, one per effect.
	Reasons   []string  `json:"reasons,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Decision is a person's answer to an approval.
type Decision struct {
	Approve bool
	Reason  string
}

// ApprovalOutcome is what deciding an approval did: for an approved
// one-shot run its response (the run has ended), for an approved command
// the command (running: poll it as any other).
type ApprovalOutcome struct {
	Approval Approval     `json:"approval"`
	Run      *RunResponse `json:"run,omitempty"`
	Exec     *Exec        `json:"exec,omitempty"`
}

// pending is a held command.
type pending struct {
	view  Approval
	key   audit.Key
	run   *RunArgs  // a one-shot run's arguments, stdin buffered
	exec  *ExecArgs // a command's, stdin buffered
	timer *time.Timer
}

// effectsPolicy is the policy commands are screened with, or nil when
// screening is off.
func (s *Service) effectsPolicy() *effects.Policy {
	if s.cfg.NoEffects {
		return nil
	}
	return s.cfg.Effects
}

// commandNumbers are the command indexes in an effect's detail
// ("command 3", "commands 1, 2 and 4").
var commandNumbers = regexp.MustCompile(`\bcommands? [0-9]+(?:(?:, | and )[0-9]+)*`)

// effectKey is how an approved effect is remembered within a session
// (RememberApprovals: session): its kind and plain-words detail with the
// command numbers left out, so that running the same fetched file again
// as command 5 ("command 5 runs x.sh, which command 1 downloaded from
// URL") is the effect approved for command 3. The detail still names the
// files, hosts and URLs, so a different file or source is asked again.
func effectKey(e effects.Effect) string {
	return string(e.Kind) + "\x00" + commandNumbers.ReplaceAllString(e.Detail, "command #")
}

// screen decides argv's effects against the policy. fx is the session the
// analysis composes with (it is advanced: pass a clone); remembered are
// the session's approved effects. It returns nil, nil to run, or the
// held effects or the denied ones (with their reasons).
func screen(p *effects.Policy, fx *effects.Session, argv []string, remembered map[string]bool) (held, denied []effects.Decided) {
	effs := fx.Exec(argv)
	if p.RememberApprovals == effects.RememberSession && len(remembered) > 0 {
		kept := effs[:0:0]
		for _, ef := range effs {
			if d := p.DecideOne(ef); d.Decision == effects.Approve && remembered[effectKey(ef)] {
				continue // a person already approved this very effect in this session
			}
			kept = append(kept, ef)
		}
		effs = kept
	}
	v := p.Decide(effs)
	switch v.Decision {
	case effects.Allow:
		return nil, nil
	case effects.Deny:
		return nil, v.Because
	default:
		return v.Because, nil
	}
}

// refuse records a command the effects policy denied — an audit record
// of kind approval, denied by policy, and an incident bundle when the
// service keeps them (Config.Incidents) — and returns the refusal. A
// denial is the policy catching something: it must not leave less trace
// than a run that was let through.
func (s *Service) refuse(key audit.Key, sandboxID string, m *manifest.Manifest, argv []string, denied []effects.Decided) *Error {
	refusal := &Error{Kind: Forbidden, Field: "argv",
		Message: "the command is refused by the operator's effects policy: " + plainEffects(denied) +
			" (a different command, or an operator policy that allows it, is the fix)"}
	id := "ap-" + NewID(8)
	rec := auditRecord(id, audit.KindApproval, key.ID, sandboxID, m, argv)
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		s.log.Error("audit: begin denial", "approval", id, "err", err)
		return refusal
	}
	res := &result.Result{ID: id, Command: argv, Termination: result.Policy,
		Error: ApprovalDenied + ": by the operator's effects policy"}
	for _, d := range denied {
		res.Violations = append(res.Violations, result.Violation{Kind: ViolationEffect, Detail: d.Effect.String()})
	}
	if st := s.cfg.Incidents; st != nil {
		ev := *res
		ev.Violations = slices.Clone(res.Violations)
		for _, d := range denied {
			ev.Violations = append(ev.Violations, result.Violation{Kind: "policy",
				Detail: "refused before it started: " + d.Effect.Detail})
		}
		b, _ := json.Marshal(rec)
		sum, err := st.Keep(&incident.Evidence{RunID: id, Key: key.ID, Manifest: m, Commands: [][]string{argv},
			Result: &ev, ProcsNote: "none: the command was refused before anything started", Audit: b})
		if err != nil {
			s.log.Error("incident: keep denial", "approval", id, "err", err)
		} else {
			res.Incident = sum.ID
		}
	}
	if err := s.cfg.Auditor.Finish(id, res, nil); err != nil {
		s.log.Error("audit: finish denial", "approval", id, "err", err)
	}
	return refusal
}

// plainEffects says decided effects in plain words, with the policy's
// reasons.
func plainEffects(ds []effects.Decided) string {
	var parts []string
	for _, d := range ds {
		p := d.Effect.Detail
		if d.Reason != "" {
			p += " (" + d.Reason + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// holdForApproval registers a held command and returns the Error that tells the
// caller (Kind Forbidden, Held set: the HTTP API answers 202).
func (s *Service) holdForApproval(key audit.Key, sandboxID string, m *manifest.Manifest, argv []string, because []effects.Decided, run *RunArgs, exec *ExecArgs) *Error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return unavailable("the server is shutting down; the command needs approval and nothing ran")
	}
	n := 0
	for _, p := range s.approvals {
		if p.key.ID == key.ID {
			n++
		}
	}
	s.mu.Unlock()
	if n >= MaxPendingApprovals {
		return quotaExceeded(60, "key %s has %d commands waiting for approval, the most it may have: approve or deny some (GET /v1/approvals)", key.ID, n)
	}
	// The held request outlives the call: keep its stdin.
	if run != nil && run.Stdin != nil {
		b, err := io.ReadAll(run.Stdin)
		if err != nil {
			return requestError(err, "stdin", "stdin")
		}
		run.Stdin = bytes.NewReader(b)
	}
	if exec != nil && exec.Stdin != nil {
		b, err := io.ReadAll(exec.Stdin)
		if err != nil {
			return requestError(err, "stdin", "stdin")
		}
		exec.Stdin = bytes.NewReader(b)
	}
	now := time.Now().UTC()
	v := Approval{ID: "ap-" + NewID(8), State: ApprovalPending, SandboxID: sandboxID, Argv: argv,
		CreatedAt: now, ExpiresAt: now.Add(s.cfg.ApprovalTimeout)}
	for _, d := range because {
		v.Effects = append(v.Effects, d.Effect)
		v.Reasons = append(v.Reasons, d.Reason)
	}
	rec := auditRecord(v.ID, audit.KindApproval, key.ID, sandboxID, m, argv)
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		// Nothing is held unaudited.
		return InternalError(fmt.Errorf("audit: begin approval %s: %w", v.ID, err))
	}
	p := &pending{view: v, key: key, run: run, exec: exec}
	s.mu.Lock()
	closing := s.closing
	if !closing {
		s.approvals[v.ID] = p
		p.timer = time.AfterFunc(s.cfg.ApprovalTimeout, func() { s.expire(v.ID) })
	}
	s.mu.Unlock()
	if closing {
		// Shutdown has ended the pending approvals (stopApprovals): none
		// may start after it.
		s.finishApproval(p, ApprovalExpired, "the server is shutting down")
		return unavailable("the server is shutting down; the command needed approval and nothing ran")
	}
	view := v
	return &Error{Kind: Forbidden, Held: &view,
		Message: fmt.Sprintf("the command is held for approval %s until %s: %s; approve or deny it with POST /v1/approvals/%s",
			v.ID, v.ExpiresAt.Format(time.RFC3339), plainEffects(because), v.ID)}
}

// take removes key's pending approval id.
func (s *Service) take(key audit.Key, id string) (*pending, *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.approvals[id]
	if !ok || p.key.ID != key.ID || key.ID == "" {
		return nil, notFound("approval " + Quote(id))
	}
	delete(s.approvals, id)
	p.timer.Stop()
	return p, nil
}

// expire denies an approval nobody decided in time.
func (s *Service) expire(id string) {
	s.mu.Lock()
	p, ok := s.approvals[id]
	delete(s.approvals, id)
	s.mu.Unlock()
	if !ok {
		return
	}
	s.finishApproval(p, ApprovalExpired, fmt.Sprintf("nobody decided within %s", s.cfg.ApprovalTimeout))
}

// finishApproval writes the decision to the approval's audit record:
// termination exited for approved, policy for denied or expired; the
// error text carries the decision and its reason, the violations the
// effects asked about.
func (s *Service) finishApproval(p *pending, state, reason string) {
	res := &result.Result{Termination: result.Exited}
	if state != ApprovalApproved {
		res.Termination = result.Policy
	}
	res.Error = state
	if reason != "" {
		res.Error += ": " + reason
	}
	for _, e := range p.view.Effects {
		res.Violations = append(res.Violations, result.Violation{Kind: ViolationEffect, Detail: e.String()})
	}
	if err := s.cfg.Auditor.Finish(p.view.ID, res, nil); err != nil {
		s.log.Error("audit: finish approval", "approval", p.view.ID, "err", err)
	}
}

// ListApprovals returns key's pending approvals, oldest first.
func (s *Service) ListApprovals(ctx context.Context, key audit.Key) []Approval {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Approval{}
	for _, p := range s.approvals {
		if p.key.ID == key.ID && key.ID != "" {
			out = append(out, p.view)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out
}

// DecideApproval approves or denies key's pending approval id, with a
// reason for the audit log. An approved one-shot run runs now (ctx bounds
// it, as POST /v1/runs's does) and the outcome carries its response; an
// approved command starts and the outcome carries it. Another key's
// approval, or one already decided or expired, is NotFound.
func (s *Service) DecideApproval(ctx context.Context, key audit.Key, id string, d Decision) (ApprovalOutcome, error) {
	if len(d.Reason) > 4096 {
		return ApprovalOutcome{}, InvalidField("reason", "is %d bytes, more than 4096: say it shorter", len(d.Reason))
	}
	p, e := s.take(key, id)
	if e != nil {
		return ApprovalOutcome{}, e
	}
	if !d.Approve {
		p.view.State = ApprovalDenied
		s.finishApproval(p, ApprovalDenied, d.Reason)
		return ApprovalOutcome{Approval: p.view}, nil
	}
	p.view.State = ApprovalApproved
	s.finishApproval(p, ApprovalApproved, d.Reason)
	out := ApprovalOutcome{Approval: p.view}
	if p.run != nil {
		resp, err := s.run(ctx, key, *p.run, true)
		if err != nil {
			return ApprovalOutcome{}, err
		}
		out.Run = &resp
		return out, nil
	}
	ex, err := s.startExecApproved(ctx, key, p.view.SandboxID, *p.exec, p.view.Effects)
	if err != nil {
		return ApprovalOutcome{}, err
	}
	v := ex.view()
	out.Exec = &v
	return out, nil
}

// stopApprovals stops the timers of pending approvals at shutdown and
// records them as expired: nothing held outlives the service.
func (s *Service) stopApprovals() {
	s.mu.Lock()
	ps := make([]*pending, 0, len(s.approvals))
	for id, p := range s.approvals {
		p.timer.Stop()
		ps = append(ps, p)
		delete(s.approvals, id)
	}
	s.mu.Unlock()
	for _, p := range ps {
		s.finishApproval(p, ApprovalExpired, "the server shut down")
	}
}
