package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/kernel"
	"github.com/moat-sandbox/moat/manifest"
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

func cmdManifest(args []string) int {
	fs := newFlags("manifest", "Usage: moat manifest check [--print] FILE\n\nValidates a capability manifest. Exit status 0 when valid, 2 with every problem\nnamed (field, value, accepted range) when not.\n\nFlags:\n")
	print := fs.Bool("print", false, "print the effective manifest (defaults applied) as JSON")
	if len(args) == 0 || args[0] != "check" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fs.SetOutput(os.Stdout)
			fs.Usage()
			return 0
		}
		if len(args) > 0 {
			fmt.Fprintf(os.Stderr, "moat manifest: unknown subcommand %q\n", args[0])
		}
		fs.Usage()
		return exitUsage
	}
	if c := parse(fs, args[1:]); c >= 0 {
		return c
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "moat manifest check: want exactly one FILE")
		return exitUsage
	}
	m, err := manifest.Load(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat: %v\n", err)
		return exitUsage
	}
	if *print {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(m)
		return 0
	}
	fmt.Printf("%s: valid (digest %s)\n", fs.Arg(0), m.Digest())
	if m.Tier != "native" && m.Tier != "gvisor" && m.Tier != "microvm" && m.Tier != "wasm" {
		fmt.Fprintf(os.Stderr, "note: tier %q is valid in a manifest but not implemented in this version of moat; 'moat run' will refuse it\n", m.Tier)
	}
	return 0
}

func cmdImage(args []string) int {
	const usage = "Usage:\n  moat image build [--locked] [NAME]   build an image (default python) from Debian packages\n  moat image list                      list built images\n\nFlags:\n"
	fs := newFlags("image", usage)
	locked := fs.Bool("locked", false, "fail if the resolved package versions differ from the lockfile")
	lockDir := fs.String("lockfile-dir", "", "`DIR` holding NAME.lock to record versions in (e.g. images/ in a checkout)")
	if len(args) == 0 {
		fs.Usage()
		return exitUsage
	}
	if args[0] == "-h" || args[0] == "--help" {
		fs.SetOutput(os.Stdout)
		fs.Usage()
		return 0
	}
	sub := args[0]
	if c := parse(fs, args[1:]); c >= 0 {
		return c
	}
	e, err := engine.New(engine.Options{Progress: os.Stderr})
	if err != nil {
		return fail(err)
	}
	switch sub {
	case "build":
		name := "python"
		if fs.NArg() > 0 {
			name = fs.Arg(0)
		}
		ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
		defer stop()
		img, err := e.Images().Build(ctx, name, image.BuildOptions{Progress: os.Stderr, Locked: *locked, LockfileDir: *lockDir})
		if err != nil {
			return fail(err)
		}
		fmt.Printf("%s %s (%d packages) at %s\n", img.Name, img.Digest, len(img.Packages), img.Root)
		return 0
	case "list":
		imgs, err := e.Images().List()
		if err != nil {
			return fail(err)
		}
		if len(imgs) == 0 {
			fmt.Println("no images built yet; run: moat image build python")
		}
		for _, img := range imgs {
			cur := ""
			if img.Current {
				cur = " (current)"
			}
			fmt.Printf("%-10s %s %s%s\n", img.Name, img.Digest, img.Built.Format("2006-01-02 15:04"), cur)
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "moat image: unknown subcommand %q\n", sub)
	fs.Usage()
	return exitUsage
}

func cmdGC(args []string) int {
	fs := newFlags("gc", "Usage: moat gc\n\nRemoves what runs killed mid-way left behind: cgroups, run directories,\nabandoned image builds. Live runs are never touched.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	e, err := engine.New(engine.Options{})
	if err != nil {
		return fail(err)
	}
	rep, err := e.GC()
	fmt.Printf("removed %d run directories, %d cgroups, %d abandoned image builds\n", len(rep.Runs), len(rep.Cgroups), len(rep.Images))
	if err != nil {
		return fail(err)
	}
	return 0
}

func cmdVersion(args []string) int {
	fs := newFlags("version", "Usage: moat version\n\nPrints Moat's version and the kernel features its tiers use.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	fmt.Printf("moat %s\n", versionString())
	r := kernel.Probe()
	fmt.Printf("kernel %s\n", r.Release)
	for _, f := range r.Features {
		mark := "yes"
		if !f.OK {
			mark = "no "
		}
		fmt.Printf("  %-16s %s  %s\n", f.Name, mark, f.Detail)
	}
	return 0
}
