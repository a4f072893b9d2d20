package main

// moat incident: list, show, export and remove the evidence bundles Moat
// keeps of flagged runs. The bundles are package incident's; this file is
// flags and printing. Everything printed from a bundle came from a
// hostile run and goes through output.Sanitize.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
)

const incidentUsage = `Usage:
  moat incident list [--json]
  moat incident show ID [--json]
  moat incident export ID FILE
  moat incident rm ID

A flagged run (a canary seen, a secret sent to the wrong host, a seccomp
kill, a typosquat, a hostile file name, a policy kill: docs/INCIDENTS.md)
leaves an evidence bundle, read-only, in $MOAT_HOME/incidents/ID/: its
manifest, command, result, network log, changed workspace files, process
list and audit record. Everything else of the sandbox is destroyed.

list shows the bundles, newest first. show prints one's summary, its
files, and the data paths the run could reach (the playbook's exposure
check). export writes a tar.gz of a bundle to FILE (0600; never
overwrites). rm removes a bundle. Old bundles are pruned by moat gc and
when a new one is written (caps: docs/INCIDENTS.md).
`

func cmdIncident(args []string) int {
	if c := subcommandHelp(incidentUsage, args); c >= 0 {
		return c
	}
	switch args[0] {
	case "list", "ls":
		return incidentList(args[1:])
	case "show":
		return incidentShow(args[1:])
	case "export":
		return incidentExport(args[1:])
	case "rm", "remove":
		return incidentRemove(args[1:])
	}
	fmt.Fprintf(os.Stderr, "moat incident: unknown subcommand %q; accepted: list, show, export, rm\n\n%s", args[0], incidentUsage)
	return exitUsage
}

// incidentStore is the store of this host's engine ($MOAT_HOME). Its
// policy matters only to Keep and Prune; a bad one is reported by them.
func incidentStore() *incident.Store {
	pol, _ := incidentPolicy()
	return incident.Open(engine.IncidentDir(engine.DefaultHome()), pol)
}

// incidentArgs parses a subcommand's flags and wants exactly n arguments.
func incidentArgs(cmd, synopsis string, args []string, n int, jsonFlag bool) ([]string, bool, int) {
	fs := newFlags("incident "+cmd, "Usage: moat incident "+synopsis+"\n\nFlags:\n")
	var asJSON *bool
	if jsonFlag {
		asJSON = fs.Bool("json", false, "print JSON")
	}
	if c := parse(fs, args); c >= 0 {
		return nil, false, c
	}
	if fs.NArg() != n {
		fmt.Fprintf(os.Stderr, "moat incident %s: want %d argument(s): moat incident %s\n", cmd, n, synopsis)
		return nil, false, exitUsage
	}
	return fs.Args(), asJSON != nil && *asJSON, -1
}

// incidentFail reports an unknown id as a usage error, naming the fix.
func incidentFail(err error) int {
	if errors.Is(err, incident.ErrNotFound) {
		return fail(usageError{err})
	}
	return fail(err)
}

