// Package dashboard is the operator's web dashboard that `moat serve`
// mounts at /dashboard/ on the API's listener: live and recent runs and
// sandboxes, a run's result and output, the network destinations allowed
// and refused, pending approvals (approved or denied from the page),
// incidents, costs per key and `moat policy suggest`'s proposal.
//
// Everything it serves is embedded (no CDN, no third-party script or
// stylesheet) and every response carries a strict Content-Security-Policy.
// Only admin keys may use it, on every request (assets too): the login
// form (the one page served without a key) posts the key once and gets an
// HttpOnly, SameSite=Strict cookie holding an HMAC-signed session; each
// request re-reads the key, so revoking it ends its sessions. Requests
// that change state need POST, a same-origin request and the session's
// CSRF token.
//
// It must never put data into the page as markup: every string its JSON
// carries has passed output.Sanitize (terminal escapes, bidi overrides,
// NULs and bytes that are not UTF-8 shown as visible escapes), and the
// script builds the page with textContent and createElement only.
package dashboard

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/server/accesslog"
	"github.com/moat-sandbox/moat/service"
)

//go:embed assets
var assets embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/dashboard/"

// CookieName is the session cookie's name.
const CookieName = "moat_dashboard"

// CSRFHeader carries the session's CSRF token on requests that change
// state.
const CSRFHeader = "X-Moat-CSRF"

// CSP is the Content-Security-Policy of every response: scripts, styles,
// images and fetches from the dashboard itself only (no inline script or
// style), forms post only to it, and no page may frame it.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// Records is the audit log the dashboard reads (*audit.Store).
type Records interface {
	// Key returns the key with this id, revoked or not.
	Key(id string) (audit.Key, error)
	Query(f audit.Filter) ([]audit.Record, error)
	Get(id string) (audit.Record, error)
	Report(f audit.Filter, p audit.Prices) (*audit.Report, error)
}

// Incidents is the store of incident bundles (*incident.Store).
type Incidents interface {
	List() ([]incident.Summary, error)
	Get(id string) (incident.Summary, error)
}

// Config configures a Dashboard. Service, Authenticate and Records are
// required.
type Config struct {
	Service *service.Service
	// Authenticate checks the key the login form posts (the Auditor's
	// Authenticate).
	Authenticate func(token string) (audit.Key, error)
	Records      Records
	// Incidents is nil when the server keeps no bundles (--no-incidents).
	Incidents Incidents
	// Prices turn usage into costs. Zero: audit.DefaultPrices.
	Prices audit.Prices
	// Secret signs sessions. Nil: 32 random bytes, so that sessions end
	// when the server restarts.
	Secret []byte
	// SessionTTL is how long a login lasts. Default 8h.
	SessionTTL time.Duration
	// Logger receives errors. Nil: slog.Default().
	Logger *slog.Logger
	// now is the clock (tests move it).
	now func() time.Time
}

// Dashboard is the dashboard's http.Handler, for paths under Prefix.
type Dashboard struct {
	cfg Config
	mux *http.ServeMux
}

