package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/result"
)

// Terminal injection through moat's own output (docs/THREATS.md,
// "Terminal injection"): what a sandbox chooses must reach a terminal
// inert from every path, and stay exact where it is data.

// rawControl returns the first character of s a terminal would act on or
// that reorders text: a byte that is not UTF-8, a C0 control other than
// newline, tab and the CR of a CRLF, DEL, a C1 control, a bidi formatting
// character; "" when there is none.
func rawControl(s string) string {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return s[i : i+1]
		case r == '\r':
			if !strings.HasPrefix(s[i+1:], "\n") {
				return "\r"
			}
		case r == '\n', r == '\t':
		case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f,
			r == 0x61c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
			return string(r)
		}
		i += size
	}
	return ""
}

// hostile is text with everything the rule covers: OSC 52, OSC 0, CSI 2J,
// 8-bit CSI and OSC in UTF-8, bidi override, isolate and marks, DEL and a
// bare CR.
const hostile = "x\x1b]52;c;SGVsbG8=\x07\x1b]0;t\x07\x1b[2J\u009b2J\u009d0;t\u009c\u202eevil\u202c\u2066i\u2069\u200f\u061c\x7f\rend\n"

func TestJSONCarriesNoRawControls(t *testing.T) {
	needSandbox(t)
	prog := `import os, sys
sys.stdout.write(sys.argv[1])
os.chdir("/workspace")
for n in [sys.argv[2].encode(), b"a\xff", b"a\xfe"]:
    open(n, "wb").write(b"x")
`
	name := "f-\u202egpj.exe\u009b"
	res, out := runJSON(t, invocation{args: []string{"--", "python3", "-c", prog, hostile, name}})
	if bad := rawControl(out.stdout); bad != "" {
		t.Errorf("the JSON document holds a raw %q:\n%s", bad, out.stdout)
	}
	if got, _ := decodeStream(res.Stdout); got != hostile {
		t.Errorf("stdout decodes to %q, want %q: the escapes must be lossless", got, hostile)
	}
	var paths []string
	for _, f := range res.Files {
		paths = append(paths, f.Path)
	}
	for _, want := range []string{name, "a\xff", "a\xfe"} {
		if n := strings.Count("\x00"+strings.Join(paths, "\x00")+"\x00", "\x00"+want+"\x00"); n != 1 {
			t.Errorf("the diff holds %q %d times, want once (paths %q)", want, n, paths)
		}
	}
	if !strings.Contains(out.stdout, `"encoding": "base64"`) {
		t.Errorf("no diff entry is base64-encoded:\n%s", out.stdout)
	}
}

func decodeStream(s result.Stream) (string, error) {
	if s.Encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(s.Data)
		return string(b), err
	}
	return s.Data, nil
}

func TestMessagesQuoteSandboxNames(t *testing.T) {
	needSandbox(t)
	prog := `import os, sys
os.chdir("/workspace")
for n in sys.argv[1:]:
    os.symlink("t", n)
`
	names := []string{"osc52-\x1b]52;c;SGVsbG8=\x07", "bidi-\u202egpj.exe", "c1-\u009b2J", "cr-evil\rgood", "nl-x\nmoat: copied 99 file(s)"}
	dir := filepath.Join(t.TempDir(), "out")
	out := moat(t, invocation{args: append([]string{"run", "--output", dir, "--", "python3", "-c", prog}, names...)})
	out.check(t, 0, nil, []string{`moat: not copied: "osc52-\x1b]52;c;SGVsbG8=\a": symlink`, `"bidi-\u202egpj.exe"`, `"c1-\u009b2J"`,
		`"cr-evil\rgood"`, `"nl-x\nmoat: copied 99 file(s)"`}, nil)
	if bad := rawControl(out.stderr); bad != "" {
		t.Errorf("stderr holds a raw %q: %q", bad, out.stderr)
	}
	if strings.Contains(out.stderr, "\nmoat: copied 99") {
		t.Errorf("a file name forged a line of moat's: %q", out.stderr)
	}
}

func TestBareCR(t *testing.T) {
	needSandbox(t)
	argv := []string{"run", "--", "printf", `rm -rf ~\recho fine \nok\r\n`}
	t.Run("a pipe gets the bytes unchanged", func(t *testing.T) {
		out := moat(t, invocation{args: argv})
		out.check(t, 0, nil, nil, nil)
		if out.stdout != "rm -rf ~\recho fine \nok\r\n" {
			t.Errorf("stdout %q, want the program's bytes", out.stdout)
		}
	})
	t.Run("a terminal sees the CR", func(t *testing.T) {
		master, slave := openPTY(t)
		// Raw output: no CR added before newlines, so the bytes are moat's.
		tio, err := unix.IoctlGetTermios(int(slave.Fd()), unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		tio.Oflag &^= unix.OPOST
		if err := unix.IoctlSetTermios(int(slave.Fd()), unix.TCSETS, tio); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(moatBin, argv...)
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = slave, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		slave.Close()
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(master)
			got <- b
		}()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("moat run on a terminal: %v\nstderr: %s", err, stderr.String())
		}
		var tty []byte
		select {
		case tty = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("the terminal never reported the end of output")
		}
		if want := `rm -rf ~\recho fine ` + "\nok\r\n"; string(tty) != want {
			t.Errorf("the terminal received %q, want %q", tty, want)
		}
	})
}

func TestAuditEscapesLoggedHosts(t *testing.T) {
	_, env := auditEnv(t)
	db := filepath.Join(t.TempDir(), "audit.db")
	st, err := audit.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	host := "moat\u202eevil\u009b.example"
	if err := st.Begin(audit.Record{ID: "run-1", Kind: audit.KindRun, Command: []string{"python3"}}); err != nil {
		t.Fatal(err)
	}
	res := &result.Result{Termination: result.Exited, Network: []result.NetworkAttempt{{Method: "CONNECT", Host: host, Port: 443, Reason: "bad-request"}}}
	if err := st.Finish("run-1", res, nil); err != nil {
		t.Fatal(err)
	}
	st.Close()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"audit --json", []string{"audit", "--json"}, `moat\u202eevil\u009b.example`},
		{"audit report", []string{"audit", "report"}, `"moat\u202eevil\u009b.example:443"`},
		{"audit report --json", []string{"audit", "report", "--json"}, `moat\u202eevil\u009b.example`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: append(tc.args, "--db", db), env: env})
			out.check(t, 0, []string{tc.want}, nil, nil)
			if bad := rawControl(out.stdout); bad != "" {
				t.Errorf("stdout holds a raw %q: %q", bad, out.stdout)
			}
		})
	}
	out := moat(t, invocation{args: []string{"audit", "--json", "--db", db}, env: env})
	var rec audit.Record
	if err := json.Unmarshal([]byte(out.stdout), &rec); err != nil || len(rec.Network) != 1 || rec.Network[0].Host != host {
		t.Errorf("audit --json decodes to %+v (%v), want the host exactly as sent", rec.Network, err)
	}
}
