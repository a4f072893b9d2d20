package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testServeFlags is a FlagSet with one flag of each kind moat serve has.
func testServeFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.String("listen", "127.0.0.1:7070", "`ADDR`")
	fs.Int("session-pool", 1, "")
	fs.Duration("drain", 30*time.Second, "")
	fs.Bool("e2b", false, "")
	fs.String("policy", "", "policy `FILE`")
	fs.String(configFlag, "", "`FILE`")
	return fs
}

func TestApplySettings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "# moat serve\nlisten: 0.0.0.0:8080\nsession-pool: 3\ndrain: 1m\ne2b: true\npolicy: /etc/moat/policy.yaml\n")
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    map[string]string // flag -> value
		sources map[string]string // flag -> settingSources.of
		wantErr []string
	}{
		{name: "defaults", want: map[string]string{"listen": "127.0.0.1:7070", "session-pool": "1", "drain": "30s", "e2b": "false"},
			sources: map[string]string{"listen": "--listen"}},
		{name: "environment over default", env: map[string]string{"MOAT_LISTEN": "127.0.0.1:9", "MOAT_SESSION_POOL": "0", "MOAT_DRAIN": "5s", "MOAT_E2B": "true"},
			want:    map[string]string{"listen": "127.0.0.1:9", "session-pool": "0", "drain": "5s", "e2b": "true"},
			sources: map[string]string{"session-pool": "MOAT_SESSION_POOL (--session-pool)", "drain": "MOAT_DRAIN (--drain)"}},
		{name: "an existing variable is its flag's", env: map[string]string{"MOAT_POLICY": "/p.yaml"}, want: map[string]string{"policy": "/p.yaml"}},
		{name: "file over default", args: []string{"--config", good},
			want:    map[string]string{"listen": "0.0.0.0:8080", "session-pool": "3", "drain": "1m0s", "e2b": "true", "policy": "/etc/moat/policy.yaml"},
			sources: map[string]string{"listen": good + ":2: listen", "session-pool": good + ":3: session-pool"}},
		{name: "MOAT_CONFIG names the file", env: map[string]string{"MOAT_CONFIG": good}, want: map[string]string{"session-pool": "3"}},
		{name: "--config over MOAT_CONFIG", args: []string{"--config", good}, env: map[string]string{"MOAT_CONFIG": "/nonexistent"}, want: map[string]string{"session-pool": "3"}},
		{name: "environment over file", args: []string{"--config", good}, env: map[string]string{"MOAT_SESSION_POOL": "7"},
			want: map[string]string{"session-pool": "7", "listen": "0.0.0.0:8080"}, sources: map[string]string{"session-pool": "MOAT_SESSION_POOL (--session-pool)"}},
		{name: "flag over environment and file", args: []string{"--config", good, "--session-pool", "9", "--e2b=false"}, env: map[string]string{"MOAT_SESSION_POOL": "7"},
			want: map[string]string{"session-pool": "9", "e2b": "false", "drain": "1m0s"}, sources: map[string]string{"session-pool": "--session-pool"}},
		{name: "an empty variable is unset", args: []string{"--config", good}, env: map[string]string{"MOAT_SESSION_POOL": ""}, want: map[string]string{"session-pool": "3"}},
		{name: "an empty file sets nothing", args: []string{"--config", write("empty.yaml", "# nothing\n")}, want: map[string]string{"session-pool": "1"}},
		{name: "a null value is the default", args: []string{"--config", write("null.yaml", "session-pool:\n")}, want: map[string]string{"session-pool": "1"}},
		{name: "a flag's spelling with dashes", args: []string{"--config", write("dashes.yaml", "--session-pool: 2\n")}, want: map[string]string{"session-pool": "2"}},

		{name: "bad variable names itself and its flag", env: map[string]string{"MOAT_SESSION_POOL": "many"},
			wantErr: []string{`MOAT_SESSION_POOL="many": want a whole number (--session-pool)`}},
		{name: "bad bool variable", env: map[string]string{"MOAT_E2B": "yes please"}, wantErr: []string{`MOAT_E2B="yes please": want true or false (--e2b)`}},
		{name: "bad duration in the file names its line", args: []string{"--config", write("bad.yaml", "listen: x\n\ndrain: 30\n")},
			wantErr: []string{"bad.yaml:3: drain: \"30\": want a duration such as 30s or 5m (--drain)"}},
		{name: "unknown key with a suggestion", args: []string{"--config", write("typo.yaml", "listen: x\nsesion-pool: 2\n")},
			wantErr: []string{`typo.yaml:2: unknown key "sesion-pool": keys are moat serve's flag names (did you mean "session-pool"?)`}},
		{name: "every unknown key", args: []string{"--config", write("two.yaml", "frob: 1\nlisten: x\nzzzzzzzz: 2\n")},
			wantErr: []string{`two.yaml:1: unknown key "frob"`, `two.yaml:3: unknown key "zzzzzzzz"`}},
		{name: "a key twice", args: []string{"--config", write("twice.yaml", "drain: 1s\ndrain: 2s\n")}, wantErr: []string{"twice.yaml:2: drain is given twice (first at line 1)"}},
		{name: "a list", args: []string{"--config", write("list.yaml", "listen: [a, b]\n")}, wantErr: []string{"list.yaml:1: listen: want a single value, not a list"}},
		{name: "config in the file", args: []string{"--config", write("self.yaml", "config: other.yaml\n")}, wantErr: []string{"self.yaml:1: config: a config file cannot name another"}},
		{name: "not a mapping", args: []string{"--config", write("seq.yaml", "- listen\n")}, wantErr: []string{"seq.yaml:1: want a mapping of flag names to values"}},
		{name: "not YAML", args: []string{"--config", write("tab.yaml", "listen: [\n")}, wantErr: []string{"tab.yaml: not YAML"}},
		{name: "a missing file", args: []string{"--config", filepath.Join(dir, "none.yaml")}, wantErr: []string{"--config: open ", "none.yaml: no such file"}},
		{name: "a missing MOAT_CONFIG", env: map[string]string{"MOAT_CONFIG": filepath.Join(dir, "none.yaml")}, wantErr: []string{"none.yaml: no such file"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := testServeFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			src, err := applySettings(fs, func(k string) string { return tc.env[k] })
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; want %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got := fs.Lookup(name).Value.String(); got != want {
					t.Errorf("--%s = %q, want %q", name, got, want)
				}
			}
			for name, want := range tc.sources {
				if got := src.of(name); got != want {
					t.Errorf("source of --%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

// FuzzParseConfig: any file is a set of settings or an error, never a
// panic, and only known flags come out of it.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		"listen: 0.0.0.0:8080\nsession-pool: 3\ndrain: 1m\ne2b: true\n", "", "# c\n", "session-pool:\n", "- a\n",
		"a: &x 1\nlisten: *x\n", "listen: [a]\n", "listen: {a: b}\n", "drain: 1s\ndrain: 2s\n", "config: x\n", "? [a]\n: b\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fs := testServeFlags()
		got, err := parseConfig("c.yaml", data, fs)
		if err != nil {
			return
		}
		for name := range got {
			if fs.Lookup(name) == nil || name == configFlag {
				t.Fatalf("parseConfig returned %q, which is no flag of serve's", name)
			}
		}
	})
}

func TestLogFlags(t *testing.T) {
	tests := []struct {
		name, format, level string
		wantErr             string
		debug, info         bool // what the logger logs
	}{
		{name: "defaults", format: "text", level: "info", info: true},
		{name: "json debug", format: "json", level: "debug", debug: true, info: true},
		{name: "case is ignored", format: "JSON", level: "Warn"},
		{name: "error", format: "text", level: "error"},
		{name: "bad format", format: "xml", level: "info", wantErr: `--log-format "xml": want one of text, json`},
		{name: "bad level", format: "text", level: "verbose", wantErr: `--log-level "verbose": want one of debug, info, warn, error`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := logFlags{format: &tc.format, level: &tc.level}
			var b strings.Builder
			log, err := l.logger(&b, nil)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			log.Debug("d")
			log.Info("i")
			out := b.String()
			if got := strings.Contains(out, "d"); got != tc.debug && strings.Contains(out, `msg=d`) != tc.debug {
				t.Errorf("debug logged: %v, want %v: %q", got, tc.debug, out)
			}
			if got := strings.Contains(out, `msg=i`) || strings.Contains(out, `"msg":"i"`); got != tc.info {
				t.Errorf("info logged: %v, want %v: %q", got, tc.info, out)
			}
			if strings.EqualFold(tc.format, "json") && out != "" && !strings.HasPrefix(out, "{") {
				t.Errorf("not JSON: %q", out)
			}
		})
	}
}

func TestCheckMetricsAddr(t *testing.T) {
	tests := []struct {
		addr    string
		public  bool
		wantErr string
	}{
		{"127.0.0.1:9464", false, ""},
		{"[::1]:9464", false, ""},
		{"localhost:9464", false, ""},
		{"127.0.0.1:0", false, ""},
		{"0.0.0.0:9464", false, `--metrics-listen "0.0.0.0:9464" is not a loopback address`},
		{":9464", false, "add --metrics-public"},
		{"192.0.2.1:9464", false, "not a loopback address"},
		{"0.0.0.0:9464", true, ""},
		{"9464", false, `--metrics-listen "9464": want HOST:PORT`},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			err := checkMetricsAddr(tc.addr, tc.public, settingSources{}.of)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// TestServeSettingsRefused: moat serve refuses a bad setting from any
// source before it starts anything, naming the source, the value and what
// it takes.
func TestServeSettingsRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "moat.yaml")
	if err := os.WriteFile(cfg, []byte("listen: 127.0.0.1:0\nlog-format: yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("pools: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     []string
		wantErr []string
	}{
		{"bad --log-format", []string{"serve", "--log-format", "xml"}, nil, []string{`--log-format "xml": want one of text, json`}},
		{"bad --log-level", []string{"serve", "--log-level", "loud"}, nil, []string{`--log-level "loud": want one of debug, info, warn, error`}},
		{"bad MOAT_LOG_LEVEL", []string{"serve"}, []string{"MOAT_LOG_LEVEL=loud"}, []string{`MOAT_LOG_LEVEL (--log-level) "loud": want one of debug, info, warn, error`}},
		{"bad log-format in the file", []string{"serve", "--config", cfg}, nil, []string{cfg + `:2: log-format "yaml": want one of text, json`}},
		{"MOAT_POOL out of range", []string{"serve"}, []string{"MOAT_POOL=200"}, []string{"MOAT_POOL (--pool) 200: want 0 to 128"}},
		{"MOAT_POOL not a number", []string{"serve"}, []string{"MOAT_POOL=two"}, []string{`MOAT_POOL="two": want a whole number (--pool)`}},
		{"unknown key", []string{"serve"}, []string{"MOAT_CONFIG=" + typo}, []string{typo + `:1: unknown key "pools"`, `did you mean "pool"?`}},
		{"metrics on every address", []string{"serve", "--metrics-listen", "0.0.0.0:9464"}, nil, []string{"--metrics-listen \"0.0.0.0:9464\" is not a loopback address", "--metrics-public"}},
		{"bad max-body from the environment", []string{"serve"}, []string{"MOAT_MAX_BODY=64M"}, []string{`MOAT_MAX_BODY (--max-body) "64M": want a size such as 64MiB`}},
		{"mcp's bad --log-format", []string{"mcp", "--log-format", "xml"}, []string{"MOAT_API_KEY=moat_k_x"}, []string{`--log-format "xml": want one of text, json`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			moat(t, invocation{args: tc.args, env: append([]string{"MOAT_HOME=" + dir}, tc.env...)}).check(t, exitUsage, nil, tc.wantErr, nil)
		})
	}
}

func TestVersionFlag(t *testing.T) {
	want := moat(t, invocation{args: []string{"version"}})
	line, _, _ := strings.Cut(want.stdout, "\n")
	for _, arg := range []string{"--version", "-version"} {
		t.Run(arg, func(t *testing.T) {
			out := moat(t, invocation{args: []string{arg}})
			out.check(t, 0, []string{"moat "}, nil, []string{"kernel"})
			if out.stdout != line+"\n" {
				t.Errorf("stdout %q, want the first line of moat version, %q", out.stdout, line+"\n")
			}
		})
	}
}

// TestServeOperations runs a real server configured by a file and the
// environment: JSON logs with one access-log line per request (the health
// check only at debug), the OpenAPI document without a key, and /metrics
// without a key on the metrics listener.
func TestServeOperations(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	metricsKey := createKey(t, home, "--scope", "metrics")
	cfg := filepath.Join(t.TempDir(), "moat.yaml")
	if err := os.WriteFile(cfg, []byte("listen: 127.0.0.1:0\npool: 0\nsession-pool: 0\nlog-format: json\nmetrics-listen: 127.0.0.1:0\ne2b: true\nmcp: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(moatBin, "serve", "--config", cfg)
	cmd.Env = append(os.Environ(), "MOAT_HOME="+home, "MOAT_LOG_LEVEL=info")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan map[string]any, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				m = map[string]any{"msg": "NOT JSON: " + sc.Text()}
			}
			lines <- m
		}
		close(lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	next := func(msg string) map[string]any {
		t.Helper()
		timeout := time.After(60 * time.Second)
		for {
			select {
			case m, ok := <-lines:
				if !ok {
					t.Fatalf("the server ended before logging %q", msg)
				}
				if s, _ := m["msg"].(string); strings.HasPrefix(s, "NOT JSON") {
					t.Fatalf("a log line is not JSON: %s", s)
				}
				if m["msg"] == msg {
					return m
				}
			case <-timeout:
				t.Fatalf("no %q in the log", msg)
			}
		}
	}
	metricsURL := next("metrics listening")["url"].(string)
	apiURL := next("moat serve listening")["url"].(string)

	get := func(url string, header map[string]string) (int, string, string) {
		t.Helper()
		rq, err := http.NewRequest("GET", url, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			rq.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Request-Id"), string(b)
	}
	const keyID = "the key's id"
	tests := []struct {
		name, url  string
		header     map[string]string
		status     int
		body       string
		route, key string // the access-log line's; "" none at info
	}{
		{"health is not at info", apiURL + "/v1/health", nil, 200, `"status":"ok"`, "", ""},
		{"the OpenAPI document", apiURL + "/v1/openapi.yaml", nil, 200, "openapi: 3.0.3", "GET /v1/openapi.yaml", "-"},
		{"metrics without a key on the API", apiURL + "/metrics", nil, 401, "unauthenticated", "GET /metrics", "-"},
		{"metrics without a key on its listener", metricsURL, nil, 200, "moat_build_info{", "", ""},
		{"a key's API request", apiURL + "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + key}, 200, "[", "GET /v1/sandboxes", keyID},
		{"E2B's control plane", apiURL + "/sandboxes", map[string]string{"X-API-Key": key}, 200, "[", "e2b control", keyID},
		{"MCP without a key, beside E2B", apiURL + "/mcp", nil, 401, "", "/mcp", "-"},
		{"a metrics key reads /metrics", apiURL + "/metrics", map[string]string{"Authorization": "Bearer " + metricsKey}, 200, "moat_build_info{", "GET /metrics", keyID},
		{"a metrics key is no key for the API", apiURL + "/v1/sandboxes", map[string]string{"Authorization": "Bearer " + metricsKey}, 401, "unauthenticated", "GET /v1/sandboxes", "-"},
		{"a metrics key is no key for E2B", apiURL + "/sandboxes", map[string]string{"X-API-Key": metricsKey}, 401, "Invalid API key", "e2b control", "-"},
		{"a metrics key is no key for MCP", apiURL + "/mcp", map[string]string{"Authorization": "Bearer " + metricsKey}, 401, "", "/mcp", "-"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, id, body := get(tc.url, tc.header)
			if status != tc.status || !strings.Contains(body, tc.body) {
				t.Fatalf("GET %s: %d %.300q; want %d with %q", tc.url, status, body, tc.status, tc.body)
			}
			if tc.route == "" {
				return
			}
			line := next("request")
			if tc.key == keyID {
				// The key's id, whatever it is, never its secret.
				k, _ := line["key"].(string)
				if k == "" || k == "-" || !(strings.Contains(key, k) || strings.Contains(metricsKey, k)) || k == key || k == metricsKey {
					t.Errorf("access-log key %q: want the id of the key, not the key", k)
				}
				tc.key, _ = line["key"].(string)
			}
			if line["request_id"] != id || line["route"] != tc.route || line["key"] != tc.key || line["status"] != float64(tc.status) || line["level"] != "INFO" {
				t.Errorf("access-log line %v; want request_id %s, route %q, key %q, status %d", line, id, tc.route, tc.key, tc.status)
			}
		})
	}
}

func TestMetricsKeyCLI(t *testing.T) {
	home := t.TempDir()
	env := []string{"MOAT_HOME=" + home}
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{"a metrics key", []string{"keys", "create", "--name", "scraper", "--scope", "metrics"}, 0, []string{"Created metrics key k", "reads GET /metrics and nothing else"}},
		{"an unknown scope", []string{"keys", "create", "--name", "x", "--scope", "read"}, exitUsage, []string{`--scope "read": want one of metrics`}},
		{"a scope with more", []string{"keys", "create", "--name", "x", "--scope", "metrics", "--admin", "--max-sandboxes", "2"}, exitUsage,
			[]string{"--scope metrics makes a key that runs nothing: drop --admin, --max-sandboxes"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			moat(t, invocation{args: tc.args, env: env}).check(t, tc.code, nil, tc.wantErr, nil)
		})
	}
	out := moat(t, invocation{args: []string{"keys", "list"}, env: env})
	out.check(t, 0, []string{"scraper", "active (metrics only)"}, nil, nil)
	if n := strings.Count(out.stdout, "\nk"); n != 1 {
		t.Errorf("want one key listed, got %d:\n%s", n, out.stdout)
	}
}

// TestOperationsDocListsEverySetting: docs/OPERATIONS.md's table has a row
// for every flag of moat serve, with its variable, and no row for a flag
// serve does not have.
func TestOperationsDocListsEverySetting(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "OPERATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	help := moat(t, invocation{args: []string{"serve", "--help"}})
	flagLine := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`)
	flags := map[string]bool{}
	for _, m := range flagLine.FindAllStringSubmatch(help.stdout, -1) {
		flags[m[1]] = true
	}
	if len(flags) < 20 {
		t.Fatalf("found %d flags in moat serve --help:\n%s", len(flags), help.stdout)
	}
	for name := range flags {
		t.Run(name, func(t *testing.T) {
			row := fmt.Sprintf("| `--%s` | `%s` |", name, envName(name))
			if !strings.Contains(string(doc), row) {
				t.Errorf("docs/OPERATIONS.md has no row %q", row)
			}
		})
	}
	rowLine := regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| `MOAT_")
	for _, m := range rowLine.FindAllStringSubmatch(string(doc), -1) {
		if !flags[m[1]] {
			t.Errorf("docs/OPERATIONS.md lists --%s, which moat serve does not have", m[1])
		}
	}
}
