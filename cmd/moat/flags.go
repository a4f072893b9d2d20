package main

// The flag handling the commands share: a FlagSet whose help goes to
// stdout only when asked for, flags anywhere among the arguments, and the
// help of commands made of subcommands.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func newFlags(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	fs.Usage = usageFunc(fs, name, usage)
	return fs
}

// usageFunc prints a command's whole help when the user asked for it (its
// output is then stdout: see helpOutput) and, after a mistake, only the
// synopsis (usage's first paragraph) and where the rest is, so that the
// message naming the mistake is not buried under the list of flags.
func usageFunc(fs *flag.FlagSet, name, usage string) func() {
	return func() {
		if fs.Output() == io.Writer(os.Stdout) {
			fmt.Fprint(fs.Output(), usage)
			fs.PrintDefaults()
			return
		}
		synopsis, _, _ := strings.Cut(usage, "\n\n")
		fmt.Fprintf(fs.Output(), "%s\nRun 'moat %s --help' for the flags.\n", synopsis, name)
	}
}

// parse parses flags anywhere among the arguments (moat manifest check FILE
// --print) and returns -1 when parsing succeeded, else the exit status.
// Not for 'moat run', whose arguments after the first non-flag belong to
// the program.
func parse(fs *flag.FlagSet, args []string) int {
	fs.SetOutput(helpOutput(args))
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return exitUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			rest = append(rest, args[1:]...)
			break
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
	fs.Parse(append([]string{"--"}, rest...))
	return -1
}

// helpOutput sends usage text to stdout when the user asked for help (so
// it pages), and to stderr when it accompanies an error.
func helpOutput(args []string) io.Writer {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" {
			return os.Stdout
		}
	}
	return os.Stderr
}

// subcommandHelp handles 'moat CMD', 'moat CMD --help' and 'moat CMD -h':
// it returns the exit status, or -1 when args[0] is to be dispatched.
func subcommandHelp(usage string, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprint(os.Stdout, usage)
		return 0
	}
	return -1
}
