package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildah is one private instance of Debian's buildah: its storage (vfs,
// no mounts), run root and configuration all live under dir, so a test
// neither reads nor writes the host's /var/lib/containers store.
type buildah struct {
	dir string
	env []string
}

// newBuildah sets up a private buildah under a fresh temporary directory
// and removes, when the test ends, everything it made: containers, images,
// the storage, and the host paths buildah creates as root whatever its
// flags say (/var/lib/containers/cache, /run/containers/networks) when
// they were not there before. It fails the test if a mount is left under
// its directory.
func newBuildah(t *testing.T) *buildah {
	t.Helper()
	if _, err := exec.LookPath("buildah"); err != nil {
		t.Skip("needs Debian's buildah: apt-get install buildah (scripts/setup --deps installs it)")
	}
	dir := t.TempDir()
	b := &buildah{dir: dir}
	storageConf := filepath.Join(dir, "storage.conf")
	// vfs: plain directory copies, no overlay mounts to leak; the
	// configuration files are the test's own so that the host's (if any)
	// cannot point the build at a registry or another store.
	conf := "[storage]\ndriver = \"vfs\"\ngraphroot = \"" + filepath.Join(dir, "root") +
		"\"\nrunroot = \"" + filepath.Join(dir, "run") + "\"\n"
	if err := os.WriteFile(storageConf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	registriesConf := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(registriesConf, []byte("unqualified-search-registries = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.env = []string{"CONTAINERS_STORAGE_CONF=" + storageConf, "CONTAINERS_REGISTRIES_CONF=" + registriesConf}

	var created []string
	for _, p := range []string{"/var/lib/containers", "/run/containers"} {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			created = append(created, p)
		}
	}
	t.Cleanup(func() {
		// Containers first (they hold their images), then images.
		for _, args := range [][]string{{"rm", "--all"}, {"rmi", "--all", "--force"}} {
			if out, err := b.cmd(context.Background(), args...).CombinedOutput(); err != nil {
				t.Errorf("buildah %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		if left := mountsUnder(t, dir); len(left) > 0 {
			t.Errorf("buildah left mounts under %s: %s", dir, strings.Join(left, "; "))
		}
		for _, p := range created {
			if err := os.RemoveAll(p); err != nil {
				t.Errorf("remove %s, which buildah created: %v", p, err)
			}
		}
	})
	return b
}

// cmd returns buildah with args, under the private storage.
func (b *buildah) cmd(ctx context.Context, args ...string) *exec.Cmd {
	args = append([]string{"--storage-driver", "vfs", "--root", filepath.Join(b.dir, "root"), "--runroot", filepath.Join(b.dir, "run")}, args...)
	c := exec.CommandContext(ctx, "buildah", args...)
	c.Env = append(os.Environ(), b.env...)
	return c
}

// run runs buildah and returns its trimmed stdout, failing the test on a
// non-zero exit.
func (b *buildah) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := b.cmd(ctx, args...)
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		t.Fatalf("buildah %s: %v\nstdout %s\nstderr %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// mountsUnder returns the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	var found []string
	for _, line := range strings.Split(string(info), "\n") {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		if mp := f[4]; mp == dir || strings.HasPrefix(mp, dir+"/") {
			found = append(found, mp)
		}
	}
	return found
}

// appJS is the app the Dockerfile copies in: it prints the Dockerfile's
// ENV and the working directory, so the run with no command shows that
// the image's Cmd, Env and WorkingDir were all honoured.
const appJS = `console.log("app: " + process.env.GREETING + " in " + process.cwd());
`

// dockerfile has no RUN on purpose: buildah would execute it on the host
// (chroot isolation, or a runtime Moat does not control), and a Moat
// build never runs a step outside a sandbox (docs/RATIONALE.md).
const dockerfile = `FROM localhost/moat-node-rootfs
ENV GREETING=hello-from-buildah
WORKDIR /app
COPY app.js /app/app.js
CMD ["node", "/app/app.js"]
`

// checkBuildahImage is issue 19 §4: an image built by Debian's buildah
// from a Dockerfile, FROM an image that buildah imported from a rootfs
// tar of nodeRootfs (the node image's tree), is imported into the store
// at home from buildah's OCI and docker archives, and runs Node.js in a
// native sandbox: the given command, and with none, the image's CMD with
// its ENV and WORKDIR.
func checkBuildahImage(t *testing.T, home, nodeRootfs string) {
	needRoot(t)
	b := newBuildah(t)
	work := t.TempDir()

	// Image A: the rootfs tar as buildah's only layer (buildah add
	// unpacks a local tar), committed under a local name; nothing is
	// pulled.
	rootfsTar := filepath.Join(work, "node-rootfs.tar")
	if out, err := exec.Command("tar", "-C", nodeRootfs, "-cf", rootfsTar, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar the node image's tree: %v\n%s", err, out)
	}
	ctr := b.run(t, "from", "scratch")
	b.run(t, "add", ctr, rootfsTar, "/")
	b.run(t, "commit", "--rm", ctr, "localhost/moat-node-rootfs")
	if err := os.Remove(rootfsTar); err != nil {
		t.Fatal(err)
	}

	// Image B: the Dockerfile FROM A.
	ctxDir := filepath.Join(work, "context")
	if err := os.Mkdir(ctxDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"Dockerfile": dockerfile, "app.js": appJS} {
		if err := os.WriteFile(filepath.Join(ctxDir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b.run(t, "bud", "--isolation", "chroot", "--pull-never", "-t", "localhost/moat-node-app", ctxDir)

	tests := []struct {
		name   string
		format string // buildah push's transport and moat's source kind
	}{
		{"oci-archive", "oci-archive"},
		// docker-archive works the same way (checked by hand: buildah
		// push IMAGE docker-archive:FILE:NAME) but costs CI another
		// 40 s of importing 450 MB; image's tests cover the format
		// with archives they build in Go.
	}
	env := []string{"MOAT_HOME=" + home}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			archive := filepath.Join(work, tc.name+".tar")
			dest := tc.format + ":" + archive
			if tc.format == "docker-archive" {
				dest += ":localhost/moat-node-app:latest"
			}
			b.run(t, "push", "--disable-compression", "localhost/moat-node-app", dest)
			defer os.Remove(archive)

			name := "buildah-" + tc.name
			imp := moat(t, invocation{args: []string{"image", "import", name, tc.format + ":" + archive}, env: env})
			imp.check(t, 0, []string{name + " sha256:"}, nil, nil)
			if imp.code != 0 {
				return
			}
			t.Cleanup(func() {
				moat(t, invocation{args: []string{"image", "rm", "--force", name}, env: env})
			})

			runs := []struct {
				name string
				argv []string
				want string
			}{
				{"node -e", []string{"--", "node", "-e", "console.log(6*7)"}, "42\n"},
				{"image CMD with ENV and WORKDIR", nil, "app: hello-from-buildah in /app\n"},
			}
			for _, r := range runs {
				t.Run(r.name, func(t *testing.T) {
					args := append([]string{"run", "--no-build", "--tier", "native", "--image", name}, r.argv...)
					o := moat(t, invocation{args: args, env: env})
					if o.code != 0 || o.stdout != r.want {
						t.Errorf("moat %q: want exit 0 and stdout %q\n%s", args, r.want, o)
					}
				})
			}
		})
	}
}
