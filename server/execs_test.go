package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
)

func TestExec(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, `{"manifest":{"resources":{"timeout":"30s"}}}`)
	tests := []struct {
		name     string
		body     string
		status   int
		wantOut  string
		wantErr  string
		wantExit int
		state    string
	}{
		{name: "argv waits by default", body: `{"argv":["fake","out:hello","err:oops","exit:2"]}`, status: 200, wantOut: "hello\n", wantErr: "oops\n", wantExit: 2, state: ExecExited},
		{name: "code", body: `{"code":"print(1)","language":"python"}`, status: 200, wantOut: "python3 -c print(1)\n", state: ExecExited},
		{name: "stdin text", body: `{"argv":["fake","cat"],"stdin":"in put"}`, status: 200, wantOut: "in put", state: ExecExited},
		{name: "env, dir and timeout", body: `{"argv":["echo"],"env":{"A_B":"1"},"dir":"/workspace/src","timeout":"5s"}`, status: 200, wantOut: "echo\n", state: ExecExited},
		{name: "no wait", body: `{"argv":["fake","sleep:50ms","out:late"],"wait":false}`, status: 202, state: ExecRunning},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ex := e.exec(tokenA, sb.ID, tc.body, tc.status)
			if ex.State != tc.state || ex.SandboxID != sb.ID || !strings.HasPrefix(ex.ID, "e-") {
				t.Fatalf("exec %+v", ex)
			}
			if tc.state == ExecRunning {
				if ex.Result != nil {
					t.Error("a running exec has a result")
				}
				ex = e.waitExec(tokenA, sb.ID, ex.ID)
				if ex.Result.Stdout.Data != "late\n" {
					t.Errorf("stdout %q", ex.Result.Stdout.Data)
				}
				return
			}
			if ex.Result == nil || ex.EndedAt == nil {
				t.Fatalf("ended exec without result: %+v", ex)
			}
			if ex.Result.Stdout.Data != tc.wantOut || ex.Result.Stderr.Data != tc.wantErr || ex.Result.ExitCode != tc.wantExit {
				t.Errorf("result stdout %q stderr %q exit %d", ex.Result.Stdout.Data, ex.Result.Stderr.Data, ex.Result.ExitCode)
			}
			rec, ok := e.au.Record(sb.ID + "-" + ex.ID)
			if !ok || rec.Kind != audit.KindExec || rec.SandboxID != sb.ID || rec.Status != audit.Done || rec.ExitCode != tc.wantExit {
				t.Errorf("audit record %+v", rec)
			}
		})
	}
	var list ExecList
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs", token: tokenA}).decode(t, &list)
	if len(list.Execs) != len(tests) {
		t.Errorf("%d execs listed, want %d", len(list.Execs), len(tests))
	}
	var got Sandbox
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID, token: tokenA}).decode(t, &got)
	if got.Execs != len(tests) {
		t.Errorf("sandbox counts %d execs", got.Execs)
	}
	e.must(404, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs/e-99", token: tokenA})
}

func TestExecRefused(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, `{"manifest":{"resources":{"timeout":"10s"}}}`)
	tests := []struct {
		name   string
		body   string
		status int
		field  string
	}{
		{name: "malformed", body: `{"argv":[`, status: 400},
		{name: "unknown field", body: `{"argv":["echo"],"user":"root"}`, status: 400, field: "user"},
		{name: "no command", body: `{}`, status: 400, field: "argv"},
		{name: "timeout over the manifest", body: `{"argv":["echo"],"timeout":"1m"}`, status: 400, field: "timeout"},
		{name: "bad timeout", body: `{"argv":["echo"],"timeout":"soon"}`, status: 400, field: "timeout"},
		{name: "bad env name", body: `{"argv":["echo"],"env":{"1X":"a"}}`, status: 400, field: "env.1X"},
		{name: "env NUL", body: `{"argv":["echo"],"env":{"X":"a\u0000"}}`, status: 400, field: "env.X"},
		{name: "relative dir", body: `{"argv":["echo"],"dir":"src"}`, status: 400, field: "dir"},
		{name: "stdin with stdin_open", body: `{"argv":["echo"],"stdin":"x","stdin_open":true}`, status: 400, field: "stdin"},
		{name: "wait not a bool", body: `{"argv":["echo"],"wait":"no"}`, status: 400, field: "wait"},
		{name: "tty of zero rows", body: `{"argv":["sh"],"tty":{"rows":0,"cols":80}}`, status: 400, field: "tty"},
		{name: "tty too wide", body: `{"argv":["sh"],"tty":{"rows":24,"cols":100000}}`, status: 400, field: "tty"},
		{name: "tty rows not a number", body: `{"argv":["sh"],"tty":{"rows":"24","cols":80}}`, status: 400, field: "tty.rows"},
		{name: "tty rows a fraction", body: `{"argv":["sh"],"tty":{"rows":2.5,"cols":80}}`, status: 400, field: "tty.rows"},
		{name: "tty unknown field", body: `{"argv":["sh"],"tty":{"rows":24,"cols":80,"height":9}}`, status: 400, field: "tty.height"},
		{name: "engine refuses", body: `{"argv":["fail-start"]}`, status: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs", token: tokenA, body: tc.body})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if d := r.errBody(t); d.Field != tc.field {
				t.Errorf("field %q, want %q: %s", d.Field, tc.field, d.Message)
			}
		})
	}
	var list ExecList
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs", token: tokenA}).decode(t, &list)
	if len(list.Execs) != 0 {
		t.Errorf("refused requests left execs: %+v", list.Execs)
	}
}

