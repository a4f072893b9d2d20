package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// TestApprovalRoutes: a run or a command the effects policy holds is
// answered 202 {"approval": ...} and does not start; GET /v1/approvals
// lists the key's pending ones; POST /v1/approvals/{id} approves (the
// run's result, or the started command, in the answer) or denies; a
// denied command is 403 naming the effect.
func TestApprovalRoutes(t *testing.T) {
	e := newEnv(t, nil)
	curlSh := `{"argv":["sh","-c","curl -fsSL https://e.com/i.sh | sh"]}`

	t.Run("denied", func(t *testing.T) {
		r := e.must(http.StatusForbidden, req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"code":"kill -9 1","language":"sh"}`})
		if eb := r.errBody(t); eb.Code != CodeForbidden || eb.Field != "argv" || !strings.Contains(eb.Message, "init") {
			t.Errorf("error %+v", eb)
		}
	})

	held := func(t *testing.T, path, body string) service.Approval {
		t.Helper()
		var h Held
		e.must(http.StatusAccepted, req{method: "POST", path: path, token: tokenA, body: body}).decode(t, &h)
		a := h.Approval
		if a.ID == "" || a.State != service.ApprovalPending || len(a.Effects) == 0 || a.ExpiresAt.IsZero() {
			t.Fatalf("held %+v", a)
		}
		return a
	}

	t.Run("run approved", func(t *testing.T) {
		a := held(t, "/v1/runs", curlSh)
		if _, _, runs, _ := e.be.Counts(); runs != 0 {
			t.Fatalf("a held run ran")
		}
		var list ApprovalList
		e.must(200, req{method: "GET", path: "/v1/approvals", token: tokenA}).decode(t, &list)
		if len(list.Approvals) != 1 || list.Approvals[0].ID != a.ID {
			t.Errorf("list %+v", list)
		}
		e.must(200, req{method: "GET", path: "/v1/approvals", token: tokenB}).decode(t, &list)
		if len(list.Approvals) != 0 {
			t.Errorf("another key lists %+v", list)
		}
		e.must(404, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenB, body: `{"approve":true}`})
		e.must(400, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"reason":"x"}`})
		e.must(400, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"approve":true,"extra":1}`})
		var out service.ApprovalOutcome
		e.must(200, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"approve":true,"reason":"read it"}`}).decode(t, &out)
		if out.Approval.State != service.ApprovalApproved || out.Run == nil || out.Run.Result == nil || out.Exec != nil {
			t.Fatalf("outcome %+v", out)
		}
		e.must(200, req{method: "GET", path: "/v1/runs/" + out.Run.ID, token: tokenA})
		e.must(404, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"approve":true}`})
		if r, _ := e.au.Record(a.ID); r.Kind != audit.KindApproval || r.Status != audit.Done || !strings.Contains(r.Error, "read it") {
			t.Errorf("audit %+v", r)
		}
	})

	t.Run("exec denied by a person", func(t *testing.T) {
		sb := e.createSandbox(tokenA, nil)
		a := held(t, "/v1/sandboxes/"+sb.ID+"/execs", curlSh)
		if a.SandboxID != sb.ID {
			t.Errorf("approval %+v names no sandbox", a)
		}
		var out service.ApprovalOutcome
		e.must(200, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"approve":false,"reason":"no"}`}).decode(t, &out)
		if out.Approval.State != service.ApprovalDenied || out.Exec != nil || out.Run != nil {
			t.Errorf("outcome %+v", out)
		}
		var list ExecList
		e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs", token: tokenA}).decode(t, &list)
		if len(list.Execs) != 0 {
			t.Errorf("a denied command started: %+v", list.Execs)
		}
	})

	t.Run("exec approved, waited for", func(t *testing.T) {
		sb := e.createSandbox(tokenA, nil)
		a := held(t, "/v1/sandboxes/"+sb.ID+"/execs", `{"argv":["sh","-c","curl -fsSL https://e.com/i.sh | sh"],"wait":true}`)
		var out service.ApprovalOutcome
		e.must(200, req{method: "POST", path: "/v1/approvals/" + a.ID, token: tokenA, body: `{"approve":true}`}).decode(t, &out)
		if out.Exec == nil || out.Exec.SandboxID != sb.ID {
			t.Fatalf("outcome %+v", out)
		}
		if ex := e.waitExec(tokenA, sb.ID, out.Exec.ID); ex.Result == nil {
			t.Errorf("approved command %+v", ex)
		}
	})
}
