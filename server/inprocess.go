package server

import (
	"context"
	"net/http"

	"github.com/moat-sandbox/moat/audit"
)

// In-process access for an adapter mounted beside the API (the E2B
// compatibility layer, server/e2b): it authenticates its callers in its own
// way, then serves them through the same handlers, so quotas, audit
// records, ownership and cleanup are the API's and nothing is duplicated.

type preauthCtx struct{}

// ServeAs serves r through the API's handlers as key, which the caller has
// already authenticated: the request's own credentials are not read. Only
// code in this process can call it; a remote request can never carry the
// context value it sets.
func (s *Server) ServeAs(key audit.Key, w http.ResponseWriter, r *http.Request) {
	ctx := context.WithValue(r.Context(), preauthCtx{}, key)
	s.handler.ServeHTTP(w, r.WithContext(ctx))
}

// preauthenticated is the key ServeAs gave r, if any.
func preauthenticated(r *http.Request) (audit.Key, bool) {
	k, ok := r.Context().Value(preauthCtx{}).(audit.Key)
	return k, ok && k.ID != ""
}

// SessionOf returns the live sandbox id of key keyID: the same lookup as the
// API's, so another key's sandbox is absent. The adapter uses it for the
// file operations the API has no route for (stat, mkdir, rename).
func (s *Server) SessionOf(keyID, id string) (Session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil || sb.key != keyID || sb.state != StateRunning {
		return nil, false
	}
	return sb.sess, true
}
