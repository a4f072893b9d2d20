package e2b

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// TestTemplateImageOn: the code interpreter's templates run on the image
// code-interpreter when the store has it, else on Moat's default image;
// base and others as before.
func TestTemplateImageOn(t *testing.T) {
	has := func(images ...string) func(string) bool {
		return func(name string) bool { return slices.Contains(images, name) }
	}
	tests := []struct {
		name     string
		template string
		has      func(string) bool
		want     string
	}{
		{"code-interpreter-v1 with its image", "code-interpreter-v1", has("code-interpreter"), "code-interpreter"},
		{"code-interpreter-v1 without its image is the default", "code-interpreter-v1", has("base"), "python"},
		{"code-interpreter with its image", "code-interpreter", has("code-interpreter", "base"), "code-interpreter"},
		{"code-interpreter without its image is the default", "code-interpreter", has(), "python"},
		{"base without base, with code-interpreter", "base", has("code-interpreter"), "python"},
		{"base with base", "base", has("base"), "base"},
		{"a name like it is its own image", "code-interpreter-v2", has("code-interpreter"), "code-interpreter-v2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := templateImageOn(tc.template, tc.has); got != tc.want {
				t.Errorf("templateImageOn(%q) = %q, want %q", tc.template, got, tc.want)
			}
		})
	}
}

// TestCreateCodeInterpreterTemplate: create maps the template through the
// store (the fake backend refuses an image it lacks, so a 201 proves the
// image), and the sandbox keeps the template's name.
func TestCreateCodeInterpreterTemplate(t *testing.T) {
	has := func(images ...string) func(string) bool {
		return func(name string) bool { return slices.Contains(images, name) }
	}
	tests := []struct {
		name     string
		images   []string
		hasImage func(string) bool
		template string
		want     int
	}{
		{"v1 on code-interpreter", []string{"code-interpreter"}, has("code-interpreter"), "code-interpreter-v1", http.StatusCreated},
		{"v1 on python without the image", []string{"python"}, has("python"), "code-interpreter-v1", http.StatusCreated},
		{"old name on code-interpreter", []string{"code-interpreter"}, has("code-interpreter"), "code-interpreter", http.StatusCreated},
		{"v1 falls back to python, which this backend lacks", []string{"code-interpreter"}, has(), "code-interpreter-v1", http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvWith(t, tc.images, tc.hasImage)
			status, data := e.control("POST", "/v2/sandboxes", keyA, `{"templateID":"`+tc.template+`"}`)
			if status != tc.want {
				t.Fatalf("create: %d %s, want %d", status, data, tc.want)
			}
			if status != http.StatusCreated {
				return
			}
			var c created
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			if c.TemplateID != tc.template {
				t.Errorf("templateID = %q, want %q", c.TemplateID, tc.template)
			}
		})
	}
}

