package main

// Tests of moat keys, moat audit and moat policy. They need no root: each
// works on a database in its own temporary directory, seeded through
// package audit where the CLI only reads.

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// auditEnv is a temporary MOAT_HOME, so nothing touches the host's.
func auditEnv(t *testing.T) (home string, env []string) {
	t.Helper()
	home = filepath.Join(t.TempDir(), "home")
	return home, []string{"MOAT_HOME=" + home}
}

var cliTokenRE = regexp.MustCompile(`^moat_(k[0-9a-f]{12})_[0-9a-f]{64}\n$`)

func TestKeysCLI(t *testing.T) {
	home, env := auditEnv(t)
	run := func(args ...string) outcome { return moat(t, invocation{args: args, env: env}) }

	out := run("keys", "list")
	out.check(t, 0, nil, []string{"no API keys yet"}, nil)
	if _, err := os.Stat(home); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("listing keys created the state directory (%v)", err)
	}

	out = run("keys", "create", "--name", "agent-1", "--max-sandboxes", "3", "--cpu-seconds-per-day", "2h")
	out.check(t, 0, nil, []string{"cannot be shown again", "at most 3 sandboxes", "7200 CPU-seconds per day"}, nil)
	m := cliTokenRE.FindStringSubmatch(out.stdout)
	if m == nil {
		t.Fatalf("stdout %q is not the token alone", out.stdout)
	}
	token, id := strings.TrimSpace(out.stdout), m[1]
	if strings.Contains(out.stderr, token) {
		t.Error("the token is printed twice")
	}
	// The state directory is created as the engine needs it: traversable.
	if fi, err := os.Stat(home); err != nil || fi.Mode().Perm() != 0o711 {
		t.Errorf("state directory %s: %v %v, want mode 0711", home, fi.Mode().Perm(), err)
	}
	db := filepath.Join(home, "audit.db")
	if fi, err := os.Stat(db); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("database %s: %v, want mode 0600", db, err)
	}
	authenticate := func() error {
		st, err := audit.Open(db)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		k, err := st.Authenticate(token)
		if err == nil && (k.ID != id || k.Name != "agent-1" || k.Quota.MaxSandboxes != 3 || k.Quota.CPUSecondsPerDay != 7200) {
			t.Errorf("the key is stored as %+v", k)
		}
		return err
	}
	if err := authenticate(); err != nil {
		t.Fatalf("the printed token does not authenticate: %v", err)
	}

	run("keys", "list").check(t, 0, []string{id, "agent-1", "active", "7200"}, nil, []string{token})
	out = run("keys", "list", "--json")
	out.check(t, 0, []string{`"id":"` + id + `"`}, nil, []string{token, "secret"})
	var k audit.Key
	if err := json.Unmarshal([]byte(out.stdout), &k); err != nil || k.ID != id || k.Revoked != nil {
		t.Errorf("--json line %q: %+v, %v", out.stdout, k, err)
	}

	run("keys", "revoke", id).check(t, 0, nil, []string{"revoked key " + id}, nil)
	if err := authenticate(); !errors.Is(err, audit.ErrBadKey) {
		t.Errorf("a revoked key authenticates: %v", err)
	}
	run("keys", "list").check(t, 0, []string{id, "revoked"}, nil, nil)
	// --db on every subcommand.
	other := filepath.Join(t.TempDir(), "other.db")
	run("keys", "create", "--db", other, "--name", "elsewhere").check(t, 0, []string{"moat_k"}, nil, nil)
	run("keys", "list", "--db", other).check(t, 0, []string{"elsewhere"}, nil, []string{"agent-1"})

	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{"revoke unknown", []string{"keys", "revoke", "k0123456789ab"}, exitUsage, []string{`"k0123456789ab"`, "no such key"}},
		{"revoke a token", []string{"keys", "revoke", token}, exitUsage, []string{"not the whole token"}},
		{"revoke without id", []string{"keys", "revoke"}, exitUsage, []string{"exactly one key ID"}},
		{"create without name", []string{"keys", "create"}, exitUsage, []string{"--name is required"}},
		{"name with escape", []string{"keys", "create", "--name", "a\x1b[2J"}, exitUsage, []string{"--name", "not printable"}},
		{"name too long", []string{"keys", "create", "--name", strings.Repeat("n", 65)}, exitUsage, []string{"at most 64"}},
		{"sandboxes not a number", []string{"keys", "create", "--name", "x", "--max-sandboxes", "lots"}, exitUsage,
			[]string{`invalid value "lots" for flag -max-sandboxes`, "whole number from 1 to 100000"}},
		{"cpu seconds negative", []string{"keys", "create", "--name", "x", "--cpu-seconds-per-day", "-5"}, exitUsage,
			[]string{`invalid value "-5" for flag -cpu-seconds-per-day`, "positive number of seconds"}},
		{"unknown subcommand", []string{"keys", "rotate"}, exitUsage, []string{`unknown subcommand "rotate"`, "create, list, revoke"}},
		{"no subcommand", []string{"keys"}, exitUsage, []string{"moat keys create"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run(tc.args...).check(t, tc.code, nil, tc.wantErr, nil)
		})
	}
}

