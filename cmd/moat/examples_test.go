package main

// TestExamples runs examples/secrets and examples/guard end to end with the
// real CLI, as their READMEs (and the main README) show them: the claims
// there are this test's assertions.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/syncbuf"
)

// exampleDir copies examples/NAME to a temporary directory with the port
// the example's files name (fixed, for the README) replaced by port, free
// on this machine now.
func exampleDir(t *testing.T, name, fixedPort, port string) string {
	t.Helper()
	src := filepath.Join("..", "..", "examples", name)
	dst := filepath.Join(t.TempDir(), name)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dst, "manifest.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(fixedPort)) {
		t.Fatalf("examples/%s/manifest.yaml no longer names port %s: update this test with the example", name, fixedPort)
	}
	if err := os.WriteFile(p, bytes.ReplaceAll(b, []byte(fixedPort), []byte(port)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// hostServer starts a server of an example on the host and waits until
// its port accepts connections; it is stopped when the test ends.
func hostServer(t *testing.T, port string, argv ...string) *syncbuf.Buffer {
	t.Helper()
	var log syncbuf.Buffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		c, err := net.Dial("tcp4", "127.0.0.1:"+port)
		if err == nil {
			c.Close()
			return &log
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q did not listen on port %s: %v\n%s", argv, port, err, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestExamples(t *testing.T) {
	needRoot(t)
	needImage(t)
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 on the host: the examples' test API and package index run there")
	}
	env := buildHome(t)

	t.Run("secrets", func(t *testing.T) {
		port := freePort(t)
		dir := exampleDir(t, "secrets", "8787", port)
		var tok [16]byte
		rand.Read(tok[:])
		token := "tok-" + hex.EncodeToString(tok[:])
		tokenFile := filepath.Join(t.TempDir(), "token.txt")
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		apiLog := hostServer(t, port, python, "-u", filepath.Join(dir, "api.py"), port, tokenFile)
		moat(t, invocation{args: []string{"secrets", "add", "example-api-token", "--from-file", tokenFile}, env: env}).
			check(t, 0, nil, []string{"stored secret example-api-token"}, []string{token})
		manifest := filepath.Join(dir, "manifest.yaml")
		steps := []struct {
			name           string
			args           []string
			wantOut, wantE []string
		}{
			{
				name: "the API authorizes the placeholder's request; the echo and the program hold only the placeholder; elsewhere refused",
				args: []string{"run", "--manifest", manifest, "--", "python3", "client.py"},
				wantOut: []string{
					"API_TOKEN inside the sandbox: moat-secret-example-api-token-",
					"bound API answered: 200 authorized: yes\nyou sent: Bearer moat-secret-example-api-token-",
					"another host answered: 403 moat egress: a secret's placeholder may only go to the hosts the secret is bound to",
				},
				wantE: []string{"moat: secret-exfiltration: 1 request(s) carried a secret's placeholder", "(first: example.com:80)"},
			},
			{name: "the result lists the use and the refusal, never the value", args: []string{"run", "--json", "--manifest", manifest, "--", "python3", "client.py"},
				wantOut: []string{`"secrets_used": [`, `"name": "example-api-token"`, `"reason": "secret-exfiltration"`}},
		}
		for _, st := range steps {
			t.Run(st.name, func(t *testing.T) {
				out := moat(t, invocation{args: st.args, env: env})
				out.check(t, 0, st.wantOut, st.wantE, []string{token})
				if strings.Contains(st.args[1], "--json") {
					var r struct {
						SecretsUsed []struct {
							Name, Host string
							Requests   int
						} `json:"secrets_used"`
					}
					if err := json.Unmarshal([]byte(out.stdout), &r); err != nil || len(r.SecretsUsed) != 1 || r.SecretsUsed[0].Requests != 1 || r.SecretsUsed[0].Host != "localhost" {
						t.Errorf("secrets_used %+v (%v), want one request of example-api-token to localhost", r.SecretsUsed, err)
					}
				}
			})
		}
		if n := strings.Count(apiLog.String(), "api: GET /hello authorized=yes"); n != len(steps) {
			t.Errorf("the API authorized %d requests, want %d (its log: %q)", n, len(steps), apiLog.String())
		}
		if strings.Contains(apiLog.String(), "authorized=no") {
			t.Errorf("the API received a request without the token: %q", apiLog.String())
		}
		// The audit log and everything else moat wrote in its state
		// directory (the sealed store included) hold no plaintext value.
		noValueUnder(t, strings.TrimPrefix(env[0], "MOAT_HOME="), token)

		// The same run through moat serve, by an API key granted the
		// secret: serve's own logs (debug level) and state hold no value.
		// (A short name: the state directory is under t.TempDir(), and
		// the run's egress socket path must fit a sockaddr_un.)
		t.Run("serve", func(t *testing.T) {
			home := serverHome(t)
			senv := []string{"MOAT_HOME=" + home}
			moat(t, invocation{args: []string{"secrets", "add", "example-api-token", "--from-file", tokenFile}, env: senv}).
				check(t, 0, nil, []string{"stored secret example-api-token"}, []string{token})
			key := createKey(t, home, "--secret", "example-api-token")
			srv := startServer(t, home, key, "--log-level", "debug")
			before := strings.Count(apiLog.String(), "authorized=yes")
			out := moat(t, invocation{args: []string{"run", "--server", srv.url, "--api-key", key, "--json", "--manifest", manifest, "--", "python3", "client.py"}})
			out.check(t, 0, []string{"bound API answered: 200 authorized: yes", `"name": "example-api-token"`, `"reason": "secret-exfiltration"`}, nil, []string{token})
			if n := strings.Count(apiLog.String(), "authorized=yes") - before; n != 1 {
				t.Errorf("the API authorized %d requests of the served run, want 1; moat serve's log:\n%s", n, srv.logs())
			}
			srv.terminate(t, 30*time.Second)
			if strings.Contains(srv.logs(), token) {
				t.Errorf("moat serve's log holds the value:\n%s", srv.logs())
			}
			noValueUnder(t, home, token)
		})
	})

	t.Run("guard", func(t *testing.T) {
		port := freePort(t)
		dir := exampleDir(t, "guard", "18765", port)
		index := filepath.Join(t.TempDir(), "index")
		if out, err := exec.Command(python, filepath.Join(dir, "make_index.py"), index).CombinedOutput(); err != nil {
			t.Fatalf("make_index.py: %v\n%s", err, out)
		}
		indexLog := hostServer(t, port, python, "-u", "-m", "http.server", port, "--bind", "127.0.0.1", "--directory", index)
		manifest := filepath.Join(dir, "manifest.yaml")
		steps := []struct {
			name           string
			args           []string
			code           int
			wantOut, wantE []string
		}{
			{name: "the allowed package installs and imports", args: []string{"run", "--manifest", manifest, "--", "sh", "-c",
				`pip install -q --target t hello-moat && PYTHONPATH=t python3 -c "import hello_moat; print(hello_moat.VERSION)"`},
				wantOut: []string{"1.0.0\n"}},
			{name: "the typosquat is refused", args: []string{"run", "--manifest", manifest, "--", "pip", "install", "-q", "--target", "t", "helo-moat"},
				code: 1, wantE: []string{"No matching distribution found for helo-moat", "moat: package: helo-moat refused as a likely typosquat of hello-moat"}},
			// --json exits 0: the program's exit status is in the result.
			{name: "the result logs the typosquat and what it resembles", args: []string{"run", "--json", "--manifest", manifest, "--", "pip", "install", "-q", "--target", "t", "helo-moat"},
				wantOut: []string{`"exit_code": 1`, `"reason": "typosquat"`, `"package": "helo-moat"`, `"resembles": "hello-moat"`, `"kind": "package"`}},
		}
		for _, st := range steps {
			t.Run(st.name, func(t *testing.T) {
				moat(t, invocation{args: st.args, env: env}).check(t, st.code, st.wantOut, st.wantE, nil)
			})
		}
		log := indexLog.String()
		for _, bad := range []string{"helo-moat", "helo_moat", "0.9.0"} {
			if strings.Contains(log, bad) {
				t.Errorf("the index was asked for %s: %q", bad, log)
			}
		}
		if !strings.Contains(log, "GET /files/hello_moat-1.0.0-py3-none-any.whl") {
			t.Errorf("the index never served the allowed wheel: %q", log)
		}
	})
}

// noValueUnder fails the test if any regular file under dir (the audit
// database and its WAL, run records, incident bundles, the secret store)
// holds value in plain text. Symbolic links (the shared image store) are
// not followed.
func noValueUnder(t *testing.T, dir, value string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		n++
		if bytes.Contains(b, []byte(value)) {
			t.Errorf("%s holds the secret's value in plain text", p)
		}
		return nil
	})
	if err != nil || n == 0 {
		t.Errorf("searched %d files under %s for the value: %v", n, dir, err)
	}
}