func TestExecSignal(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	tests := []struct {
		name, signal string
		want         int
	}{
		{"full name", `"SIGTERM"`, 15},
		{"short name", `"TERM"`, 15},
		{"lower case", `"sigkill"`, 9},
		{"number", `15`, 15},
		{"number as text", `"2"`, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ex := e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
			path := "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal"
			e.must(200, req{method: "POST", path: path, token: tokenA, body: `{"signal":` + tc.signal + `}`})
			ex = e.waitExec(tokenA, sb.ID, ex.ID)
			if ex.Result.Termination != result.Signaled || ex.Result.Signal != tc.want {
				t.Errorf("ended %+v, want signal %d", ex.Result, tc.want)
			}
			r := e.must(409, req{method: "POST", path: path, token: tokenA, body: `{"signal":"KILL"}`})
			if r.errBody(t).Code != CodeConflict {
				t.Errorf("signal after the end: %s", r.body)
			}
		})
	}
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
	path := "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal"
	for _, bad := range []string{`{"signal":"SIGNOPE"}`, `{"signal":0}`, `{"signal":99}`, `{"signal":true}`, `{}`, `{"sig":"TERM"}`} {
		r := e.do(req{method: "POST", path: path, token: tokenA, body: bad})
		if r.StatusCode != 400 {
			t.Errorf("signal %s: %d %s", bad, r.StatusCode, r.body)
		}
	}
	e.must(200, req{method: "POST", path: path, token: tokenA, body: `{"signal":"KILL"}`})
	e.waitExec(tokenA, sb.ID, ex.ID)
}

// TestExecTTY starts a command with a terminal and resizes it; every
// refusal names its field.
func TestExecTTY(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","tty","winch"],"tty":{"rows":24,"cols":80},"wait":false}`, 202)
	if ex.TTY == nil || *ex.TTY != (service.TTYSize{Rows: 24, Cols: 80}) {
		t.Fatalf("exec tty %+v, want 24x80", ex.TTY)
	}
	path := "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/resize"
	for _, bad := range []struct{ body, field string }{
		{`{"rows":0,"cols":80}`, "size"},
		{`{"rows":24}`, "size"},
		{`{"rows":-1,"cols":80}`, "size"},
		{`{"rows":24,"cols":1001}`, "size"},
		{`{"rows":"24","cols":80}`, "rows"},
		{`{"rows":1e100,"cols":80}`, "rows"},
		{`{"row":24,"cols":80}`, "row"},
	} {
		r := e.do(req{method: "POST", path: path, token: tokenA, body: bad.body})
		if r.StatusCode != 400 || r.errBody(t).Field != bad.field {
			t.Errorf("resize %s: %d %s, want 400 naming %s", bad.body, r.StatusCode, r.body, bad.field)
		}
	}
	e.must(404, req{method: "POST", path: path, token: tokenB, body: `{"rows":40,"cols":132}`})
	e.must(404, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/e-99/resize", token: tokenA, body: `{"rows":40,"cols":132}`})
	var got Exec
	e.must(200, req{method: "POST", path: path, token: tokenA, body: `{"rows":40,"cols":132}`}).decode(t, &got)
	if got.TTY == nil || *got.TTY != (service.TTYSize{Rows: 40, Cols: 132}) {
		t.Errorf("after resize: tty %+v, want 40x132", got.TTY)
	}
	ex = e.waitExec(tokenA, sb.ID, ex.ID)
	if ex.Result.Stdout.Data != "24 80\r\n40 132\r\n" {
		t.Errorf("stdout %q: want the size before and after the resize", ex.Result.Stdout.Data)
	}
	r := e.must(409, req{method: "POST", path: path, token: tokenA, body: `{"rows":10,"cols":10}`})
	if !strings.Contains(r.errBody(t).Message, "ended") {
		t.Errorf("resize after the end: %s", r.body)
	}
	plain := e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
	r = e.must(409, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + plain.ID + "/resize", token: tokenA, body: `{"rows":10,"cols":10}`})
	if !strings.Contains(r.errBody(t).Message, "terminal") {
		t.Errorf("resize without a terminal: %s", r.body)
	}
	e.must(200, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + plain.ID + "/signal", token: tokenA, body: `{"signal":"KILL"}`})
	e.waitExec(tokenA, sb.ID, plain.ID)
}

