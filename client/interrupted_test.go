package client_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/moat-sandbox/moat/client"
)

// TestExecInterrupted: the server's interrupted reaches Exec.Interrupted,
// and its absence is "".
func TestExecInterrupted(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"killed with its sandbox", `{"id":"e-1","sandbox_id":"sb-1","state":"exited","argv":["sleep","9"],"interrupted":"sandbox-deleted","result":{"termination":"signaled"}}`, "sandbox-deleted"},
		{"ended on its own", execJSON, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			c, err := client.New(srv.URL, testKey)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := c.Sandbox("sb-1").GetExec(context.Background(), "e-1")
			if err != nil {
				t.Fatal(err)
			}
			if ex.Interrupted != tc.want {
				t.Errorf("Interrupted %q, want %q", ex.Interrupted, tc.want)
			}
		})
	}
}