// New returns the dashboard configured by cfg.
func New(cfg Config) (*Dashboard, error) {
	if cfg.Service == nil || cfg.Authenticate == nil || cfg.Records == nil {
		return nil, errors.New("dashboard: Config.Service, Authenticate and Records are required")
	}
	if cfg.Secret == nil {
		cfg.Secret = make([]byte, 32)
		if _, err := rand.Read(cfg.Secret); err != nil {
			return nil, fmt.Errorf("dashboard: session secret: %w", err)
		}
	}
	if len(cfg.Secret) < 16 {
		return nil, fmt.Errorf("dashboard: Config.Secret is %d bytes; want at least 16", len(cfg.Secret))
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 8 * time.Hour
	}
	if cfg.Prices == (audit.Prices{}) {
		cfg.Prices = audit.DefaultPrices
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	d := &Dashboard{cfg: cfg, mux: http.NewServeMux()}
	d.routes()
	return d, nil
}

func (d *Dashboard) routes() {
	// Public: the login form and its answer.
	d.mux.HandleFunc("GET /dashboard/login", d.loginPage)
	d.mux.HandleFunc("POST /dashboard/login", d.login)
	// Everything else needs a session.
	d.mux.Handle("GET /dashboard/{$}", d.page(d.index))
	d.mux.Handle("GET /dashboard/app.js", d.page(d.asset("assets/app.js", "text/javascript; charset=utf-8")))
	d.mux.Handle("GET /dashboard/app.css", d.page(d.asset("assets/app.css", "text/css; charset=utf-8")))
	d.mux.Handle("POST /dashboard/logout", d.action(d.logout))
	d.mux.Handle("GET /dashboard/api/session", d.api(d.session))
	d.mux.Handle("GET /dashboard/api/runs", d.api(d.runs))
	d.mux.Handle("GET /dashboard/api/runs/{id}", d.api(d.run))
	d.mux.Handle("GET /dashboard/api/sandboxes", d.api(d.sandboxes))
	d.mux.Handle("GET /dashboard/api/network", d.api(d.network))
	d.mux.Handle("GET /dashboard/api/timeline", d.api(d.timeline))
	d.mux.Handle("GET /dashboard/api/approvals", d.api(d.approvals))
	d.mux.Handle("POST /dashboard/api/approvals/{id}", d.action(d.decide))
	d.mux.Handle("GET /dashboard/api/incidents", d.api(d.incidents))
	d.mux.Handle("GET /dashboard/api/incidents/{id}", d.api(d.incident))
	d.mux.Handle("GET /dashboard/api/costs", d.api(d.costs))
	d.mux.Handle("GET /dashboard/api/suggest", d.api(d.suggest))
}

// ServeHTTP serves a request under Prefix, with the security headers on
// every answer (errors and redirects too).
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
	if r.URL.Path == "/dashboard" {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	if _, pattern := d.mux.Handler(r); pattern == "" {
		writeError(w, http.StatusNotFound, "no such dashboard page: see "+Prefix)
		return
	}
	d.mux.ServeHTTP(w, r)
}

// session is a signed login: the key id it was made for, when it ends,
// and a nonce (the CSRF token is derived from the whole cookie value).
type sessionToken struct {
	keyID   string
	expires time.Time
}

func (d *Dashboard) sign(payload string) string {
	m := hmac.New(sha256.New, d.cfg.Secret)
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newCookie is the value of a new session cookie for keyID.
func (d *Dashboard) newCookie(keyID string) string {
	nonce := make([]byte, 16)
	rand.Read(nonce)
	payload := keyID + "." + strconv.FormatInt(d.cfg.now().Add(d.cfg.SessionTTL).Unix(), 10) + "." + base64.RawURLEncoding.EncodeToString(nonce)
	return payload + "." + d.sign("session\x00"+payload)
}

// parseCookie checks a session cookie's signature and expiry.
func (d *Dashboard) parseCookie(v string) (sessionToken, bool) {
	payload, mac, ok := cutLast(v, ".")
	if !ok || !hmac.Equal([]byte(mac), []byte(d.sign("session\x00"+payload))) {
		return sessionToken{}, false
	}
	parts := strings.Split(payload, ".")
	if len(parts) != 3 || parts[0] == "" {
		return sessionToken{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return sessionToken{}, false
	}
	t := sessionToken{keyID: parts[0], expires: time.Unix(exp, 0)}
	if !d.cfg.now().Before(t.expires) {
		return sessionToken{}, false
	}
	return t, true
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+len(sep):], true
}

// csrf is the CSRF token of the session whose cookie is v: only a page
// that can read the dashboard's API (same origin, logged in) learns it.
func (d *Dashboard) csrf(v string) string { return d.sign("csrf\x00" + v) }

// authorize returns the admin key of r's session and the cookie's value,
// or why not. The key is read again on every request: a revoked key, or
// one no longer admin, ends its sessions at once.
func (d *Dashboard) authorize(r *http.Request) (audit.Key, string, error) {
	c, err := r.Cookie(CookieName)
	if err != nil {
		return audit.Key{}, "", errNoSession
	}
	t, ok := d.parseCookie(c.Value)
	if !ok {
		return audit.Key{}, "", errNoSession
	}
	k, err := d.cfg.Records.Key(t.keyID)
	if errors.Is(err, audit.ErrNotFound) {
		return audit.Key{}, "", errNoSession
	}
	if err != nil {
		return audit.Key{}, "", err
	}
	if k.Revoked != nil || !k.Admin {
		return audit.Key{}, "", errNoSession
	}
	accesslog.From(r.Context()).Note("", k.ID)
	return k, c.Value, nil
}

var errNoSession = errors.New("no valid dashboard session")

// page wraps an HTML page or asset: without a session the page redirects
// to the login form and an asset is 401.
func (d *Dashboard) page(h func(w http.ResponseWriter, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, err := d.authorize(r); err != nil {
			if !errors.Is(err, errNoSession) {
				d.internal(w, r, err)
				return
			}
			if r.URL.Path == Prefix {
				http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
				return
			}
			writeError(w, http.StatusUnauthorized, "log in first: "+Prefix+"login")
			return
		}
		h(w, r)
	})
}

// apiFunc is a JSON endpoint: it returns the value to send (sanitised by
// writeJSON) or an error.
type apiFunc func(r *http.Request, key audit.Key, cookie string) (any, error)

// api wraps a GET endpoint: 401 without a session.
func (d *Dashboard) api(h apiFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, cookie, err := d.authorize(r)
		if err != nil {
			if errors.Is(err, errNoSession) {
				writeError(w, http.StatusUnauthorized, "log in first: "+Prefix+"login")
			} else {
				d.internal(w, r, err)
			}
			return
		}
		v, err := h(r, key, cookie)
		if err != nil {
			d.fail(w, r, err)
			return
		}
		if _, ok := v.(loggedOut); ok {
			http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/dashboard", MaxAge: -1,
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		}
		writeJSON(w, http.StatusOK, v)
	})
}

