package main

// moat policy suggest: the tightest manifest the audit log supports
// (audit.Suggest).

import (
	"errors"
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/audit"
)

const policyUsage = `Usage: moat policy suggest [FILTERS] [--limit N] [--json]

Proposes the tightest capability manifest that would have allowed what the
selected runs legitimately did: only runs and execs that exited by
themselves with status 0 count (how many others were ignored, and why, is
printed too). Memory, timeout and CPU time come from the largest use with
headroom; the network grant lists exactly the destinations that were
reached. The manifest is printed as YAML with the reason for each field as
a comment, ready for 'moat run --manifest'.

Exit status 0 with the manifest on stdout, 1 when no record qualifies,
2 for invalid flags.

Flags:
`

func cmdPolicy(args []string) int {
	if c := subcommandHelp(policyUsage, args); c >= 0 {
		if c == exitUsage {
			fmt.Fprintln(os.Stderr, "moat policy: want a subcommand: suggest")
		}
		return c
	}
	if args[0] != "suggest" {
		fmt.Fprintf(os.Stderr, "moat policy: unknown subcommand %q; accepted: suggest\n", args[0])
		return exitUsage
	}
	q := newAuditQuery("policy suggest", policyUsage, audit.MaxQueryLimit, fmt.Sprintf("base the suggestion on the newest `N` selected records, 1 to %d (default %d)", audit.MaxQueryLimit, audit.MaxQueryLimit),
		"print the suggestion as JSON: the manifest, the reason for each field, what was ignored")
	if c := q.parse(args[1:], ""); c >= 0 {
		return c
	}
	recs, found, err := q.records()
	if err != nil {
		return fail(err)
	}
	if !found {
		noDatabase(*q.db)
	}
	sug, err := audit.Suggest(recs)
	if errors.Is(err, audit.ErrNoLegitimateRuns) {
		fmt.Fprintf(os.Stderr, "moat policy suggest: %v\n", err)
		return 1
	}
	if err != nil {
		return fail(err)
	}
	if *q.json {
		return printJSON(sug)
	}
	if err := sug.WriteYAML(os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}
