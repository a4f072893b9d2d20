package main

// moat keys: the API keys of moat serve, kept in the audit database.
// Everything here is flags and printing; the keys live in package audit.

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
)

const keysUsage = `Usage:
  moat keys create --name NAME [--max-sandboxes N] [--cpu-seconds-per-day S] [--admin] [--e2b] [--secret NAME...]
  moat keys create --name NAME --scope metrics
  moat keys list [--json]
  moat keys revoke ID
  moat keys grant ID SECRET
  moat keys ungrant ID SECRET

Manages the API keys of moat serve. create prints the new key's token
(moat_<id>_<secret>, or with --e2b the same key spelled e2b_<hex> for the
E2B SDKs) on stdout, once: the database keeps only a SHA-256 of its
secret, so it cannot be shown again. list shows every key, revoked
ones included; revoke refuses the key from its next request on. grant lets
the key's manifests name the stored secret SECRET (moat secrets add);
ungrant takes it back. A key starts with no secrets.

Every subcommand takes --db FILE (default: audit.db in moat's state
directory, $MOAT_HOME or /var/lib/moat). Run 'moat keys SUBCOMMAND --help'
for its flags.
`

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
	case "grant":
		return keysGrant(args[1:], true)
	case "ungrant":
		return keysGrant(args[1:], false)
	}
	fmt.Fprintf(os.Stderr, "moat keys: unknown subcommand %q; accepted: create, list, revoke, grant, ungrant\n\n%s", args[0], keysUsage)
	return exitUsage
}

