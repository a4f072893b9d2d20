// Command moat runs AI-generated code inside a sandbox it controls.
//
// This package only wires flags to the packages that do the work; no
// sandbox mechanism lives here. Each command has the file of its name
// (run.go, serve.go, keys.go, ...); what several share is in flags.go,
// print.go and auditdb.go.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest"
	"github.com/moat-sandbox/moat/internal/suggest"
	"github.com/moat-sandbox/moat/ociruntime"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// Exit statuses of moat itself, beside the program's own.
const (
	exitDiffers = 1   // image build --locked: the build differs from its lockfile
	exitUsage   = 2   // bad flags, invalid manifest
	exitMoat    = 125 // moat failed (as docker run and env do)
)

type command struct {
	name    string
	summary string
	run     func(args []string) int
}

var commands []command

func init() {
	commands = []command{
		{"run", "run a command in a fresh sandbox", cmdRun},
		{"manifest", "validate a capability manifest (moat manifest check FILE)", cmdManifest},
		{"image", "build and list root images (moat image build [NAME], moat image list)", cmdImage},
		{"gc", "remove what killed runs left behind", cmdGC},
		{"redteam", "attack this host's sandbox with Moat's red-team corpus", cmdRedteam},
		{"bench", "measure per-run overhead against the bare command and bubblewrap", cmdBench},
		{"serve", "serve the HTTP API with warm pools and an audit log (docs/API.md)", cmdServe},
		{"mcp", "serve Moat's tools to a local agent over MCP on stdio (docs/MCP.md)", cmdMCP},
		{"keys", "create, list and revoke API keys of moat serve (moat keys create --name NAME)", cmdKeys},
		{"secrets", "store the secrets runs use without seeing them (moat secrets add NAME)", cmdSecrets},
		{"audit", "list what ran, or report what it attempted and cost (moat audit report)", cmdAudit},
		{"incident", "list, show, export and remove the evidence of flagged runs (moat incident list)", cmdIncident},
		{"analyse", "name the composed effects of commands and what a policy decides (moat analyse -- CMD)", cmdAnalyse},
		{"policy", "suggest the tightest manifest from the audit log (moat policy suggest)", cmdPolicy},
		{"oci", "the OCI runtime containerd and docker call (also as moat-runtime; docs/RUNTIME.md)", cmdOCI},
		{"doctor", "explain what this host supports and which tiers can run", cmdDoctor},
		{"version", "print the version and the kernel features Moat uses", cmdVersion},
	}
}

func main() {
	// The in-sandbox half (native's init, gVisor's init, the microvm
	// agent) is also this binary under a hidden argument, when moat-guest
	// is not installed (engine.GuestBinary); it must be dispatched before
	// anything else runs.
	guest.Dispatch()
	// And the jailer the microvm tier starts its VMM through (host side:
	// never part of moat-guest).
	if jail.IsJailer() {
		jail.Main()
	}
	// An OCI container's monitor (its egress proxy, its diff), started
	// by the runtime's create.
	if len(os.Args) > 1 && os.Args[1] == ociruntime.MonitorArg {
		os.Exit(ociruntime.RunMonitor())
	}
	// Descriptors moat inherited from its caller must never travel on to
	// anything moat starts (init, mmdebstrap): mark them close-on-exec.
	// Moat opens its own files close-on-exec already.
	unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if isRuntime() {
		os.Exit(cmdOCI(os.Args[1:]))
	}
	os.Exit(dispatch(os.Args[1:]))
}

func dispatch(args []string) (code int) {
	// No stack traces for users: a panic is a Moat bug, reported as one.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "moat: internal error: %v\nThis is a bug in Moat; please report it with the command you ran.\n", r)
			if os.Getenv("MOAT_DEBUG") != "" {
				os.Stderr.Write(debug.Stack())
			}
			code = exitMoat
		}
	}()
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	if args[0] == "--version" || args[0] == "-version" {
		// The one line of 'moat version', for scripts and package
		// managers that expect the GNU convention (no kernel probe).
		fmt.Printf("moat %s\n", versionString())
		return 0
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			// moat help run == moat run --help
			return dispatch([]string{args[1], "--help"})
		}
		usage(os.Stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "moat: unknown command %q\n", args[0])
	if s := suggestCommand(args[0]); s != "" {
		fmt.Fprintf(os.Stderr, "Did you mean %q?\n", s)
	}
	fmt.Fprintln(os.Stderr, "Run 'moat help' for the list of commands.")
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "moat %s: a sandbox for AI-generated code\n\nUsage: moat COMMAND [FLAGS]\n\nCommands:\n", versionString())
	for _, c := range commands {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'moat COMMAND --help' for a command's flags.")
}

// suggestCommand returns the command closest to s (a prefix, or at most two
// edits away), or "".
func suggestCommand(s string) string {
	names := make([]string, len(commands))
	for i, c := range commands {
		if strings.HasPrefix(c.name, s) || strings.HasPrefix(s, c.name) {
			return c.name
		}
		names[i] = c.name
	}
	best, _ := suggest.Closest(s, names)
	return best
}

// fail prints err for a user and returns the exit status for it.
func fail(err error) int {
	say("moat: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitMoat
}

type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }
