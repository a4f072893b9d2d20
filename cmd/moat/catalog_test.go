package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
)

// TestBuiltinNodeImage runs the built-in node image (Debian's nodejs, npm,
// git) on every Linux tier, builds image files on it (npm packages from a
// lockfile; a Dockerfile image made by buildah) and lists it. It never
// builds node itself (486 packages installed in a sandbox: 2.5-6 min on 2
// cores, half of this package's time when it did): scripts/test builds it
// into the default store before the tests, once per machine and
// definition, as it does base and code-interpreter; where it is missing,
// CI (CI=true) fails and a developer's run skips, saying how to build it.
// The build itself is tested by the image package's TestBuildPython (the
// same engine.BuildImage as the build on first use) and, on a fresh
// machine, by scripts/setup's first `moat run`.
func TestBuiltinNodeImage(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needRoot(t)
	store := image.NewStore(filepath.Join(engine.DefaultHome(), "images"))
	node, err := store.Lookup("node")
	if err != nil {
		missing := t.Skipf
		if os.Getenv("CI") == "true" {
			missing = t.Fatalf
		}
		missing("the node image is not built in %s (%v): `moat image build node` (scripts/test builds it first)", engine.DefaultHome(), err)
	}
	watchLeftovers(t)
	// Runs use the default home (its microVM disk of node is made once
	// per digest); what the subtests build (npmapp, the buildah import)
	// goes to a home of its own that holds node's build hard-linked, so
	// that the host's store is only read.
	home := linkedHome(t, store, node)
	env := []string{"MOAT_HOME=" + home}

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
			o := moat(t, invocation{args: args})
			if o.code != 0 || !strings.HasPrefix(o.stdout, tc.want) {
				t.Errorf("moat %q: want exit 0 and stdout starting %q\n%s", args, tc.want, o)
			}
		})
	}
	// Every image runs on every Linux tier (issue 19 §3): the gVisor tier
	// on the same tree, the microVM tier on an ext4 disk made from it.
	for _, tierName := range []string{"gvisor", "microvm"} {
		t.Run("tier "+tierName, func(t *testing.T) {
			args := []string{"run", "--no-build", "--tier", tierName, "--image", "node", "--", "node", "-e", "console.log(6*7)"}
			o := moat(t, invocation{args: args})
			if o.code != 0 || o.stdout != "42\n" {
				t.Errorf("moat %q: want exit 0 and stdout \"42\\n\"\n%s", args, o)
			}
		})
	}
	// An image file on the node image installs npm packages from a
	// package-lock.json, through the egress proxy to the registry only
	// (issue 19 §2). The registry must be reachable (it is on CI). Where
	// the host resolves it to a reserved address, or intercepts TLS
	// (CI does both), the operator grants that address and hands the
	// host's CA bundle to the step, as a user behind such a proxy would.
	t.Run("npm packages from a lockfile", func(t *testing.T) {
		addrs, err := net.LookupHost("registry.npmjs.org")
		if err != nil {
			t.Fatalf("resolve registry.npmjs.org: %v", err)
		}
		dir, err := os.MkdirTemp("", "moat-npm-build-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		for _, f := range []string{"package.json", "package-lock.json"} {
			b, err := os.ReadFile(filepath.Join("..", "..", "imagebuild", "testdata", "npm", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		imageFile := filepath.Join(dir, "app.yaml")
		if err := os.WriteFile(imageFile, []byte("version: 1\nbase: {image: node}\nnpm: {lockfile: package-lock.json, dir: /opt/app}\nworkdir: /opt/app\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args := []string{"image", "build", "npmapp", "-f", imageFile, "--ca-file", "/etc/ssl/certs/ca-certificates.crt"}
		for _, a := range addrs {
			args = append(args, "--allow-address", a)
		}
		o := moat(t, invocation{args: args, env: env})
		if o.code != 0 {
			t.Fatalf("moat %q:\n%s", args, o)
		}
		lock, err := os.ReadFile(imageFile + ".lock")
		if err != nil || !strings.Contains(string(lock), `"is-number"`) || !strings.Contains(string(lock), "sha512-") {
			t.Errorf("app.yaml.lock lacks is-number and its integrity: %s %v", lock, err)
		}
		run := []string{"run", "--no-build", "--tier", "native", "--image", "npmapp", "--", "node", "-e", `console.log(require("is-number")(5), require("is-number")("x"))`}
		moat(t, invocation{args: run, env: env}).check(t, 0, []string{"true false"}, nil, nil)
	})
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

// linkedHome makes a MOAT_HOME (0755: the sandbox's unprivileged init
// must reach the image, as under /var/lib/moat) whose store holds img's
// build as its name's current one, hard-linked from the host's store (no
// copy; builds are read-only), and removes it when the test ends.
func linkedHome(t *testing.T, from *image.Store, img *image.Image) string {
	t.Helper()
	home, err := os.MkdirTemp("", "moat-linked-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	buildDir := filepath.Dir(img.Root)
	nameDir := filepath.Join(home, "images", img.Name)
	if err := os.MkdirAll(nameDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-al", buildDir, nameDir+"/").CombinedOutput(); err != nil {
		t.Fatalf("hard-link %s into %s: %v\n%s", buildDir, nameDir, err, out)
	}
	if err := os.Symlink(filepath.Base(buildDir), filepath.Join(nameDir, "current")); err != nil {
		t.Fatal(err)
	}
	got, err := image.NewStore(filepath.Join(home, "images")).Lookup(img.Name)
	if err != nil || got.Digest != img.Digest {
		t.Fatalf("the linked store's %s is %v (err %v), want %s from %s", img.Name, got, err, img.Digest, from.Dir)
	}
	return home
}

// TestBuiltinBaseImage runs the built-in base image (E2B's base template:
// python3, node, git, curl, build-essential) on every Linux tier. It
// never builds it (636 MB, 1-3 min on 2 cores): scripts/test builds it
// into the default store before the tests, once per machine and
// definition, as it does code-interpreter; where it is missing, CI
// (CI=true) fails and a developer's run skips, saying how to build it.
// The microVM tier makes its ext4 disk from the tree on the first run
// of each image digest (cached in the default home after that); the
// test logs how long that run took.
func TestBuiltinBaseImage(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needRoot(t)
	home := engine.DefaultHome()
	if _, err := image.NewStore(filepath.Join(home, "images")).Lookup("base"); err != nil {
		missing := t.Skipf
		if os.Getenv("CI") == "true" {
			missing = t.Fatalf
		}
		missing("the base image is not built in %s (%v): `moat image build base` (scripts/test builds it first)", home, err)
	}
	watchLeftovers(t)
	// A C program compiled with cc and run: build-essential's compiler,
	// headers and linker, and a writable, executable /tmp.
	const cc = `printf '#include <stdio.h>\nint main(void) { printf("%%d\\n", 6 * 7); return 0; }\n' | cc -x c -o /tmp/six - && /tmp/six`
	tests := []struct {
		name  string
		argv  []string
		want  string // stdout prefix
		tiers []string
	}{
		{"python3", []string{"python3", "-c", "print(6*7)"}, "42\n", []string{"native"}},
		{"node", []string{"node", "-e", "console.log(6*7)"}, "42\n", []string{"native", "gvisor", "microvm"}},
		{"git", []string{"git", "--version"}, "git version 2.", []string{"native"}},
		{"curl", []string{"curl", "--version"}, "curl 7.", []string{"native"}},
		{"cc", []string{"sh", "-c", cc}, "42\n", []string{"native", "gvisor", "microvm"}},
	}
	// Every image runs on every Linux tier (issue 19 §3); the other
	// tiers get the two checks that exercise the most of the tree.
	for _, tierName := range []string{"native", "gvisor", "microvm"} {
		t.Run(tierName, func(t *testing.T) {
			for _, tc := range tests {
				if !slices.Contains(tc.tiers, tierName) {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					args := append([]string{"run", "--no-build", "--tier", tierName, "--image", "base", "--"}, tc.argv...)
					start := time.Now()
					o := moat(t, invocation{args: args})
					t.Logf("%s on %s: %s", tc.name, tierName, time.Since(start).Round(10*time.Millisecond))
					if o.code != 0 || !strings.HasPrefix(o.stdout, tc.want) {
						t.Errorf("moat %q: want exit 0 and stdout starting %q\n%s", args, tc.want, o)
					}
				})
			}
		})
	}
}
