package main

// moat manifest check: validate a capability manifest (package manifest).

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

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
	if !slices.Contains(tier.List(), m.Tier) {
		fmt.Fprintf(os.Stderr, "note: tier %q is valid in a manifest but not implemented in this version of moat; 'moat run' will refuse it\n", m.Tier)
	}
	return 0
}
