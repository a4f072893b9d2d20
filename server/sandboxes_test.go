package server

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

func TestSandboxLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	before := time.Now().UTC()
	sb := e.createSandbox(tokenA, map[string]any{
		"manifest": map[string]any{"resources": map[string]any{"timeout": "5s"}},
		"ttl":      "1h",
		"files":    []map[string]string{{"path": "src/main.py", "content": "print(1)"}},
		"metadata": map[string]string{"owner": "agent-1"},
	})
	if sb.State != StateRunning || sb.Tier != "fake" || sb.ManifestDigest == "" || sb.Metadata["owner"] != "agent-1" || sb.Execs != 0 {
		t.Errorf("created %+v", sb)
	}
	if d := sb.ExpiresAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("expires in %s, want 1h", d)
	}
	if rec, ok := e.au.Record(sb.ID); !ok || rec.Kind != audit.KindSandbox || rec.KeyID != "ka" || rec.Status != audit.Running {
		t.Errorf("audit record %+v", rec)
	}
	// The upload is in the workspace.
	var got []byte
	dir := e.be.Sessions()[0].Dir()
	got, _ = os.ReadFile(filepath.Join(dir, "src/main.py"))
	if string(got) != "print(1)" {
		t.Errorf("uploaded file holds %q", got)
	}

	other := e.createSandbox(tokenB, nil)

	var one Sandbox
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA}).decode(t, &one)
	if one.ID != sb.ID {
		t.Errorf("get %+v", one)
	}
	var list SandboxList
	e.must(200, req{method: "GET", path: "/v1/sandboxes", token: tokenA}).decode(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].ID != sb.ID {
		t.Errorf("key a lists %+v", list)
	}

	// Another key's sandbox does not exist, whatever the route.
	for _, rq := range []req{
		{method: "GET", path: "/v1/sandboxes/" + other.ID},
		{method: "DELETE", path: "/v1/sandboxes/" + other.ID},
		{method: "POST", path: "/v1/sandboxes/" + other.ID + "/timeout", body: `{"ttl":"1m"}`},
		{method: "POST", path: "/v1/sandboxes/" + other.ID + "/execs", body: `{"argv":["echo"]}`},
		{method: "GET", path: "/v1/sandboxes/" + other.ID + "/execs"},
		{method: "GET", path: "/v1/sandboxes/" + other.ID + "/execs/e-1"},
		{method: "GET", path: "/v1/sandboxes/" + other.ID + "/execs/e-1/events"},
		{method: "POST", path: "/v1/sandboxes/" + other.ID + "/execs/e-1/stdin", body: "x"},
		{method: "POST", path: "/v1/sandboxes/" + other.ID + "/execs/e-1/signal", body: `{"signal":"KILL"}`},
		{method: "PUT", path: "/v1/sandboxes/" + other.ID + "/files?path=a", body: "x"},
		{method: "GET", path: "/v1/sandboxes/" + other.ID + "/files?path=a"},
		{method: "DELETE", path: "/v1/sandboxes/" + other.ID + "/files?path=a"},
		{method: "GET", path: "/v1/sandboxes/sb-unknown"},
	} {
		rq.token = tokenA
		r := e.do(rq)
		if r.StatusCode != 404 || r.errBody(t).Code != CodeNotFound {
			t.Errorf("%s %s with another key: %d %s", rq.method, rq.path, r.StatusCode, r.body)
		}
	}

	// Extend the TTL.
	var ext Sandbox
	e.must(200, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/timeout", token: tokenA, body: `{"ttl":"5m"}`}).decode(t, &ext)
	if d := time.Until(ext.ExpiresAt); d < 4*time.Minute || d > 6*time.Minute {
		t.Errorf("after timeout 5m, expires in %s", d)
	}
	for _, tc := range []struct{ body, field string }{
		{`{"ttl":"forever"}`, "ttl"},
		{`{"ttl":"-1m"}`, "ttl"},
		{`{"ttl":"48h"}`, "ttl"},
		{`{}`, "ttl"},
		{`{"ttl":"1m","x":1}`, "x"},
	} {
		r := e.must(400, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/timeout", token: tokenA, body: tc.body})
		if d := r.errBody(t); d.Field != tc.field {
			t.Errorf("timeout %s: %+v", tc.body, d)
		}
	}

	var del Sandbox
	e.must(200, req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: tokenA}).decode(t, &del)
	if del.State != StateDeleted {
		t.Errorf("deleted %+v", del)
	}
	e.must(404, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA})
	e.must(404, req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: tokenA})
	if rec, _ := e.au.Record(sb.ID); rec.Status != audit.Done {
		t.Errorf("audit record after delete %+v", rec)
	}
	if live, _, _, _ := e.be.Counts(); live != 1 {
		t.Errorf("%d fake sessions alive, want 1", live)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the deleted sandbox's workspace is still there: %v", err)
	}
}

func TestSandboxRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxTTL = 2 * time.Hour; c.MaxFiles = 2 })
	manyMeta := map[string]string{}
	for i := range 65 {
		manyMeta[strings.Repeat("k", i+1)] = "v"
	}
	tests := []struct {
		name   string
		body   any
		status int
		field  string
	}{
		{name: "bad ttl", body: `{"ttl":"soon"}`, status: 400, field: "ttl"},
		{name: "zero ttl", body: `{"ttl":"0s"}`, status: 400, field: "ttl"},
		{name: "ttl over max", body: `{"ttl":"3h"}`, status: 400, field: "ttl"},
		{name: "unknown field", body: `{"tll":"1m"}`, status: 400, field: "tll"},
		{name: "metadata not strings", body: `{"metadata":{"a":1}}`, status: 400, field: "metadata.a"},
		{name: "metadata too big", body: map[string]any{"metadata": manyMeta}, status: 400, field: "metadata"},
		{name: "metadata value too long", body: map[string]any{"metadata": map[string]string{"a": strings.Repeat("v", 1025)}}, status: 400, field: "metadata.a"},
		{name: "dot-dot file", body: `{"files":[{"path":"../../etc/passwd","content":"x"}]}`, status: 400, field: "files[0].path"},
		{name: "absolute file", body: `{"files":[{"path":"/etc/cron.d/x","content":"x"}]}`, status: 400, field: "files[0].path"},
		{name: "NUL file", body: `{"files":[{"path":"a\u0000","content":"x"}]}`, status: 400, field: "files[0].path"},
		{name: "too many files", body: `{"files":[{"path":"a","content":""},{"path":"b","content":""},{"path":"c","content":""}]}`, status: 413, field: "files"},
		{name: "manifest inputs", body: `{"manifest":{"inputs":[{"src":"/"}]}}`, status: 400, field: "manifest.inputs"},
		{name: "manifest field", body: `{"manifest":{"network":{"mode":"open"}}}`, status: 400, field: "manifest.network.mode"},
		{name: "wrong content type", body: `{}`, status: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rq := req{method: "POST", path: "/v1/sandboxes", token: tokenA, body: tc.body}
			if tc.name == "wrong content type" {
				rq.header = map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
			}
			r := e.do(rq)
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if d := r.errBody(t); d.Field != tc.field {
				t.Errorf("field %q, want %q: %s", d.Field, tc.field, d.Message)
			}
			if _, created, _, _ := e.be.Counts(); created != 0 {
				t.Error("a refused request created a sandbox")
			}
		})
	}
}

func TestSandboxBackendErrors(t *testing.T) {
	e := newEnv(t, nil)
	e.au.FailNextBegin(os.ErrPermission)
	// The audit record cannot be written: the sandbox is destroyed, the
	// key's slot given back.
	e.must(http.StatusInternalServerError, req{method: "POST", path: "/v1/sandboxes", token: tokenA, body: `{}`})
	if live, created, _, _ := e.be.Counts(); live != 0 || created != 1 {
		t.Errorf("live %d created %d after an audit failure", live, created)
	}
	held := e.srv.svc.Held("ka")
	if held != 0 {
		t.Errorf("key holds %d slots after a failed create", held)
	}
}

func TestTTLExpiry(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, map[string]any{"ttl": "50ms"})
	keep := e.createSandbox(tokenA, map[string]any{"ttl": "1h"})
	ex := e.exec(tokenA, sb.ID, map[string]any{"argv": []string{"fake", "block"}, "wait": false}, 202)
	waitFor(t, "the sandbox to expire", func() bool {
		return e.do(req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA}).StatusCode == 404
	})
	waitFor(t, "the fake session to close", func() bool {
		live, _, _, _ := e.be.Counts()
		return live == 1
	})
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + keep.ID, token: tokenA})
	waitFor(t, "audit records to finish", func() bool {
		r1, _ := e.au.Record(sb.ID)
		r2, _ := e.au.Record(sb.ID + "-" + ex.ID)
		return r1.Status == audit.Done && r2.Status == audit.Done
	})
	if r, _ := e.au.Record(sb.ID + "-" + ex.ID); r.Termination != "signaled" {
		t.Errorf("the expired sandbox's command ended %+v", r)
	}
}

// TestDeleting: while a sandbox is being destroyed, other requests on it
// get 409.
func TestDeleting(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	release := e.be.HoldClose()
	deleted := make(chan response, 1)
	go func() { deleted <- e.do(req{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, token: tokenA}) }()
	waitFor(t, "the sandbox to be deleting", func() bool {
		var got Sandbox
		e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA}).decode(t, &got)
		return got.State == StateDeleting
	})
	for _, rq := range []req{
		{method: "DELETE", path: "/v1/sandboxes/" + sb.ID},
		{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", body: `{"argv":["echo"]}`},
		{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/timeout", body: `{"ttl":"1m"}`},
	} {
		rq.token = tokenA
		if r := e.do(rq); r.StatusCode != 409 || r.errBody(t).Code != CodeConflict {
			t.Errorf("%s %s while deleting: %d %s", rq.method, rq.path, r.StatusCode, r.body)
		}
	}
	release()
	if r := <-deleted; r.StatusCode != 200 {
		t.Errorf("delete: %d %s", r.StatusCode, r.body)
	}
}
