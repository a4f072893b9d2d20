package main

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/sdnotify"
)

// TestServeNotify: under systemd with Type=notify (packaging/moat.service)
// moat serve says READY=1 only once its listener accepts connections, and
// STOPPING=1 when SIGTERM starts the drain. The test plays systemd's part:
// a unixgram socket in $NOTIFY_SOCKET that records what arrives.
func TestServeNotify(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// startServer passes its environment on to moat serve.
	t.Setenv(sdnotify.Socket, sock)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0")

	next := func(what string) string {
		t.Helper()
		buf := make([]byte, 4096)
		conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no %s notification from moat serve: %v\n%s", what, err, s.logs())
		}
		return string(buf[:n])
	}
	steps := []struct {
		name string
		do   func()
		want string
	}{
		{name: "ready", do: func() {}, want: sdnotify.Ready},
		// Sent on the signal, before the drain ends.
		{name: "stopping", do: func() { s.terminate(t, 40*time.Second) }, want: sdnotify.Stopping},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do()
			if got := next(st.name); got != st.want {
				t.Fatalf("notification = %q, want %q", got, st.want)
			}
			if st.name != "ready" {
				return
			}
			// READY means the API answers now, with no retry.
			resp, err := http.Get(s.url + "/v1/health")
			if err != nil {
				t.Fatalf("GET /v1/health right after READY=1: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /v1/health right after READY=1: %s", resp.Status)
			}
		})
	}
	if strings.Contains(s.logs(), "could not tell systemd") {
		t.Errorf("moat serve warned about sd_notify:\n%s", s.logs())
	}
}