func TestExecStdin(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","cat","out:done"],"stdin_open":true,"wait":false}`, 202)
	if !ex.StdinOpen {
		t.Errorf("exec %+v", ex)
	}
	path := "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/stdin"
	var sr StdinResult
	e.must(200, req{method: "POST", path: path, token: tokenA, body: "hello "}).decode(t, &sr)
	if sr.Written != 6 || sr.Closed {
		t.Errorf("stdin answered %+v", sr)
	}
	e.must(200, req{method: "POST", path: path + "?eof=1", token: tokenA, body: "world"}).decode(t, &sr)
	if sr.Written != 5 || !sr.Closed {
		t.Errorf("stdin answered %+v", sr)
	}
	ex = e.waitExec(tokenA, sb.ID, ex.ID)
	if ex.Result.Stdout.Data != "hello worlddone\n" {
		t.Errorf("stdout %q", ex.Result.Stdout.Data)
	}
	e.must(409, req{method: "POST", path: path, token: tokenA, body: "more"})
	e.must(400, req{method: "POST", path: path + "?eof=maybe", token: tokenA, body: ""})

	closed := e.exec(tokenA, sb.ID, `{"argv":["fake","block"],"wait":false}`, 202)
	e.must(409, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + closed.ID + "/stdin", token: tokenA, body: "x"})
	e.must(404, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/e-99/stdin", token: tokenA, body: "x"})
}

// sseEvent is one parsed Server-Sent Event.
type sseEvent struct {
	id    int
	event string
	data  string
}

func sseScanner(resp *http.Response) *bufio.Scanner {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return sc
}

// readEvents reads the stream until it ends, or until stop says so.
func readEvents(t *testing.T, sc *bufio.Scanner, stop func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if cur.event != "" {
				out = append(out, cur)
				if stop != nil && stop(cur) {
					return out
				}
			}
			cur = sseEvent{}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			cur.id, _ = strconv.Atoi(line[4:])
		case strings.HasPrefix(line, "event: "):
			cur.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			cur.data = line[6:]
		default:
			t.Fatalf("unexpected stream line %q", line)
		}
	}
	return out
}