// TestJupyterLines: kernel outputs as the code interpreter's lines.
func TestJupyterLines(t *testing.T) {
	now := time.Unix(1700000000, 5)
	tests := []struct {
		name string
		out  service.CellOutput
		want string
	}{
		{"stdout", service.CellOutput{Type: "stdout", Text: "hi\n"}, `{"text":"hi\n","timestamp":1700000000000000005,"type":"stdout"}`},
		{"stderr", service.CellOutput{Type: "stderr", Text: "oops"}, `{"text":"oops","timestamp":1700000000000000005,"type":"stderr"}`},
		{"main result", service.CellOutput{Type: "result", Data: map[string]string{"text/plain": "2"}}, `{"is_main_result":true,"text":"2","type":"result"}`},
		{"display with html and png", service.CellOutput{Type: "display", Data: map[string]string{"text/plain": "<x>", "text/html": "<b>x</b>", "image/png": "iVBO"}},
			`{"html":"<b>x</b>","is_main_result":false,"png":"iVBO","text":"<x>","type":"result"}`},
		{"json is a value", service.CellOutput{Type: "result", Data: map[string]string{"application/json": `{"a":[1,2]}`}}, `{"is_main_result":true,"json":{"a":[1,2]},"type":"result"}`},
		{"json that is not JSON stays text", service.CellOutput{Type: "result", Data: map[string]string{"application/json": `{nope`}}, `{"is_main_result":true,"json":"{nope","type":"result"}`},
		{"unknown MIME keeps its name", service.CellOutput{Type: "display", Data: map[string]string{"application/vnd.x+json": "1"}}, `{"application/vnd.x+json":"1","is_main_result":false,"type":"result"}`},
		{"a MIME named type cannot replace the line's type", service.CellOutput{Type: "display", Data: map[string]string{"type": "stdout"}}, `{"is_main_result":false,"type":"result"}`},
		{"error: traceback is one string", service.CellOutput{Type: "error", Error: &service.CellErrorInfo{Name: "ValueError", Value: "bad", Traceback: []string{"Traceback:", "  line 1"}}},
			`{"name":"ValueError","traceback":"Traceback:\n  line 1","type":"error","value":"bad"}`},
		{"error without its info is nothing", service.CellOutput{Type: "error"}, `null`},
		{"unknown type is nothing", service.CellOutput{Type: "status"}, `null`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			line := outputLine(&tc.out, now)
			var got []byte
			if line == nil {
				got = []byte("null")
			} else {
				var err error
				if got, err = json.Marshal(line); err != nil {
					t.Fatal(err)
				}
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &w); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g, w) {
				t.Errorf("line = %s\nwant   %s", got, tc.want)
			}
		})
	}
	ends := []struct {
		name string
		cell service.Cell
		want []string
	}{
		{"counted", service.Cell{ID: "c-3", Status: service.CellOK}, []string{"number_of_executions", "end_of_execution"}},
		{"kernel died", service.Cell{ID: "c-1", Status: service.CellKernelDied}, []string{"number_of_executions", "unexpected_end_of_execution", "end_of_execution"}},
		{"an id without a count", service.Cell{ID: "x", Status: service.CellOK}, []string{"end_of_execution"}},
	}
	for _, tc := range ends {
		t.Run("end "+tc.name, func(t *testing.T) {
			var got []string
			for _, l := range endLines(&tc.cell) {
				got = append(got, l["type"].(string))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("end lines %v, want %v", got, tc.want)
			}
		})
	}
}

// jupyterEnv is an env whose kernel runs: the fake backend runs the
// kernel driver with the host's python3.
func jupyterEnv(t *testing.T) *env {
	t.Helper()
	if !servicetest.HostPython() {
		t.Skip("needs python3 on the host: the fake backend runs the kernel driver with it")
	}
	return newEnv(t)
}

// jupyterHeaders address port 49999 of c in header mode with both of the
// SDK's tokens, as runCode sends them.
func jupyterHeaders(c created) map[string]string {
	h := map[string]string{"E2b-Sandbox-Id": c.SandboxID, "E2b-Sandbox-Port": JupyterPort, "X-Access-Token": c.EnvdAccessToken, "Content-Type": "application/json"}
	if c.TrafficAccessToken != nil {
		h[TrafficHeader] = *c.TrafficAccessToken
	}
	return h
}

// execute runs code as runCode does and returns the lines.
func (e *env) execute(hdr map[string]string, body string) (int, []map[string]any, []byte) {
	e.t.Helper()
	resp, data := e.do("POST", "/execute", hdr, strings.NewReader(body))
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil, data
	}
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			e.t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	return resp.StatusCode, lines, data
}

func linesOf(lines []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, l := range lines {
		if l["type"] == typ {
			out = append(out, l)
		}
	}
	return out
}