// seedAudit writes records with known outcomes into a new database.
func seedAudit(t *testing.T, path string) {
	t.Helper()
	st, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)
	seeds := []struct {
		rec audit.Record
		res *result.Result
	}{
		{audit.Record{ID: "run-ok", KeyID: "kA", Kind: audit.KindRun, Started: t0, Image: "python", Tier: "native", Command: []string{"python3", "main.py"}},
			&result.Result{Termination: result.Exited, DurationMS: 2000, CPUMS: 1000, PeakMemoryBytes: 100 << 20,
				Network: []result.NetworkAttempt{{Host: "pypi.org", Port: 443, Allowed: true, Reason: "allowed"}}}},
		{audit.Record{ID: "run-slow", KeyID: "kA", Kind: audit.KindRun, Started: t0.Add(time.Minute), Command: []string{"sleep", "100"}},
			&result.Result{Termination: result.Timeout, ExitCode: 124, DurationMS: 10000,
				Violations: []result.Violation{{Kind: "timeout"}},
				Network:    []result.NetworkAttempt{{Host: "evil.example", Port: 443, Reason: "not-allowlisted"}}}},
		{audit.Record{ID: "fork-bomb", KeyID: "kB", Kind: audit.KindRun, Started: t0.Add(2 * time.Minute), Command: []string{"bash", "-c", ":(){ :|:& };:"}},
			&result.Result{Termination: result.Pids, ExitCode: 137, DurationMS: 30000, CPUMS: 60000, PeakMemoryBytes: 1 << 30,
				Violations: []result.Violation{{Kind: "pids"}}}},
		{audit.Record{ID: "exec-1", KeyID: "kB", SandboxID: "sb-1", Kind: audit.KindExec, Started: t0.Add(3 * time.Minute),
			Command: []string{"printf", "\x1b]52;c;SGVsbG8=\x07"}}, nil},
	}
	for _, s := range seeds {
		if err := st.Begin(s.rec); err != nil {
			t.Fatal(err)
		}
		if s.res != nil {
			if err := st.Finish(s.rec.ID, s.res, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestAuditCLI(t *testing.T) {
	_, env := auditEnv(t)
	db := filepath.Join(t.TempDir(), "audit.db")
	seedAudit(t, db)
	run := func(args ...string) outcome {
		return moat(t, invocation{args: append(args, "--db", db), env: env})
	}
	out := run("audit")
	out.check(t, 0, []string{"STARTED (UTC)", "run-ok", "fork-bomb", "pids", "137", "30s", "1024.0MiB", `bash -c ":(){ :|:& };:"`, "running",
		`printf "\x1b]52;c;SGVsbG8=\a"`}, nil, []string{"\x1b"})
	if i, j := strings.Index(out.stdout, "exec-1"), strings.Index(out.stdout, "run-ok"); i < 0 || j < i {
		t.Errorf("not newest first:\n%s", out.stdout)
	}

	ids := func(out outcome) []string {
		t.Helper()
		var got []string
		sc := bufio.NewScanner(strings.NewReader(out.stdout))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r audit.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("--json line %q: %v", sc.Text(), err)
			}
			got = append(got, r.ID)
		}
		return got
	}
	filters := []struct {
		name string
		args []string
		want string
	}{
		{"everything", nil, "exec-1 fork-bomb run-slow run-ok"},
		{"by key", []string{"--key", "kA"}, "run-slow run-ok"},
		{"by termination", []string{"--outcome", "timeout"}, "run-slow"},
		{"running", []string{"--outcome", "running"}, "exec-1"},
		{"done", []string{"--outcome", "done"}, "fork-bomb run-slow run-ok"},
		{"by kind", []string{"--kind", "exec"}, "exec-1"},
		{"by sandbox", []string{"--sandbox", "sb-1"}, "exec-1"},
		{"since a time", []string{"--since", "2025-03-04T10:01:00Z"}, "exec-1 fork-bomb run-slow"},
		{"until a time", []string{"--until", "2025-03-04T10:01:00Z"}, "run-ok"},
		{"since a date", []string{"--since", "2025-03-05"}, ""},
		{"since days ago", []string{"--since", "36500d"}, "exec-1 fork-bomb run-slow run-ok"},
		{"since a duration ago", []string{"--since", "1h"}, ""},
		{"limit", []string{"--limit", "2"}, "exec-1 fork-bomb"},
	}
	for _, tc := range filters {
		t.Run(tc.name, func(t *testing.T) {
			out := run(append([]string{"audit", "--json"}, tc.args...)...)
			out.check(t, 0, nil, nil, nil)
			if got := strings.Join(ids(out), " "); got != tc.want {
				t.Errorf("moat audit %q: %q, want %q", tc.args, got, tc.want)
			}
		})
	}

	bad := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{"since not a time", []string{"audit", "--since", "yesterday"}, []string{`invalid value "yesterday" for flag -since`, "90m, 24h or 7d", "2025-03-04"}},
		{"until negative", []string{"audit", "--until", "-5m"}, []string{`invalid value "-5m" for flag -until`}},
		{"since after until", []string{"audit", "--since", "2025-03-05", "--until", "2025-03-04"}, []string{"is not before --until"}},
		{"unknown outcome", []string{"audit", "--outcome", "crashed"}, []string{`invalid value "crashed" for flag -outcome`, "exited", "oom", "failed", "running"}},
		{"unknown kind", []string{"audit", "--kind", "job"}, []string{`invalid value "job" for flag -kind`, "run, sandbox or exec"}},
		{"limit zero", []string{"audit", "--limit", "0"}, []string{`invalid value "0" for flag -limit`, "from 1 to 10000"}},
		{"limit too large", []string{"audit", "--limit", "10001"}, []string{`invalid value "10001" for flag -limit`}},
		{"stray argument", []string{"audit", "list"}, []string{`unexpected argument "list"`}},
		{"report bad price", []string{"audit", "report", "--price-cpu-second", "$1"}, []string{`invalid value "$1" for flag -price-cpu-second`, "0 or more"}},
		{"report NaN price", []string{"audit", "report", "--price-gib-second", "NaN"}, []string{`flag -price-gib-second`}},
		{"report bad filter", []string{"audit", "report", "--outcome", "x"}, []string{`flag -outcome`}},
		{"suggest bad filter", []string{"policy", "suggest", "--kind", "x"}, []string{`flag -kind`}},
		{"policy unknown subcommand", []string{"policy", "enforce"}, []string{`unknown subcommand "enforce"`}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			run(tc.args...).check(t, exitUsage, nil, tc.wantErr, nil)
		})
	}

	t.Run("report", func(t *testing.T) {
		out := run("audit", "report", "--price-cpu-second", "0.01", "--price-gib-second", "0.001", "--price-wall-second", "0")
		// The fork bomb: 60 CPU-s and 1 GiB x 30 s = 30 GiB-s -> $0.63.
		out.check(t, 0, []string{"Audit report: 4 records", "evil.example:443", "not-allowlisted 1", "pids", "sleep 100",
			"fork-bomb", "$0.63", "$0.01/CPU-second"}, nil, []string{"\x1b"})
		out = run("audit", "report", "--json", "--key", "kB")
		out.check(t, 0, nil, nil, nil)
		var rep audit.Report
		if err := json.Unmarshal([]byte(out.stdout), &rep); err != nil {
			t.Fatalf("report --json: %v\n%s", err, out.stdout)
		}
		if rep.Records != 2 || rep.Total.CPUSeconds != 60 || rep.Prices != audit.DefaultPrices {
			t.Errorf("report --json --key kB: %d records, %v CPU-s, prices %+v", rep.Records, rep.Total.CPUSeconds, rep.Prices)
		}
	})

	t.Run("policy suggest", func(t *testing.T) {
		out := run("policy", "suggest")
		out.check(t, 0, []string{"# Suggested by moat policy suggest from 1 legitimate run", "memory: 192MiB", "timeout: 3s", "- pypi.org"}, nil, nil)
		m, err := manifest.Parse([]byte(out.stdout), "suggested.yaml")
		if err != nil {
			t.Fatalf("the suggestion does not parse: %v\n%s", err, out.stdout)
		}
		if m.Network.Mode != "allowlist" || len(m.Network.Allow) != 1 {
			t.Errorf("network %+v", m.Network)
		}
		out = run("policy", "suggest", "--json")
		out.check(t, 0, []string{`"reasons"`, `"considered": 1`}, nil, nil)
		run("policy", "suggest", "--key", "kB").check(t, 1, nil, []string{"no legitimate runs", "ended by pids 1"}, nil)
	})
}

