package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// TestCells: POST …/cells answers the cell, or streams it as events;
// the kernel routes answer; bad input names the field; another key's
// sandbox is not found.
func TestCells(t *testing.T) {
	if !servicetest.HostPython() {
		t.Skip("needs python3 on the host: the fake backend runs the kernel driver with it")
	}
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	path := "/v1/sandboxes/" + sb.ID
	tests := []struct {
		name   string
		rq     req
		status int
		check  func(t *testing.T, r response)
	}{
		{"first cell", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "x = 41\nprint('hi')\nx + 1"}}, http.StatusOK, func(t *testing.T, r response) {
			var c service.Cell
			r.decode(t, &c)
			if c.Status != service.CellOK || c.Result["text/plain"] != "42" || !c.KernelStarted || len(c.Outputs) != 2 || c.Outputs[0].Text != "hi\n" {
				t.Errorf("cell %+v", c)
			}
		}},
		{"streamed cell", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "print(x)\n1/0"}, header: map[string]string{"Accept": "text/event-stream"}}, http.StatusOK, func(t *testing.T, r response) {
			body := string(r.body)
			for _, want := range []string{"event: stdout\ndata: {\"type\":\"stdout\",\"text\":\"41\\n\"}\n\nid: 2\nevent: error\n", "event: error\n", "ZeroDivisionError", "event: end\n", `"status":"error"`} {
				if !strings.Contains(body, want) {
					t.Errorf("stream %q lacks %q", body, want)
				}
			}
			if ct := r.Header.Get("Content-Type"); ct != "text/event-stream" {
				t.Errorf("Content-Type %q", ct)
			}
		}},
		{"kernel", req{method: "GET", path: path + "/kernel", token: tokenA}, http.StatusOK, func(t *testing.T, r response) {
			var k service.Kernel
			r.decode(t, &k)
			if k.State != "idle" || k.ExecID == "" {
				t.Errorf("kernel %+v", k)
			}
		}},
		{"interrupt with no cell", req{method: "POST", path: path + "/kernel/interrupt", token: tokenA}, http.StatusConflict, nil},
		{"restart", req{method: "POST", path: path + "/kernel/restart", token: tokenA}, http.StatusOK, nil},
		{"state is gone after the restart", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "'x' in globals()"}}, http.StatusOK, func(t *testing.T, r response) {
			var c service.Cell
			r.decode(t, &c)
			if c.Result["text/plain"] != "False" {
				t.Errorf("cell %+v", c)
			}
		}},
		{"create a context", req{method: "POST", path: path + "/contexts", token: tokenA}, http.StatusCreated, func(t *testing.T, r response) {
			var k service.Kernel
			r.decode(t, &k)
			if k.Context != "ctx-1" || k.State != "idle" {
				t.Errorf("context %+v", k)
			}
		}},
		{"a cell in the context", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "'x' in globals()", Context: "ctx-1"}}, http.StatusOK, func(t *testing.T, r response) {
			var c service.Cell
			r.decode(t, &c)
			if c.Result["text/plain"] != "False" || c.Context != "ctx-1" {
				t.Errorf("cell %+v", c)
			}
		}},
		{"list contexts", req{method: "GET", path: path + "/contexts", token: tokenA}, http.StatusOK, func(t *testing.T, r response) {
			var l ContextList
			r.decode(t, &l)
			if len(l.Contexts) != 2 || l.Contexts[1].Context != "ctx-1" {
				t.Errorf("contexts %+v", l)
			}
		}},
		{"the context's kernel", req{method: "GET", path: path + "/kernel?context=ctx-1", token: tokenA}, http.StatusOK, nil},
		{"delete the context", req{method: "DELETE", path: path + "/contexts/ctx-1", token: tokenA}, http.StatusNoContent, nil},
		{"an unknown context", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "1", Context: "ctx-1"}}, http.StatusNotFound, fieldIs("context")},
		{"another key's contexts", req{method: "GET", path: path + "/contexts", token: tokenB}, http.StatusNotFound, nil},
		{"bad language", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "1", Language: "cobol"}}, http.StatusBadRequest, fieldIs("language")},
		{"bad timeout", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "1", Timeout: "soon"}}, http.StatusBadRequest, fieldIs("timeout")},
		{"timeout above the manifest", req{method: "POST", path: path + "/cells", token: tokenA, body: CellRequest{Code: "1", Timeout: "100h"}}, http.StatusBadRequest, fieldIs("timeout")},
		{"unknown field", req{method: "POST", path: path + "/cells", token: tokenA, body: `{"code":"1","kernel":"x"}`}, http.StatusBadRequest, fieldIs("kernel")},
		{"another key's sandbox", req{method: "POST", path: path + "/cells", token: tokenB, body: CellRequest{Code: "1"}}, http.StatusNotFound, nil},
		{"another key's kernel", req{method: "POST", path: path + "/kernel/restart", token: tokenB}, http.StatusNotFound, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rq.body != nil {
				tc.rq.header = withJSON(tc.rq.header)
			}
			r := e.must(tc.status, tc.rq)
			if tc.check != nil {
				tc.check(t, r)
			}
		})
	}
}

func withJSON(h map[string]string) map[string]string {
	out := map[string]string{"Content-Type": "application/json"}
	for k, v := range h {
		out[k] = v
	}
	return out
}

func fieldIs(field string) func(t *testing.T, r response) {
	return func(t *testing.T, r response) {
		t.Helper()
		if d := r.errBody(t); d.Field != field {
			t.Errorf("error %+v, want field %q", d, field)
		}
	}
}