// action wraps a request that changes state: a session, a same-origin
// request and the session's CSRF token in CSRFHeader.
func (d *Dashboard) action(h apiFunc) http.Handler {
	api := d.api(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sameOrigin(r); err != nil {
			writeError(w, http.StatusForbidden, err.Error())
			return
		}
		c, err := r.Cookie(CookieName)
		if err != nil {
			writeError(w, http.StatusUnauthorized, "log in first: "+Prefix+"login")
			return
		}
		if tok := r.Header.Get(CSRFHeader); tok == "" || !hmac.Equal([]byte(tok), []byte(d.csrf(c.Value))) {
			writeError(w, http.StatusForbidden, "missing or wrong "+CSRFHeader+" header: reload the dashboard")
			return
		}
		api.ServeHTTP(w, r)
	})
}

// sameOrigin refuses a request a browser says came from another site:
// Sec-Fetch-Site when the browser sends it, else Origin against the
// request's own host. A request with neither (not a browser) is refused
// too: the dashboard is for browsers, and the API (/v1) takes keys.
func sameOrigin(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" {
		if s != "same-origin" {
			return fmt.Errorf("cross-site request refused (Sec-Fetch-Site: %s)", s)
		}
		return nil
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return errors.New("request without Origin or Sec-Fetch-Site refused: use the dashboard from a browser, or the API (/v1) with a key")
	}
	u, err := url.Parse(o)
	if err != nil || u.Host != r.Host {
		return fmt.Errorf("cross-origin request refused (Origin %q, host %q)", o, r.Host)
	}
	return nil
}

func (d *Dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.serveFile(w, "assets/login.html", "text/html; charset=utf-8", http.StatusOK)
}

// login checks the posted key (form field "key"): an admin key gets a
// session cookie and is sent to the dashboard; anything else gets the
// form again with 401 (or 403 for a tenant's key), saying nothing about
// the key itself.
func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	if err := sameOrigin(r); err != nil {
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil {
		writeError(w, http.StatusBadRequest, "the login form is at most 4 KiB of application/x-www-form-urlencoded")
		return
	}
	token := strings.TrimSpace(r.PostForm.Get("key"))
	k, err := d.cfg.Authenticate(token)
	switch {
	case errors.Is(err, audit.ErrBadKey) || (err == nil && k.ID == ""):
		d.serveFile(w, "assets/login-failed.html", "text/html; charset=utf-8", http.StatusUnauthorized)
		return
	case err != nil:
		d.internal(w, r, err)
		return
	case !k.Admin:
		d.serveFile(w, "assets/login-tenant.html", "text/html; charset=utf-8", http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: d.newCookie(k.ID), Path: "/dashboard",
		MaxAge:   int(d.cfg.SessionTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// loggedOut is what logout returns: api clears the cookie for it.
type loggedOut struct {
	LoggedOut bool `json:"logged_out"`
}

// logout clears the browser's cookie. The session is signed, not stored:
// a copy taken before lasts until it expires or its key is revoked
// (docs/THREATS.md).
func (d *Dashboard) logout(r *http.Request, key audit.Key, cookie string) (any, error) {
	return loggedOut{LoggedOut: true}, nil
}

func (d *Dashboard) index(w http.ResponseWriter, r *http.Request) {
	d.serveFile(w, "assets/index.html", "text/html; charset=utf-8", http.StatusOK)
}

func (d *Dashboard) asset(name, ctype string) func(w http.ResponseWriter, r *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { d.serveFile(w, name, ctype, http.StatusOK) }
}

func (d *Dashboard) serveFile(w http.ResponseWriter, name, ctype string, code int) {
	b, err := assets.ReadFile(name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "missing embedded asset "+name)
		return
	}
	w.Header().Set("Content-Type", ctype)
	w.WriteHeader(code)
	w.Write(b)
}

// internal logs err and answers 500 without its detail.
func (d *Dashboard) internal(w http.ResponseWriter, r *http.Request, err error) {
	d.cfg.Logger.Error("dashboard request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, "the dashboard failed; the server log has the detail")
}

// fail answers the service's errors with their status, others with 500.
func (d *Dashboard) fail(w http.ResponseWriter, r *http.Request, err error) {
	var se *service.Error
	var be *badRequest
	switch {
	case errors.As(err, &be):
		writeError(w, http.StatusBadRequest, be.msg)
	case errors.Is(err, incident.ErrNotFound), errors.Is(err, audit.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.As(err, &se) && se.Kind != service.Internal:
		writeError(w, statusOf(se.Kind), se.Message)
	default:
		d.internal(w, r, err)
	}
}

type badRequest struct{ msg string }

func (b *badRequest) Error() string { return b.msg }

func statusOf(k service.Kind) int {
	switch k {
	case service.NotFound:
		return http.StatusNotFound
	case service.Forbidden:
		return http.StatusForbidden
	case service.Conflict:
		return http.StatusConflict
	case service.Invalid, service.BadRequest:
		return http.StatusBadRequest
	case service.Quota:
		return http.StatusTooManyRequests
	case service.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}
