package main

// moat keys, moat audit and moat policy: the API keys of moat serve, and
// what the audit log says runs did. Everything here is flags and printing;
// the store, reports and suggestions live in package audit.

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
)

const keysUsage = `Usage:
  moat keys create --name NAME [--max-sandboxes N] [--cpu-seconds-per-day S] [--admin]
  moat keys list [--json]
  moat keys revoke ID

Manages the API keys of moat serve. create prints the new key's token
(moat_<id>_<secret>) on stdout, once: the database keeps only a SHA-256
of its secret, so it cannot be shown again. list shows every key, revoked
ones included; revoke refuses the key from its next request on.

Every subcommand takes --db FILE (default: audit.db in moat's state
directory, $MOAT_HOME or /var/lib/moat). Run 'moat keys SUBCOMMAND --help'
for its flags.
`

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

// defaultDB is where moat serve keeps its audit log.
func defaultDB() string { return filepath.Join(engine.DefaultHome(), "audit.db") }

func dbFlag(fs *flag.FlagSet) *string {
	return fs.String("db", defaultDB(), "audit database `FILE`")
}

// openAudit opens the database at path. Without create, a database that
// does not exist yet is reported as (nil, nil), so reading commands can
// say so instead of creating an empty file at a mistyped path.
func openAudit(path string, create bool) (*audit.Store, error) {
	if !create {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	if path == defaultDB() {
		// The state directory is traversable by others (the sandbox's
		// init must reach the images below it): create it as the engine
		// does, before audit.Open would create it private.
		if err := os.MkdirAll(engine.DefaultHome(), 0o711); err != nil {
			return nil, fmt.Errorf("create state directory %s: %w (set MOAT_HOME or --db)", engine.DefaultHome(), err)
		}
	}
	return audit.Open(path)
}

func noDatabase(path string) {
	fmt.Fprintf(os.Stderr, "moat: no audit database at %s yet (moat serve and 'moat keys create' create it; --db names another)\n", path)
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

func cmdKeys(args []string) int {
	if c := subcommandHelp(keysUsage, args); c >= 0 {
		return c
	}
	switch args[0] {
	case "create":
		return keysCreate(args[1:])
	case "list", "ls":
		return keysList(args[1:])
	case "revoke":
		return keysRevoke(args[1:])
	}
	fmt.Fprintf(os.Stderr, "moat keys: unknown subcommand %q; accepted: create, list, revoke\n\n%s", args[0], keysUsage)
	return exitUsage
}

func keysCreate(args []string) int {
	fs := newFlags("keys create", "Usage: moat keys create --name NAME [--max-sandboxes N] [--cpu-seconds-per-day S] [--admin]\n\n"+
		"Creates an API key for moat serve and prints its token on stdout. The token is\n"+
		"shown once: Moat keeps only a hash of it.\n\nFlags:\n")
	db := dbFlag(fs)
	name := fs.String("name", "", "the key's `NAME`, 1 to 64 printable characters, e.g. agent-1 (required)")
	admin := fs.Bool("admin", false, "an admin key: it may also read what concerns the whole server (GET /metrics); give it to monitoring, never to a tenant")
	q := audit.DefaultQuota
	fs.Func("max-sandboxes", fmt.Sprintf("`N` sandboxes and runs the key may hold at once, 1 to %d (default %d)", audit.MaxQuotaSandboxes, audit.DefaultQuota.MaxSandboxes), func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > audit.MaxQuotaSandboxes {
			return fmt.Errorf("want a whole number from 1 to %d", audit.MaxQuotaSandboxes)
		}
		q.MaxSandboxes = n
		return nil
	})
	fs.Func("cpu-seconds-per-day", fmt.Sprintf("CPU time `S` the key's runs may use per UTC day: seconds (36000) or a duration (10h), up to %g seconds (default %g)",
		float64(audit.MaxQuotaCPUSecondsPerDay), audit.DefaultQuota.CPUSecondsPerDay), func(s string) error {
		v, err := parseSeconds(s)
		if err != nil || v <= 0 || v > audit.MaxQuotaCPUSecondsPerDay {
			return fmt.Errorf("want a positive number of seconds such as 36000, or a duration such as 10h, up to %g seconds", float64(audit.MaxQuotaCPUSecondsPerDay))
		}
		q.CPUSecondsPerDay = v
		return nil
	})
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "moat keys create: unexpected argument %q; the name goes in --name\n", fs.Arg(0))
		return exitUsage
	}
	if *name == "" {
		fmt.Fprintln(os.Stderr, "moat keys create: --name is required: give 1 to 64 printable characters, e.g. --name agent-1")
		return exitUsage
	}
	if err := audit.CheckKeyName(*name); err != nil {
		fmt.Fprintf(os.Stderr, "moat keys create: --name: %v\n", err)
		return exitUsage
	}
	st, err := openAudit(*db, true)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	create, kind := st.CreateKey, "key"
	if *admin {
		create, kind = st.CreateAdminKey, "admin key"
	}
	token, k, err := create(*name, q)
	if err != nil {
		return fail(err)
	}
	fmt.Println(token)
	fmt.Fprintf(os.Stderr, "Created %s %s (%s): at most %d sandboxes at once, %g CPU-seconds per day.\n"+
		"The token above is shown only this once and cannot be shown again: store it now.\n"+
		"Use it as: Authorization: Bearer <token>\n", kind, k.ID, audit.Display(k.Name), k.Quota.MaxSandboxes, k.Quota.CPUSecondsPerDay)
	return 0
}

