package redteam

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// The guarded package index (issue 20 §2): the program installs through
// the egress proxy's index with pip, unchanged; the attacker's typosquat
// sits on the same upstream as the allowed package.
func registerGuardCases() {
	for _, c := range []Case{
		{
			ID: "supply-guard-typosquat", Category: "supply-chain", Severity: "critical",
			Threat: "pip install reqeusts (a typosquat of requests) through the guarded package index, whose upstream hosts the typosquat",
			Why:    "packages: allows requests==2.31.0 only; the guard refuses reqeusts as a likely typosquat of requests before asking the upstream (which sees no request for it), logs it (reason typosquat, resembles requests) and the run gets a package violation",
			custom: guardTyposquat,
		},
		{
			ID: "supply-guard-allowed-install", Category: "supply-chain", Severity: "high",
			Threat: "the guarded index lets through something other than the allowed, hash-verified file (another version, an upstream URL, a direct connection to the upstream)",
			Why:    "pip install requests installs and imports exactly the allowed 2.31.0 wheel through the guard; the other version on the upstream is never fetched, and the only connections let through are the guard's own to its upstream",
			custom: guardAllowedInstall,
		},
	} {
		register(c)
	}
}

// guardUpstream is a PEP 503 index on the host's loopback with requests
// 2.31.0 and 2.30.0 and the typosquat reqeusts 1.0, counting requests by
// path.
type guardUpstream struct {
	srv  *http.Server
	port int
	mu   sync.Mutex
	hits map[string]int
}

func (g *guardUpstream) count(sub string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for p, c := range g.hits {
		if strings.Contains(p, sub) {
			n += c
		}
	}
	return n
}

func guardWheel(name, version string) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	di := name + "-" + version + ".dist-info/"
	for _, f := range [][2]string{
		{name + "/__init__.py", fmt.Sprintf("VERSION = %q\n", version)},
		{di + "METADATA", "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n"},
		{di + "WHEEL", "Wheel-Version: 1.0\nGenerator: moat-redteam\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
		{di + "RECORD", ""},
	} {
		w, err := zw.Create(f[0])
		if err != nil {
			return nil, err
		}
		w.Write([]byte(f[1]))
	}
	err := zw.Close()
	return buf.Bytes(), err
}

func startGuardUpstream() (*guardUpstream, error) {
	files := map[string][]byte{}
	for _, nv := range [][2]string{{"requests", "2.31.0"}, {"requests", "2.30.0"}, {"reqeusts", "1.0"}} {
		b, err := guardWheel(nv[0], nv[1])
		if err != nil {
			return nil, err
		}
		files[nv[0]+"-"+nv[1]+"-py3-none-any.whl"] = b
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := &guardUpstream{port: l.Addr().(*net.TCPAddr).Port, hits: map[string]int{}}
	g.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		g.mu.Lock()
		g.hits[req.URL.Path]++
		g.mu.Unlock()
		if name, ok := strings.CutPrefix(req.URL.Path, "/simple/"); ok {
			name = strings.TrimSuffix(name, "/")
			fmt.Fprint(w, "<!DOCTYPE html><html><body>\n")
			for fn, b := range files {
				if strings.HasPrefix(fn, name+"-") {
					sum := sha256.Sum256(b)
					fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", fn, hex.EncodeToString(sum[:]), fn)
				}
			}
			fmt.Fprint(w, "</body></html>\n")
			return
		}
		if b, ok := files[strings.TrimPrefix(req.URL.Path, "/files/")]; ok {
			w.Write(b)
			return
		}
		http.NotFound(w, req)
	})}
	go g.srv.Serve(l)
	return g, nil
}

// guardRun runs argv with packages: allowing requests==2.31.0 from up.
func (r *runner) guardRun(ctx context.Context, up *guardUpstream, argv []string) (*result.Result, error) {
	m := r.defaults()
	m.Network.Mode = "allowlist"
	m.Network.AllowAddresses = []string{"127.0.0.1"}
	m.Packages.PyPI = manifest.PackageIndex{Index: fmt.Sprintf("http://127.0.0.1:%d/simple", up.port), Allow: []string{"requests==2.31.0"}}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	m.Tier = r.tier // after validation, as netRun
	return r.exec(ctx, &engine.Request{Manifest: m, Argv: argv})
}

