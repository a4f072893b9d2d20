package server

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// storeEnv is a server over the fake backend and a real audit store, for
// what the audit log records.
func storeEnv(t *testing.T, mod func(*Config)) (*env, *audit.Store, string) {
	t.Helper()
	store, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	token, _, err := store.CreateKey("test", audit.Quota{})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Auditor = store
		if mod != nil {
			mod(c)
		}
	})
	return e, store, token
}

// TestSandboxAuditRecord: a sandbox that ends normally (deleted, expired,
// shut down) is recorded done with its lifetime, not "failed /
// infra-error / no result was recorded"; one whose init a command killed
// is destroyed at once (not left reporting running while every command
// fails) and recorded failed with the reason.
func TestSandboxAuditRecord(t *testing.T) {
	e, store, token := storeEnv(t, nil)
	waitRecord := func(id string) audit.Record {
		t.Helper()
		var r audit.Record
		waitFor(t, "sandbox "+id+" to be finished in the audit log", func() bool {
			var err error
			r, err = store.Get(id)
			return err == nil && r.Status != audit.Running
		})
		return r
	}

	t.Run("deleted", func(t *testing.T) {
		sb := e.createSandbox(token, nil)
		e.exec(token, sb.ID, map[string]any{"argv": []string{"fake", "out:hi"}}, http.StatusOK)
		time.Sleep(5 * time.Millisecond)
		e.must(http.StatusOK, req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: token})
		r := waitRecord(sb.ID)
		if r.Status != audit.Done || r.Termination != "" || r.Error != "" || r.WallMS <= 0 {
			t.Errorf("record %+v; want done, no termination, no error, its lifetime as wall time", r)
		}
	})
	t.Run("expired", func(t *testing.T) {
		sb := e.createSandbox(token, map[string]any{"ttl": "1s"})
		r := waitRecord(sb.ID)
		if r.Status != audit.Done || r.Error != "" || r.WallMS < 1000 {
			t.Errorf("record %+v; want done after its 1s TTL", r)
		}
	})
	t.Run("init killed", func(t *testing.T) {
		sb := e.createSandbox(token, nil)
		ex := e.exec(token, sb.ID, map[string]any{"argv": []string{"fake", "kill-init"}}, http.StatusOK)
		if ex.State != ExecFailed {
			t.Errorf("the command that killed init: state %s", ex.State)
		}
		// The next command finds the sandbox gone (or, if it comes
		// first, ending): never a 500.
		next := e.do(req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", token: token, body: map[string]any{"argv": []string{"true"}}})
		if next.StatusCode != http.StatusNotFound && next.StatusCode != http.StatusConflict {
			t.Errorf("a command after init died: %d %s; want 404 or 409", next.StatusCode, next.body)
		}
		waitFor(t, "the sandbox whose init died to be gone", func() bool {
			return e.do(req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: token}).StatusCode == http.StatusNotFound
		})
		r := waitRecord(sb.ID)
		if r.Status != audit.Failed || !strings.Contains(r.Error, "init process exited") {
			t.Errorf("record %+v; want failed, saying its init exited", r)
		}
	})
	t.Run("start on an ended sandbox", func(t *testing.T) {
		sb := e.createSandbox(token, nil)
		// Kill init without the server seeing a failed command: the
		// next Start is the first to find out.
		for _, fs := range e.be.Sessions() {
			if fs.ID() == sb.ID {
				fs.KillInit()
			}
		}
		r := e.do(req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", token: token, body: map[string]any{"argv": []string{"true"}}})
		if r.StatusCode != http.StatusConflict || !strings.Contains(string(r.body), "init process exited") {
			t.Errorf("command on a sandbox whose init died: %d %s; want 409 saying so", r.StatusCode, r.body)
		}
		if got := e.do(req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: token}); got.StatusCode != http.StatusNotFound {
			t.Errorf("the ended sandbox is still listed: %d %s", got.StatusCode, got.body)
		}
		if rec := waitRecord(sb.ID); rec.Status != audit.Failed {
			t.Errorf("record %+v; want failed", rec)
		}
	})
}
