package accesslog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHandler(t *testing.T) {
	tests := []struct {
		name    string
		nested  bool // the handler inside another Handler
		handler http.HandlerFunc
		want    map[string]any // nil: no line at info
	}{
		{"one line with what the front door noted", false, func(w http.ResponseWriter, r *http.Request) {
			From(r.Context()).Note("GET /x/{id}", "k1")
			w.WriteHeader(http.StatusTeapot)
			w.Write([]byte("hello"))
		}, map[string]any{"route": "GET /x/{id}", "key": "k1", "status": float64(418), "bytes": float64(5), "path": "/x/1", "method": "GET"}},
		{"nested handlers log once", true, func(w http.ResponseWriter, r *http.Request) {
			From(r.Context()).Note("GET /x/{id}", "")
			w.Write([]byte("ok"))
		}, map[string]any{"route": "GET /x/{id}", "key": "-", "status": float64(200), "bytes": float64(2)}},
		{"nothing noted", false, func(w http.ResponseWriter, r *http.Request) {},
			map[string]any{"route": "unmatched", "key": "-", "status": float64(200), "bytes": float64(0)}},
		{"a quiet request is not at info", false, func(w http.ResponseWriter, r *http.Request) { From(r.Context()).Quiet() }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewJSONHandler(&logs, nil))
			var h http.Handler = Handler(log, tc.handler)
			if tc.nested {
				h = Handler(log, h)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", "/x/1?token=secret", nil))
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			if tc.want == nil {
				if logs.Len() != 0 {
					t.Fatalf("logged %s", logs.String())
				}
				return
			}
			if len(lines) != 1 {
				t.Fatalf("%d lines, want 1:\n%s", len(lines), logs.String())
			}
			var got map[string]any
			if err := json.Unmarshal([]byte(lines[0]), &got); err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v (%s)", k, got[k], v, lines[0])
				}
			}
			if strings.Contains(lines[0], "secret") {
				t.Errorf("the query is in the line: %s", lines[0])
			}
			if id, _ := got["request_id"].(string); !strings.HasPrefix(id, "r-") || len(id) != 18 || rec.Header().Get("X-Request-Id") != id {
				t.Errorf("request_id %q, X-Request-Id %q", id, rec.Header().Get("X-Request-Id"))
			}
		})
	}
}
