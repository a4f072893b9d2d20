// Package e2b serves E2B's API on `moat serve --e2b`, so that the
// unmodified E2B SDKs (`e2b` on npm, `e2b` on PyPI) drive Moat sandboxes:
// the control plane of E2B's public OpenAPI (POST /v2/sandboxes, GET
// /v2/sandboxes, …, authenticated by X-API-Key) and the data plane of
// envd, the daemon E2B runs inside each sandbox (the Connect services
// process.Process and filesystem.Filesystem in Connect's JSON codec, and
// REST /files), which Moat serves on the host side.
//
// It is a translation layer and nothing more: every request is answered
// by the methods of Moat's service layer (package service), the same the
// Moat API's handlers call, so an E2B sandbox is a Moat sandbox with its
// manifest, limits, quotas, audit record and zero-residue destruction, and
// Moat's API reaches it by the same id. It must never create a sandbox the API would refuse, honour
// an E2B field Moat cannot enforce (it refuses it, naming the field), let
// a request reach a sandbox without that sandbox's access token (or a
// URL it signed; for the ports of a sandbox, its traffic token unless the
// creator made them public), or let a path leave the workspace.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/server/accesslog"
	"github.com/moat-sandbox/moat/service"
)

// EnvdPort is the port of envd in E2B's addressing (E2b-Sandbox-Port, and
// the "<port>-<id>.<domain>" host names).
const EnvdPort = "49983"

// envdVersion is the envd version Moat claims: the SDKs gate features on
// it, and e2b 2.51's newest gate is 0.6.4. 0.5.7 has octet-stream uploads
// and CloseStdin; 0.6.2 file metadata (X-Metadata-* on POST /files, kept
// as the file's user xattrs, returned by list, getInfo, rename and
// write); 0.6.3 watch events with their entry (includeEntry); 0.6.4
// watching on network mounts (allowNetworkMounts), which Moat's polling
// watcher needs nothing for: a workspace has no network mount.
const envdVersion = "0.6.4"

// Config configures a Handler.
type Config struct {
	// Service is Moat's service layer every request is served by (the
	// Moat API's: server.Server.Service). Required.
	Service *service.Service
	// Auditor authenticates X-API-Key (Moat's keys). Required.
	Auditor service.Auditor
	// Domain, when set, routes host names "49983-<id>.<Domain>" to the
	// sandbox's envd and is returned to the SDK as the sandbox domain.
	Domain string
	Logger *slog.Logger
	// MaxBodyBytes bounds each file uploaded to envd's /files, as
	// server.Config.MaxBodyBytes bounds an upload to Moat's API (give it
	// the same). Default 64 MiB.
	MaxBodyBytes int64
	// Keys, when set (*audit.Store), is asked on every envd call for the
	// key that created the sandbox: a revoked key's sandboxes refuse
	// their access tokens from then on, and quotas are current. Nil: the
	// key as authenticated at creation.
	Keys KeyLookup
	// HasImage, when set, says whether the host's store holds a current
	// build of the named image (engine.Engine.Images().Lookup succeeds).
	// The "base" template is the Moat image "base" only when it does;
	// otherwise it is the default image, so that a host which never built
	// the larger base image answers at once instead of building it inside
	// an SDK's create request. Nil: "base" is always the default image.
	HasImage func(name string) bool
	// Internet is what E2B sandboxes that ask for internet access get
	// (moat serve --e2b-internet). Zero: none, loopback only.
	Internet Internet
}

// KeyLookup finds an API key by id; *audit.Store implements it.
type KeyLookup interface {
	Key(id string) (audit.Key, error)
}

// Handler is the E2B API. Create it with New.
type Handler struct {
	cfg     Config
	svc     *service.Service
	log     *slog.Logger
	control *http.ServeMux
	rpc     *http.ServeMux

	mu    sync.Mutex
	boxes map[string]*box // by sandbox id
}

// box is what E2B knows of a sandbox beyond Moat: its access token, its
// template and the tags of its processes.
type box struct {
	id       string
	keyID    string
	key      audit.Key // as authenticated at creation (its quota)
	token    string
	traffic  string // the traffic access token of its ports (ports.go); "" when public
	public   bool   // network.allowPublicTraffic: true
	template string
	cpus     int
	memoryMB int

	mu       sync.Mutex
	tags     map[string]uint32 // process tag -> pid
	pids     map[uint32]string // pid -> command id (pids.go)
	watchers map[string]*pollWatcher
}

// New returns the E2B API over cfg.Service.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	h := &Handler{cfg: cfg, svc: cfg.Service, log: cfg.Logger, control: http.NewServeMux(), rpc: newRPCMux(), boxes: map[string]*box{}}
	h.routes()
	return h
}

// Wrap returns a handler that serves Moat's own API (/v1/…, /metrics)
// through moat and everything else as E2B: envd when the request names a
// sandbox (E2b-Sandbox-Id header or "49983-<id>.<domain>" host), the
// control plane otherwise. Both share one listener, so E2B_API_URL and
// E2B_SANDBOX_URL can both be the server's address.
func (h *Handler) Wrap(moat http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/metrics" {
			moat.ServeHTTP(w, r)
			return
		}
		// The access log's route: which of E2B's two planes answered
		// (never the raw path: it holds sandbox ids).
		entry := accesslog.From(r.Context())
		if id, port, ok := h.sandboxOf(r); ok {
			entry.Note("e2b envd", "")
			h.serveEnvd(w, r, id, port)
			return
		}
		if r.URL.Path == "/files" {
			entry.Note("e2b envd", "")
			// envd's /files in path mode (E2B_SANDBOX_URL) without
			// E2b-Sandbox-Id: a signed URL, whose signature names the
			// sandbox, or nothing this server lets through (401).
			h.serveSignedPathMode(w, r)
			return
		}
		entry.Note("e2b control", "")
		h.serveControl(w, r)
	})
}

// sandboxOf reads the sandbox a data-plane request is for.
func (h *Handler) sandboxOf(r *http.Request) (id, port string, ok bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id, r.Header.Get("E2b-Sandbox-Port"), true
	}
	if h.cfg.Domain == "" {
		return "", "", false
	}
	host := r.Host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	label, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(h.cfg.Domain))
	if !ok {
		return "", "", false
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || id == "" || strings.Contains(id, ".") {
		return "", "", false
	}
	return id, port, true
}

// authenticate checks X-API-Key against Moat's keys.
func (h *Handler) authenticate(r *http.Request) (audit.Key, *apiError) {
	token := r.Header.Get("X-API-Key")
	if token == "" {
		return audit.Key{}, &apiError{http.StatusUnauthorized, "missing X-API-Key header: give a Moat API key (moat keys create, or moat keys create --e2b for the e2b_ spelling older E2B SDKs require)"}
	}
	if strings.HasPrefix(token, "e2b_") {
		// The spelling e2b JS 2.2x-2.50 insist on (moat keys create
		// --e2b): the same key, translated back, never a second secret.
		moat, ok := audit.FromE2BToken(token)
		if !ok {
			return audit.Key{}, &apiError{http.StatusUnauthorized, "Invalid API key: an e2b_ key here must be a Moat key in its E2B spelling, e2b_ and 76 hex digits (moat keys create --e2b); keys of E2B's cloud are not Moat keys"}
		}
		token = moat
	}
	key, err := h.cfg.Auditor.Authenticate(token)
	if err != nil || key.ID == "" {
		return audit.Key{}, &apiError{http.StatusUnauthorized, "Invalid API key: it is not a live Moat API key (moat keys create)"}
	}
	accesslog.From(r.Context()).Note("", key.ID)
	return key, nil
}

// box returns the E2B record of sandbox id when keyID owns it and the
// Moat sandbox is alive; a dead sandbox's record is dropped.
func (h *Handler) box(keyID, id string) *box {
	h.mu.Lock()
	b := h.boxes[id]
	h.mu.Unlock()
	if b == nil || b.keyID != keyID {
		return nil
	}
	if !h.alive(keyID, id) {
		h.forget(id)
		return nil
	}
	return b
}

// alive reports whether key keyID's Moat sandbox id is running: the
// service's own lookup, so another key's sandbox is absent.
func (h *Handler) alive(keyID, id string) bool {
	sb, err := h.svc.GetSandbox(context.Background(), audit.Key{ID: keyID}, id)
	// A paused sandbox keeps its record (its token) until it is resumed.
	return err == nil && sb.State != service.StateDeleting && sb.State != service.StateDeleted
}

// boxByToken returns the record of sandbox id if token is its access
// token, compared in constant time.
func (h *Handler) boxByToken(id, token string) (*box, bool) {
	h.mu.Lock()
	b := h.boxes[id]
	h.mu.Unlock()
	if b == nil {
		return nil, false
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(b.token)) != 1 {
		return b, false
	}
	if !h.alive(b.keyID, id) {
		h.forget(id)
		return nil, false
	}
	return b, true
}

func (h *Handler) forget(id string) {
	h.mu.Lock()
	delete(h.boxes, id)
	h.mu.Unlock()
}

// sweep drops the records of sandboxes Moat has destroyed (TTL, DELETE
// through Moat's API, shutdown).
func (h *Handler) sweep() {
	h.mu.Lock()
	all := make([]*box, 0, len(h.boxes))
	for _, b := range h.boxes {
		all = append(all, b)
	}
	h.mu.Unlock()
	for _, b := range all {
		if !h.alive(b.keyID, b.id) {
			h.forget(b.id)
		}
	}
}

// Boxes is the number of sandboxes E2B keeps a record of (for tests).
func (h *Handler) Boxes() int {
	h.sweep()
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.boxes)
}

func newToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// apiError is E2B's error document, {code, message}, code being the HTTP
// status.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) write(w http.ResponseWriter) {
	writeJSON(w, e.Code, e)
}

// fromService is a service error as the control plane answers it: the
// status of its Kind (kinds), the service's message. An internal error's
// cause is logged, not sent.
func (h *Handler) fromService(err error) *apiError {
	k := kindOf(err)
	msg := err.Error()
	var se *service.Error
	if errors.As(err, &se) {
		msg = se.Message
		if se.Kind == service.Internal {
			h.log.Error("e2b: request failed", "err", err)
		}
	}
	return &apiError{k.status, msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"code":500,"message":"encode response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(data)
}
