// Package server is Moat's HTTP API (`moat serve`): one-shot runs,
// long-lived sandboxes with their commands, event streams and files,
// health and metrics, as docs/API.md and openapi.yaml describe.
//
// It is a thin layer over package service, which owns the business
// (the sandbox registry, quotas, audit records, ownership, expiry and
// cleanup): each handler authenticates, decodes the request strictly,
// calls one service method with the caller's key, and encodes the answer;
// httpError maps the service's error kinds onto statuses and codes. It
// authenticates every request but the health check and the OpenAPI
// document, and refuses malformed
// or oversized requests before the service is called. It must never
// accept a host path from a caller, and never let a panic or a client
// that goes away take the server down.
//
// The sandboxes themselves come from a Backend (the engine); the keys and
// the audit log from an Auditor (the audit store). TLS and listening are
// the caller's: Handler is a plain http.Handler.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/dashboard"
	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server/accesslog"
	"github.com/moat-sandbox/moat/service"
)

// Config configures a Server. Backend and Auditor are required; every other
// zero value takes the default named on the field.
type Config struct {
	Backend Backend
	Auditor Auditor
	// Logger receives errors (with their cause and request id) and
	// lifecycle events. Nil: slog.Default().
	Logger *slog.Logger
	// Version is reported by GET /v1/health and moat_build_info.
	Version string
	// Source is the source digest Moat was built from (scripts/source-id,
	// package internal/sourceid), moat_build_info's source label.
	Source string

	// MaxBodyBytes bounds a request body (--max-body). Default 64 MiB.
	MaxBodyBytes int64
	// MaxFiles bounds the files of one request (--max-files). Default 1000.
	MaxFiles int
	// MaxConcurrent bounds the programs running at once, server-wide:
	// one-shot runs and session commands (--max-concurrent). Default
	// 4 × runtime.NumCPU().
	MaxConcurrent int
	// QueueWait is how long a request waits for one of MaxConcurrent's
	// slots before it is refused with 429. Default 10s; negative: no
	// waiting.
	QueueWait time.Duration
	// DefaultTTL is a sandbox's TTL when the request gives none. Default
	// 10m.
	DefaultTTL time.Duration
	// MaxTTL bounds a sandbox's TTL (--max-ttl). Default 24h.
	MaxTTL time.Duration
	// KeepRuns is how many one-shot results GET /v1/runs/{id} can return
	// (--keep-runs). Default 1000.
	KeepRuns int
	// KeepExecs is how many ended commands a sandbox remembers (with
	// their output); running ones are always kept. Default 32.
	KeepExecs int
	// ReapInterval is how often expired sandboxes are looked for.
	// Default 1s.
	ReapInterval time.Duration
	// DrainBytes bounds how much of a request body the server reads and
	// discards before an error answer (a body over MaxBodyBytes, a bad
	// key), so that a client that sends its whole body before reading
	// the answer (Python's http.client) gets the answer, not a reset
	// connection. Default 256 MiB; negative: none.
	DrainBytes int64
	// AccrueInterval is how often the usage of running records is written
	// to the audit log (when the Auditor is an Accruer): what a crash of
	// the server can lose of a run's accounting. Default 2s.
	AccrueInterval time.Duration
	// Policy is the operator's policy (--policy): per-key ceilings and
	// required justifications (service.Config.Policy). Nil: none.
	Policy *policy.Policy
	// Effects is the operator's effects policy (--effects-policy):
	// commands are analysed before they start, and allowed, refused or
	// held for approval (service.Config.Effects). Nil: effects' default
	// policy. NoEffects turns the analysis off.
	Effects   *effects.Policy
	NoEffects bool
	// ApprovalTimeout is how long a held command waits for a decision
	// before it is denied (--approval-timeout). Default 5m.
	ApprovalTimeout time.Duration
	// Incidents is the store of incident bundles: GET /v1/incidents and
	// the dashboard read it, and the service keeps in it the evidence of
	// the commands the effects policy denies (service.Config.Incidents).
	// Nil: the server keeps no bundles (--no-incidents).
	Incidents IncidentStore
	// SnapshotDir and SnapshotTTL keep snapshots and paused sandboxes
	// (service.Config.SnapshotDir, SnapshotTTL). "": none.
	SnapshotDir string
	SnapshotTTL time.Duration
	// NoDashboard turns the dashboard (/dashboard/) off. It is served
	// only when the Auditor is also a dashboard.Records (the audit
	// store).
	NoDashboard bool
	// Prices price the dashboard's costs. Zero: audit.DefaultPrices.
	Prices audit.Prices
}

