package engine

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

const secretValue = "sk-live-ENGINEtestVALUEneverINSIDE-7f3a"

// mapSource is a SecretSource of fixed values.
type mapSource map[string]string

func (s mapSource) Value(name string) (string, error) {
	v, ok := s[name]
	if !ok {
		return "", errors.New("no such secret; add it with moat secrets add " + name)
	}
	return v, nil
}

func secretManifest(t *testing.T, secrets ...manifest.Secret) *manifest.Manifest {
	t.Helper()
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"api.example.com", "*.example.org"}
	m.Secrets = secrets
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestSecretBindings(t *testing.T) {
	gh := manifest.Secret{Name: "gh", Hosts: []string{"api.example.com"}, Header: "Authorization", PathPrefix: "/v1/", Query: true, Env: "GH"}
	other := manifest.Secret{Name: "other", Hosts: []string{"*.example.org"}, Body: true, Env: "OTHER"}
	tests := []struct {
		name    string
		source  SecretSource
		secrets []manifest.Secret
		field   string
	}{
		{"no secrets, no store", nil, nil, ""},
		{"secrets without a store", nil, []manifest.Secret{gh}, "secrets[0].name"},
		{"missing secret", mapSource{"gh": secretValue}, []manifest.Secret{gh, other}, "secrets[1].name"},
		{"all found", mapSource{"gh": secretValue, "other": secretValue + "2"}, []manifest.Secret{gh, other}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{opts: Options{Secrets: tc.source}}
			m := secretManifest(t, tc.secrets...)
			b, env, err := e.secretBindings(m)
			if tc.field != "" {
				var fe *manifest.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("error %v, want a field error on %s", err, tc.field)
				}
				if strings.Contains(err.Error(), secretValue) {
					t.Errorf("error %q holds a value", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != len(tc.secrets) || len(env) != len(tc.secrets) {
				t.Fatalf("bindings %d, env %v; want %d each", len(b), env, len(tc.secrets))
			}
			for i, s := range tc.secrets {
				got := b[i]
				if got.Name != s.Name || got.Value != tc.source.(mapSource)[s.Name] || got.Header != s.Header || got.PathPrefix != s.PathPrefix || got.Query != s.Query || got.Body != s.Body {
					t.Errorf("binding %d = %+v, want %+v", i, got, s)
				}
				if want := []egress.Rule{egress.MustParseRule(s.Hosts[0])}; !reflect.DeepEqual(got.Hosts, want) {
					t.Errorf("binding %d hosts %v, want %v", i, got.Hosts, want)
				}
				if !egress.IsPlaceholder(got.Placeholder) || env[s.Env] != got.Placeholder {
					t.Errorf("binding %d placeholder %q, env %s=%q", i, got.Placeholder, s.Env, env[s.Env])
				}
			}
			// A placeholder is per run: the next run gets another.
			if len(b) == 0 {
				return
			}
			b2, _, _ := e.secretBindings(m)
			if b2[0].Placeholder == b[0].Placeholder {
				t.Errorf("two runs share the placeholder %q", b[0].Placeholder)
			}
		})
	}
}

func TestSecretUses(t *testing.T) {
	tests := []struct {
		name        string
		now, before []egress.SecretUse
		want        []result.SecretUse
	}{
		{"none", nil, nil, nil},
		{"whole run, sorted", []egress.SecretUse{{Name: "b", Host: "x", Requests: 1}, {Name: "a", Host: "y", Requests: 2}, {Name: "a", Host: "x", Requests: 3}},
			nil, []result.SecretUse{{Name: "a", Host: "x", Requests: 3}, {Name: "a", Host: "y", Requests: 2}, {Name: "b", Host: "x", Requests: 1}}},
		{"a session command's share", []egress.SecretUse{{Name: "a", Host: "x", Requests: 5}, {Name: "a", Host: "y", Requests: 1}},
			[]egress.SecretUse{{Name: "a", Host: "x", Requests: 2}, {Name: "a", Host: "y", Requests: 1}}, []result.SecretUse{{Name: "a", Host: "x", Requests: 3}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := secretUses(tc.now, tc.before); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("secretUses = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestExfiltrationViolation(t *testing.T) {
	refused := result.NetworkAttempt{Host: "evil.example", Port: 443, Reason: egress.ReasonSecretExfiltration}
	other := result.NetworkAttempt{Host: "b.example", Port: 80, Reason: "not-allowed"}
	tests := []struct {
		name   string
		log    []result.NetworkAttempt
		sum    *result.NetworkSummary
		detail string // "" for no violation
	}{
		{"none", []result.NetworkAttempt{other}, &result.NetworkSummary{OmittedReasons: map[string]int{"not-allowed": 4}}, ""},
		{"no proxy", nil, nil, ""},
		{"listed", []result.NetworkAttempt{other, refused, refused}, &result.NetworkSummary{}, "2 request(s) carried a secret's placeholder to a host the secret is not bound to and were refused (first: evil.example:443)"},
		{"only counted", nil, &result.NetworkSummary{OmittedReasons: map[string]int{egress.ReasonSecretExfiltration: 7}}, "7 request(s) carried a secret's placeholder to a host the secret is not bound to and were refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := exfiltrationViolation(tc.log, tc.sum)
			switch {
			case tc.detail == "" && v != nil:
				t.Errorf("violation %+v, want none", v)
			case tc.detail != "" && (v == nil || v.Kind != result.ViolationSecretExfiltration || v.Detail != tc.detail):
				t.Errorf("violation %+v, want %s: %q", v, result.ViolationSecretExfiltration, tc.detail)
			}
		})
	}
}

// TestSecretRunSeesOnlyPlaceholder runs a real sandbox with a secret: the
// program finds the placeholder in the variable the manifest names, and
// the value nowhere it can look (its environment, /proc, the workspace),
// nor in the result.
func TestSecretRunSeesOnlyPlaceholder(t *testing.T) {
	e := secretEngine(t)
	m := secretManifest(t, manifest.Secret{Name: "api-key", Hosts: []string{"api.example.com"}, Header: "Authorization", Env: "API_KEY"})
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	out := filepath.Join(t.TempDir(), "out")
	prog := `
import os, glob
print("API_KEY=" + os.environ.get("API_KEY", "<unset>"))
seen = []
for p in ["/proc/self/environ", "/proc/1/environ", "/proc/self/cmdline"] + glob.glob("/proc/[0-9]*/environ"):
    try:
        seen.append(open(p, "rb").read())
    except OSError:
        pass
open("/workspace/seen", "wb").write(b"\n".join(seen))
`
	res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"python3", "-c", prog}, OutputDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("program failed: %s %s", res.Stdout.Data, res.Stderr.Data)
	}
	got := strings.TrimSpace(res.Stdout.Data)
	ph, ok := strings.CutPrefix(got, "API_KEY=")
	if !ok || !egress.IsPlaceholder(ph) || !strings.HasPrefix(ph, egress.PlaceholderPrefix+"api-key-") {
		t.Errorf("program saw %q, want API_KEY=<a placeholder for api-key>", got)
	}
	seen, err := os.ReadFile(filepath.Join(out, "seen"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(seen), ph) {
		t.Errorf("/proc/self/environ does not hold the placeholder %q", ph)
	}
	js, _ := json.Marshal(res)
	for what, b := range map[string][]byte{"the workspace and /proc": seen, "the result": js} {
		if strings.Contains(string(b), secretValue) {
			t.Errorf("%s holds the secret's value", what)
		}
	}
}

// TestSecretEndToEnd runs a real sandbox against two local plain-HTTP
// servers: the one the secret is bound to receives the value in place of
// the placeholder the program sent; the other, though allowed, receives
// nothing (the proxy refuses the placeholder there), the run gets a
// secret-exfiltration violation, and the result lists the use and never
// the value.
func TestSecretEndToEnd(t *testing.T) {
	e := secretEngine(t)
	var mu sync.Mutex
	got := map[string][]string{}
	server := func(name string) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[name] = append(got[name], r.Header.Get("Authorization"))
			mu.Unlock()
			// An API that echoes the credential: the proxy must not let
			// the value back in.
			fmt.Fprintf(w, "echo %s", r.Header.Get("Authorization"))
		}))
		t.Cleanup(srv.Close)
		return strings.TrimPrefix(srv.URL, "http://127.0.0.1:")
	}
	bound, other := server("bound"), server("other")
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"localhost:" + bound, "localhost:" + other}
	m.Network.AllowAddresses = []string{"127.0.0.1", "::1"}
	m.Secrets = []manifest.Secret{{Name: "api-key", Hosts: []string{"localhost:" + bound}, Header: "Authorization", Env: "API_KEY"}}
	m.Resources.Timeout = manifest.Duration(30 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	prog := fmt.Sprintf(`
import os, urllib.request
k = os.environ["API_KEY"]
def get(port):
    req = urllib.request.Request("http://localhost:%%s/" %% port, headers={"Authorization": "Bearer " + k})
    try:
        return urllib.request.urlopen(req, timeout=10).read().decode()
    except Exception as e:
        return "ERR %%s %%s" %% (type(e).__name__, getattr(e, "code", ""))
print("bound", get(%s))
print("other", get(%s))
`, bound, other)
	res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"python3", "-c", prog}})
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(res)
	t.Logf("stdout %q stderr %q secrets_used %+v violations %+v", res.Stdout.Data, res.Stderr.Data, res.SecretsUsed, res.Violations)
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"Bearer " + secretValue}; !reflect.DeepEqual(got["bound"], want) {
		t.Errorf("bound server received %q, want %q", got["bound"], want)
	}
	if len(got["other"]) != 0 {
		t.Errorf("the server the secret is not bound to received %q", got["other"])
	}
	if strings.Contains(string(js), secretValue) {
		t.Errorf("the result holds the value (the echo reached the program, or a log holds it)")
	}
	if !strings.Contains(res.Stdout.Data, "bound echo Bearer "+egress.PlaceholderPrefix+"api-key-") {
		t.Errorf("the program did not get the echo with its placeholder back: %q", res.Stdout.Data)
	}
	if len(res.SecretsUsed) != 1 || res.SecretsUsed[0].Name != "api-key" || res.SecretsUsed[0].Requests != 1 || !strings.HasPrefix(res.SecretsUsed[0].Host, "localhost") {
		t.Errorf("secrets_used %+v, want one request of api-key to localhost", res.SecretsUsed)
	}
	found := false
	for _, v := range res.Violations {
		found = found || v.Kind == result.ViolationSecretExfiltration
	}
	if !found {
		t.Errorf("no %s violation in %+v", result.ViolationSecretExfiltration, res.Violations)
	}
}

