package main

// moat secrets: the host's secret store, whose values runs use through
// their manifest's secrets section without ever seeing them. Everything
// here is flags and printing; the store is package secretstore.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/secretstore"
)

const secretsUsage = `Usage:
  moat secrets add NAME [--from-file FILE | --from-env VAR | --ref file:PATH | --ref env:VAR]
  moat secrets rotate NAME [the same sources]
  moat secrets list [--json]
  moat secrets rm NAME

Manages the secrets runs may use (a manifest's secrets section names them).
A run's program sees only a per-run placeholder; Moat's egress proxy puts
the value into requests to the hosts the manifest binds it to.

add stores a new secret. The value is read from stdin (one line; a final
newline is dropped) unless --from-file or --from-env gives it; it is sealed
with AES-256-GCM in $MOAT_HOME/secrets/NAME.json under the key
$MOAT_HOME/secrets.key (created 0600 on first use; --key-file or
$MOAT_SECRETS_KEY names another), never in the audit database. --ref
stores a reference instead, read at each run: file:PATH (an absolute path)
or env:VAR (a variable of moat's own environment, e.g. moat serve's).
rotate replaces the value (or reference) of an existing secret; runs that
start afterwards get the new one. list shows names, kinds and dates, never
values. API keys use a secret only once granted it: moat keys grant ID NAME.

Run 'moat secrets SUBCOMMAND --help' for its flags.
`

func cmdSecrets(args []string) int {
	if c := subcommandHelp(secretsUsage, args); c >= 0 {
		return c
	}
	switch args[0] {
	case "add":
		return secretsPut(args[1:], false)
	case "rotate":
		return secretsPut(args[1:], true)
	case "list", "ls":
		return secretsList(args[1:])
	case "rm", "remove":
		return secretsRemove(args[1:])
	}
	fmt.Fprintf(os.Stderr, "moat secrets: unknown subcommand %q; accepted: add, rotate, list, rm\n\n%s", args[0], secretsUsage)
	return exitUsage
}

// secretsKeyFile is the key's path: $MOAT_SECRETS_KEY, else the store's
// default in the state directory.
func secretsKeyFile() string { return os.Getenv("MOAT_SECRETS_KEY") }

// openSecrets is the host's secret store, as run and serve use it.
func openSecrets(keyFile string) *secretstore.Store {
	if keyFile == "" {
		keyFile = secretsKeyFile()
	}
	return secretstore.Open(engine.DefaultHome(), keyFile)
}

func keyFileFlag(fs *flag.FlagSet) *string {
	return fs.String("key-file", "", "the store's key `FILE` (default $MOAT_SECRETS_KEY, else secrets.key in $MOAT_HOME)")
}

func checkSecretName(cmd, name string) bool {
	if !egress.ValidSecretName(name) {
		fmt.Fprintf(os.Stderr, "moat secrets %s: %q is not a secret name; give 1 to %d of a-z 0-9 _ -, starting with a letter or digit, e.g. github-token\n", cmd, name, egress.MaxSecretName)
		return false
	}
	return true
}

