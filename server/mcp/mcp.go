// Package mcp is Moat's Model Context Protocol server: the tools an agent
// calls to run code and keep sandboxes (run_code, create_sandbox, exec,
// write_file, read_file, list_files, download, kill_sandbox,
// get_approval), over stdio (`moat mcp`, one key for the process) and
// over Streamable HTTP (`moat serve --mcp`, at /mcp, the API key as a
// bearer token on every request). It uses the official Go SDK
// (github.com/modelcontextprotocol/go-sdk).
//
// It is a front door like package server: each tool decodes its
// arguments strictly (internal/strictjson), calls one service method with
// the connection's key and encodes what it returns as a tool result (the
// service's JSON view as structured content, a short summary as text).
// A tool's arguments are a model's output, untrusted: they get the same
// checks as the HTTP API's requests and never more authority than the
// key has. It must never answer a refused request with a transport
// failure (every refusal is an IsError result naming the field), never
// let one key reach another's sandbox, and never leave the sandboxes of
// a stdio session alive after the session ends.
package mcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/server/accesslog"
	"github.com/moat-sandbox/moat/service"
)

// Authenticator turns an API key into its audit.Key (the audit store,
// service.Auditor).
type Authenticator interface {
	Authenticate(token string) (audit.Key, error)
}

// Config configures a Server. Service is required, and Keys for Handler;
// every other zero value takes the default named on the field.
type Config struct {
	Service *service.Service
	Keys    Authenticator
	// Logger receives what a caller is not shown (internal errors' causes).
	// Nil: slog.Default().
	Logger *slog.Logger
	// Version is the server version MCP's initialize reports.
	Version string
	// MaxFiles bounds the files of one tool call. Default 1000.
	MaxFiles int
	// MaxRequestBytes bounds one HTTP request body (--max-body). Default
	// 64 MiB.
	MaxRequestBytes int64
	// MaxFileBytes bounds what read_file and download return of one file:
	// a tool result travels whole, in one message. Default 8 MiB.
	MaxFileBytes int64
	// SessionTimeout closes an HTTP session idle this long (its sandboxes
	// live on until their TTL). Default 30m.
	SessionTimeout time.Duration
}

// Server serves the MCP tools over a service.Service. Create it with New.
type Server struct {
	cfg Config
	svc *service.Service
	log *slog.Logger
	// sdkLog is log for the SDK: its warnings and errors only (it logs
	// every session's start and end at info).
	sdkLog *slog.Logger

	mu sync.Mutex
	// http is the SDK server behind Handler, once made.
	http *mcp.Server
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Service == nil {
		return nil, errors.New("mcp: Config.Service is required")
	}
	if toolsErr != nil {
		return nil, toolsErr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = 1000
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 64 << 20
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = 8 << 20
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	return &Server{cfg: cfg, svc: cfg.Service, log: cfg.Logger, sdkLog: slog.New(quieter{cfg.Logger.Handler()})}, nil
}

// quieter passes on warnings and errors only.
type quieter struct{ slog.Handler }

func (q quieter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && q.Handler.Enabled(ctx, l)
}

func (q quieter) WithAttrs(as []slog.Attr) slog.Handler { return quieter{q.Handler.WithAttrs(as)} }
func (q quieter) WithGroup(name string) slog.Handler    { return quieter{q.Handler.WithGroup(name)} }

// keyExtra is where the HTTP handler's token verifier leaves the caller's
// audit.Key in the SDK's TokenInfo (auth.TokenInfo.Extra).
const keyExtra = "moat_key"

// conn is what the tools know of their caller: how to find its key, and,
// for a stdio session, the sandboxes it created (destroyed when it ends).
type conn struct {
	// key returns the caller's key from a request's extra information
	// (a tool call's, a resource read's).
	key func(extra *mcp.RequestExtra) (audit.Key, bool)

	mu      sync.Mutex
	owned   map[string]bool // nil: sandboxes outlive the connection (HTTP)
	drained bool            // the session has ended: no more sandboxes
}

// own records a sandbox the connection created; false when the session
// has already ended (the caller destroys the sandbox).
func (c *conn) own(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.owned == nil {
		return true
	}
	if c.drained {
		return false
	}
	c.owned[id] = true
	return true
}

func (c *conn) disown(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.owned, id)
}

// drain returns the sandboxes still owned and refuses new ones.
func (c *conn) drain() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drained = true
	ids := make([]string, 0, len(c.owned))
	for id := range c.owned {
		ids = append(ids, id)
	}
	c.owned = map[string]bool{}
	return ids
}

