package engines_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/engines"
)

// The pod's two containers meet on the pod's loopback: the server
// listens on 127.0.0.1 and answers the client once. Shared network
// namespaces are what Kubernetes promises a pod's containers.
const (
	serverPy = `import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8099))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"pong from the pod's other container")
    c.close()
`
	clientPy = `import socket, time
for i in range(200):
    try:
        c = socket.create_connection(("127.0.0.1", 8099), timeout=2)
        break
    except OSError:
        time.sleep(0.05)
print(c.recv(100).decode())
`
)

var exitedWith = regexp.MustCompile(`exited with (\d+)`)

// TestCRIPodLifecycle drives crictl exactly as the kubelet would for a
// pod whose RuntimeClass names the handler: runp, create, start, logs,
// exec (sync), stop, rm, stopp, rmp; then checks the pod left nothing.
// runc runs the same table, as the peer that proves the steps themselves.
func TestCRIPodLifecycle(t *testing.T) {
	f := getFixture(t)
	for _, handler := range []string{"runc", "moat"} {
		t.Run(handler, func(t *testing.T) {
			f.needMoat(t, handler)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p, err := f.runPod(ctx, handler, "lifecycle-"+handler, nil)
			if err != nil {
				t.Fatalf("runp --runtime %s: %v", handler, err)
			}
			netns, err := p.netnsOf(ctx)
			if err != nil || netns == "" {
				t.Errorf("the pod's network namespace: %q, %v", netns, err)
			}
			removed := false
			defer func() {
				if !removed {
					p.remove(context.Background())
				}
			}()

			steps := []struct {
				name     string
				argv     []string
				wantExit int
				wantLogs []string
			}{
				{"output and exit code", []string{"sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7"}, 7, []string{"to-stdout", "to-stderr"}},
				{"python workload", []string{"python3", "-c", "import os; print('six times seven is', 6*7, 'as', os.getuid())"}, 0, []string{"six times seven is 42 as 0"}},
			}
			for _, s := range steps {
				id, err := p.start(ctx, strings.ReplaceAll(s.name, " ", "-"), s.argv, nil)
				if err != nil {
					t.Fatalf("%s: create+start: %v", s.name, err)
				}
				code, err := p.wait(ctx, id)
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if code != s.wantExit {
					t.Errorf("%s: exit code %d, want %d", s.name, code, s.wantExit)
				}
				logs, _ := p.logs(ctx, id)
				for _, w := range s.wantLogs {
					if !strings.Contains(logs, w) {
						t.Errorf("%s: crictl logs %q lacks %q", s.name, logs, w)
					}
				}
			}

			server, err := p.start(ctx, "server", []string{"python3", "-c", serverPy}, nil)
			if err != nil {
				t.Fatalf("server: %v", err)
			}
			execs := []struct {
				name     string
				argv     []string
				wantOut  string
				wantExit int
			}{
				{"exec output", []string{"sh", "-c", "echo $((6*7))"}, "42", 0},
				{"exec exit code", []string{"sh", "-c", "echo before >&2; exit 3"}, "before", 3},
			}
			for _, e := range execs {
				out, err := f.cd.Crictl(ctx, append([]string{"exec", "-s", server}, e.argv...)...)
				code := 0
				var ce *engines.CmdError
				if errors.As(err, &ce) {
					// crictl exits 1 and says the command's exit status
					// and stderr, as the CRI's ExecSync returned them.
					m := exitedWith.FindStringSubmatch(ce.Stderr)
					if m == nil {
						t.Fatalf("%s: %v", e.name, err)
					}
					code, _ = strconv.Atoi(m[1])
					out = ce.Stderr
				} else if err != nil {
					t.Fatalf("%s: %v", e.name, err)
				}
				if code != e.wantExit || !strings.Contains(out, e.wantOut) {
					t.Errorf("%s: crictl exec -s: exit %d output %q (%v), want exit %d output %q", e.name, code, out, err, e.wantExit, e.wantOut)
				}
			}
			client, err := p.start(ctx, "client", []string{"python3", "-c", clientPy}, nil)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			if code, err := p.wait(ctx, client); err != nil || code != 0 {
				logs, _ := p.logs(ctx, client)
				t.Errorf("client: exit %d, %v: %s", code, err, logs)
			}
			if logs, _ := p.logs(ctx, client); !strings.Contains(logs, "pong from the pod's other container") {
				t.Errorf("the client did not reach the server on the pod's loopback: %q", logs)
			}

			if err := p.remove(ctx); err != nil {
				t.Fatalf("removing the pod: %v", err)
			}
			removed = true
			if left := p.residue(netns); len(left) > 0 {
				t.Errorf("the removed pod left:\n  %s", strings.Join(left, "\n  "))
			}
		})
	}
}

// TestCRIRefusals checks that what Moat's runtime refuses reaches crictl
// (the kubelet's events) with a message naming the field, and that runc
// runs the same pods: the refusal is Moat's, not the engine's.
func TestCRIRefusals(t *testing.T) {
	f := getFixture(t)
	tests := []struct {
		name      string
		podLinux  map[string]any // pod config's linux object
		container map[string]any // merged into the container config
		want      string         // in moat's error, case-insensitive
	}{
		{
			name: "privileged container",
			// containerd admits a privileged container only in a
			// privileged pod.
			podLinux:  map[string]any{"security_context": map[string]any{"privileged": true}},
			container: map[string]any{"linux": map[string]any{"security_context": map[string]any{"privileged": true}}},
			want:      "privileged",
		},
		{
			name:      "added capability",
			container: map[string]any{"linux": map[string]any{"security_context": map[string]any{"capabilities": map[string]any{"add_capabilities": []string{"SYS_ADMIN"}}}}},
			want:      "SYS_ADMIN",
		},
		{
			name:     "host network pod",
			podLinux: map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"network": 2}}},
			want:     "network",
		},
		{
			name:     "host pid pod",
			podLinux: map[string]any{"security_context": map[string]any{"namespace_options": map[string]any{"pid": 2}}},
			want:     "pid",
		},
	}
	for _, handler := range []string{"runc", "moat"} {
		for _, tc := range tests {
			t.Run(handler+"/"+tc.name, func(t *testing.T) {
				f.needMoat(t, handler)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				err := func() error {
					p, err := f.runPod(ctx, handler, "refusal", tc.podLinux)
					if err != nil {
						return err
					}
					defer p.remove(context.Background())
					extra := map[string]any{"image": busybox["image"]}
					for k, v := range tc.container {
						extra[k] = v
					}
					id, err := p.start(ctx, "c", []string{"sh", "-c", "echo ran"}, extra)
					if err != nil {
						return err
					}
					_, err = p.wait(ctx, id)
					return err
				}()
				switch {
				case handler == "runc" && err != nil:
					t.Fatalf("runc refused it too, so the case proves nothing: %v", err)
				case handler == "moat" && err == nil:
					t.Fatalf("moat ran it; want a refusal naming %q", tc.want)
				case handler == "moat" && !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)):
					t.Errorf("moat's refusal does not name %q: %v", tc.want, err)
				}
			})
		}
	}
}