// TestSecretSessionPlaceholder: a session's commands share one
// placeholder for the sandbox's life; another session gets another.
func TestSecretSessionPlaceholder(t *testing.T) {
	e := secretEngine(t)
	m := secretManifest(t, manifest.Secret{Name: "api-key", Hosts: []string{"api.example.com"}, Env: "API_KEY"})
	placeholders := func() []string {
		s, err := e.NewSession(context.Background(), &SessionRequest{Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var out []string
		for range 2 {
			p, err := s.Start(context.Background(), &ExecRequest{Argv: []string{"sh", "-c", `printf %s "$API_KEY"`}})
			if err != nil {
				t.Fatal(err)
			}
			<-p.Done()
			res := p.Result()
			if strings.Contains(res.Stdout.Data, secretValue) || !egress.IsPlaceholder(res.Stdout.Data) {
				t.Fatalf("a session command saw %q, want a placeholder", res.Stdout.Data)
			}
			out = append(out, res.Stdout.Data)
		}
		return out
	}
	a, b := placeholders(), placeholders()
	if a[0] != a[1] || b[0] != b[1] {
		t.Errorf("a session's commands saw different placeholders: %q, %q", a, b)
	}
	if a[0] == b[0] {
		t.Errorf("two sessions share the placeholder %q", a[0])
	}
}

// TestSecretUpstreamRootCAs: a secret bound to an HTTPS host whose
// certificate is its own reaches it only when Options.UpstreamRootCAs
// trusts that certificate; with the system roots (nil, production) the
// proxy's re-originated TLS fails verification and the value is sent
// nowhere.
func TestSecretUpstreamRootCAs(t *testing.T) {
	bin := nativeTestBin(t)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprintf(w, "echo %s", r.Header.Get("Authorization"))
	}))
	// httptest's own certificate names example.com, not localhost, which
	// the binding must name (IP literals are no hosts for secrets).
	cert, leaf := localhostCert(t)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	port := strings.TrimPrefix(srv.URL, "https://127.0.0.1:")
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	tests := []struct {
		name     string
		roots    *x509.CertPool
		wantSent bool
	}{
		{name: "the upstream's certificate is trusted", roots: roots, wantSent: true},
		{name: "system roots only: verification fails, nothing sent", roots: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Options{Exe: bin, NoAutoBuild: true, Secrets: mapSource{"api-key": secretValue}, UpstreamRootCAs: tc.roots})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			if _, err := e.Images().Lookup("python"); err != nil {
				t.Skipf("the python image is not built (%v): run moat image build python", err)
			}
			mu.Lock()
			got = nil
			mu.Unlock()
			m := manifest.Default()
			m.Network.Mode = "allowlist"
			m.Network.Allow = []string{"localhost:" + port}
			m.Network.AllowAddresses = []string{"127.0.0.1"}
			m.Secrets = []manifest.Secret{{Name: "api-key", Hosts: []string{"localhost:" + port}, Header: "Authorization", Env: "API_KEY"}}
			if err := m.Validate(); err != nil {
				t.Fatal(err)
			}
			prog := `
import os, sys, urllib.request
req = urllib.request.Request("https://localhost:%s/" % sys.argv[1], headers={"Authorization": "Bearer " + os.environ["API_KEY"]})
try:
    print(urllib.request.urlopen(req, timeout=10).read().decode())
except Exception as e:
    print("ERR", type(e).__name__, getattr(e, "code", ""))
`
			res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"python3", "-c", prog, port}})
			if err != nil {
				t.Fatal(err)
			}
			js, _ := json.Marshal(res)
			if strings.Contains(string(js), secretValue) {
				t.Fatalf("the result holds the value")
			}
			mu.Lock()
			defer mu.Unlock()
			sent := len(got) == 1 && got[0] == "Bearer "+secretValue
			if sent != tc.wantSent {
				t.Errorf("the upstream received %q; want the value: %v (stdout %q, network %+v)", got, tc.wantSent, res.Stdout.Data, res.Network)
			}
			if tc.wantSent && !strings.Contains(res.Stdout.Data, "echo Bearer "+egress.PlaceholderPrefix+"api-key-") {
				t.Errorf("the program did not get the echo with its placeholder: %q", res.Stdout.Data)
			}
		})
	}
}

