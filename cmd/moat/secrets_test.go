package main

// Tests of moat secrets and of the secret grants of moat keys. No root:
// each works in its own temporary MOAT_HOME.

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const cliSecret = "tok_CLIsecretVALUE_mustNotAppear_91"

func TestSecretsCLI(t *testing.T) {
	home, env := auditEnv(t)
	valueFile := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(valueFile, []byte(cliSecret+"-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env = append(env, "MOAT_TEST_CLI_SECRET="+cliSecret+"-env")
	run := func(stdin string, args ...string) outcome {
		return moat(t, invocation{args: args, env: env, stdin: stdin})
	}
	out := run("", "secrets", "list")
	out.check(t, 0, nil, []string{"no secrets yet"}, nil)
	if _, err := os.Stat(home); err == nil {
		t.Errorf("listing secrets created the state directory")
	}

	steps := []struct {
		name           string
		stdin          string
		args           []string
		code           int
		wantOut, wantE []string
	}{
		{"add from stdin", cliSecret + "\n", []string{"secrets", "add", "gh"}, 0, nil, []string{"stored secret gh (value)"}},
		{"add twice", cliSecret, []string{"secrets", "add", "gh"}, exitMoat, nil, []string{"secret gh exists", "moat secrets rotate gh"}},
		{"add from a file", "", []string{"secrets", "add", "from-file", "--from-file", valueFile}, 0, nil, []string{"stored secret from-file (value)"}},
		{"add from the environment", "", []string{"secrets", "add", "from-env", "--from-env", "MOAT_TEST_CLI_SECRET"}, 0, nil, nil},
		{"add a reference", "", []string{"secrets", "add", "ref", "--ref", "env:MOAT_TEST_CLI_SECRET"}, 0, nil, []string{"stored secret ref (env)"}},
		{"add a relative file reference", "", []string{"secrets", "add", "ref2", "--ref", "file:value"}, exitUsage, nil, []string{"absolute path"}},
		{"empty value", "\n", []string{"secrets", "add", "empty"}, exitUsage, nil, []string{"the value is empty"}},
		{"two lines", "a\nb\n", []string{"secrets", "add", "lines"}, exitUsage, nil, []string{"CR or LF"}},
		{"two sources", "", []string{"secrets", "add", "x", "--from-env", "A", "--ref", "env:A"}, exitUsage, nil, []string{"give one of"}},
		{"unset variable", "", []string{"secrets", "add", "x", "--from-env", "MOAT_TEST_UNSET_VAR"}, exitUsage, nil, []string{"is not set"}},
		{"bad name", "v", []string{"secrets", "add", "GitHub"}, exitUsage, nil, []string{`"GitHub" is not a secret name`}},
		{"no name", "v", []string{"secrets", "add"}, exitUsage, nil, []string{"exactly one NAME"}},
		{"rotate", cliSecret + "2", []string{"secrets", "rotate", "gh"}, 0, nil, []string{"rotated secret gh"}},
		{"rotate a missing secret", "v", []string{"secrets", "rotate", "nope"}, exitUsage, nil, []string{"no such secret", "moat secrets add nope"}},
		{"list", "", []string{"secrets", "list"}, 0, []string{"NAME", "from-env", "from-file", "gh", "ref", "env"}, nil},
		{"rm", "", []string{"secrets", "rm", "from-env"}, 0, nil, []string{"removed secret from-env"}},
		{"rm twice", "", []string{"secrets", "rm", "from-env"}, exitUsage, nil, []string{"no such secret"}},
		{"unknown subcommand", "", []string{"secrets", "show", "gh"}, exitUsage, nil, []string{`unknown subcommand "show"`}},
		{"help", "", []string{"secrets", "--help"}, 0, []string{"moat secrets add NAME", "AES-256-GCM", "moat keys grant"}, nil},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			run(st.stdin, st.args...).check(t, st.code, st.wantOut, st.wantE, []string{cliSecret})
		})
	}

	t.Run("list json", func(t *testing.T) {
		out := run("", "secrets", "list", "--json")
		out.check(t, 0, nil, nil, []string{cliSecret})
		var names []string
		for _, line := range strings.Split(strings.TrimSpace(out.stdout), "\n") {
			var e struct {
				Name, Kind string
				Rotated    *string
			}
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			names = append(names, e.Name+":"+e.Kind)
			if e.Name == "gh" && e.Rotated == nil {
				t.Errorf("gh was rotated, but lists no rotation")
			}
		}
		if got := strings.Join(names, " "); got != "from-file:value gh:value ref:env" {
			t.Errorf("listed %s", got)
		}
	})
	t.Run("nothing in clear on disk", func(t *testing.T) {
		filepath.WalkDir(home, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("CLIsecretVALUE")) {
				t.Errorf("%s holds a secret's value in clear", p)
			}
			if fi, _ := d.Info(); fi.Mode().Perm()&0o077 != 0 && strings.HasPrefix(p, filepath.Join(home, "secrets")) {
				t.Errorf("%s has mode %v; want 0600", p, fi.Mode().Perm())
			}
			return nil
		})
		fi, err := os.Stat(filepath.Join(home, "secrets.key"))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("secrets.key: %v, %v; want mode 0600", fi, err)
		}
	})
}

func TestKeysSecretGrantsCLI(t *testing.T) {
	_, env := auditEnv(t)
	run := func(args ...string) outcome { return moat(t, invocation{args: args, env: env}) }
	out := run("keys", "create", "--name", "agent", "--secret", "gh", "--secret", "api-key")
	out.check(t, 0, nil, nil, nil)
	m := cliTokenRE.FindStringSubmatch(out.stdout)
	if m == nil {
		t.Fatalf("no token in %q", out.stdout)
	}
	id := m[1]
	steps := []struct {
		name           string
		args           []string
		code           int
		wantOut, wantE []string
	}{
		{"created with grants", []string{"keys", "list"}, 0, []string{"SECRETS", "api-key,gh"}, nil},
		{"grant", []string{"keys", "grant", id, "openai"}, 0, nil, []string{"granted secret openai to key " + id, "holds no secret openai yet"}},
		{"listed", []string{"keys", "list", "--json"}, 0, []string{`"secrets":["api-key","gh","openai"]`}, nil},
		{"ungrant", []string{"keys", "ungrant", id, "gh"}, 0, nil, []string{"took secret gh back"}},
		{"ungrant again", []string{"keys", "ungrant", id, "gh"}, exitUsage, nil, []string{"was not granted secret"}},
		{"after ungrant", []string{"keys", "list"}, 0, []string{"api-key,openai"}, nil},
		{"grant to an unknown key", []string{"keys", "grant", "k0123456789ab", "gh"}, exitUsage, nil, []string{"no such key"}},
		{"grant a bad name", []string{"keys", "grant", id, "Bad/Name"}, exitUsage, nil, []string{"is not a secret name"}},
		{"grant without a secret", []string{"keys", "grant", id}, exitUsage, nil, []string{"want a key ID and a secret name"}},
		{"create with a bad secret", []string{"keys", "create", "--name", "x", "--secret", "A B"}, exitUsage, nil, []string{"want a secret name"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			run(st.args...).check(t, st.code, st.wantOut, st.wantE, nil)
		})
	}
}