// TestJupyterExecute drives /execute as @e2b/code-interpreter does: state
// kept between cells, outputs in order, errors with their traceback, the
// end line last, in both addressing modes; bad requests refused naming
// what is wrong.
func TestJupyterExecute(t *testing.T) {
	e := jupyterEnv(t)
	a := e.create(keyA, `{"templateID":"code-interpreter-v1","timeout":120}`)
	hdr := jupyterHeaders(a)
	code := func(c string) string {
		data, _ := json.Marshal(map[string]any{"code": c})
		return string(data)
	}
	if status, _, data := e.execute(hdr, code("x = 1")); status != 200 {
		t.Fatalf("x = 1: %d %s", status, data)
	}
	hostMode := map[string]string{"Host": JupyterPort + "-" + a.SandboxID + ".moat.test", TrafficHeader: *a.TrafficAccessToken}
	status, lines, data := e.execute(hostMode, code("print('out'); import sys; print('err', file=sys.stderr); x + 1"))
	if status != 200 {
		t.Fatalf("x + 1 (host mode, traffic token only): %d %s", status, data)
	}
	if r := linesOf(lines, "result"); len(r) != 1 || r[0]["text"] != "2" || r[0]["is_main_result"] != true {
		t.Errorf("results %v, want one main result with text 2 (state kept)", r)
	}
	for stream, want := range map[string]string{"stdout": "out\n", "stderr": "err\n"} {
		// A stream's writes may come as more than one line.
		var got strings.Builder
		for _, o := range linesOf(lines, stream) {
			got.WriteString(o["text"].(string))
			if _, ok := o["timestamp"].(float64); !ok {
				t.Errorf("%s line %v has no timestamp", stream, o)
			}
		}
		if got.String() != want {
			t.Errorf("%s %q, want %q", stream, got.String(), want)
		}
	}
	if n := linesOf(lines, "number_of_executions"); len(n) != 1 || n[0]["execution_count"] != 2.0 {
		t.Errorf("number_of_executions %v, want 2", n)
	}
	if last := lines[len(lines)-1]; last["type"] != "end_of_execution" {
		t.Errorf("last line %v, want end_of_execution", last)
	}
	_, lines, _ = e.execute(hdr, code("def f():\n    raise ValueError('bad value')\nf()"))
	errs := linesOf(lines, "error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad value" {
		t.Fatalf("error lines %v, want ValueError: bad value", errs)
	}
	if tb, _ := errs[0]["traceback"].(string); !strings.Contains(tb, "ValueError") || !strings.Contains(tb, "\n") {
		t.Errorf("traceback %q, want the lines joined into one string", tb)
	}
	_, lines, _ = e.execute(hdr, code("class H:\n    def _repr_html_(self): return '<b>hi</b>'\ndisplay(H())"))
	if d := linesOf(lines, "result"); len(d) != 1 || d[0]["html"] != "<b>hi</b>" || d[0]["is_main_result"] != false {
		t.Errorf("display lines %v, want html <b>hi</b>, not the main result", d)
	}

	other := e.create(keyB, `{"templateID":"code-interpreter-v1","timeout":120}`)
	pub := e.create(keyA, `{"templateID":"code-interpreter-v1","timeout":120,"network":{"allowPublicTraffic":true}}`)
	bad := []struct {
		name    string
		hdr     map[string]string
		body    string
		want    int
		wantMsg string
	}{
		{"bad JSON", hdr, `{"code":`, 400, "not the JSON"},
		{"no code", hdr, `{"language":"python"}`, 400, "code is missing"},
		{"context and language", hdr, `{"code":"1","context_id":"default","language":"python"}`, 400, "both given"},
		{"unknown context", hdr, `{"code":"1","context_id":"ctx-99"}`, 404, `Context "ctx-99" not found`},
		{"another language", hdr, `{"code":"1","language":"r"}`, 404, `language "r" has no kernel`},
		{"env vars", hdr, `{"code":"1","env_vars":{"A":"1"}}`, 400, "env_vars"},
		{"no token", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": JupyterPort}, code("1"), 401, "traffic"},
		{"another key's sandbox's token", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": JupyterPort, "X-Access-Token": other.EnvdAccessToken, TrafficHeader: *other.TrafficAccessToken}, code("1"), 401, ""},
		{"public sandbox without a token", map[string]string{"E2b-Sandbox-Id": pub.SandboxID, "E2b-Sandbox-Port": JupyterPort}, code("1"), 401, "allowPublicTraffic"},
		{"no such sandbox", map[string]string{"E2b-Sandbox-Id": "nosuch", "E2b-Sandbox-Port": JupyterPort, "X-Access-Token": a.EnvdAccessToken}, code("1"), 502, "not found"},
		{"another path", hdr, `{}`, 404, "not a path"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			path := "/execute"
			if tc.name == "another path" {
				path = "/kernels"
			}
			resp, data := e.do("POST", path, tc.hdr, strings.NewReader(tc.body))
			if resp.StatusCode != tc.want || !strings.Contains(string(data), tc.wantMsg) {
				t.Errorf("%d %s, want %d naming %q", resp.StatusCode, data, tc.want, tc.wantMsg)
			}
		})
	}
	// A public sandbox's code interpreter with its envd token, as runCode
	// sends it.
	if status, lines, data := e.execute(jupyterHeaders(pub), code("40 + 2")); status != 200 || len(linesOf(lines, "result")) != 1 || linesOf(lines, "result")[0]["text"] != "42" {
		t.Errorf("public sandbox with its envd token: %d %s", status, data)
	}
}

// TestJupyterContexts: contexts are the kernel's: made, listed, isolated,
// restarted, removed; bad ones refused.
func TestJupyterContexts(t *testing.T) {
	e := jupyterEnv(t)
	a := e.create(keyA, `{"templateID":"code-interpreter-v1","timeout":120}`)
	hdr := jupyterHeaders(a)
	// createCodeContext sends the traffic token only.
	ctxHdr := map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": JupyterPort, TrafficHeader: *a.TrafficAccessToken, "Content-Type": "application/json"}
	resp, data := e.do("POST", "/contexts", ctxHdr, strings.NewReader(`{"cwd":"/home/user"}`))
	var c jupyterContext
	if resp.StatusCode != 200 || json.Unmarshal(data, &c) != nil || c.ID == "" || c.Language != "python" || c.Cwd != "/home/user" {
		t.Fatalf("create context: %d %s", resp.StatusCode, data)
	}
	run := func(body string) []map[string]any {
		t.Helper()
		status, lines, data := e.execute(hdr, body)
		if status != 200 {
			t.Fatalf("execute %s: %d %s", body, status, data)
		}
		return lines
	}
	run(`{"code":"y = 'default'"}`)
	run(`{"code":"y = 'mine'","context_id":"` + c.ID + `"}`)
	if r := linesOf(run(`{"code":"y","context_id":"`+c.ID+`"}`), "result"); len(r) != 1 || r[0]["text"] != "'mine'" {
		t.Errorf("y in the new context: %v, want 'mine'", r)
	}
	if r := linesOf(run(`{"code":"y","language":"python"}`), "result"); len(r) != 1 || r[0]["text"] != "'default'" {
		t.Errorf("y in the default context: %v, want 'default'", r)
	}
	resp, data = e.do("GET", "/contexts", ctxHdr, nil)
	var list []jupyterContext
	if resp.StatusCode != 200 || json.Unmarshal(data, &list) != nil || len(list) != 2 || list[0].ID != service.DefaultContext || list[1].ID != c.ID {
		t.Errorf("list: %d %s, want default and %s", resp.StatusCode, data, c.ID)
	}
	if resp, data := e.do("POST", "/contexts/"+c.ID+"/restart", ctxHdr, nil); resp.StatusCode != 204 {
		t.Fatalf("restart: %d %s", resp.StatusCode, data)
	}
	if errs := linesOf(run(`{"code":"y","context_id":"`+c.ID+`"}`), "error"); len(errs) != 1 || errs[0]["name"] != "NameError" {
		t.Errorf("y after restart: %v, want NameError", errs)
	}
	if resp, data := e.do("DELETE", "/contexts/"+c.ID, ctxHdr, nil); resp.StatusCode != 204 {
		t.Fatalf("remove: %d %s", resp.StatusCode, data)
	}
	bad := []struct {
		name, method, path, body string
		hdr                      map[string]string
		want                     int
		wantMsg                  string
	}{
		{"removed context", "POST", "/execute", `{"code":"1","context_id":"` + c.ID + `"}`, hdr, 404, "not found"},
		{"remove it again", "DELETE", "/contexts/" + c.ID, "", ctxHdr, 404, c.ID},
		{"restart unknown", "POST", "/contexts/ctx-99/restart", "", ctxHdr, 404, "ctx-99"},
		{"remove default", "DELETE", "/contexts/default", "", ctxHdr, 400, "default context cannot be deleted"},
		{"another language", "POST", "/contexts", `{"language":"javascript"}`, ctxHdr, 404, `"javascript" has no kernel`},
		{"another cwd", "POST", "/contexts", `{"cwd":"/tmp"}`, ctxHdr, 400, `cwd "/tmp"`},
		{"bad JSON", "POST", "/contexts", `[`, ctxHdr, 400, "not the JSON"},
		{"bad method", "PUT", "/contexts", "", ctxHdr, 405, "PUT"},
		{"deeper path", "POST", "/contexts/default/restart/now", "", ctxHdr, 404, "not a path"},
		{"no token", "GET", "/contexts", "", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "E2b-Sandbox-Port": JupyterPort}, 401, ""},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			resp, data := e.do(tc.method, tc.path, tc.hdr, strings.NewReader(tc.body))
			if resp.StatusCode != tc.want || !strings.Contains(string(data), tc.wantMsg) {
				t.Errorf("%d %s, want %d naming %q", resp.StatusCode, data, tc.want, tc.wantMsg)
			}
		})
	}
}