func TestAuditCLIWithoutDatabase(t *testing.T) {
	home, env := auditEnv(t)
	missing := filepath.Join(t.TempDir(), "nope.db")
	for _, args := range [][]string{{"audit"}, {"audit", "report"}, {"audit", "--db", missing}} {
		moat(t, invocation{args: args, env: env}).check(t, 0, nil, []string{"no audit database at"}, nil)
	}
	moat(t, invocation{args: []string{"audit", "--json"}, env: env}).check(t, 0, nil, nil, nil)
	moat(t, invocation{args: []string{"policy", "suggest"}, env: env}).check(t, 1, nil, []string{"no audit records match"}, nil)
	moat(t, invocation{args: []string{"keys", "revoke", "k0123456789ab"}, env: env}).check(t, exitUsage, nil, []string{"no key k0123456789ab"}, nil)
	for _, p := range []string{home, missing} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a reading command created %s", p)
		}
	}
}

func TestAuditHelp(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, []string{"keys", "audit", "policy"}},
		{[]string{"keys", "--help"}, []string{"moat keys create", "moat keys list", "moat keys revoke", "--db FILE", "cannot be shown again"}},
		{[]string{"help", "keys"}, []string{"moat keys create"}},
		{[]string{"keys", "create", "--help"}, []string{"-name", "-max-sandboxes", "-cpu-seconds-per-day", "-db", "(default 8)", "(default 36000)"}},
		{[]string{"keys", "list", "-h"}, []string{"-json", "-db"}},
		{[]string{"keys", "revoke", "--help"}, []string{"moat keys revoke ID", "-db"}},
		{[]string{"audit", "--help"}, []string{"moat audit report", "-key", "-since", "-until", "-outcome", "-kind", "-limit", "-json", "-db", "RFC 3339"}},
		{[]string{"audit", "report", "--help"}, []string{"-price-cpu-second", "-price-gib-second", "-price-wall-second", "Fargate", "peak memory x wall"}},
		{[]string{"policy", "--help"}, []string{"moat policy suggest", "exited by"}},
		{[]string{"policy", "suggest", "--help"}, []string{"-since", "-limit", "-json", "Exit status 0"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			moat(t, invocation{args: tc.args}).check(t, 0, tc.want, nil, nil)
		})
	}
}