func keysList(args []string) int {
	fs := newFlags("keys list", "Usage: moat keys list [--json]\n\nLists every API key, revoked ones included, oldest first.\n\nFlags:\n")
	db := dbFlag(fs)
	jsonOut := fs.Bool("json", false, "print one JSON object per key and line")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "moat keys list: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	st, err := openAudit(*db, false)
	if err != nil {
		return fail(err)
	}
	keys := []audit.Key{}
	if st != nil {
		defer st.Close()
		if keys, err = st.Keys(); err != nil {
			return fail(err)
		}
	}
	if *jsonOut {
		for _, k := range keys {
			output.EncodeJSON(os.Stdout, k, "")
		}
		return 0
	}
	if len(keys) == 0 {
		fmt.Fprintln(os.Stderr, "no API keys yet; create one with: moat keys create --name NAME")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tSTATE\tMAX SANDBOXES\tCPU-S/DAY")
	for _, k := range keys {
		state := "active"
		if k.Revoked != nil {
			state = "revoked " + k.Revoked.Format("2006-01-02 15:04")
		}
		if k.Admin {
			state += " (admin)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%g\n", k.ID, audit.Display(k.Name), k.Created.Format("2006-01-02 15:04"), state, k.Quota.MaxSandboxes, k.Quota.CPUSecondsPerDay)
	}
	tw.Flush()
	return 0
}

func keysRevoke(args []string) int {
	fs := newFlags("keys revoke", "Usage: moat keys revoke ID\n\nRevokes the API key ID (as 'moat keys list' shows it): moat serve refuses it\nfrom its next request on. Revoking a revoked key changes nothing.\n\nFlags:\n")
	db := dbFlag(fs)
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "moat keys revoke: want exactly one key ID, e.g. moat keys revoke k0123456789ab (moat keys list shows them)")
		return exitUsage
	}
	id := fs.Arg(0)
	if strings.HasPrefix(id, "moat_") {
		fmt.Fprintln(os.Stderr, "moat keys revoke: give the key's ID (k + 12 hex digits, the part after moat_), not the whole token")
		return exitUsage
	}
	st, err := openAudit(*db, false)
	if err != nil {
		return fail(err)
	}
	if st == nil {
		noDatabase(*db)
		fmt.Fprintf(os.Stderr, "moat keys revoke: no key %s\n", audit.Display(id))
		return exitUsage
	}
	defer st.Close()
	if err := st.RevokeKey(id); err != nil {
		if errors.Is(err, audit.ErrNotFound) {
			return fail(usageError{err})
		}
		return fail(err)
	}
	fmt.Fprintf(os.Stderr, "revoked key %s\n", audit.Display(id))
	return 0
}

// terminations are the accepted --outcome terminations: result's closed
// taxonomy.
var terminations = []result.Termination{result.Exited, result.Signaled, result.Timeout, result.CPUTime, result.OOM,
	result.Pids, result.OutputLimit, result.DiskLimit, result.Policy, result.InfraError}