// TestJupyterClientLeaves: a client that leaves (runCode's timeoutMs)
// has its cell interrupted, and the context, with its state, runs the
// next cell.
func TestJupyterClientLeaves(t *testing.T) {
	e := jupyterEnv(t)
	a := e.create(keyA, `{"templateID":"code-interpreter-v1","timeout":120}`)
	hdr := jupyterHeaders(a)
	if status, _, data := e.execute(hdr, `{"code":"kept = 7"}`); status != 200 {
		t.Fatalf("kept = 7: %d %s", status, data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/execute", strings.NewReader(`{"code":"import time\nprint('started', flush=True)\ntime.sleep(60)"}`))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	start := time.Now()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body) // until the deadline cuts it
		resp.Body.Close()
	}
	// Without the interrupt the sleeping cell holds the context for 60 s
	// and the next cell is refused as a conflict.
	var lines []map[string]any
	var status int
	var data []byte
	for {
		status, lines, data = e.execute(hdr, `{"code":"kept"}`)
		if status == 200 || time.Since(start) > 30*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status != 200 {
		t.Fatalf("the next cell: %d %s, want it to run once the left cell is interrupted", status, data)
	}
	if r := linesOf(lines, "result"); len(r) != 1 || r[0]["text"] != "7" {
		t.Errorf("kept after the interrupt: %v, want 7 (the kernel and its state survive)", lines)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the next cell ran after %s", d)
	}
}

// FuzzJupyterLines: whatever bundle or error a kernel sends (from inside
// the sandbox), its line is one line of JSON whose type is the kernel
// output's and whose is_main_result is the host's.
func FuzzJupyterLines(f *testing.F) {
	f.Add("text/plain", "2", "ValueError", "bad", "Traceback\n  line 1")
	f.Add("application/json", `{"a":[1,2]}`, "", "", "")
	f.Add("application/json", `{nope`, "E\n", "v\r\n", "")
	f.Add("type", "stdout", "is_main_result", "x", "\u2028")
	f.Add("image/png", "iVBORw0KGgo=", "KeyboardInterrupt", "", "")
	f.Fuzz(func(t *testing.T, mime, value, name, evalue, tb string) {
		for _, o := range []service.CellOutput{
			{Type: "result", Data: map[string]string{mime: value, "text/plain": value}},
			{Type: "display", Data: map[string]string{mime: value}},
			{Type: "error", Error: &service.CellErrorInfo{Name: name, Value: evalue, Traceback: strings.Split(tb, "\n")}},
			{Type: "stdout", Text: value},
		} {
			line := outputLine(&o, time.Now())
			if line == nil {
				t.Fatalf("%s output gave no line", o.Type)
			}
			data, err := json.Marshal(line)
			if err != nil {
				t.Fatalf("%s line does not encode: %v", o.Type, err)
			}
			if bytes.ContainsAny(data, "\n\r") {
				t.Fatalf("%s line %q is more than one line", o.Type, data)
			}
			var back map[string]any
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatalf("%s line %q is not JSON: %v", o.Type, data, err)
			}
			want := o.Type
			if want == "display" {
				want = "result"
			}
			if back["type"] != want {
				t.Fatalf("%s line has type %v", o.Type, back["type"])
			}
			if o.Type == "result" || o.Type == "display" {
				if back["is_main_result"] != (o.Type == "result") {
					t.Fatalf("%s line has is_main_result %v", o.Type, back["is_main_result"])
				}
			}
		}
	})
}
