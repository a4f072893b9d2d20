package native_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

// TestSessionSetNetwork: a live session's allowlist is replaced for its
// next connections (E2B's updateNetwork): a server it could reach is
// refused after, one it could not is reached; a session made without
// network cannot get one.
func TestSessionSetNetwork(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	first := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "first") })
	second := startServer(t, false, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "second") })
	s := newSession(t, e, func(m *manifest.Manifest) {
		m.Network.Mode = "allowlist"
		m.Network.Allow = []string{"localhost:" + port(first.srv)}
		m.Network.AllowAddresses = tiertest.LoopbackAddresses
	})
	fetch := func(srv string) string {
		r := execWait(t, s, &engine.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("curl -fsS --max-time 5 http://localhost:%s/ 2>&1; echo \" curl=$?\"", srv)}})
		return r.Stdout.Data
	}
	steps := []struct {
		name       string
		allow      []string
		wantFirst  string
		wantSecond string
	}{
		{"as created", nil, "first curl=0", "curl=22"},
		{"replaced", []string{"localhost:" + port(second.srv)}, "curl=22", "second curl=0"},
		{"emptied", []string{}, "curl=22", "curl=22"},
	}
	for i, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if i > 0 {
				n := manifest.Network{Mode: "allowlist", Allow: st.allow, AllowAddresses: tiertest.LoopbackAddresses}
				if err := s.SetNetwork(n); err != nil {
					t.Fatal(err)
				}
			}
			if got := fetch(port(first.srv)); !strings.Contains(got, st.wantFirst) {
				t.Errorf("first: %q, want %q", got, st.wantFirst)
			}
			if got := fetch(port(second.srv)); !strings.Contains(got, st.wantSecond) {
				t.Errorf("second: %q, want %q", got, st.wantSecond)
			}
		})
	}
	none := newSession(t, e, nil)
	if err := none.SetNetwork(manifest.Network{Mode: "allowlist", Allow: []string{"localhost"}}); err == nil || !strings.Contains(err.Error(), "network.mode none") {
		t.Errorf("SetNetwork of a session without network: %v", err)
	}
}
