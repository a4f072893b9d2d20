package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/redteam"
)

func cmdRedteam(args []string) int {
	fs := newFlags("redteam", `Usage: moat redteam [--tier T] [--case ID|CATEGORY] [--json] [--list [--markdown]]

Runs Moat's attack corpus against this host and configuration: every case is
a real attack judged from the host side (planted canaries, host listeners,
host file hashes, the sandbox's processes as the host's /proc shows them,
the result's fields). Prints one verdict per case and tier: contained,
escaped, not-applicable (with the reason; never counted as contained) or
error. Exit status 0 only if nothing escaped and nothing errored. The
secret cases bind a random value per case in this process's memory; the
host's secret store is neither read nor written.

Flags:
`)
	tiers := fs.String("tier", "native", "comma-separated `TIERS` to attack; TIER+session runs every case as the only command of a session sandbox (the path moat serve's sandboxes use)")
	only := fs.String("case", "", "run only this case `ID` or category")
	jsonOut := fs.Bool("json", false, "print the verdicts as JSON")
	list := fs.Bool("list", false, "list the cases instead of running them")
	markdown := fs.Bool("markdown", false, "with --list: print docs/REDTEAM.md")
	parallel := fs.Int("parallel", 2, "cases run at once (resource cases always run alone)")
	imageName := fs.String("image", "", "run every case on the stored image `NAME` (default: python); the corpus needs python3 and sh in it, as in an image imported from the python image's rootfs")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if *list {
		cases, err := redteam.Cases()
		if err != nil {
			return fail(err)
		}
		if *markdown {
			fmt.Print(redteam.Markdown(cases))
			return 0
		}
		for _, c := range cases {
			fmt.Printf("%-34s %-14s %-8s %s\n", c.ID, c.Category, c.Severity, c.Threat)
		}
		return 0
	}
	// The secret cases bind random values in this in-memory store, one
	// per case, never printed; the host's own secret store is not used.
	secrets, err := redteam.NewSecretStore()
	if err != nil {
		return fail(err)
	}
	e, err := engine.New(engine.Options{NoAutoBuild: false, Progress: os.Stderr, Secrets: secrets, UpstreamRootCAs: secrets.RootCAs()})
	if err != nil {
		return fail(err)
	}
	if *imageName != "" {
		// Refused once here rather than as an error per case.
		if _, err := e.Images().Lookup(*imageName); err != nil {
			return fail(usageError{fmt.Errorf("--image %q: %w", *imageName, err)})
		}
		if !*jsonOut {
			fmt.Printf("image: %s\n", *imageName)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer stop()
	progress := func(v redteam.Verdict) {
		if !*jsonOut {
			// Evidence quotes what sandboxes printed: inert on a terminal.
			os.Stdout.Write(output.Sanitize([]byte(fmt.Sprintf("%-34s %-8s %-15s %s\n", v.Case, v.Tier, v.Verdict, v.Evidence))))
		}
	}
	if !*jsonOut {
		fmt.Printf("%-34s %-8s %-15s %s\n", "CASE", "TIER", "VERDICT", "EVIDENCE")
	}
	verdicts, err := redteam.Run(ctx, e, redteam.Options{Tiers: strings.Split(*tiers, ","), Case: *only, Parallel: *parallel, Progress: progress, Image: *imageName, Secrets: secrets})
	if err != nil {
		return fail(err)
	}
	counts := map[string]int{}
	for _, v := range verdicts {
		counts[v.Verdict]++
	}
	if *jsonOut {
		output.EncodeJSON(os.Stdout, verdicts, "  ")
	} else {
		fmt.Printf("\n%d contained, %d escaped, %d not-applicable, %d error\n",
			counts[redteam.Contained], counts[redteam.Escaped], counts[redteam.NotApplicable], counts[redteam.Error])
	}
	if counts[redteam.Escaped] > 0 || counts[redteam.Error] > 0 {
		return 1
	}
	return 0
}
