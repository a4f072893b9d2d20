package server

import (
	"errors"
	"net/http"

	"github.com/moat-sandbox/moat/service"
)

// The approval routes: a command the operator's effects policy holds is
// answered 202 with {"approval": {...}}; the key lists its pending ones
// and approves or denies each.

// Held is the answer to a run or a command held for approval (202).
type Held struct {
	Approval service.Approval `json:"approval"`
}

// ApprovalList is GET /v1/approvals.
type ApprovalList struct {
	Approvals []service.Approval `json:"approvals"`
}

// ApprovalDecision is the body of POST /v1/approvals/{id}.
type ApprovalDecision struct {
	Approve *bool  `json:"approve"`
	Reason  string `json:"reason,omitempty"`
}

// writeHeld answers 202 when err is a request held for approval, and
// reports whether it did.
func writeHeld(w http.ResponseWriter, err error) (bool, error) {
	var se *service.Error
	if errors.As(err, &se) && se.Held != nil {
		return true, writeJSON(w, http.StatusAccepted, Held{Approval: *se.Held})
	}
	return false, nil
}

func (s *Server) listApprovals(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, http.StatusOK, ApprovalList{Approvals: s.svc.ListApprovals(r.Context(), keyOf(r))})
}

// decideApproval serves POST /v1/approvals/{id}: an approved run runs
// now and is answered with its result ({"approval", "run"}); an approved
// command starts and is answered running ({"approval", "exec"}: poll it
// as any other).
func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request) error {
	if e := requireJSON(r); e != nil {
		return e
	}
	data, e := readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	var d ApprovalDecision
	if e := decodeStrict(data, &d); e != nil {
		return e
	}
	if d.Approve == nil {
		return invalid("approve", "is required: true runs the held command, false refuses it")
	}
	out, err := s.svc.DecideApproval(r.Context(), keyOf(r), r.PathValue("id"), service.Decision{Approve: *d.Approve, Reason: d.Reason})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, out)
}
