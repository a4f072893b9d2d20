// Package gvinit is what Moat runs inside a gVisor sandbox, on gVisor's
// Sentry, beside the program: the moat binary under a hidden argument,
// bind-mounted read-only into the sandbox. It has three small jobs:
//
//   - init: the container's first process. It keeps the sandbox alive
//     between commands (a warm pool's sandbox, a session), reaps orphans,
//     and, with an egress grant, relays connections from the sandbox's
//     loopback (127.0.0.1:tier.EgressPort, where HTTP_PROXY points) to the
//     host's egress proxy socket, bound into the sandbox. It says "ready"
//     on its stdout once it serves.
//   - exec: the start of every command (`runsc exec` runs it): it applies
//     the run's rlimits and no_new_privs, which `runsc exec` does not, and
//     execs the program in place, so the program's pid, wait status and
//     session (it leads its own, as runsc creates it) are exactly the
//     command's.
//   - kill: signals a command's process group from inside the sandbox
//     (runsc can signal only single processes).
//
// Everything here runs as the program's unprivileged user in the sandbox,
// where the program can see and signal it: it holds nothing the program may
// not have. It must never be trusted by the host for anything but
// convenience (the host reads only "ready" from it, bounded); the egress
// proxy on the host decides every connection.
package gvinit

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/gvinit/gvwire"
	"github.com/moat-sandbox/moat/guest/relay"
)

// Arg is the hidden first argument that makes the moat binary this guest
// (gvwire.Arg: the host's side names it there).
const Arg = gvwire.Arg

// Main runs the guest. It never returns.
func Main() {
	if len(os.Args) < 3 {
		fail(2, "moat: "+Arg+" is Moat's internal gVisor guest; use 'moat run --tier gvisor'")
	}
	switch args := os.Args[3:]; os.Args[2] {
	case "init":
		initMain(args)
	case "exec":
		execMain(args)
	case "kill":
		killMain(args)
	}
	fail(2, "moat guest: unknown mode %q", os.Args[2])
}

func fail(code int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(code)
}

// initMain: init [SOCKET PORT]
func initMain(args []string) {
	// Signals the program sends to pid 1 are ignored, as Linux ignores
	// them for an init without handlers; SIGKILL from the host ends it.
	signal.Ignore(unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2, unix.SIGPIPE)
	switch len(args) {
	case 0:
	case 2:
		port, err := strconv.Atoi(args[1])
		if err != nil || port <= 0 || port > 65535 {
			fail(2, "moat guest init: bad port %q", args[1])
		}
		l, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			fail(1, "moat guest init: egress: listen on 127.0.0.1:%d: %v", port, err)
		}
		go relay.Serve(l, args[0], relay.MaxConns)
	default:
		fail(2, "moat guest init: want no arguments or SOCKET PORT")
	}
	// The host reads this line and nothing else from init's stdout. Then
	// init lets go of its standard descriptors, the only host files it
	// had: the program can list /proc/1/fd (gVisor shows it to other
	// users), and must find nothing of the host there.
	os.Stdout.WriteString(gvwire.Ready + "\n")
	os.Stdin.Close()
	os.Stdout.Close()
	os.Stderr.Close()
	reap()
}

// reap waits for every child reparented to init, forever.
func reap() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	for {
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		select {
		case <-sigs:
		case <-time.After(time.Second):
		}
	}
}

// Rlimit names accepted by exec, as NAME=VALUE (soft and hard).
var rlimits = map[string]int{
	"core":   unix.RLIMIT_CORE,
	"nofile": unix.RLIMIT_NOFILE,
	"fsize":  unix.RLIMIT_FSIZE,
	"nproc":  unix.RLIMIT_NPROC,
	"cpu":    unix.RLIMIT_CPU,
}

// execMain: exec NAME=VALUE... -- ARGV...
func execMain(args []string) {
	i := 0
	for ; i < len(args) && args[i] != "--"; i++ {
		name, val, _ := strings.Cut(args[i], "=")
		res, ok := rlimits[name]
		v, err := strconv.ParseUint(val, 10, 64)
		if !ok || err != nil {
			fail(125, "moat guest exec: bad rlimit %q", args[i])
		}
		hard := v
		if res == unix.RLIMIT_CPU {
			hard = v + 1
		}
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: v, Max: hard}); err != nil {
			fail(125, "moat guest exec: setrlimit %s=%d: %v", name, v, err)
		}
	}
	if i+1 >= len(args) {
		fail(125, "moat guest exec: no command")
	}
	argv := args[i+1:]
	// runsc exec does not set no_new_privs: a set-user-ID file in the
	// image must not raise the program's privileges in the Sentry.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fail(125, "moat guest exec: no_new_privs: %v", err)
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		lp, err := exec.LookPath(path)
		if err != nil {
			// The shell's convention, as on the native tier.
			fail(127, "moat: %s: command not found", path)
		}
		path = lp
	}
	err := unix.Exec(path, argv, os.Environ())
	code := 126
	if errors.Is(err, unix.ENOENT) {
		code = 127
	}
	fail(code, "moat: cannot execute %s: %v", argv[0], err)
}

// killMain: kill SIGNAL PGID
func killMain(args []string) {
	if len(args) != 2 {
		fail(2, "moat guest kill: want SIGNAL PGID")
	}
	sig, err1 := strconv.Atoi(args[0])
	pgid, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || sig <= 0 || sig > 64 || pgid <= 1 {
		fail(2, "moat guest kill: bad arguments %q", args)
	}
	if err := unix.Kill(-pgid, syscall.Signal(sig)); err != nil && !errors.Is(err, unix.ESRCH) {
		fail(1, "moat guest kill: %v", err)
	}
	os.Exit(0)
}
