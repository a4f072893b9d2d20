package main

// moat policy suggest: the tightest manifest the audit log supports
// (audit.Suggest).

import (
	"errors"
	"fmt"
	"os"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/policy"
)

const policyUsage = `Usage: moat policy suggest [FILTERS] [--limit N] [--json] [--ceilings]

Proposes the tightest capability manifest that would have allowed what the
selected runs legitimately did: only runs and execs that exited by
themselves with status 0 count (how many others were ignored, and why, is
printed too). Memory, timeout and CPU time come from the largest use with
headroom; the network grant lists exactly the destinations that were
reached. The manifest is printed as YAML with the reason for each field as
a comment, ready for 'moat run --manifest'.

With --ceilings, proposes an operator policy instead (for moat serve
--policy and moat run --policy): per API key, the ceiling that admits every
manifest the key's selected records were granted (sessions, runs and
execs, whatever their outcome: they were all admitted), and the largest
memory, wall and CPU time used, with the same headroom. Local runs make
the default ceiling. The policy requires justifications.

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
	ceilings := q.fs.Bool("ceilings", false, "propose an operator policy (per-key ceilings) instead of a manifest")
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
	if *ceilings {
		return suggestCeilings(recs, *q.json)
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

// loadPolicy loads the operator policy from path, or from $MOAT_POLICY
// when path is empty; nil when neither names one.
func loadPolicy(path string) (*policy.Policy, error) {
	if path == "" {
		path = os.Getenv(policy.EnvVar)
	}
	if path == "" {
		return nil, nil
	}
	return policy.Load(path)
}

// checkLocalPolicy refuses a local run beyond the policy's default
// ceiling (a local run has no key). It returns -1 to go on, or the exit
// status.
func checkLocalPolicy(path string, m *manifest.Manifest) int {
	pol, err := loadPolicy(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat run: %v\n", err)
		return exitUsage
	}
	if pol == nil {
		return -1
	}
	if err := pol.Check("", m); err != nil {
		fmt.Fprintf(os.Stderr, "moat run: refused by policy: manifest.%v\n", err)
		return exitUsage
	}
	return -1
}

// suggestCeilings prints policy.Suggest's proposal.
func suggestCeilings(recs []audit.Record, asJSON bool) int {
	sug, err := policy.Suggest(recs)
	if errors.Is(err, audit.ErrNoLegitimateRuns) {
		fmt.Fprintf(os.Stderr, "moat policy suggest: %v\n", err)
		return 1
	}
	if err != nil {
		return fail(err)
	}
	if asJSON {
		return printJSON(sug)
	}
	if err := sug.WriteYAML(os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}