func incidentList(args []string) int {
	_, asJSON, c := incidentArgs("list", "list [--json]", args, 0, true)
	if c >= 0 {
		return c
	}
	sums, err := incidentStore().List()
	if err != nil {
		return fail(err)
	}
	if asJSON {
		return printJSON(sums)
	}
	if len(sums) == 0 {
		fmt.Fprintln(os.Stderr, "no incidents")
		return 0
	}
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTIME\tRUN\tKEY\tSIZE\tWHY")
	for _, s := range sums {
		why := strings.Join(s.Reasons, "; ")
		if len(why) > 80 {
			why = why[:77] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Time.Format("2006-01-02 15:04:05"), s.RunID, orDash(s.Key), bytesText(s.Bytes), why)
	}
	tw.Flush()
	os.Stdout.Write(output.Sanitize([]byte(b.String())))
	return 0
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func incidentShow(args []string) int {
	rest, asJSON, c := incidentArgs("show", "show ID [--json]", args, 1, true)
	if c >= 0 {
		return c
	}
	st := incidentStore()
	sum, err := st.Get(rest[0])
	if err != nil {
		return incidentFail(err)
	}
	dir, _ := st.Path(sum.ID)
	if asJSON {
		return printJSON(struct {
			incident.Summary
			Dir string `json:"dir"`
		}{sum, dir})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "incident %s\n  time:     %s\n  run:      %s\n  key:      %s\n  tier:     %s\n  size:     %s\n",
		sum.ID, sum.Time.Format("2006-01-02 15:04:05 MST"), sum.RunID, orDash(sum.Key), sum.Tier, bytesText(sum.Bytes))
	for _, cmd := range sum.Commands {
		fmt.Fprintf(&b, "  command:  %q\n", cmd)
	}
	b.WriteString("why flagged:\n")
	for _, r := range sum.Reasons {
		fmt.Fprintf(&b, "  - %s\n", r)
	}
	fmt.Fprintf(&b, "files (in %s):\n", dir)
	for _, f := range sum.Files {
		fmt.Fprintf(&b, "  %s\n", filepath.Join(dir, f))
	}
	x := sum.Exposure
	b.WriteString("exposure (what the run could reach, from its manifest):\n")
	list := func(name string, items []string) {
		if len(items) == 0 {
			fmt.Fprintf(&b, "  %-16s none\n", name+":")
			return
		}
		fmt.Fprintf(&b, "  %-16s %s\n", name+":", strings.Join(items, ", "))
	}
	list("inputs", x.Inputs)
	fmt.Fprintf(&b, "  %-16s %s\n", "network:", orDash(x.Network))
	list("network allow", x.Allow)
	if len(x.AllowAddresses) > 0 {
		list("allow addresses", x.AllowAddresses)
	}
	var secrets []string
	for _, s := range x.Secrets {
		secrets = append(secrets, s.Name+" -> "+strings.Join(s.Hosts, " "))
	}
	list("secrets", secrets)
	list("secrets used", x.SecretsUsed)
	list("packages", x.Packages)
	b.WriteString("playbook (docs/INCIDENTS.md):\n")
	if sum.Key != "" {
		fmt.Fprintf(&b, "  moat keys revoke %s\n", sum.Key)
	}
	for _, s := range x.Secrets {
		fmt.Fprintf(&b, "  moat secrets rotate %s\n", s.Name)
	}
	fmt.Fprintf(&b, "  moat incident export %s %s.tar.gz\n", sum.ID, sum.ID)
	os.Stdout.Write(output.Sanitize([]byte(b.String())))
	return 0
}

func incidentExport(args []string) int {
	rest, _, c := incidentArgs("export", "export ID FILE", args, 2, false)
	if c >= 0 {
		return c
	}
	if err := incidentStore().Export(rest[0], rest[1]); err != nil {
		if errors.Is(err, incident.ErrNotFound) || errors.Is(err, incident.ErrExists) {
			return fail(usageError{err})
		}
		return fail(err)
	}
	fmt.Fprintf(os.Stderr, "exported incident %s to %s\n", rest[0], rest[1])
	return 0
}

func incidentRemove(args []string) int {
	rest, _, c := incidentArgs("rm", "rm ID", args, 1, false)
	if c >= 0 {
		return c
	}
	if err := incidentStore().Remove(rest[0]); err != nil {
		return incidentFail(err)
	}
	fmt.Fprintf(os.Stderr, "removed incident %s\n", rest[0])
	return 0
}

// incidentPolicy is the operator's incident policy, the same for moat
// run, moat serve, moat gc and moat incident: from the environment
// (MOAT_INCIDENT_MAX_BUNDLE and MOAT_INCIDENT_MAX_TOTAL, sizes like
// "16MiB"; MOAT_INCIDENT_MAX_AGE, a duration like "720h"), defaults for
// what is unset.
func incidentPolicy() (incident.Policy, error) {
	var p incident.Policy
	for _, v := range []struct {
		name string
		dst  *int64
	}{{"MOAT_INCIDENT_MAX_BUNDLE", &p.MaxBundleBytes}, {"MOAT_INCIDENT_MAX_TOTAL", &p.MaxTotalBytes}} {
		s := os.Getenv(v.name)
		if s == "" {
			continue
		}
		n, err := manifest.ParseSize(s)
		if err != nil || n <= 0 {
			return p, usageError{fmt.Errorf("%s=%q is not a positive size; write e.g. %s=64MiB, or unset it for the default", v.name, s, v.name)}
		}
		*v.dst = int64(n)
	}
	if s := os.Getenv("MOAT_INCIDENT_MAX_AGE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return p, usageError{fmt.Errorf("MOAT_INCIDENT_MAX_AGE=%q is not a positive duration; write e.g. MOAT_INCIDENT_MAX_AGE=720h, or unset it for the default (30 days)", s)}
		}
		p.MaxAge = d
	}
	return p, nil
}

// incidentOptions sets opts to keep incident bundles by the operator's
// policy, or none when off (--no-incidents, or MOAT_INCIDENTS=off).
func incidentOptions(opts *engine.Options, off bool) error {
	if off || os.Getenv("MOAT_INCIDENTS") == "off" {
		return nil
	}
	pol, err := incidentPolicy()
	if err != nil {
		return err
	}
	home := opts.Home
	if home == "" {
		home = engine.DefaultHome()
	}
	opts.Incidents = incident.Open(engine.IncidentDir(home), pol)
	return nil
}
