package main

// moat audit and moat audit report: what the audit log says runs did and
// what they cost. Everything here is flags and printing; the store and the
// reports live in package audit.

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/output"
)

const auditUsage = `Usage:
  moat audit [FILTERS] [--limit N] [--json]
  moat audit report [FILTERS] [--price-cpu-second X] [--price-gib-second Y] [--price-wall-second Z] [--json]

moat audit lists the audit log, newest first: one record per one-shot run,
sandbox (session) and command run in a sandbox (exec), with its outcome and
usage. With --json, one JSON record per line.

moat audit report summarises the records the filters select (all of them
unless --limit): counts by status and termination, the most-denied network
destinations, the limits hit, the commands that timed out, and what the
runs cost: CPU-seconds, memory GiB-seconds (peak memory x wall time) and
wall-seconds, in total, per record and per key, at the given prices.

Flags:
`

func cmdAudit(args []string) int {
	if len(args) > 0 && args[0] == "report" {
		return auditReport(args[1:])
	}
	q := newAuditQuery("audit", auditUsage, audit.DefaultQueryLimit, fmt.Sprintf("show the newest `N` records, 1 to %d (default %d)", audit.MaxQueryLimit, audit.DefaultQueryLimit),
		"print one JSON record per line (the full record: manifest, network attempts, violations)")
	if c := q.parse(args, "; the subcommand is 'moat audit report', written first"); c >= 0 {
		return c
	}
	recs, found, err := q.records()
	if err != nil {
		return fail(err)
	}
	if *q.json {
		// Hosts in the network log are as the program sent them: escaped
		// where a terminal would act on them, the same strings.
		for _, r := range recs {
			output.EncodeJSON(os.Stdout, r, "")
		}
		return 0
	}
	if !found {
		noDatabase(*q.db)
		return 0
	}
	if len(recs) == 0 {
		fmt.Fprintln(os.Stderr, "no audit records match")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STARTED (UTC)\tID\tKIND\tKEY\tSTATUS\tOUTCOME\tEXIT\tWALL\tCPU\tPEAK MEM\tCOMMAND")
	for _, r := range recs {
		key := r.KeyID
		if key == "" {
			key = "(local)"
		}
		outcome, exit := "-", "-"
		if r.Termination != "" {
			outcome = string(r.Termination)
		}
		if r.Status == audit.Done {
			exit = strconv.Itoa(r.ExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			r.Started.Format("2006-01-02 15:04:05"), audit.Display(r.ID), r.Kind, audit.Display(key), r.Status,
			audit.Display(outcome), exit, msText(r.WallMS), msText(r.CPUMS), bytesText(r.PeakMemoryBytes), audit.DisplayCommand(r.Command, 60))
	}
	tw.Flush()
	return 0
}

func msText(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return (time.Duration(ms * float64(time.Millisecond))).Round(time.Millisecond).String()
}

func bytesText(b int64) string {
	if b == 0 {
		return "-"
	}
	const mib = 1 << 20
	if b < mib {
		return strconv.FormatFloat(float64(b)/1024, 'f', 1, 64) + "KiB"
	}
	return strconv.FormatFloat(float64(b)/mib, 'f', 1, 64) + "MiB"
}

// priceFlag registers a price flag writing into *v.
func priceFlag(fs *flag.FlagSet, name, help string, v *float64) {
	fs.Func(name, help, func(s string) error {
		p, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(p) || math.IsInf(p, 0) || p < 0 {
			return errors.New("want a price of 0 or more, such as 0.0000125 (a plain decimal number, no currency sign)")
		}
		*v = p
		return nil
	})
}

func auditReport(args []string) int {
	q := newAuditQuery("audit report", auditUsage, 0, fmt.Sprintf("summarise only the newest `N` records, up to %d (default: every record the filters select)", audit.MaxQueryLimit),
		"print the report as one JSON document")
	fs := q.fs
	p := audit.DefaultPrices
	priceFlag(fs, "price-cpu-second", "`PRICE` of one CPU busy for one second (default 0.04048/3600, AWS Fargate's on-demand vCPU-hour in us-east-1)", &p.CPUSecond)
	priceFlag(fs, "price-gib-second", "`PRICE` of one GiB of memory held for one second, charged on peak memory x wall time (default 0.004445/3600, Fargate's GB-hour)", &p.GiBSecond)
	priceFlag(fs, "price-wall-second", "`PRICE` of one record alive for one second, whatever it used: the occupancy of a sandbox slot (default 0)", &p.WallSecond)
	if c := q.parse(args, ""); c >= 0 {
		return c
	}
	st, err := openAudit(*q.db, false)
	if err != nil {
		return fail(err)
	}
	if st == nil {
		noDatabase(*q.db)
		return 0
	}
	defer st.Close()
	rep, err := st.Report(q.filter, p)
	if err != nil {
		return fail(err)
	}
	if *q.json {
		return printJSON(rep)
	}
	if err := rep.WriteText(os.Stdout); err != nil {
		return fail(err)
	}
	return 0
}