// newServer is an SDK server with the tools, serving c.
func (s *Server) newServer(c *conn) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "moat", Title: "Moat sandbox", Version: s.cfg.Version}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       s.sdkLog,
	})
	s.addTools(srv, c)
	s.addFiles(srv, c)
	return srv
}

// instructions is what initialize tells the model about the server.
const instructions = "Moat runs code in isolated, disposable sandboxes. Use run_code for a one-off program " +
	"(a fresh sandbox, destroyed after). For multi-step work, create_sandbox once, then exec, write_file, " +
	"read_file, list_files and download in it (files and installed state persist across calls), and " +
	"kill_sandbox when done. Paths are relative to /workspace. Network access and resources are limited " +
	"by the manifest and the operator's policy; a refused request says which field to change."

// Serve serves one session on t (stdio under `moat mcp`) as key until the
// client goes away or ctx ends, then destroys the sandboxes the session
// created that are still alive.
func (s *Server) Serve(ctx context.Context, t mcp.Transport, key audit.Key) error {
	c := &conn{
		key:   func(*mcp.RequestExtra) (audit.Key, bool) { return key, true },
		owned: map[string]bool{},
	}
	err := s.newServer(c).Run(ctx, t)
	s.destroyAll(key, c.drain())
	if errors.Is(err, context.Canceled) || errors.Is(err, mcp.ErrConnectionClosed) {
		err = nil
	}
	return err
}

// destroyAll deletes key's sandboxes ids. One already gone (killed,
// expired) is not an error.
func (s *Server) destroyAll(key audit.Key, ids []string) {
	for _, id := range ids {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := s.svc.DeleteSandbox(ctx, key, id)
		cancel()
		if err != nil && service.KindOf(err) != service.NotFound {
			s.log.Error("mcp: destroy the sandbox of an ended session", "sandbox", id, "key", key.ID, "err", err)
		}
	}
}

// Handler serves MCP's Streamable HTTP transport (mount it at /mcp). Every
// request carries an API key as "Authorization: Bearer K": without a
// valid one it is answered 401 before the SDK sees it, and a session is
// bound to the key that opened it (the SDK refuses another key's requests
// on it).
func (s *Server) Handler() (http.Handler, error) {
	if s.cfg.Keys == nil {
		return nil, errors.New("mcp: Config.Keys is required to serve HTTP")
	}
	c := &conn{key: keyFromToken}
	srv := s.newServer(c)
	s.mu.Lock()
	s.http = srv
	s.mu.Unlock()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Logger:              s.sdkLog,
		SessionTimeout:      s.cfg.SessionTimeout,
		MaxRequestBodyBytes: s.cfg.MaxRequestBytes,
	})
	verify := func(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		key, err := s.cfg.Keys.Authenticate(token)
		if err != nil {
			if !errors.Is(err, audit.ErrBadKey) {
				s.log.Error("mcp: authenticate", "err", err)
			}
			return nil, fmt.Errorf("%w: a valid API key is required: send \"Authorization: Bearer <key>\" (create one with moat keys create)", auth.ErrInvalidToken)
		}
		// Keys do not expire; a revoked key fails the next request's
		// Authenticate, since every request is verified.
		if r != nil {
			accesslog.From(r.Context()).Note("", key.ID)
		}
		return &auth.TokenInfo{UserID: key.ID, Extra: map[string]any{keyExtra: key}}, nil
	}
	authed := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accesslog.From(r.Context()).Note("/mcp", "")
		authed.ServeHTTP(w, r)
	}), nil
}

// CloseSessions ends the HTTP sessions, so that their open event streams
// (a client's GET /mcp) do not hold an http.Server's Shutdown until its
// deadline. Register it with http.Server.RegisterOnShutdown. The
// sessions' sandboxes are the service's to end.
func (s *Server) CloseSessions() {
	s.mu.Lock()
	srv := s.http
	s.mu.Unlock()
	if srv == nil {
		return
	}
	for ss := range srv.Sessions() {
		ss.Close()
	}
}

// keyFromToken is the key the HTTP handler's verifier authenticated for
// the HTTP request carrying a call.
func keyFromToken(extra *mcp.RequestExtra) (audit.Key, bool) {
	if extra == nil || extra.TokenInfo == nil {
		return audit.Key{}, false
	}
	k, ok := extra.TokenInfo.Extra[keyExtra].(audit.Key)
	return k, ok && k.ID != ""
}