func (c *Config) setDefaults() error {
	sc := c.serviceConfig()
	if err := sc.SetDefaults(); err != nil {
		return err
	}
	c.Logger, c.MaxConcurrent, c.QueueWait = sc.Logger, sc.MaxConcurrent, sc.QueueWait
	c.DefaultTTL, c.MaxTTL, c.KeepRuns, c.KeepExecs = sc.DefaultTTL, sc.MaxTTL, sc.KeepRuns, sc.KeepExecs
	c.ReapInterval, c.AccrueInterval = sc.ReapInterval, sc.AccrueInterval
	if c.MaxBodyBytes <= 0 {
		c.MaxBodyBytes = 64 << 20
	}
	if c.MaxFiles <= 0 {
		c.MaxFiles = 1000
	}
	if c.DrainBytes == 0 {
		c.DrainBytes = 256 << 20
	}
	return nil
}

// serviceConfig is the part of c the service takes.
func (c *Config) serviceConfig() service.Config {
	return service.Config{
		Backend: c.Backend, Auditor: c.Auditor, Logger: c.Logger,
		MaxConcurrent: c.MaxConcurrent, QueueWait: c.QueueWait,
		DefaultTTL: c.DefaultTTL, MaxTTL: c.MaxTTL, KeepRuns: c.KeepRuns, KeepExecs: c.KeepExecs,
		ReapInterval: c.ReapInterval, AccrueInterval: c.AccrueInterval,
		Policy:  c.Policy,
		Effects: c.Effects, NoEffects: c.NoEffects, ApprovalTimeout: c.ApprovalTimeout,
		Incidents:   c.Incidents,
		SnapshotDir: c.SnapshotDir, SnapshotTTL: c.SnapshotTTL,
	}
}

// Server is the HTTP API over a service.Service. Create it with New; serve
// Handler; stop it with Shutdown.
type Server struct {
	cfg     Config
	svc     *service.Service
	log     *slog.Logger
	mux     *http.ServeMux
	handler http.Handler
	metrics *metrics
	// routes lists every pattern registered, and routeOpts their
	// options, for the OpenAPI test.
	routes    []string
	routeOpts map[string]routeOpts

	// streams counts open event streams (the tests check none leak).
	streams atomic.Int64
}

// New returns a Server over a new service.Service built from cfg.
// Shutdown stops it.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg,
		log: cfg.Logger,
		mux: http.NewServeMux(),
	}
	sc := cfg.serviceConfig()
	// The service reports every program that ended; the counters are
	// read at the next scrape.
	sc.Observe = func(res *result.Result) { s.metrics.observe(res) }
	sc.ObserveStart = func(tier string, poolHit bool, d time.Duration) { s.metrics.observeStart(tier, poolHit, d) }
	svc, err := service.New(sc)
	if err != nil {
		return nil, err
	}
	s.svc = svc
	s.metrics = newMetrics(svc)
	s.metrics.build[0], s.metrics.build[2] = cfg.Version, cfg.Source
	s.routesInit()
	if err := s.mountDashboard(); err != nil {
		return nil, err
	}
	// The access log is outermost: its line is written after the
	// answer, whatever the handlers did (accesslog.Handler).
	s.handler = accesslog.Handler(s.log, http.HandlerFunc(s.serveHTTP))
	return s, nil
}

// Service is the business layer the API serves: other front doors of
// the same process (the E2B layer) call it directly.
func (s *Server) Service() *service.Service { return s.svc }

// Shutdown stops the service (see service.Service.Shutdown): new work is
// refused with 503, in-flight runs finish or, past ctx, are killed, and
// every sandbox is destroyed before it returns.
func (s *Server) Shutdown(ctx context.Context) error { return s.svc.Shutdown(ctx) }

// Handler is the API's http.Handler. It writes the access log (package
// accesslog); wrapped in another accesslog.Handler (the listener's, in
// front of E2B's and MCP's front doors too) it leaves the line to that
// one.
func (s *Server) Handler() http.Handler { return s.handler }

// Sessions is the number of live sandboxes (for tests and metrics).
func (s *Server) Sessions() int { return s.svc.Sessions() }

// handlerFunc is a route's handler: it writes its answer, or returns an
// error the wrapper turns into the JSON error response.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// routeOpts say what a route needs around it.
type routeOpts struct {
	public bool // no API key
	// probe: the access log writes this route's requests at debug
	// level, not info (a load balancer's health check every second
	// would drown the log).
	probe bool
	// scope: a key of this scope (audit.Key.Scope) may use the route
	// too, when the Auditor is a ScopedAuthenticator.
	scope string
}

// ScopedAuthenticator is an Auditor that also authenticates scoped keys
// (audit.Store): keys that Authenticate refuses, for the routes of their
// scope only.
type ScopedAuthenticator interface {
	AuthenticateScope(token, scope string) (audit.Key, error)
}

func (s *Server) routesInit() {
	s.handle("GET /v1/health", s.health, routeOpts{public: true, probe: true})
	s.handle("GET /v1/openapi.yaml", s.openAPI, routeOpts{public: true})
	s.handle("GET /metrics", s.serveMetrics, routeOpts{scope: audit.ScopeMetrics})
	s.handle("POST /v1/runs", s.createRun, routeOpts{})
	s.handle("GET /v1/runs/{id}", s.getRun, routeOpts{})
	s.handle("POST /v1/sandboxes", s.createSandbox, routeOpts{})
	s.handle("GET /v1/sandboxes", s.listSandboxes, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}", s.getSandbox, routeOpts{})
	s.handle("DELETE /v1/sandboxes/{id}", s.deleteSandbox, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/timeout", s.setTimeout, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/execs", s.createExec, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/execs", s.listExecs, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/execs/{eid}", s.getExec, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/execs/{eid}/events", s.execEvents, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/execs/{eid}/stdin", s.execStdin, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/execs/{eid}/signal", s.execSignal, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/execs/{eid}/resize", s.execResize, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/cells", s.runCell, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/kernel", s.getKernel, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/kernel/interrupt", s.interruptKernel, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/kernel/restart", s.restartKernel, routeOpts{})
	s.handle("POST /v1/sandboxes/{id}/contexts", s.createContext, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/contexts", s.listContexts, routeOpts{})
	s.handle("DELETE /v1/sandboxes/{id}/contexts/{cid}", s.deleteContext, routeOpts{})
	s.handle("PUT /v1/sandboxes/{id}/files", s.putFile, routeOpts{})
	s.handle("GET /v1/sandboxes/{id}/files", s.getFile, routeOpts{})
	s.handle("DELETE /v1/sandboxes/{id}/files", s.deleteFile, routeOpts{})
	s.handle("GET /v1/approvals", s.listApprovals, routeOpts{})
	s.handle("POST /v1/approvals/{id}", s.decideApproval, routeOpts{})
	s.handle("GET /v1/incidents", s.listIncidents, routeOpts{})
	s.handle("GET /v1/incidents/{id}", s.getIncident, routeOpts{})
}

// mountDashboard serves the dashboard at /dashboard/ when the Auditor is
// the audit store it reads. It does its own authentication (an admin
// key's session cookie) and headers: it is not under the API's routes.
func (s *Server) mountDashboard() error {
	recs, ok := s.cfg.Auditor.(dashboard.Records)
	if s.cfg.NoDashboard || !ok {
		return nil
	}
	var inc dashboard.Incidents
	if s.cfg.Incidents != nil {
		inc = s.cfg.Incidents
	}
	d, err := dashboard.New(dashboard.Config{Service: s.svc, Authenticate: s.cfg.Auditor.Authenticate,
		Records: recs, Incidents: inc, Prices: s.cfg.Prices, Logger: s.log})
	if err != nil {
		return err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rw, ok := w.(*responseWriter); ok {
			rw.route = dashboard.Prefix
		}
		accesslog.From(r.Context()).Note(dashboard.Prefix, "")
		d.ServeHTTP(w, r)
	})
	s.mux.Handle(dashboard.Prefix, h)
	s.mux.Handle("/dashboard", h)
	return nil
}

