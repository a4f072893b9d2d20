package e2b

import (
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestAutoPause: autoPause (lifecycle.onTimeout 'pause') on create is
// honoured filesystem-only, and the answer says so; a memory snapshot or
// auto-resume is refused. A sandbox that times out is then paused, listed
// as paused, and connect resumes it with its files.
func TestAutoPause(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name, body string
		status     int
		onTimeout  string // the lifecycle GET reports
		notice     bool   // the autoPause notice is sent
	}{
		{"autoPause", `{"templateID":"base","timeout":60,"autoPause":true}`, 201, "pause", true},
		{"autoPause filesystem-only", `{"templateID":"base","timeout":60,"autoPause":true,"autoPauseMemory":false}`, 201, "pause", false},
		{"autoPause false", `{"templateID":"base","timeout":60,"autoPause":false}`, 201, "kill", false},
		{"unset", `{"templateID":"base","timeout":60}`, 201, "kill", false},
		{"memory", `{"templateID":"base","autoPause":true,"autoPauseMemory":true}`, 400, "", false},
		{"memory without autoPause", `{"templateID":"base","autoPauseMemory":false}`, 400, "", false},
		{"autoResume", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`, 400, "", false},
		{"malformed", `{"templateID":"base","autoPause":"yes"}`, 400, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("POST", "/v2/sandboxes", map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"}, strings.NewReader(tc.body))
			if tc.status != http.StatusCreated {
				wantE2BError(t, tc.name, resp.StatusCode, body, tc.status)
				return
			}
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if got := strings.Contains(resp.Header.Get(NoticeHeader), "paused filesystem-only"); got != tc.notice {
				t.Errorf("notice %q, want the autoPause notice %v", resp.Header.Get(NoticeHeader), tc.notice)
			}
			var c created
			json.Unmarshal(body, &c)
			_, body = e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
			var l listed
			if err := json.Unmarshal(body, &l); err != nil || l.Lifecycle.OnTimeout != tc.onTimeout || l.Lifecycle.AutoResume {
				t.Errorf("lifecycle %+v (%v), want onTimeout %s", l.Lifecycle, err, tc.onTimeout)
			}
			e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
		})
	}

	t.Run("times out paused, connect resumes", func(t *testing.T) {
		c := e.create(keyA, `{"templateID":"base","timeout":1,"autoPause":true}`)
		if err := os.WriteFile(e.session(c.SandboxID).Dir()+"/kept.txt", []byte("kept"), 0o644); err != nil {
			t.Fatal(err)
		}
		var l listed
		for deadline := time.Now().Add(20 * time.Second); l.State != "paused"; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not paused after its timeout: %+v", l)
			}
			status, body := e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
			if status != http.StatusOK {
				t.Fatalf("an auto-paused sandbox: %d %s", status, body)
			}
			json.Unmarshal(body, &l)
		}
		if status, body := e.control("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", keyB, `{"timeout":60}`); status != http.StatusNotFound {
			t.Errorf("another key's connect resumed it: %d %s", status, body)
		}
		status, body := e.control("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", keyA, `{"timeout":60}`)
		if status != http.StatusOK && status != http.StatusCreated {
			t.Fatalf("connect: %d %s", status, body)
		}
		if !e.alive("ka", c.SandboxID) {
			t.Fatal("connect did not resume the auto-paused sandbox")
		}
		// The files are there, through envd with the old token.
		if code, m := e.unary(c, "filesystem.Filesystem/Stat", map[string]any{"path": "/workspace/kept.txt"}); code != http.StatusOK {
			t.Errorf("kept.txt after resume: %d %v", code, m)
		}
		e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
	})
}

// TestInterruptedStream: a command whose sandbox is killed, paused or
// timed out under it ends its stream with an error the SDKs turn into an
// actionable one (not_found: NotFoundError; unavailable: TimeoutError;
// aborted: SandboxError), naming what happened, never an end event with
// exit code -1 and no message.
func TestInterruptedStream(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name    string
		timeout int
		end     func(id string)
		code    string
		message string
	}{
		{"killed", 60, func(id string) { e.control("DELETE", "/sandboxes/"+id, keyA, "") }, "not_found", "was killed"},
		{"paused", 60, func(id string) { e.control("POST", "/sandboxes/"+id+"/pause", keyA, "{}") }, "aborted", "was paused"},
		{"timed out", 2, nil, "unavailable", "reached its timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := e.create(keyA, `{"templateID":"base","timeout":`+itoa(tc.timeout)+`}`)
			done := make(chan map[string]any, 1)
			go func() {
				_, last := e.serverStream(c, "process.Process/Start", map[string]any{"process": map[string]any{"cmd": "fake", "args": []string{"block"}}})
				done <- last
			}()
			// Wait until it runs (a timeout ends it on its own).
			for i := 0; tc.end != nil; i++ {
				_, l := e.unary(c, "process.Process/List", map[string]any{})
				if len(items(l, "processes")) == 1 {
					break
				}
				if i > 1000 {
					t.Fatal("the command never started")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if tc.end != nil {
				tc.end(c.SandboxID)
			}
			var last map[string]any
			select {
			case last = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("the stream did not end")
			}
			errObj, _ := last["error"].(map[string]any)
			if errObj == nil || errObj["code"] != tc.code || !strings.Contains(errObj["message"].(string), tc.message) || !strings.Contains(errObj["message"].(string), c.SandboxID) {
				t.Errorf("end of stream %v, want error %s naming the sandbox and %q", last, tc.code, tc.message)
			}
			e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
		})
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

// TestEnvdPaused: envd of a paused sandbox answers 502, as E2B's proxy
// does (the SDKs' isRunning is then false), and again after resume.
func TestEnvdPaused(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","timeout":60}`)
	health := func() int {
		resp, _ := e.do("GET", "/health", envdHeaders(c), nil)
		return resp.StatusCode
	}
	steps := []struct {
		name   string
		do     func()
		health int
		stat   int
	}{
		{"running", func() {}, http.StatusNoContent, http.StatusOK},
		{"paused", func() { e.control("POST", "/sandboxes/"+c.SandboxID+"/pause", keyA, `{}`) }, http.StatusBadGateway, http.StatusBadGateway},
		{"resumed", func() { e.control("POST", "/v2/sandboxes/"+c.SandboxID+"/connect", keyA, `{"timeout":60}`) }, http.StatusNoContent, http.StatusOK},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do()
			if got := health(); got != st.health {
				t.Errorf("/health: %d, want %d", got, st.health)
			}
			if code, m := e.unary(c, "filesystem.Filesystem/Stat", map[string]any{"path": "/workspace"}); code != st.stat {
				t.Errorf("Stat: %d %v, want %d", code, m, st.stat)
			}
		})
	}
	e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
}
