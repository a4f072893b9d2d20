package pkgguard

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PathPrefix is where the guard lives on the proxy: requests whose path
// starts with it are the guard's.
const PathPrefix = "/moat-index/"

// Reasons of the guard's Events (they become network attempts' reasons).
const (
	ReasonAllowed = "allowed"
	// ReasonTyposquat: a name within a small edit distance of an allowed
	// or popular package (Event.Resembles) that is not itself allowed.
	ReasonTyposquat = "typosquat"
	// ReasonNotAllowed: a package, version or file the manifest does not
	// allow, or one the new-package or yanked policy holds back.
	ReasonNotAllowed = "package-not-allowed"
	// ReasonHashMismatch: the upstream's bytes did not match the digest
	// the upstream listed or the manifest pinned; nothing was served.
	ReasonHashMismatch = "hash-mismatch"
	// ReasonUpstreamError: the upstream index could not be read, or
	// answered something the guard cannot parse.
	ReasonUpstreamError = "upstream-error"
)

// Config is what the manifest grants.
type Config struct {
	// PyPI and NPM are the granted indexes; nil is not served.
	PyPI, NPM *Index
	// Typosquat is "refuse" (the default): an allowed name that itself
	// resembles a popular one is refused too; or "warn": such a name is
	// served and the event logged. A name that is not allowed is refused
	// either way; the policy only decides about the allowed ones.
	Typosquat string
	// NewPackagesDays holds back files and versions the upstream says were
	// uploaded less than this many days ago (0: no hold).
	NewPackagesDays int
	// Yanked is "refuse" (the default: yanked PyPI files are not listed)
	// or "allow" (listed, marked yanked, as the upstream does).
	Yanked string
}

// Index is one granted upstream.
type Index struct {
	// URL is the upstream: the simple index root for PyPI
	// (https://pypi.org/simple), the registry root for npm
	// (https://registry.npmjs.org).
	URL   string
	Allow []Requirement
}

// Event is one decision of the guard, reported to Options.Report.
type Event struct {
	Ecosystem Ecosystem
	Package   string // normalised name as requested
	Version   string // when known
	File      string // the file or tarball, for downloads
	Allowed   bool
	Reason    string
	// Resembles is the allowed or popular name a typosquat resembles.
	Resembles string
	// Detail is a sentence for people.
	Detail string
}

// Options are the guard's collaborators.
type Options struct {
	// Transport fetches from upstream; required. The engine passes the
	// egress proxy's, which applies the run's address policy and budget.
	Transport http.RoundTripper
	// BaseURL is the guard's address as the sandbox reaches it, ending
	// in PathPrefix without its final slash
	// ("http://127.0.0.1:3128/moat-index"). npm needs absolute tarball
	// URLs.
	BaseURL string
	// Report receives every decision (nil: none).
	Report func(Event)
	// Now defaults to time.Now.
	Now func() time.Time
	// MaxFileBytes bounds one file or tarball (default 512 MiB);
	// MaxPageBytes one project page or packument (default 64 MiB).
	MaxFileBytes, MaxPageBytes int64
	// SpoolDir holds files while they are verified (default os.TempDir()).
	SpoolDir string
}

// Guard is the handler. Its zero value is not usable; call New.
type Guard struct {
	cfg    Config
	opts   Options
	client *http.Client

	mu    sync.Mutex
	files map[string]fileRec // ecosystem/package/file -> where and what
}

// fileRec is a file the guard listed to the sandbox: only these are served.
type fileRec struct {
	upstream string
	algo     string // "sha256" or "sha512" or "sha1"
	digest   []byte
	version  string
}

