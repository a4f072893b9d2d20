package sdnotify

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listen opens a unixgram socket the way systemd's notify socket is, and
// returns its address.
func listen(t *testing.T, abstract bool) (string, *net.UnixConn) {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "notify")
	if abstract {
		addr = "@moat-sdnotify-test-" + strings.ReplaceAll(t.Name(), "/", "-")
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return addr, conn
}

func TestNotify(t *testing.T) {
	tests := []struct {
		name     string
		env      string // "" unset; "SOCKET" the test's socket; else used as is
		abstract bool
		state    string
		wantSent bool
		wantErr  string
	}{
		{name: "not under systemd", env: "", state: Ready},
		{name: "ready to a path socket", env: "SOCKET", state: Ready, wantSent: true},
		{name: "stopping to an abstract socket", env: "SOCKET", abstract: true, state: Stopping, wantSent: true},
		{name: "relative address refused", env: "notify.sock", state: Ready, wantErr: "absolute socket path"},
		{name: "no listener", env: "/nonexistent/moat-notify.sock", state: Ready, wantErr: "sd_notify /nonexistent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var conn *net.UnixConn
			env := tc.env
			if env == "SOCKET" {
				env, conn = listen(t, tc.abstract)
			}
			t.Setenv(Socket, env)
			sent, err := Notify(tc.state)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Notify err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || sent != tc.wantSent {
				t.Fatalf("Notify = %v, %v; want %v, nil", sent, err, tc.wantSent)
			}
			if conn == nil {
				return
			}
			buf := make([]byte, 256)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := conn.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := string(buf[:n]); got != tc.state {
				t.Errorf("datagram = %q, want %q", got, tc.state)
			}
		})
	}
}
