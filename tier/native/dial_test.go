package native_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

// TestDialPort: the host reaches a server listening on 127.0.0.1 inside a
// session sandbox through DialPort, for the ports network.inbound grants,
// only while the sandbox lives; a port nothing listens on is refused as a
// connect is, and the host's own network namespace never sees the server.
func TestDialPort(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	s := newSession(t, e, func(m *manifest.Manifest) {
		m.Network.Inbound = []manifest.PortRange{"18000-18001"}
	})
	p, err := s.Start(context.Background(), &engine.ExecRequest{Argv: []string{"python3", "-m", "http.server", "18000", "--bind", "127.0.0.1"}})
	if err != nil {
		t.Fatalf("start the server: %v", err)
	}
	t.Cleanup(func() { p.Signal(syscall.SIGKILL) })
	if res := execWait(t, s, &engine.ExecRequest{Argv: []string{"sh", "-c", "echo hello-from-inside > index.html"}}); res.ExitCode != 0 {
		t.Fatalf("write index.html: %+v", res)
	}
	get := func(port int) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := s.DialPort(ctx, port)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, "GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body), nil
	}
	// The server takes a moment to listen, longer on a loaded machine.
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for {
		body, err = get(18000)
		if err == nil || time.Now().After(deadline) || !errors.Is(err, syscall.ECONNREFUSED) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	tests := []struct {
		name    string
		port    int
		wantErr error // nil: the page
	}{
		{"granted port with a server", 18000, nil},
		{"granted port, nothing listening", 18001, syscall.ECONNREFUSED},
		{"port not granted", 8000, engine.ErrPortNotGranted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := get(tc.port)
			if tc.wantErr == nil {
				if err != nil || strings.TrimSpace(got) != "hello-from-inside" {
					t.Fatalf("got %q, %v; want the page served inside (first try: %q)", got, err, body)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("err %v, want %v", err, tc.wantErr)
			}
		})
	}
	t.Run("the host's namespace does not see the server", func(t *testing.T) {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://127.0.0.1:18000/index.html")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), "hello-from-inside") {
				t.Error("the sandbox's server answered on the host's loopback")
			}
		}
	})
	t.Run("after close", func(t *testing.T) {
		s.Close()
		if _, err := get(18000); !errors.Is(err, engine.ErrSessionClosed) {
			t.Errorf("err %v, want ErrSessionClosed", err)
		}
	})
}

// TestDialPortKeepsOtherSandboxes: dials never end a sandbox. A sandbox's
// init gets SIGKILL when the host *thread* that started it ends
// (PR_SET_PDEATHSIG is per thread), and the first DialPort ended its
// thread after each dial: one that had started an init killed that
// sandbox, at random. Sandboxes started and dialled from many goroutines
// at once (as moat serve's handlers do) must all stay up.
func TestDialPortKeepsOtherSandboxes(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	grant := func(m *manifest.Manifest) { m.Network.Inbound = []manifest.PortRange{"18002"} }
	const workers, rounds = 4, 3
	var (
		mu       sync.Mutex
		sessions []*engine.Session
		wg       sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				s := newSession(t, e, grant)
				mu.Lock()
				sessions = append(sessions, s)
				all := slices.Clone(sessions)
				mu.Unlock()
				for _, o := range all {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					if c, err := o.DialPort(ctx, 18002); err == nil {
						c.Close()
					}
					cancel()
				}
			}
		}()
	}
	wg.Wait()
	for i, s := range sessions {
		if res := execWait(t, s, &engine.ExecRequest{Argv: []string{"true"}}); res.ExitCode != 0 {
			t.Errorf("sandbox %d of %d after the dials: %+v, want it still running commands", i, len(sessions), res)
		}
	}
}