// New returns a guard for cfg.
func New(cfg Config, opts Options) (*Guard, error) {
	if opts.Transport == nil {
		return nil, errors.New("pkgguard: Options.Transport is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.MaxFileBytes <= 0 {
		opts.MaxFileBytes = 512 << 20
	}
	if opts.MaxPageBytes <= 0 {
		opts.MaxPageBytes = 64 << 20
	}
	if opts.Report == nil {
		opts.Report = func(Event) {}
	}
	opts.BaseURL = strings.TrimSuffix(opts.BaseURL, "/")
	for _, ix := range []*Index{cfg.PyPI, cfg.NPM} {
		if ix == nil {
			continue
		}
		u, err := url.Parse(ix.URL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return nil, fmt.Errorf("pkgguard: index URL %q is not an http(s) URL", ix.URL)
		}
	}
	g := &Guard{cfg: cfg, opts: opts, files: map[string]fileRec{}}
	// Redirects are followed by the client, each hop through the same
	// transport (so through the same address checks).
	g.client = &http.Client{Transport: opts.Transport, Timeout: 10 * time.Minute}
	return g, nil
}

// ServeHTTP answers one request of the sandbox.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		refuse(w, http.StatusMethodNotAllowed, ReasonNotAllowed, "the package guard serves GET and HEAD only")
		return
	}
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), PathPrefix)
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch {
	case strings.HasPrefix(rest, "pypi/") && g.cfg.PyPI != nil:
		g.servePyPI(w, r, strings.TrimPrefix(rest, "pypi/"))
	case strings.HasPrefix(rest, "npm/") && g.cfg.NPM != nil:
		g.serveNPM(w, r, strings.TrimPrefix(rest, "npm/"))
	default:
		refuse(w, http.StatusNotFound, ReasonNotAllowed, fmt.Sprintf("no index at %s; the manifest grants %s", r.URL.Path, g.granted()))
	}
}

func (g *Guard) granted() string {
	var s []string
	if g.cfg.PyPI != nil {
		s = append(s, PathPrefix+"pypi/simple/")
	}
	if g.cfg.NPM != nil {
		s = append(s, PathPrefix+"npm/")
	}
	if len(s) == 0 {
		return "no index (packages: is empty)"
	}
	return strings.Join(s, " and ")
}

// refuse answers with a plain-text refusal that names the reason, in the
// egress proxy's style.
func refuse(w http.ResponseWriter, status int, reason, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Moat-Egress", reason)
	w.WriteHeader(status)
	io.WriteString(w, "moat package guard: "+msg+"\n")
}

// lookup decides on a requested name: the requirement that allows it, or
// the refusal (reported) with its reason.
func (g *Guard) lookup(w http.ResponseWriter, eco Ecosystem, ix *Index, name string) (Requirement, bool) {
	var allowed []string
	for _, rq := range ix.Allow {
		if rq.Name != name {
			allowed = append(allowed, rq.Name)
			continue
		}
		if sim, near := Resembles(name, popular[eco]); near && !IsPopular(eco, name) {
			if g.cfg.Typosquat != "warn" {
				g.deny(w, Event{Ecosystem: eco, Package: name, Reason: ReasonTyposquat, Resembles: sim,
					Detail: fmt.Sprintf("%s is allowed, but resembles the popular package %s (packages.typosquat: refuse); fix the spelling, or set packages.typosquat: warn if %s is meant", name, sim, name)})
				return rq, false
			}
			g.opts.Report(Event{Ecosystem: eco, Package: name, Allowed: true, Reason: ReasonTyposquat, Resembles: sim,
				Detail: fmt.Sprintf("%s resembles the popular package %s; served because packages.typosquat is warn", name, sim)})
		}
		return rq, true
	}
	if sim, ok := Resembles(name, allowed); ok {
		g.deny(w, Event{Ecosystem: eco, Package: name, Reason: ReasonTyposquat, Resembles: sim,
			Detail: fmt.Sprintf("%s is not allowed and resembles the allowed package %s: a likely typosquat; did you mean %s?", name, sim, sim)})
		return Requirement{}, false
	}
	if sim, ok := Resembles(name, popular[eco]); ok && !IsPopular(eco, name) {
		g.deny(w, Event{Ecosystem: eco, Package: name, Reason: ReasonTyposquat, Resembles: sim,
			Detail: fmt.Sprintf("%s is not allowed and resembles the popular package %s: a likely typosquat", name, sim)})
		return Requirement{}, false
	}
	g.deny(w, Event{Ecosystem: eco, Package: name, Reason: ReasonNotAllowed,
		Detail: fmt.Sprintf("%s is not in packages.%s.allow; add it to the manifest to grant it", name, eco)})
	return Requirement{}, false
}

// deny reports e and answers the sandbox with its detail.
func (g *Guard) deny(w http.ResponseWriter, e Event) {
	e.Allowed = false
	g.opts.Report(e)
	status := http.StatusForbidden
	if e.Reason == ReasonUpstreamError {
		status = http.StatusBadGateway
	}
	refuse(w, status, e.Reason, e.Detail)
}

// tooNew reports whether an upload time is inside the new-package hold.
func (g *Guard) tooNew(t time.Time) bool {
	return g.cfg.NewPackagesDays > 0 && !t.IsZero() && g.opts.Now().Sub(t) < time.Duration(g.cfg.NewPackagesDays)*24*time.Hour
}

