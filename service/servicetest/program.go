package servicetest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
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
	// dir is the session's workspace ("" for a one-shot run): the
	// kernel driver runs there, as a sandbox's program runs in
	// /workspace.
	dir string
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
	if kernelDriver(p.argv) {
		return p.hostPython(res, stdout, stderr, finish)
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

// kernelDriver reports whether argv starts the service's code kernel
// (service/kernel.py): the fake runs it with the host's python3, so the
// service's kernel tests exercise the real driver and protocol without a
// sandbox. Every other program stays fake.
func kernelDriver(argv []string) bool {
	return len(argv) == 3 && argv[0] == "python3" && argv[1] == "-c" && strings.HasPrefix(argv[2], "# Moat's code kernel driver")
}

// HostPython reports whether the host has the python3 the fake runs the
// kernel driver with; tests of the kernel skip without it.
func HostPython() bool {
	_, err := exec.LookPath("python3")
	return err == nil
}

// hostPython runs the kernel driver on the host: stdin, stdout and stderr
// are the command's, signals and the session's kill reach the process.
func (p *program) hostPython(res *result.Result, stdout, stderr io.Writer, finish func() *result.Result) *result.Result {
	cmd := exec.Command("python3", "-c", p.argv[2])
	cmd.Env = os.Environ()
	if p.dir != "" {
		// As in a sandbox: the working directory and HOME are the
		// workspace, and /tmp is scratch space beside it, so what the
		// driver writes shows up in the workspace exactly when a sandbox's
		// diff would show it (and nothing lands in the test's own
		// directory or the host's /tmp).
		tmp := p.dir + ".tmp"
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			res.Termination, res.ExitCode, res.Error = result.InfraError, 125, err.Error()
			return finish()
		}
		defer os.RemoveAll(tmp)
		cmd.Dir = p.dir
		cmd.Env = append(cmd.Env, "HOME="+p.dir, "TMPDIR="+tmp)
	}
	for _, env := range []map[string]string{p.manifest.Env, p.env} {
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		res.Termination, res.ExitCode, res.Error = result.InfraError, 125, err.Error()
		return finish()
	}
	if err := cmd.Start(); err != nil {
		res.Termination, res.ExitCode, res.Error = result.InfraError, 125, err.Error()
		return finish()
	}
	if p.stdin != nil {
		// Not waited for: it ends when the command's stdin is closed,
		// which happens once this returns.
		go func() { io.Copy(in, p.stdin); in.Close() }()
	}
	waited := make(chan struct{})
	go func() {
		for {
			select {
			case sig := <-p.sig:
				cmd.Process.Signal(sig)
			case <-p.kill:
				cmd.Process.Kill()
			case <-waited:
				return
			}
		}
	}()
	err = cmd.Wait()
	close(waited)
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig := unix.Signal(ws.Signal())
		res.Termination, res.Signal, res.SignalName, res.ExitCode = result.Signaled, int(sig), unix.SignalName(sig), 128+int(sig)
	} else if err != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	return finish()
}