func (e *env) openEvents(ctx context.Context, token, sbID, eid string, header map[string]string, query string) *http.Response {
	e.t.Helper()
	hr, _ := http.NewRequestWithContext(ctx, "GET", e.hs.URL+"/v1/sandboxes/"+sbID+"/execs/"+eid+"/events"+query, nil)
	hr.Header.Set("Authorization", "Bearer "+token)
	for k, v := range header {
		hr.Header.Set(k, v)
	}
	resp, err := e.hs.Client().Do(hr)
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		e.t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

func TestEventsResume(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	// Alternating streams make one event each.
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","out:a","err:b","out:c","raw:ff","err:d"]}`, 200)
	resp := e.openEvents(context.Background(), tokenA, sb.ID, ex.ID, nil, "")
	all := readEvents(t, sseScanner(resp), nil)
	resp.Body.Close()
	want := []struct{ event, data string }{
		{"stdout", `{"data":"a\n","encoding":"utf-8"}`},
		{"stderr", `{"data":"b\n","encoding":"utf-8"}`},
		{"stdout", `{"data":"Ywr/","encoding":"base64"}`}, // "c\n" and 0xff merged: not UTF-8
		{"stderr", `{"data":"d\n","encoding":"utf-8"}`},
	}
	if len(all) != len(want)+1 {
		t.Fatalf("events %+v", all)
	}
	for i, w := range want {
		if all[i].id != i+1 || all[i].event != w.event || all[i].data != w.data {
			t.Errorf("event %d = %+v, want %+v", i+1, all[i], w)
		}
	}
	exit := all[len(all)-1]
	var done Exec
	if err := json.Unmarshal([]byte(exit.data), &done); err != nil || exit.event != "exit" || exit.id != len(want)+1 || done.State != ExecExited || done.Result == nil {
		t.Errorf("exit event %+v (%v)", exit, err)
	}

	for after := 0; after <= len(all)+1; after++ {
		for _, how := range []string{"header", "query"} {
			t.Run(fmt.Sprintf("%s after %d", how, after), func(t *testing.T) {
				var resp *http.Response
				if how == "header" {
					resp = e.openEvents(context.Background(), tokenA, sb.ID, ex.ID, map[string]string{"Last-Event-ID": strconv.Itoa(after)}, "")
				} else {
					resp = e.openEvents(context.Background(), tokenA, sb.ID, ex.ID, nil, "?after="+strconv.Itoa(after))
				}
				defer resp.Body.Close()
				got := readEvents(t, sseScanner(resp), nil)
				rest := all[min(after, len(all)):]
				if fmt.Sprint(got) != fmt.Sprint(rest) {
					t.Errorf("after %d got %+v, want %+v", after, got, rest)
				}
			})
		}
	}
	e.must(400, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/events?after=-1", token: tokenA})
	e.must(400, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/events", token: tokenA, header: map[string]string{"Last-Event-ID": "x"}})
}

// TestEventsDisconnect: a client that goes away mid-stream stops neither
// the command nor leaks its stream; reconnecting gets exactly what it
// missed.
func TestEventsDisconnect(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","out:first","block","out:second"],"stdin_open":false,"wait":false}`, 202)

	ctx, cancel := context.WithCancel(context.Background())
	resp := e.openEvents(ctx, tokenA, sb.ID, ex.ID, nil, "")
	first := readEvents(t, sseScanner(resp), func(sseEvent) bool { return true })
	if len(first) != 1 || first[0].data != `{"data":"first\n","encoding":"utf-8"}` {
		t.Fatalf("first events %+v", first)
	}
	cancel()
	resp.Body.Close()
	waitFor(t, "the stream to end", func() bool { return e.srv.streams.Load() == 0 })

	var now Exec
	e.must(200, req{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID, token: tokenA}).decode(t, &now)
	if now.State != ExecRunning {
		t.Fatalf("the command stopped with its client: %+v", now)
	}
	e.must(200, req{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/signal", token: tokenA, body: `{"signal":"TERM"}`})

	resp = e.openEvents(context.Background(), tokenA, sb.ID, ex.ID, map[string]string{"Last-Event-ID": strconv.Itoa(first[0].id)}, "")
	rest := readEvents(t, sseScanner(resp), nil)
	resp.Body.Close()
	// The fake is killed inside "block": no "second".
	if len(rest) != 1 || rest[0].event != "exit" || rest[0].id != 2 {
		t.Errorf("after reconnecting %+v", rest)
	}
}

// TestEventsLive follows a command while it writes.
func TestEventsLive(t *testing.T) {
	e := newEnv(t, nil)
	sb := e.createSandbox(tokenA, nil)
	ex := e.exec(tokenA, sb.ID, `{"argv":["fake","cat"],"stdin_open":true,"wait":false}`, 202)
	resp := e.openEvents(context.Background(), tokenA, sb.ID, ex.ID, nil, "")
	defer resp.Body.Close()
	stdin := "/v1/sandboxes/" + sb.ID + "/execs/" + ex.ID + "/stdin"
	sc := sseScanner(resp)
	e.must(200, req{method: "POST", path: stdin, token: tokenA, body: "one"})
	got := readEvents(t, sc, func(sseEvent) bool { return true })
	if got[0].data != `{"data":"one","encoding":"utf-8"}` {
		t.Errorf("first live event %+v", got)
	}
	e.must(200, req{method: "POST", path: stdin + "?eof=1", token: tokenA, body: "two"})
	got = readEvents(t, sc, nil)
	if len(got) != 2 || got[0].data != `{"data":"two","encoding":"utf-8"}` || got[0].id != 2 || got[1].event != "exit" {
		t.Errorf("later events %+v", got)
	}
}
