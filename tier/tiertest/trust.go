package tiertest

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/tier"
)

// exampleResolver answers example.com (the name httptest's certificate
// carries) with loopback, and nothing else.
type exampleResolver struct{}

func (exampleResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if host == "example.com" {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// SecretThroughRunCA: a program in a sandbox of tr sends a secret's
// placeholder to a bound HTTPS host with Python's standard library (it
// trusts the run CA only through the bundle and SSL_CERT_FILE the tier
// installs), the destination receives the real value, and the program
// sees only the placeholder echoed back, never the value. The bundle is
// read-only inside.
// The image is python's: root, env and digest (the microvm tier makes
// its disk by digest).
func SecretThroughRunCA(t *testing.T, tr tier.Tier, root string, env []string, digest string) {
	t.Helper()
	const ph, value = "moat-secret-api-0123456789abcdef0123456789abcdef", "sk-real-value-for-the-trust-test"
	var mu sync.Mutex
	var gotAuth string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		gotAuth = r.Header.Get("Authorization")
		mu.Unlock()
		io.WriteString(w, "you sent "+r.Header.Get("Authorization"))
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port

	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	pol := egress.Policy{
		AllowAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		Secrets: []egress.SecretBinding{{Name: "api", Placeholder: ph, Value: value,
			Hosts: []egress.Rule{egress.MustParseRule("example.com:" + strconv.Itoa(port))}, Header: "Authorization"}},
	}
	if err := pol.Validate(); err != nil {
		t.Fatal(err)
	}
	p := egress.New(pol, egress.Options{Resolver: exampleResolver{}, RootCAs: roots})
	// A short path: runsc's control socket lives below the state
	// directory, and Unix socket paths have at most 107 bytes.
	dir, err := os.MkdirTemp("", "mt-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(sock, 0o666)
	served := make(chan error, 1)
	go func() { served <- p.Serve(l) }()
	defer func() { p.Close(); <-served }()

	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	sb, err := tr.Prepare(context.Background(), &tier.Spec{
		ID: "trust" + strconv.Itoa(os.Getpid()), ImageRoot: root, ImageEnv: env, ImageDigest: digest, StateDir: state,
		EgressSocket: sock, TrustPEM: p.TrustPEM(),
		Limits: tier.Limits{CPUs: 1, MemoryBytes: 256 << 20, Pids: 32, Timeout: 60 * time.Second, CPUTime: 60 * time.Second,
			OpenFiles: 64, FileSizeBytes: 1 << 20, WorkspaceBytes: 1 << 20, WorkspaceFiles: 100, TmpBytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy()

	script := fmt.Sprintf(`
import os, urllib.request
print("trusted:", open(%q).read().count("BEGIN CERTIFICATE") >= 1)
try:
    open(%q, "a").write("x")
    print("bundle writable")
except OSError:
    print("bundle read-only")
req = urllib.request.Request("https://example.com:%d/", headers={"Authorization": "Bearer " + os.environ["API_TOKEN"]})
print(urllib.request.urlopen(req, timeout=20).read().decode())
`, tier.TrustFile, tier.TrustFile, port)
	url := "http://127.0.0.1:" + strconv.Itoa(tier.EgressPort)
	extra := tier.TrustEnv()
	extra["HTTPS_PROXY"], extra["https_proxy"], extra["API_TOKEN"] = url, url, ph
	stdout, stderr := &syncbuf.Buffer{}, &syncbuf.Buffer{}
	out, err := sb.Exec(context.Background(), &tier.Command{Argv: []string{"python3", "-c", script},
		Env: tier.Environment(env, extra), Dir: "/workspace", Stdout: stdout, Stderr: stderr})
	if err != nil {
		t.Fatal(err)
	}
	got := stdout.String()
	if out.ExitCode != 0 || !strings.Contains(got, "trusted: True") || !strings.Contains(got, "bundle read-only") ||
		!strings.Contains(got, "you sent Bearer "+ph) {
		t.Fatalf("exit %d stdout %q stderr %q", out.ExitCode, got, stderr.String())
	}
	if strings.Contains(got, value) || strings.Contains(stderr.String(), value) {
		t.Fatal("the program saw the real value")
	}
	mu.Lock()
	defer mu.Unlock()
	if gotAuth != "Bearer "+value {
		t.Fatalf("destination got %q", gotAuth)
	}
	if u := p.Summary().SecretsUsed; len(u) != 1 || u[0].Name != "api" || u[0].Requests != 1 {
		t.Fatalf("SecretsUsed %+v", u)
	}
}