func keysCreate(args []string) int {
	fs := newFlags("keys create", "Usage: moat keys create --name NAME [--max-sandboxes N] [--cpu-seconds-per-day S] [--admin] [--e2b] [--secret NAME...]\n\n"+
		"Creates an API key for moat serve and prints its token on stdout. The token is\n"+
		"shown once: Moat keeps only a hash of it.\n\nFlags:\n")
	db := dbFlag(fs)
	name := fs.String("name", "", "the key's `NAME`, 1 to 64 printable characters, e.g. agent-1 (required)")
	e2bForm := fs.Bool("e2b", false, "print the token in the spelling the E2B SDKs require (e2b_ and hex digits; e2b JS 2.2x-2.50 refuse any other) for E2B_API_KEY with moat serve --e2b; the same key")
	admin := fs.Bool("admin", false, "an admin key: it may also read what concerns the whole server (GET /metrics); give it to monitoring, never to a tenant")
	scope := fs.String("scope", "", "a key that may do this and nothing else: metrics (GET /metrics only, for a scraper; it runs nothing)")
	var secrets []string
	fs.Func("secret", "grant the stored secret `NAME` to the key (repeat for more; moat keys grant adds more later)", func(s string) error {
		if !egress.ValidSecretName(s) {
			return fmt.Errorf("want a secret name: 1 to %d of a-z 0-9 _ -, starting with a letter or digit", egress.MaxSecretName)
		}
		secrets = append(secrets, s)
		return nil
	})
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
	if *scope != "" {
		if !slices.Contains(audit.Scopes, *scope) {
			fmt.Fprintf(os.Stderr, "moat keys create: --scope %q: want one of %s\n", *scope, strings.Join(audit.Scopes, ", "))
			return exitUsage
		}
		// A scoped key does its scope's one thing: what would widen it
		// is refused rather than ignored.
		var wider []string
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "admin", "e2b", "secret", "max-sandboxes", "cpu-seconds-per-day":
				wider = append(wider, "--"+f.Name)
			}
		})
		if len(wider) > 0 {
			fmt.Fprintf(os.Stderr, "moat keys create: --scope %s makes a key that runs nothing: drop %s\n", *scope, strings.Join(wider, ", "))
			return exitUsage
		}
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
	if *scope != "" {
		create = func(name string, _ audit.Quota) (string, audit.Key, error) { return st.CreateScopedKey(name, *scope) }
		kind = *scope + " key"
	}
	token, k, err := create(*name, q)
	if err != nil {
		return fail(err)
	}
	for _, s := range secrets {
		if err := st.GrantSecret(k.ID, s); err != nil {
			// The key exists without its grants: take it back rather
			// than hand out a token that does less than was asked.
			st.RevokeKey(k.ID)
			return fail(fmt.Errorf("%w (key %s revoked; create it again)", err, k.ID))
		}
	}
	use := "Use it as: Authorization: Bearer <token>\n"
	if *e2bForm {
		e2b, ok := audit.E2BToken(token)
		if !ok {
			return fail(fmt.Errorf("key %s: its token has no E2B spelling (a bug: please report it)", k.ID))
		}
		token = e2b
		use = "Use it as E2B_API_KEY with moat serve --e2b. Moat's own API takes the same key as\n" +
			"moat_k<its first 12 hex digits>_<the other 64>.\n"
	}
	fmt.Println(token)
	if k.Scope == audit.ScopeMetrics {
		fmt.Fprintf(os.Stderr, "Created %s %s (%s): it reads GET /metrics and nothing else.\n"+
			"The token above is shown only this once and cannot be shown again: store it now.\n"+
			use, kind, k.ID, audit.Display(k.Name))
		return 0
	}
	fmt.Fprintf(os.Stderr, "Created %s %s (%s): at most %d sandboxes at once, %g CPU-seconds per day.\n"+
		"The token above is shown only this once and cannot be shown again: store it now.\n"+
		use, kind, k.ID, audit.Display(k.Name), k.Quota.MaxSandboxes, k.Quota.CPUSecondsPerDay)
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
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tSTATE\tMAX SANDBOXES\tCPU-S/DAY\tSECRETS")
	for _, k := range keys {
		state := "active"
		if k.Revoked != nil {
			state = "revoked " + k.Revoked.Format("2006-01-02 15:04")
		}
		if k.Admin {
			state += " (admin)"
		}
		if k.Scope != "" {
			state += " (" + k.Scope + " only)"
		}
		secrets := "-"
		if len(k.Secrets) > 0 {
			secrets = strings.Join(k.Secrets, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%g\t%s\n", k.ID, audit.Display(k.Name), k.Created.Format("2006-01-02 15:04"), state, k.Quota.MaxSandboxes, k.Quota.CPUSecondsPerDay, secrets)
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

func keysGrant(args []string, grant bool) int {
	cmd, does := "grant", "Lets the API key ID name the stored secret SECRET in its manifests."
	if !grant {
		cmd, does = "ungrant", "Takes the secret SECRET back from the API key ID: its runs naming it are refused."
	}
	fs := newFlags("keys "+cmd, "Usage: moat keys "+cmd+" ID SECRET\n\n"+does+"\n\nFlags:\n")
	db := dbFlag(fs)
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() != 2 {
		fmt.Fprintf(os.Stderr, "moat keys %s: want a key ID and a secret name, e.g. moat keys %s k0123456789ab github-token\n", cmd, cmd)
		return exitUsage
	}
	id, secret := fs.Arg(0), fs.Arg(1)
	if !egress.ValidSecretName(secret) {
		fmt.Fprintf(os.Stderr, "moat keys %s: %q is not a secret name; give 1 to %d of a-z 0-9 _ -, starting with a letter or digit\n", cmd, secret, egress.MaxSecretName)
		return exitUsage
	}
	st, err := openAudit(*db, false)
	if err != nil {
		return fail(err)
	}
	if st == nil {
		noDatabase(*db)
		fmt.Fprintf(os.Stderr, "moat keys %s: no key %s\n", cmd, audit.Display(id))
		return exitUsage
	}
	defer st.Close()
	op := st.GrantSecret
	if !grant {
		op = st.RevokeSecret
	}
	if err := op(id, secret); err != nil {
		if errors.Is(err, audit.ErrNotFound) {
			return fail(usageError{err})
		}
		return fail(err)
	}
	if grant {
		fmt.Fprintf(os.Stderr, "granted secret %s to key %s\n", secret, audit.Display(id))
		if !openSecrets("").Has(secret) {
			fmt.Fprintf(os.Stderr, "note: this host holds no secret %s yet; add it with moat secrets add %s\n", secret, secret)
		}
	} else {
		fmt.Fprintf(os.Stderr, "took secret %s back from key %s\n", secret, audit.Display(id))
	}
	return 0
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
