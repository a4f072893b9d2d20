package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/image"
)

// TestBuiltinNodeImage builds the built-in node image the way a user gets
// it, by `moat run --image node` on a host that lacks it (the build on
// first use), into a temporary MOAT_HOME, then runs Node.js, npm and git
// in it on the native tier. About 70 s on 2 cores (mmdebstrap), so it is
// the one built-in image besides python that CI builds; base (the largest)
// is built by hand (README).
func TestBuiltinNodeImage(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("skipping the node image build (~70 s, needs the Debian mirror) in -short mode")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("needs mmdebstrap: apt-get install mmdebstrap")
	}
	watchLeftovers(t)
	// Not t.TempDir: its parent is 0700 and the sandbox's unprivileged
	// init must traverse to the image, as it does under /var/lib/moat.
	home, err := os.MkdirTemp("", "moat-node-image-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{"MOAT_HOME=" + home}

	// The first run builds the image; its own timeout covers the build.
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	start := time.Now()
	first := exec.CommandContext(ctx, moatBin, "run", "--tier", "native", "--image", "node", "--", "node", "-e", "console.log(6*7)")
	first.Env = append(os.Environ(), env...)
	out, err := first.Output()
	t.Logf("first run (build included) took %s", time.Since(start).Round(time.Second))
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("moat run --image node (building it): %v\nstdout %q\nstderr %s", err, out, stderr)
	}
	if string(out) != "42\n" {
		t.Fatalf("node printed %q, want \"42\\n\"", out)
	}

	tests := []struct {
		name string
		argv []string
		want string // stdout prefix
	}{
		{"node", []string{"node", "-e", "console.log(6*7)"}, "42\n"},
		{"git", []string{"git", "--version"}, "git version 2."},
		{"npm", []string{"npm", "--version"}, "9."},
		{"curl", []string{"curl", "--version"}, "curl 7."},
		// Built images ship no setuid files (finalize).
		{"no setuid files", []string{"sh", "-c", "find / -xdev -perm /6000 -type f | wc -l"}, "0\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "--no-build", "--tier", "native", "--image", "node", "--"}, tc.argv...)
			o := moat(t, invocation{args: args, env: env})
			if o.code != 0 || !strings.HasPrefix(o.stdout, tc.want) {
				t.Errorf("moat %q: want exit 0 and stdout starting %q\n%s", args, tc.want, o)
			}
		})
	}
	t.Run("listed as current", func(t *testing.T) {
		o := moat(t, invocation{args: []string{"image", "list"}, env: env})
		if o.code != 0 || !strings.Contains(o.stdout, "node") {
			t.Errorf("moat image list does not show node\n%s", o)
		}
	})
	// Issue 19 §4, here because it needs a tree with Node.js in it and
	// this test has just built one (a second build would cost CI another
	// minute).
	t.Run("buildah Dockerfile image from its rootfs", func(t *testing.T) {
		node, err := image.NewStore(filepath.Join(home, "images")).Lookup("node")
		if err != nil {
			t.Fatalf("look up the node image just built: %v", err)
		}
		checkBuildahImage(t, home, node.Root)
	})
}