// addFilterFlags registers the flags that select records.
func addFilterFlags(fs *flag.FlagSet, f *audit.Filter) {
	fs.Func("key", "only the records of the API key `ID` (moat keys list shows them)", func(s string) error {
		if s == "" {
			return errors.New("want a key ID such as k0123456789ab")
		}
		f.KeyID = s
		return nil
	})
	fs.Func("sandbox", "only the records of sandbox `ID` (its own and its execs')", func(s string) error {
		if s == "" {
			return errors.New("want a sandbox ID")
		}
		f.SandboxID = s
		return nil
	})
	fs.Func("since", "only records started at or after `WHEN`: a duration ago (90m, 24h, 7d) or a time (RFC 3339, 2025-03-04T10:00:00Z, or a date, 2025-03-04, meaning 00:00 UTC)", func(s string) error {
		t, err := parseWhen(s, time.Now())
		f.Since = t
		return err
	})
	fs.Func("until", "only records started before `WHEN`, written as for --since", func(s string) error {
		t, err := parseWhen(s, time.Now())
		f.Until = t
		return err
	})
	var names []string
	for _, t := range terminations {
		names = append(names, string(t))
	}
	outcomes := strings.Join(names, ", ")
	fs.Func("outcome", "only records with `OUTCOME`: how the program ended ("+outcomes+"), or done (any ending), failed (Moat failed) or running", func(s string) error {
		switch {
		case s == string(audit.Running), s == string(audit.Failed), s == string(audit.Done):
			f.Status = audit.Status(s)
		case slices.Contains(terminations, result.Termination(s)):
			f.Termination = result.Termination(s)
		default:
			return fmt.Errorf("want a termination (%s), or done, failed or running", outcomes)
		}
		return nil
	})
	fs.Func("kind", "only records of `KIND`: run (one-shot), sandbox (a session's lifetime) or exec (a command in a session)", func(s string) error {
		switch k := audit.Kind(s); k {
		case audit.KindRun, audit.KindSandbox, audit.KindExec:
			f.Kind = k
			return nil
		}
		return errors.New("want run, sandbox or exec")
	})
}

// addLimitFlag registers --limit with its default and range.
func addLimitFlag(fs *flag.FlagSet, f *audit.Filter, def int, help string) {
	f.Limit = def
	fs.Func("limit", help, func(s string) error {
		n, err := strconv.Atoi(s)
		lo := 1
		if def == 0 {
			lo = 0
		}
		if err != nil || n < lo || n > audit.MaxQueryLimit {
			return fmt.Errorf("want a whole number from %d to %d", lo, audit.MaxQueryLimit)
		}
		f.Limit = n
		return nil
	})
}

// checkFilter refuses what the flags cannot mean together.
// auditQuery is the command line shared by the commands that read the
// audit log: --db, the filters, --limit and --json.
type auditQuery struct {
	name   string
	fs     *flag.FlagSet
	db     *string
	filter audit.Filter
	json   *bool
}

func newAuditQuery(name, usage string, limit int, limitHelp, jsonHelp string) *auditQuery {
	q := &auditQuery{name: name, fs: newFlags(name, usage)}
	q.db = dbFlag(q.fs)
	addFilterFlags(q.fs, &q.filter)
	addLimitFlag(q.fs, &q.filter, limit, limitHelp)
	q.json = q.fs.Bool("json", false, jsonHelp)
	return q
}

// parse reads args (no positional arguments; hint follows the complaint
// about one) and checks the filter. It returns the exit status, or -1 to
// go on.
func (q *auditQuery) parse(args []string, hint string) int {
	if c := parse(q.fs, args); c >= 0 {
		return c
	}
	if q.fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "moat %s: unexpected argument %q%s\n", q.name, q.fs.Arg(0), hint)
		return exitUsage
	}
	if !checkFilter(q.name, q.filter) {
		return exitUsage
	}
	return -1
}

// records returns the selected records; found is false when there is no
// database yet (and then there are none).
func (q *auditQuery) records() (recs []audit.Record, found bool, err error) {
	st, err := openAudit(*q.db, false)
	if err != nil || st == nil {
		return []audit.Record{}, false, err
	}
	defer st.Close()
	recs, err = st.Query(q.filter)
	return recs, true, err
}

// printJSON writes v to stdout as indented JSON (output.EncodeJSON).
func printJSON(v any) int {
	if err := output.EncodeJSON(os.Stdout, v, "  "); err != nil {
		return fail(err)
	}
	return 0
}

func checkFilter(cmd string, f audit.Filter) bool {
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		fmt.Fprintf(os.Stderr, "moat %s: --since %s is not before --until %s: no record can match\n", cmd,
			f.Since.UTC().Format(time.RFC3339), f.Until.UTC().Format(time.RFC3339))
		return false
	}
	return true
}

// parseWhen reads a point in time: a duration before now ("90m", "24h",
// "7d"), an RFC 3339 time or a date (00:00 UTC).
func parseWhen(s string, now time.Time) (time.Time, error) {
	const want = "want a duration ago such as 90m, 24h or 7d, or a time such as 2025-03-04T10:00:00Z or 2025-03-04"
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days < 0 || days > 100*366 {
			return time.Time{}, errors.New(want)
		}
		return now.Add(-time.Duration(days) * 24 * time.Hour), nil
	}
	d, err := manifest.ParseDuration(s)
	if err != nil {
		return time.Time{}, errors.New(want)
	}
	return now.Add(-d.D()), nil
}

// parseSeconds reads a number of seconds or a Go duration.
func parseSeconds(s string) (float64, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, errors.New("not finite")
		}
		return v, nil
	}
	d, err := manifest.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	return d.D().Seconds(), nil
}

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