func secretsPut(args []string, rotate bool) int {
	cmd := "add"
	if rotate {
		cmd = "rotate"
	}
	fs := newFlags("secrets "+cmd, "Usage: moat secrets "+cmd+" NAME [--from-file FILE | --from-env VAR | --ref file:PATH | --ref env:VAR]\n\n"+
		"Stores the secret NAME (rotate: replaces its value). The value comes from stdin\n"+
		"unless a flag gives it; --ref stores a reference read at each run instead.\n\nFlags:\n")
	keyFile := keyFileFlag(fs)
	fromFile := fs.String("from-file", "", "read the value from `FILE` now (a final newline is dropped)")
	fromEnv := fs.String("from-env", "", "take the value from the variable `VAR` of this process now")
	ref := fs.String("ref", "", "store a reference, read when each run starts: `file:PATH` or env:VAR")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(os.Stderr, "moat secrets %s: want exactly one NAME, e.g. moat secrets %s github-token < token.txt\n", cmd, cmd)
		return exitUsage
	}
	name := fs.Arg(0)
	if !checkSecretName(cmd, name) {
		return exitUsage
	}
	given := 0
	for _, s := range []string{*fromFile, *fromEnv, *ref} {
		if s != "" {
			given++
		}
	}
	if given > 1 {
		fmt.Fprintf(os.Stderr, "moat secrets %s: give one of --from-file, --from-env and --ref\n", cmd)
		return exitUsage
	}
	kind, payload := secretstore.KindValue, ""
	switch {
	case *ref != "":
		var err error
		if kind, payload, err = secretstore.ParseSource(*ref); err != nil {
			fmt.Fprintf(os.Stderr, "moat secrets %s: --ref: %v\n", cmd, err)
			return exitUsage
		}
	case *fromEnv != "":
		v, ok := os.LookupEnv(*fromEnv)
		if !ok {
			fmt.Fprintf(os.Stderr, "moat secrets %s: --from-env: variable %s is not set\n", cmd, *fromEnv)
			return exitUsage
		}
		payload = v
	default:
		r := io.Reader(os.Stdin)
		what := "stdin"
		if *fromFile != "" {
			f, err := os.Open(*fromFile)
			if err != nil {
				fmt.Fprintf(os.Stderr, "moat secrets %s: --from-file: %v\n", cmd, err)
				return exitUsage
			}
			defer f.Close()
			r, what = f, *fromFile
		}
		b, err := io.ReadAll(io.LimitReader(r, secretstore.MaxValue+3))
		if err != nil {
			return fail(fmt.Errorf("read the value from %s: %w", what, err))
		}
		payload = secretstore.TrimValue(string(b))
	}
	if kind == secretstore.KindValue {
		if err := secretstore.CheckValue(payload); err != nil {
			fmt.Fprintf(os.Stderr, "moat secrets %s %s: %v\n", cmd, name, err)
			return exitUsage
		}
	}
	st := openSecrets(*keyFile)
	put := st.Add
	if rotate {
		put = st.Rotate
	}
	if err := put(name, kind, payload); err != nil {
		if errors.Is(err, secretstore.ErrNotFound) {
			return fail(usageError{err})
		}
		return fail(err)
	}
	verb := "stored"
	if rotate {
		verb = "rotated"
	}
	fmt.Fprintf(os.Stderr, "%s secret %s (%s) in %s\n", verb, name, kind, st.Dir())
	return 0
}

func secretsList(args []string) int {
	fs := newFlags("secrets list", "Usage: moat secrets list [--json]\n\nLists the stored secrets: names, kinds (value, file, env), created and rotated;\nnever values.\n\nFlags:\n")
	keyFile := keyFileFlag(fs)
	jsonOut := fs.Bool("json", false, "print one JSON object per secret and line")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "moat secrets list: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	ents, err := openSecrets(*keyFile).List()
	if err != nil {
		return fail(err)
	}
	if *jsonOut {
		for _, e := range ents {
			output.EncodeJSON(os.Stdout, e, "")
		}
		return 0
	}
	if len(ents) == 0 {
		fmt.Fprintln(os.Stderr, "no secrets yet; add one with: moat secrets add NAME < value.txt")
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tCREATED\tROTATED")
	for _, e := range ents {
		rotated := "-"
		if e.Rotated != nil {
			rotated = e.Rotated.Format("2006-01-02 15:04")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Name, e.Kind, e.Created.Format("2006-01-02 15:04"), rotated)
	}
	tw.Flush()
	return 0
}

func secretsRemove(args []string) int {
	fs := newFlags("secrets rm", "Usage: moat secrets rm NAME\n\nRemoves the secret NAME: runs that name it are refused from now on (grants\nto API keys stay, by name, until moat keys ungrant).\n\nFlags:\n")
	keyFile := keyFileFlag(fs)
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "moat secrets rm: want exactly one NAME (moat secrets list shows them)")
		return exitUsage
	}
	if !checkSecretName("rm", fs.Arg(0)) {
		return exitUsage
	}
	if err := openSecrets(*keyFile).Remove(fs.Arg(0)); err != nil {
		if errors.Is(err, secretstore.ErrNotFound) {
			return fail(usageError{err})
		}
		return fail(err)
	}
	fmt.Fprintf(os.Stderr, "removed secret %s\n", fs.Arg(0))
	return 0
}