// fetch GETs an upstream URL and returns its body, at most limit bytes.
func (g *Guard) fetch(ctx context.Context, u, accept string, limit int64) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, "", err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, "", &upstreamStatus{code: resp.StatusCode, url: u}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, "", err
	}
	if int64(len(b)) > limit {
		return nil, "", fmt.Errorf("%s is larger than %d bytes", u, limit)
	}
	return b, resp.Header.Get("Content-Type"), nil
}

type upstreamStatus struct {
	code int
	url  string
}

func (e *upstreamStatus) Error() string {
	return fmt.Sprintf("upstream answered %d for %s", e.code, e.url)
}

func (g *Guard) remember(key string, f fileRec) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.files) < 1<<16 {
		g.files[key] = f
	}
}

func (g *Guard) recall(key string) (fileRec, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f, ok := g.files[key]
	return f, ok
}

// serveVerified fetches f, spools it while hashing, and serves it only if
// its digest is f's: nothing unverified reaches the sandbox.
func (g *Guard) serveVerified(w http.ResponseWriter, r *http.Request, e Event, f fileRec, contentType string) {
	req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, f.upstream, nil)
	if err != nil {
		g.deny(w, Event{Ecosystem: e.Ecosystem, Package: e.Package, File: e.File, Reason: ReasonUpstreamError, Detail: err.Error()})
		return
	}
	resp, err := g.client.Do(req)
	if err != nil {
		e.Reason, e.Detail = ReasonUpstreamError, fmt.Sprintf("fetching %s: %v", e.File, err)
		g.deny(w, e)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.Reason, e.Detail = ReasonUpstreamError, (&upstreamStatus{code: resp.StatusCode, url: f.upstream}).Error()
		g.deny(w, e)
		return
	}
	spool, err := os.CreateTemp(g.opts.SpoolDir, "moat-pkgguard-*")
	if err != nil {
		e.Reason, e.Detail = ReasonUpstreamError, "cannot spool the file for verification"
		g.deny(w, e)
		return
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	var h hash.Hash
	switch f.algo {
	case "sha256":
		h = sha256.New()
	case "sha512":
		h = sha512.New()
	default:
		h = sha1.New()
	}
	n, err := io.Copy(io.MultiWriter(spool, h), io.LimitReader(resp.Body, g.opts.MaxFileBytes+1))
	if err != nil {
		e.Reason, e.Detail = ReasonUpstreamError, fmt.Sprintf("reading %s: %v", e.File, err)
		g.deny(w, e)
		return
	}
	if n > g.opts.MaxFileBytes {
		e.Reason, e.Detail = ReasonNotAllowed, fmt.Sprintf("%s is larger than %d bytes", e.File, g.opts.MaxFileBytes)
		g.deny(w, e)
		return
	}
	if got := h.Sum(nil); !equalDigest(got, f.digest) {
		e.Reason = ReasonHashMismatch
		e.Detail = fmt.Sprintf("%s from upstream has %s %s, not the %s listed or pinned; nothing of it was served", e.File, f.algo, hex.EncodeToString(got), hex.EncodeToString(f.digest))
		g.deny(w, e)
		return
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		e.Reason, e.Detail = ReasonUpstreamError, "cannot reread the spooled file"
		g.deny(w, e)
		return
	}
	e.Allowed, e.Reason = true, ReasonAllowed
	e.Detail = fmt.Sprintf("%s verified (%s)", e.File, f.algo)
	g.opts.Report(e)
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodGet {
		io.Copy(w, spool)
	}
}

func equalDigest(a, b []byte) bool {
	if len(a) != len(b) || len(a) == 0 {
		return false
	}
	var d byte
	for i := range a {
		d |= a[i] ^ b[i]
	}
	return d == 0
}

// decodeSRI decodes a Subresource Integrity value ("sha512-B64", several
// separated by spaces) to its strongest digest the guard can check.
func decodeSRI(s string) (algo string, digest []byte, ok bool) {
	for _, f := range strings.Fields(s) {
		b64, found := strings.CutPrefix(f, "sha512-")
		if !found {
			continue
		}
		if i := strings.IndexByte(b64, '?'); i >= 0 {
			b64 = b64[:i]
		}
		if d, err := base64.StdEncoding.DecodeString(b64); err == nil && len(d) == sha512.Size {
			return "sha512", d, true
		}
	}
	return "", nil, false
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
