package main

// The audit database as moat keys, moat audit and moat policy open it,
// and the flags that select its records.

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

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

// checkFilter refuses what the flags cannot mean together.
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
