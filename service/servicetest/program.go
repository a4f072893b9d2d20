package servicetest

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/tier"
)

// program is the fake interpreter.
type program struct {
	argv           []string
	env            map[string]string // the command's own variables
	stdin          io.Reader
	stdout, stderr io.Writer
	sig            <-chan unix.Signal
	kill           <-chan struct{}
	manifest       *manifest.Manifest
	// tty is the terminal size the command was started with (nil: none);
	// winch delivers Resize's sizes.
	tty   *tier.WindowSize
	winch <-chan tier.WindowSize
}

func (p *program) run() *result.Result {
	start := time.Now()
	var out, errb bytes.Buffer
	stdout := io.Writer(&out)
	if p.stdout != nil {
		stdout = io.MultiWriter(&out, p.stdout)
	}
	stderr := io.Writer(&errb)
	if p.stderr != nil {
		stderr = io.MultiWriter(&errb, p.stderr)
	}
	res := &result.Result{
		Schema: result.SchemaVersion, ID: "fake-" + service.NewID(4), Tier: "fake",
		Image: result.Image{Name: "python", Digest: "sha256:fake"}, Manifest: p.manifest.Digest(), Justifications: p.manifest.Justifications,
		Command: p.argv, Termination: result.Exited, StartedAt: start.UTC(),
		Files: []result.FileChange{}, Network: []result.NetworkAttempt{}, Violations: []result.Violation{}, Degradations: []string{},
	}
	killed := func(sig unix.Signal) {
		res.Termination, res.Signal, res.SignalName, res.ExitCode = result.Signaled, int(sig), unix.SignalName(sig), 128+int(sig)
	}
	finish := func() *result.Result {
		res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		res.Stdout = result.Stream{Data: out.String(), Encoding: "utf-8", Bytes: int64(out.Len())}
		res.Stderr = result.Stream{Data: errb.String(), Encoding: "utf-8", Bytes: int64(errb.Len())}
		return res
	}
	if p.argv[0] != "fake" {
		fmt.Fprintln(stdout, strings.Join(p.argv, " "))
		return finish()
	}
	for _, step := range p.argv[1:] {
		op, arg, _ := strings.Cut(step, ":")
		switch op {
		case "out":
			fmt.Fprintln(stdout, arg)
		case "err":
			fmt.Fprintln(stderr, arg)
		case "raw":
			var b []byte
			fmt.Sscanf(arg, "%x", &b)
			stdout.Write(b)
		case "env":
			v, ok := p.env[arg]
			if !ok {
				v = p.manifest.Env[arg]
			}
			fmt.Fprintln(stdout, v)
		case "tty":
			// The terminal's size, as stty size prints it.
			if p.tty == nil {
				fmt.Fprintln(stderr, "not a tty")
				res.ExitCode = 1
				return finish()
			}
			fmt.Fprintf(stdout, "%d %d\r\n", p.tty.Rows, p.tty.Cols)
		case "winch":
			// Waits for a Resize, then prints the new size.
			select {
			case ws := <-p.winch:
				p.tty = &ws
				fmt.Fprintf(stdout, "%d %d\r\n", ws.Rows, ws.Cols)
			case <-p.kill:
				killed(unix.SIGKILL)
				return finish()
			}
		case "cat":
			if p.stdin != nil {
				io.Copy(stdout, p.stdin)
			}
		case "block":
			select {
			case sig := <-p.sig:
				killed(sig)
				return finish()
			case <-p.kill:
				killed(unix.SIGKILL)
				return finish()
			}
		case "sleep":
			d, _ := time.ParseDuration(arg)
			select {
			case <-time.After(d):
			case <-p.kill:
				killed(unix.SIGKILL)
				return finish()
			}
		case "exit":
			res.ExitCode, _ = strconv.Atoi(arg)
		case "kill-init":
			// The engine's view when init dies under a command.
			res.Termination, res.ExitCode, res.Error = result.InfraError, 125, "the sandbox's init exited"
			return finish()
		case "cpu":
			res.CPUMS, _ = strconv.ParseFloat(arg, 64)
		case "deny":
			res.Network = append(res.Network, result.NetworkAttempt{Host: arg, Port: 443, Reason: "not-allowlisted"})
		case "violate":
			res.Violations = append(res.Violations, result.Violation{Kind: arg, Detail: "fake"})
		}
	}
	return finish()
}