func (s *Server) handle(pattern string, h handlerFunc, o routeOpts) {
	s.routes = append(s.routes, pattern)
	if s.routeOpts == nil {
		s.routeOpts = map[string]routeOpts{}
	}
	s.routeOpts[pattern] = o
	s.mux.Handle(pattern, &route{s: s, pattern: pattern, h: h, opts: o})
}

type ctxKey int

const (
	keyCtx ctxKey = iota
	requestIDCtx
)

// keyOf is the authenticated key of a request.
func keyOf(r *http.Request) audit.Key {
	k, _ := r.Context().Value(keyCtx).(audit.Key)
	return k
}

func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDCtx).(string)
	return id
}

// serveHTTP is the outermost handler: request id, panic recovery, metrics,
// and JSON errors for what the mux itself refuses (unknown path, wrong
// method).
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	id := accesslog.From(r.Context()).ID()
	if id == "" {
		id = accesslog.NewID()
	}
	r = r.WithContext(context.WithValue(r.Context(), requestIDCtx, id))
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &trackedBody{ReadCloser: r.Body}
	}
	rw := &responseWriter{ResponseWriter: w}
	rw.Header().Set("X-Request-Id", id)
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p) // net/http's own way to abort a response
			}
			buf := make([]byte, 16<<10)
			buf = buf[:runtime.Stack(buf, false)]
			s.writeError(rw, r, internal(fmt.Errorf("panic: %v\n%s", p, buf)))
		}
		route := rw.route
		if route == "" {
			route = "unmatched"
		}
		s.metrics.http.inc(route, strconv.Itoa(rw.status()))
	}()
	if _, pattern := s.mux.Handler(r); pattern == "" {
		s.unrouted(rw, r)
		return
	}
	// The route records its pattern in rw for the metric.
	s.mux.ServeHTTP(rw, r)
}

// unrouted answers what the mux does not route: 404, 405 with Allow, or
// the mux's redirect to a cleaned path.
func (s *Server) unrouted(w *responseWriter, r *http.Request) {
	h, _ := s.mux.Handler(r)
	rec := &headerRecorder{h: http.Header{}}
	h.ServeHTTP(rec, r)
	switch rec.code {
	case http.StatusMethodNotAllowed:
		w.Header().Set("Allow", rec.h.Get("Allow"))
		s.writeError(w, r, &Error{Status: http.StatusMethodNotAllowed, Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, rec.h.Get("Allow"))})
	case http.StatusNotFound:
		s.writeError(w, r, &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: "no such endpoint: " + r.URL.Path + " (see docs/API.md)"})
	default:
		for k, v := range rec.h {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.code)
	}
}

// headerRecorder keeps the status and headers of the mux's own 404, 405
// and redirect answers, and drops their text bodies.
type headerRecorder struct {
	h    http.Header
	code int
}

func (h *headerRecorder) Header() http.Header { return h.h }
func (h *headerRecorder) Write(b []byte) (int, error) {
	if h.code == 0 {
		h.code = http.StatusOK
	}
	return len(b), nil
}
func (h *headerRecorder) WriteHeader(code int) {
	if h.code == 0 {
		h.code = code
	}
}

// route wraps one handler: authentication, then the handler, then its
// error.
type route struct {
	s       *Server
	pattern string
	h       handlerFunc
	opts    routeOpts
}

