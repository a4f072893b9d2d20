package engines_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// TestCRIAnnotations: a pod's moat.sandbox/* annotations reach Moat's
// runtime through containerd's CRI (the handler's pod_annotations, as
// docs/KUBERNETES.md configures it): moat.sandbox/egress takes each app
// container off the pod's network into a namespace of its own whose only
// way out is Moat's egress proxy, and moat.sandbox/result writes its
// result (exit, the diff of its root, the network log) when the kubelet
// removes it.
func TestCRIAnnotations(t *testing.T) {
	f := getFixture(t)
	f.needMoat(t, "moat")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "granted-body") })}
	go srv.Serve(l)
	defer srv.Close()
	port := l.Addr().(*net.TCPAddr).Port
	prog := fmt.Sprintf(`
import os, urllib.request
names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
print('interfaces', names)
for url in ('http://localhost:%d/', 'http://localhost:%d/other'):
    try:
        print('fetch', urllib.request.urlopen(url, timeout=10).read().decode())
    except Exception as e:
        print('fetch refused', type(e).__name__)
open('/etc/moat-cri', 'w').write('written')
`, port, port+1)
	tests := []struct {
		name    string
		egress  string
		want    []string
		network int // attempts in the result
	}{
		{name: "allowlist", egress: fmt.Sprintf("localhost:%d", port), want: []string{"interfaces ['lo']", "fetch granted-body", "fetch refused"}, network: 2},
		{name: "none", egress: "none", want: []string{"interfaces ['lo']", "fetch refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ann := map[string]string{"moat.sandbox/egress": tc.egress, "moat.sandbox/result": "true"}
			if tc.egress != "none" {
				ann["moat.sandbox/egress-addresses"] = "127.0.0.1"
			}
			p, err := f.runPodAnnotated(ctx, "moat", "annotated-"+tc.name, nil, ann)
			if err != nil {
				t.Fatal(err)
			}
			id, err := p.start(ctx, "c", []string{"python3", "-c", prog}, nil)
			if err != nil {
				p.remove(context.Background())
				t.Fatal(err)
			}
			code, err := p.wait(ctx, id)
			logs, _ := p.logs(ctx, id)
			if err != nil || code != 0 {
				t.Errorf("exit %d, %v: %s", code, err, logs)
			}
			for _, w := range tc.want {
				if !strings.Contains(logs, w) {
					t.Errorf("output lacks %q:\n%s", w, logs)
				}
			}
			if err := p.remove(ctx); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(f.results, id+".json"))
			if err != nil {
				t.Fatalf("no result for the container: %v", err)
			}
			var res result.Result
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			found := false
			for _, c := range res.Files {
				found = found || c.Path == "etc/moat-cri" && c.Change == result.Added
			}
			if !found || res.Termination != result.Exited || len(res.Network) != tc.network {
				t.Errorf("result: termination %s, files %+v, network %+v; want etc/moat-cri added and %d attempts", res.Termination, res.Files, res.Network, tc.network)
			}
		})
	}
}
