package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
)

// ServeAs serves as the given key, with its ownership; SessionOf sees only
// that key's live sandboxes; nothing a remote client sends can do the same.
func TestServeAs(t *testing.T) {
	e := newEnv(t, nil)
	a := e.createSandbox(tokenA, nil)
	keyA, keyB := audit.Key{ID: "ka", Quota: audit.DefaultQuota}, audit.Key{ID: "kb", Quota: audit.DefaultQuota}

	serve := func(key audit.Key, method, path, auth string) *httptest.ResponseRecorder {
		t.Helper()
		r := httptest.NewRequest(method, path, nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		w := httptest.NewRecorder()
		e.srv.ServeAs(key, w, r)
		return w
	}
	tests := []struct {
		name      string
		key       audit.Key
		path      string
		auth      string
		want      int
		inBody    string
		notInBody string
	}{
		{"own sandbox", keyA, "/v1/sandboxes/" + a.ID, "", http.StatusOK, a.ID, ""},
		{"another key's sandbox", keyB, "/v1/sandboxes/" + a.ID, "", http.StatusNotFound, "", a.ID + `","state`},
		{"the request's own credentials are not read", keyB, "/v1/sandboxes/" + a.ID, tokenA, http.StatusNotFound, "", ""},
		{"an empty key is no key", audit.Key{}, "/v1/sandboxes", "", http.StatusUnauthorized, "", ""},
		{"public routes stay public", audit.Key{}, "/v1/health", "", http.StatusOK, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(tc.key, "GET", tc.path, tc.auth)
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.inBody) || (tc.notInBody != "" && strings.Contains(w.Body.String(), tc.notInBody)) {
				t.Errorf("status %d body %s, want %d", w.Code, w.Body, tc.want)
			}
		})
	}
	if _, ok := e.srv.SessionOf("ka", a.ID); !ok {
		t.Error("SessionOf: the owner does not see its sandbox")
	}
	if _, ok := e.srv.SessionOf("kb", a.ID); ok {
		t.Error("SessionOf: another key sees the sandbox")
	}
	// Over the network, the same request without a key is refused.
	e.must(http.StatusUnauthorized, req{method: "GET", path: "/v1/sandboxes/" + a.ID})
	e.must(http.StatusOK, req{method: "DELETE", path: "/v1/sandboxes/" + a.ID, token: tokenA})
	if _, ok := e.srv.SessionOf("ka", a.ID); ok {
		t.Error("SessionOf: a deleted sandbox")
	}
}