func (rt *route) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rw, _ := w.(*responseWriter)
	if rw != nil {
		rw.route = rt.pattern
	}
	entry := accesslog.From(r.Context())
	entry.Note(rt.pattern, "")
	if rt.opts.probe {
		entry.Quiet()
	}
	if !rt.opts.public {
		key, err := rt.s.authenticate(r, rt.opts.scope)
		if err != nil {
			rt.s.writeError(w, r, err)
			return
		}
		entry.Note("", key.ID)
		r = r.WithContext(context.WithValue(r.Context(), keyCtx, key))
	}
	if err := rt.h(w, r); err != nil {
		rt.s.writeError(w, r, err)
	}
}

// authenticate reads the key from "Authorization: Bearer K" or
// "X-API-Key: K": a full key, or a key of scope when scope is not "".
func (s *Server) authenticate(r *http.Request, scope string) (audit.Key, error) {
	token := r.Header.Get("X-API-Key")
	if a := r.Header.Get("Authorization"); a != "" {
		scheme, rest, ok := strings.Cut(a, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return audit.Key{}, unauthenticated()
		}
		token = strings.TrimSpace(rest)
	}
	if token == "" {
		return audit.Key{}, unauthenticated()
	}
	key, err := s.cfg.Auditor.Authenticate(token)
	if sa, ok := s.cfg.Auditor.(ScopedAuthenticator); ok && scope != "" && errors.Is(err, audit.ErrBadKey) {
		key, err = sa.AuthenticateScope(token, scope)
	}
	if errors.Is(err, audit.ErrBadKey) {
		return audit.Key{}, unauthenticated()
	}
	if err != nil {
		return audit.Key{}, internal(fmt.Errorf("authenticate: %w", err))
	}
	if key.ID == "" {
		// Ownership is by key id: an empty one would share sandboxes.
		return audit.Key{}, internal(errors.New("authenticate: the auditor returned a key without an id"))
	}
	return key, nil
}

func unauthenticated() *Error {
	return &Error{Status: http.StatusUnauthorized, Code: CodeUnauthenticated,
		Message: "a valid API key is required: send \"Authorization: Bearer <key>\" or \"X-API-Key: <key>\" (create one with moat keys create)"}
}

// writeError sends err as the JSON error document and logs its cause. A
// response already under way (an event stream) cannot change its status:
// the error is only logged.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := httpError(err)
	id := requestID(r)
	attrs := []any{"request_id", id, "method", r.Method, "path", r.URL.Path, "status", e.Status, "code", e.Code}
	if k := keyOf(r); k.ID != "" {
		attrs = append(attrs, "key", k.ID)
	}
	if e.Err != nil {
		attrs = append(attrs, "cause", e.Err.Error())
	}
	if e.Status >= 500 {
		s.log.Error("request failed: "+e.Message, attrs...)
	} else {
		s.log.Debug("request refused: "+e.Message, attrs...)
	}
	if rw, ok := w.(*responseWriter); ok && rw.wrote {
		return
	}
	s.discardBody(w, r)
	msg := e.Message
	if e.Status == http.StatusInternalServerError {
		msg += " (request id " + id + "; the server log has the detail)"
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	writeJSON(w, e.Status, ErrorBody{Error: ErrorDetail{Code: e.Code, Message: msg, Field: e.Field, RequestID: id}})
}

func writeJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return internal(fmt.Errorf("encode response: %w", err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
	return nil
}

// responseWriter records the status for the metrics and whether the
// answer has begun.
type responseWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
	route string
}

func (w *responseWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.code, w.wrote = http.StatusOK, true
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets event streams push each event.
func (w *responseWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		w.wrote = true
		if w.code == 0 {
			w.code = http.StatusOK
		}
		f.Flush()
	}
}

// Unwrap serves http.ResponseController (write deadlines).
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *responseWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) error {
	if s.isClosing() {
		return writeJSON(w, http.StatusServiceUnavailable, Health{Status: "shutting_down", Version: s.cfg.Version})
	}
	return writeJSON(w, http.StatusOK, Health{Status: "ok", Version: s.cfg.Version})
}

func (s *Server) isClosing() bool { return s.svc.Closing() }
