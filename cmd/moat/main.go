// Command moat runs AI-generated code inside a sandbox it controls.
//
// This package only wires flags to the packages that do the work; no
// sandbox mechanism lives here.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"

	"github.com/moat-sandbox/moat/guest/nsinit"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// Exit statuses of moat itself, beside the program's own.
const (
	exitUsage = 2   // bad flags, invalid manifest
	exitMoat  = 125 // moat failed (as docker run and env do)
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
		{"bench", "measure per-run overhead against the bare command and bubblewrap", cmdBench},
		{"doctor", "explain what this host supports and which tiers can run", cmdDoctor},
		{"version", "print the version and the kernel features Moat uses", cmdVersion},
	}
}

func main() {
	// Moat's in-sandbox init is this same binary under a hidden argument;
	// it must be dispatched before anything else runs.
	if len(os.Args) > 1 && os.Args[1] == nsinit.Arg {
		nsinit.Main()
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
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage()
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "moat: unknown command %q\n", args[0])
	if s := suggest(args[0]); s != "" {
		fmt.Fprintf(os.Stderr, "Did you mean %q?\n", s)
	}
	fmt.Fprintln(os.Stderr, "Run 'moat help' for the list of commands.")
	return exitUsage
}

func usage() {
	fmt.Fprintf(os.Stderr, "moat %s: a sandbox for AI-generated code\n\nUsage: moat COMMAND [FLAGS]\n\nCommands:\n", versionString())
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'moat COMMAND --help' for a command's flags.")
}

func suggest(s string) string {
	for _, c := range commands {
		if strings.HasPrefix(c.name, s) || strings.HasPrefix(s, c.name) {
			return c.name
		}
	}
	return ""
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if rev != "" {
			if dirty {
				rev += "-dirty"
			}
			return "dev-" + rev
		}
	}
	return "dev"
}

// fail prints err for a user and returns the exit status for it.
func fail(err error) int {
	fmt.Fprintf(os.Stderr, "moat: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitMoat
}

type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }
