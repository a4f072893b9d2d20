package native_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// TestSessionTTY runs session commands on terminals of the sandbox's own
// devpts instance: what the command sees, what comes back, and what a
// program may not do to its terminal.
func TestSessionTTY(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, func(m *manifest.Manifest) { m.Resources.StdoutBytes = 64 << 10 })
	id := s.ID()
	ws := &tier.WindowSize{Rows: 24, Cols: 80}
	cases := []struct {
		name string
		argv []string
		// want are substrings of the terminal's output.
		want []string
		// not must not appear in it.
		not  []string
		exit int
	}{
		{"stdio are the terminal, of the size asked for", []string{"sh", "-c", "test -t 0 && test -t 1 && test -t 2 && echo all-tty; stty size; tty"},
			[]string{"all-tty\r\n", "24 80\r\n", "/dev/pts/"}, nil, 0},
		{"stderr arrives on the terminal too", []string{"sh", "-c", "echo to-stderr >&2; exit 3"},
			[]string{"to-stderr\r\n"}, nil, 3},
		{"the terminal is the controlling one: /dev/tty opens", []string{"sh", "-c", "echo via-dev-tty > /dev/tty"},
			[]string{"via-dev-tty"}, nil, 0},
		{"TIOCSTI cannot type into the terminal", []string{"python3", "-c", `
import fcntl, termios, errno
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"X")
    print("sti-ok")
except OSError as e:
    print("sti-denied", errno.errorcode[e.errno])
`}, []string{"sti-denied EPERM"}, []string{"sti-ok"}, 0},
		{"TIOCSETD cannot change the line discipline", []string{"python3", "-c", `
import fcntl, termios, errno, struct
try:
    fcntl.ioctl(0, termios.TIOCSETD, struct.pack("i", 0))
    print("setd-ok")
except OSError as e:
    print("setd-denied", errno.errorcode[e.errno])
`}, []string{"setd-denied EPERM"}, []string{"setd-ok"}, 0},
		{"a background process holding the terminal does not hold the command", []string{"sh", "-c", "(sleep 30 &) ; echo bye"},
			[]string{"bye"}, nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			res := execWait(t, s, &engine.ExecRequest{Argv: c.argv, TTY: ws})
			wantResult(t, res, result.Exited, c.exit)
			for _, w := range c.want {
				if !strings.Contains(res.Stdout.Data, w) {
					t.Errorf("terminal output %q lacks %q", res.Stdout.Data, w)
				}
			}
			for _, n := range c.not {
				if strings.Contains(res.Stdout.Data, n) {
					t.Errorf("terminal output %q has %q", res.Stdout.Data, n)
				}
			}
			if res.Stderr.Data != "" {
				t.Errorf("stderr %q: a terminal's output is all on stdout", res.Stderr.Data)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}

	t.Run("a program opens terminals of its own, up to the bound", func(t *testing.T) {
		res := execWait(t, s, &engine.ExecRequest{Argv: []string{"python3", "-c", `
import os
fds = []
try:
    while len(fds) < 200:
        fds.append(os.openpty())
except OSError as e:
    print("stopped", len(fds), e.strerror)
print("name", os.ttyname(fds[0][1]))
`}})
		wantResult(t, res, result.Exited, 0)
		// Commands of the session may hold some already; the bound is
		// devpts's max of 64 for the whole sandbox.
		if !strings.Contains(res.Stdout.Data, "stopped 6") && !strings.Contains(res.Stdout.Data, "stopped 5") {
			t.Errorf("openpty loop: %q; want it stopped near 64", res.Stdout.Data)
		}
		if !strings.Contains(res.Stdout.Data, "name /dev/pts/") {
			t.Errorf("openpty loop: %q; want a terminal under /dev/pts", res.Stdout.Data)
		}
	})

	t.Run("interactive: input, resize, exit", func(t *testing.T) {
		var live syncbuf.Buffer
		p, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sh", "-i"}, TTY: ws, StdinOpen: true, Stdout: &live})
		if err != nil {
			t.Fatal(err)
		}
		seen := func(want string) {
			t.Helper()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				if strings.Contains(live.String(), want) {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
			t.Fatalf("terminal never showed %q; it showed %q", want, live.String())
		}
		io.WriteString(p.Stdin(), "stty size\n")
		seen("24 80\r\n")
		if err := p.Resize(tier.WindowSize{Rows: 40, Cols: 132}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(p.Stdin(), "stty size\n")
		seen("40 132\r\n")
		io.WriteString(p.Stdin(), "exit 7\n")
		select {
		case <-p.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the shell did not exit")
		}
		wantResult(t, p.Result(), result.Exited, 7)
		if err := p.Resize(tier.WindowSize{Rows: 10, Cols: 10}); err == nil {
			t.Error("resize of an ended command succeeded")
		}
	})

	t.Run("output is capped like any stream", func(t *testing.T) {
		res := execWait(t, s, &engine.ExecRequest{Argv: []string{"sh", "-c", "yes | head -c 1000000"}, TTY: ws})
		if !res.Stdout.Truncated || len(res.Stdout.Data) > 64<<10 || res.Stdout.Bytes < 500000 {
			t.Errorf("stdout: %d bytes kept of %d, truncated %v; want the 64 KiB cap", len(res.Stdout.Data), res.Stdout.Bytes, res.Stdout.Truncated)
		}
	})

	t.Run("bad requests", func(t *testing.T) {
		if _, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"true"}, TTY: &tier.WindowSize{Rows: 0, Cols: 80}}); err == nil || !strings.Contains(err.Error(), "tty") {
			t.Errorf("0 rows: %v; want a tty field error", err)
		}
		p, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"sleep", "5"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Resize(tier.WindowSize{Rows: 10, Cols: 10}); !errors.Is(err, engine.ErrUsage) {
			t.Errorf("resize without a terminal: %v; want ErrUsage", err)
		}
		p.Signal(9)
		<-p.Done()
	})

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(e.Home())(id); len(left) > 0 {
		t.Errorf("session %s left: %v", id, left)
	}
}
