// Package accesslog writes the access log of moat serve: one line per
// request, after it ends, with its request id, method, route pattern,
// path, status, duration, bytes written and the id of the key that made
// it. Every front door on the listener (the API, E2B's, MCP) records what
// only it knows (its route pattern, the authenticated key) with Note;
// the outermost Handler writes the line.
//
// It must never log a key's secret, a request's query string or body:
// the line holds the key's id only, and the path without its query.
package accesslog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Entry is what the front doors know of a request beyond net/http's view.
type Entry struct {
	mu    sync.Mutex
	id    string
	route string
	key   string
	quiet bool
}

type ctxKey struct{}

// From returns the entry of the request ctx belongs to, or nil when no
// Handler is around it.
func From(ctx context.Context) *Entry {
	e, _ := ctx.Value(ctxKey{}).(*Entry)
	return e
}

// ID is the request's id ("r-" and 16 hex digits), also sent to the
// client as X-Request-Id; "" without a Handler.
func (e *Entry) ID() string {
	if e == nil {
		return ""
	}
	return e.id
}

// Note records the route pattern that served the request and the id of
// the key it authenticated with ("" leaves either as it was). A nil Entry
// ignores it.
func (e *Entry) Note(route, keyID string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if route != "" {
		e.route = route
	}
	if keyID != "" {
		e.key = keyID
	}
}

// Quiet logs the request at debug level rather than info: probes (the
// health check, metrics scrapes) that would flood the log at a few per
// second while telling nothing.
func (e *Entry) Quiet() {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.quiet = true
	e.mu.Unlock()
}

// Handler wraps next with the access log: it gives each request an id and
// an Entry and writes one line to log when the request ends. Inside
// another Handler it only passes the request on, so that front doors can
// each be wrapped and stacked without logging a request twice.
func Handler(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if From(r.Context()) != nil {
			next.ServeHTTP(w, r)
			return
		}
		e := &Entry{id: NewID()}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, e))
		w.Header().Set("X-Request-Id", e.id)
		cw := &countingWriter{ResponseWriter: w}
		start := time.Now()
		defer func() {
			// Deferred, so that a handler that panics (net/http
			// recovers it) still leaves its line.
			e.mu.Lock()
			route, key, quiet := e.route, e.key, e.quiet
			e.mu.Unlock()
			if route == "" {
				route = "unmatched"
			}
			if key == "" {
				key = "-"
			}
			level := slog.LevelInfo
			if quiet {
				level = slog.LevelDebug
			}
			status := cw.code
			if status == 0 {
				status = http.StatusOK
			}
			log.Log(context.Background(), level, "request",
				"request_id", e.id, "method", r.Method, "route", route, "path", r.URL.Path,
				"status", status, "duration_ms", float64(time.Since(start).Microseconds())/1000,
				"bytes", cw.bytes, "key", key)
		}()
		next.ServeHTTP(cw, r)
	})
}

// NewID returns a fresh request id.
func NewID() string {
	var b [8]byte
	rand.Read(b[:])
	return "r-" + hex.EncodeToString(b[:])
}

// countingWriter records the status and counts the body's bytes.
type countingWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *countingWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Flush lets event streams push each event.
func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.code == 0 {
			w.code = http.StatusOK
		}
		f.Flush()
	}
}

// Unwrap serves http.ResponseController (deadlines, hijacking).
func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
