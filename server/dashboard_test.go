package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/dashboard"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// TestDashboardMount: the dashboard is served on the API's listener when
// the Auditor is the audit store, with its own headers, and not with an
// API key in place of its session.
func TestDashboardMount(t *testing.T) {
	store, err := audit.Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	admin, _, err := store.CreateAdminKey("operator", audit.DefaultQuota)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(t *testing.T, au Auditor, off bool) *httptest.Server {
		srv, err := New(Config{Backend: &servicetest.Backend{Dir: t.TempDir()}, Auditor: au, NoDashboard: off, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		t.Cleanup(func() {
			hs.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			srv.Shutdown(ctx)
		})
		return hs
	}
	tests := []struct {
		name   string
		au     Auditor
		off    bool
		path   string
		bearer bool
		want   int
	}{
		{"login form", store, false, "/dashboard/login", false, http.StatusOK},
		{"bare /dashboard redirects", store, false, "/dashboard", false, http.StatusSeeOther},
		{"page without session", store, false, "/dashboard/", false, http.StatusSeeOther},
		{"API key is no session", store, false, "/dashboard/api/runs", true, http.StatusUnauthorized},
		{"--no-dashboard", store, true, "/dashboard/login", false, http.StatusNotFound},
		{"auditor that is not the audit store", servicetest.NewAuditor(), false, "/dashboard/login", false, http.StatusNotFound},
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs := serve(t, tc.au, tc.off)
			rq, _ := http.NewRequest("GET", hs.URL+tc.path, nil)
			if tc.bearer {
				rq.Header.Set("Authorization", "Bearer "+admin)
			}
			resp, err := client.Do(rq)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("GET %s: %d, want %d", tc.path, resp.StatusCode, tc.want)
			}
			if tc.want != http.StatusNotFound && resp.Header.Get("Content-Security-Policy") != dashboard.CSP {
				t.Errorf("CSP %q", resp.Header.Get("Content-Security-Policy"))
			}
		})
	}
}