// guardPip installs with pip, or, where the image has no pip, fetches the
// project page from the injected index URL with urllib (the guard's
// answer is the same either way).
const guardPip = `
import os, subprocess, sys, urllib.request, urllib.error
pkg = sys.argv[1]
if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--retries", "0", "--target", "t", pkg])
    print("pip exit", r.returncode)
    if r.returncode == 0:
        sys.path.insert(0, "t")
        mod = __import__(pkg.split("=")[0])
        print("imported", mod.VERSION)
    sys.exit(r.returncode)
print("no pip in the image: fetching the project page with urllib")
try:
    page = urllib.request.urlopen(os.environ["PIP_INDEX_URL"] + pkg + "/", timeout=10).read()
    print("fetched", len(page), "bytes")
    sys.exit(0 if b".whl" in page else 3)
except urllib.error.HTTPError as e:
    print("refused", e.code, e.headers.get("X-Moat-Egress"))
    sys.exit(3)
`

func guardTyposquat(ctx context.Context, r *runner) (string, string, int) {
	up, err := startGuardUpstream()
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer up.srv.Close()
	res, err := r.guardRun(ctx, up, []string{"python3", "-c", guardPip, "reqeusts"})
	if err != nil {
		return guardErr(err)
	}
	if n := up.count("reqeusts"); n > 0 {
		return Escaped, fmt.Sprintf("the upstream served %d request(s) for the typosquat", n), 1
	}
	if res.ExitCode == 0 {
		return Escaped, "the typosquat install reported success: " + netTail(res), 1
	}
	logged := false
	for _, a := range res.Network {
		logged = logged || (!a.Allowed && a.Reason == "typosquat" && a.Resembles == "requests")
	}
	viol := false
	for _, v := range res.Violations {
		viol = viol || v.Kind == "package"
	}
	if !logged || !viol {
		return Error, fmt.Sprintf("the install failed but not as a typosquat refusal (logged=%v violation=%v; %s; %s)", logged, viol, egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("refused as a typosquat of requests (network reason typosquat, a package violation); the upstream saw no request for reqeusts; install exit %d", res.ExitCode), 1
}

func guardAllowedInstall(ctx context.Context, r *runner) (string, string, int) {
	up, err := startGuardUpstream()
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer up.srv.Close()
	res, err := r.guardRun(ctx, up, []string{"python3", "-c", guardPip, "requests"})
	if err != nil {
		return guardErr(err)
	}
	if n := up.count("2.30.0"); n > 0 {
		return Escaped, "the upstream served the version the manifest does not allow", 1
	}
	for _, a := range egressAllowed(res) {
		if a.Method != "INDEX" && !strings.HasPrefix(a.Host, "moat-index/") {
			return Escaped, "a connection other than the guard's own went through: " + fmtAttempt(a), 1
		}
		if a.Package != "" && a.Package != "requests==2.31.0" {
			return Escaped, "the guard served something else: " + a.Package, 1
		}
	}
	out := decode(res.Stdout)
	if res.ExitCode != 0 || !(strings.Contains(out, "imported 2.31.0") || strings.Contains(out, "fetched")) {
		return Error, fmt.Sprintf("the allowed install failed (exit %d; %s; %s)", res.ExitCode, egressReasons(res), netTail(res)), 1
	}
	return Contained, fmt.Sprintf("the allowed requests 2.31.0 was installed through the guard (%s); 2.30.0 never left the upstream", egressReasons(res)), 1
}

// guardErr: a tier without an egress proxy (network.mode allowlist
// unsupported) has no guarded index to attack; anything else is an error.
func guardErr(err error) (string, string, int) {
	var fe *manifest.FieldError
	if errors.As(err, &fe) && fe.Field == "network.mode" {
		return NotApplicable, "the tier has no egress proxy, so no guarded index: " + err.Error(), 0
	}
	return runErr(err)
}