// localhostCert is a self-signed certificate for localhost.
func localhostCert(t *testing.T) (tls.Certificate, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, leaf
}

// TestSecretFilePlaceholder: secrets[].file puts the run's placeholder
// (the one in the variable too) in a workspace file of the program's,
// 0600, outside the diff unless the program changes it; a session's
// commands read the same one. The value is in neither.
func TestSecretFilePlaceholder(t *testing.T) {
	e := secretEngine(t)
	m := secretManifest(t, manifest.Secret{Name: "api-key", Hosts: []string{"api.example.com"}, Env: "API_KEY", File: ".secrets/api-key"})
	// stat's mode and owner, the file, the variable: one line each.
	const show = `stat -c '%a %u' .secrets/api-key; cat .secrets/api-key; echo; printf %s "$API_KEY"`
	check := func(t *testing.T, out string) string {
		t.Helper()
		lines := strings.Split(out, "\n")
		if len(lines) != 3 || lines[0] != "600 1000" || !egress.IsPlaceholder(lines[1]) || lines[1] != lines[2] || strings.Contains(out, secretValue) {
			t.Fatalf("the program saw %q, want mode 600 owner 1000, and the file's placeholder equal to API_KEY's", out)
		}
		return lines[1]
	}

	t.Run("run", func(t *testing.T) {
		res, err := e.Run(context.Background(), &Request{Manifest: m, Argv: []string{"sh", "-c", show + "; echo changed > .secrets/api-key"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s %s", res.ExitCode, res.Stdout.Data, res.Stderr.Data)
		}
		check(t, res.Stdout.Data)
		// Planted before the baseline: in the diff only as modified.
		if len(res.Files) != 1 || res.Files[0].Path != ".secrets/api-key" || res.Files[0].Change != result.Modified {
			t.Errorf("diff %+v, want only .secrets/api-key modified", res.Files)
		}
		if js, _ := json.Marshal(res); strings.Contains(string(js), secretValue) {
			t.Errorf("the result holds the value")
		}
	})
	t.Run("session", func(t *testing.T) {
		s, err := e.NewSession(context.Background(), &SessionRequest{Manifest: m})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var seen []string
		for range 2 {
			p, err := s.Start(context.Background(), &ExecRequest{Argv: []string{"sh", "-c", show}})
			if err != nil {
				t.Fatal(err)
			}
			<-p.Done()
			seen = append(seen, check(t, p.Result().Stdout.Data))
		}
		if seen[0] != seen[1] {
			t.Errorf("a session's commands read different placeholders: %q", seen)
		}
	})
}

// secretEngine is an engine of real native sandboxes whose secret
// source holds api-key; it skips without root or the python image.
func secretEngine(t *testing.T) *Engine {
	t.Helper()
	bin := nativeTestBin(t)
	e, err := New(Options{Exe: bin, NoAutoBuild: true, Secrets: mapSource{"api-key": secretValue}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	return e
}
