package image_test

// The real builds: mmdebstrap on the host, the packages' install in a
// native-tier sandbox through an engine (engine.BuildImage), as `moat
// image build` runs them. An external test package: engine imports image.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/syncbuf"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
	// The tier the install step runs on.
	_ "github.com/moat-sandbox/moat/tier/native"
)

// updateLock rewrites ../images/<name>.lock from a real build:
//
//	go test ./image -run TestBuildPython -update
var updateLock = flag.Bool("update", false, "write the repo lockfile (images/python.lock) from the real build")

// requireBuildHost skips unless a real build can run here.
func requireBuildHost(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping real image build (~20 s, needs network) in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: mmdebstrap --mode=root")
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		t.Skip("needs mmdebstrap: apt-get install mmdebstrap")
	}
}

// buildEngine is an engine with a home of its own (its image store
// empty) whose native tier runs the builds' install steps.
func buildEngine(t *testing.T) (e *engine.Engine, home string) {
	return newBuildEngine(t, false, nil)
}

// newBuildEngine is buildEngine; with autoBuild the engine builds a
// missing image on first use, as `moat run` and `moat serve` do, writing
// its progress to progress.
func newBuildEngine(t *testing.T, autoBuild bool, progress io.Writer) (e *engine.Engine, home string) {
	t.Helper()
	bin, cleanup, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	home = t.TempDir()
	// The sandbox's unprivileged ids reach the tree by path.
	for _, d := range []string{home, filepath.Dir(home)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	e, err = engine.New(engine.Options{Home: home, Exe: bin, NoAutoBuild: !autoBuild, Progress: progress})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, home
}

func TestBuildPython(t *testing.T) {
	requireBuildHost(t)
	e, home := buildEngine(t)
	s := e.Images()
	lockDir := t.TempDir()
	if *updateLock {
		lockDir = filepath.Join("..", "images")
		if err := os.MkdirAll(lockDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var progress bytes.Buffer
	start := time.Now()
	img, err := e.BuildImage(context.Background(), "python", image.BuildOptions{Progress: &progress, LockfileDir: lockDir})
	t.Logf("build took %s; progress:\n%s", time.Since(start).Round(100*time.Millisecond), progress.String())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	t.Logf("image %s, %.0f MB, %d packages", img.Digest, float64(img.Size)/1e6, len(img.Packages))
	recordPython(t, img)

	for _, pkg := range []string{"python3", "python3-pip", "python3-numpy", "python3-yaml", "bash", "coreutils"} {
		if img.Packages[pkg] == "" {
			t.Errorf("package %s not recorded in %v", pkg, img.Packages)
		}
	}

	// chroot is enough to prove the tree runs; the real sandbox pivots.
	out, err := exec.Command("chroot", img.Root, "/usr/bin/python3", "-c",
		"import numpy, yaml; print(numpy.__version__, numpy.arange(4).sum())").CombinedOutput()
	if err != nil {
		t.Fatalf("python3 in the image: %v\n%s", err, out)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(out)), " 6") {
		t.Errorf("python3 printed %q, want '<version> 6'", out)
	}

	passwd, err := os.ReadFile(filepath.Join(img.Root, "etc/passwd"))
	if err != nil || string(passwd) != image.ImagePasswd {
		t.Errorf("/etc/passwd = %q (err %v), want the image's own", passwd, err)
	}
	if resolv, err := os.ReadFile(filepath.Join(img.Root, "etc/resolv.conf")); err != nil || len(resolv) != 0 {
		t.Errorf("/etc/resolv.conf = %q (err %v), want empty", resolv, err)
	}
	if fi, err := os.Lstat(filepath.Join(img.Root, "tmp")); err != nil || fi.Mode()&(fs.ModePerm|fs.ModeSticky) != 0o777|fs.ModeSticky {
		t.Errorf("/tmp mode = %v (err %v), want 1777", fi.Mode(), err)
	}
	err = filepath.WalkDir(img.Root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
			t.Errorf("%s has mode %v: no setuid/setgid or special files may ship", p, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if d, _, err := image.TreeDigest(img.Root); err != nil || d != img.Digest {
		t.Errorf("stored tree digests to %s (err %v), metadata says %s", d, err, img.Digest)
	}
	if got, err := s.Lookup("python"); err != nil || got.Digest != img.Digest {
		t.Errorf("Lookup = %+v, %v", got, err)
	}
	lf, err := image.ReadLockfile(lockDir, "python")
	if err != nil || lf.Digest != img.Digest {
		t.Fatalf("lockfile = %+v, %v", lf, err)
	}
	// Every package is hashed: mmdebstrap kept the .debs it installed or
	// downloaded.
	for pkg := range lf.Packages {
		if !strings.HasPrefix(lf.SHA256[pkg], "sha256:") || len(lf.SHA256[pkg]) != len("sha256:")+64 {
			t.Errorf("lockfile sha256 of %s = %q, want sha256:HEX", pkg, lf.SHA256[pkg])
		}
	}
	// ... and none of them ships: the digest is the tree without them.
	if ents, err := os.ReadDir(filepath.Join(img.Root, "var/cache")); err != nil || len(ents) != 0 {
		t.Errorf("/var/cache of the image holds %v (err %v), want it empty", ents, err)
	}

	// A cancelled build leaves nothing: while mmdebstrap has /dev, /proc
	// and /sys mounted in the tree (when a careless cleanup would delete
	// host files), and while the sandboxed install runs (its sandbox,
	// cgroup and run directory must go too).
	cancels := []struct {
		name string
		now  func(progress string) bool
	}{
		{"while mmdebstrap has mounts", func(string) bool {
			m, _ := image.MountsUnder(filepath.Join(s.Dir, "python"))
			return len(m) > 0
		}},
		{"during the sandboxed install", func(progress string) bool {
			return strings.Contains(progress, "Setting up ")
		}},
	}
	for _, tc := range cancels {
		t.Run("cancel "+tc.name+" leaves nothing", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			progress := &syncbuf.Buffer{}
			go func() {
				deadline := time.After(3 * time.Minute)
				for {
					select {
					case <-ctx.Done():
						return
					case <-deadline:
						cancel()
						return
					case <-time.After(50 * time.Millisecond):
					}
					if tc.now(progress.String()) {
						cancel()
						return
					}
				}
			}()
			_, err := e.BuildImage(ctx, "python", image.BuildOptions{Progress: progress})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Build = %v, want context.Canceled; progress:\n%s", err, progress.String())
			}
			if m, _ := image.MountsUnder(s.Dir); len(m) > 0 {
				t.Errorf("mounts left under the store: %v", m)
			}
			image.AssertStoreClean(t, s, "python", 1)
			if got, err := s.Lookup("python"); err != nil || got.Digest != img.Digest {
				t.Errorf("cancelled build changed the current image: %+v, %v", got, err)
			}
			if runs, err := os.ReadDir(filepath.Join(home, "runs")); err != nil && !errors.Is(err, fs.ErrNotExist) || len(runs) != 0 {
				t.Errorf("run directories left by the install's sandbox: %v (err %v)", runs, err)
			}
			if left, _ := filepath.Glob("/sys/fs/cgroup/*/moat/*"); len(left) > 0 {
				// Other packages' runs may be live: name them, do not fail.
				t.Logf("cgroups under moat/ now (other tests' runs?): %v", left)
			}
		})
	}
}

// builtPython is what TestBuildPython built, for TestBuildReproducible to
// compare against (its tree is gone with that test's home): the digest,
// and the tree's listing when MOAT_IMAGE_REPRO asks for the comparison.
var builtPython struct{ digest, listing string }

// recordPython keeps img's digest and, when TestBuildReproducible will
// run, its listing.
func recordPython(t *testing.T, img *image.Image) {
	t.Helper()
	builtPython.digest = img.Digest
	if os.Getenv("MOAT_IMAGE_REPRO") != "" {
		var b bytes.Buffer
		if _, err := image.WriteListing(&b, img.Root); err != nil {
			t.Fatal(err)
		}
		builtPython.listing = b.String()
	}
}

// TestBuildReproducible builds the python image a second time, in a home
// of its own, and compares it with TestBuildPython's build (or with a
// build of its own when that test did not run). The second build is the
// build on first use: a run on an engine whose store lacks the image, as
// `moat run --image python` on a fresh host. It costs another build, so
// it runs only when asked: MOAT_IMAGE_REPRO=1 (scripts/test sets it).
func TestBuildReproducible(t *testing.T) {
	requireBuildHost(t)
	if os.Getenv("MOAT_IMAGE_REPRO") == "" {
		t.Skip("set MOAT_IMAGE_REPRO=1 to build the python image twice and compare digests")
	}
	if builtPython.digest == "" {
		e, _ := buildEngine(t)
		img, err := e.BuildImage(context.Background(), "python", image.BuildOptions{})
		if err != nil {
			t.Fatalf("first build: %v", err)
		}
		recordPython(t, img)
	}

	progress := &syncbuf.Buffer{}
	e, home := newBuildEngine(t, true, progress)
	m := manifest.Default()
	m.Tier = "native"
	m.Image = "python"
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"python3", "-c", "print(6*7)"}})
	if err != nil {
		t.Fatalf("a run on an engine without the image (the build on first use): %v\nprogress:\n%s", err, progress.String())
	}
	if res.ExitCode != 0 || res.Stdout.Data != "42\n" {
		t.Errorf("the run after the build on first use: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout.Data, res.Stderr.Data)
	}
	if !strings.Contains(progress.String(), `image "python" is not built yet; building it now`) {
		t.Errorf("the build on first use did not say so; progress:\n%s", progress.String())
	}
	img, err := image.NewStore(filepath.Join(home, "images")).Lookup("python")
	if err != nil {
		t.Fatalf("the image the run built: %v", err)
	}
	if img.Digest == builtPython.digest {
		t.Logf("reproducible: both builds are %s", img.Digest)
		return
	}
	var b bytes.Buffer
	if _, err := image.WriteListing(&b, img.Root); err != nil {
		t.Fatal(err)
	}
	inB := map[string]bool{}
	for _, l := range strings.Split(b.String(), "\n") {
		inB[l] = true
	}
	var differ []string
	for _, l := range strings.Split(builtPython.listing, "\n") {
		if !inB[l] {
			differ = append(differ, l)
		}
	}
	t.Errorf("builds differ: %s vs %s; entries of the first not in the second:\n%s",
		builtPython.digest, img.Digest, strings.Join(differ, "\n"))
}
