package e2b

import (
	"encoding/base64"
	"testing"
	"time"
)

// TestPTY drives sandbox.pty.* as the SDK sends it: a Start with a pty
// size, input typed as pty bytes, a resize through Update, the output as
// pty data events, bad sizes refused with the field.
func TestPTY(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	done := make(chan map[string]any, 1)
	go func() {
		msgs, last := e.serverStream(c, "process.Process/Start", map[string]any{
			"process": map[string]any{"cmd": "fake", "args": []string{"tty", "cat", "winch"}},
			"pty":     map[string]any{"size": map[string]any{"cols": 80, "rows": 24}},
			"tag":     "term",
		})
		var pty, other string
		for _, m := range msgs {
			d, ok := m["event"].(map[string]any)["data"].(map[string]any)
			if !ok {
				continue
			}
			if d["pty"] != nil {
				b, _ := base64.StdEncoding.DecodeString(d["pty"].(string))
				pty += string(b)
			}
			if d["stdout"] != nil || d["stderr"] != nil {
				other += "x"
			}
		}
		done <- map[string]any{"pty": pty, "other": other, "last": last, "end": msgs[len(msgs)-1]}
	}()
	var pid float64
	for i := 0; i < 200 && pid == 0; i++ {
		_, l := e.unary(c, "process.Process/List", map[string]any{})
		for _, p := range items(l, "processes") {
			if p.(map[string]any)["tag"] == "term" {
				pid = p.(map[string]any)["pid"].(float64)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pid == 0 {
		t.Fatal("the terminal's process was never listed")
	}
	sel := map[string]any{"pid": pid}
	for _, bad := range []map[string]any{
		{"size": map[string]any{"cols": 0, "rows": 24}},
		{"size": map[string]any{"cols": 80, "rows": 1001}},
		{},
	} {
		if _, out := e.unary(c, "process.Process/Update", map[string]any{"process": sel, "pty": bad}); out["code"] != "invalid_argument" {
			t.Errorf("Update with pty %v: %v, want invalid_argument", bad, out)
		}
	}
	if st, out := e.unary(c, "process.Process/SendInput", map[string]any{"process": sel, "input": map[string]any{"pty": base64.StdEncoding.EncodeToString([]byte("ls\n"))}}); st != 200 {
		t.Fatalf("SendInput pty: %d %v", st, out)
	}
	if st, out := e.unary(c, "process.Process/CloseStdin", map[string]any{"process": sel}); st != 200 {
		t.Fatalf("CloseStdin: %d %v", st, out)
	}
	if st, out := e.unary(c, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 132, "rows": 40}}}); st != 200 {
		t.Fatalf("Update pty: %d %v", st, out)
	}
	select {
	case r := <-done:
		if r["pty"] != "24 80\r\nls\n40 132\r\n" {
			t.Errorf("pty output %q: want the size, the input and the new size", r["pty"])
		}
		if r["other"] != "" {
			t.Error("a terminal's output came as stdout or stderr events")
		}
		if r["last"].(map[string]any)["error"] != nil {
			t.Errorf("stream ended with %v", r["last"])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's command did not end")
	}
	// Ended: a resize is refused as the process not running.
	if _, out := e.unary(c, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 10, "rows": 10}}}); out["code"] == nil {
		t.Errorf("Update of an ended terminal: %v", out)
	}
	// Another key's sandbox is not found.
	other := e.create(keyB, `{"templateID":"base"}`)
	other.EnvdAccessToken = c.EnvdAccessToken
	if st, out := e.unary(other, "process.Process/Update", map[string]any{"process": sel, "pty": map[string]any{"size": map[string]any{"cols": 10, "rows": 10}}}); st == 200 {
		t.Errorf("Update through another sandbox: %d %v", st, out)
	}
}
