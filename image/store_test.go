package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// fakeTools is a toolchain that needs neither root nor network: bootstrap
// writes a small tree that looks like a host-tainted mmdebstrap result.
type fakeTools struct {
	// hostFile is outside the tree; the tree's resolv.conf links to it, and
	// finalize must replace the link, not write through it.
	hostFile string
	// failBootstrap and failPackages inject failures after files exist.
	failBootstrap, failPackages bool
	// blockUntilCancel makes bootstrap wait for ctx, like a slow download.
	blockUntilCancel bool
	// packages is what the fake dpkg reports.
	pkgs map[string]string
	// installExit and installErr are the fake sandboxed install's result;
	// installed records the commands it was given.
	installExit int
	installErr  error
	installed   [][]string
	// booted records the definitions bootstrap was given.
	booted []Definition
}

// install is the fake Installer (BuildOptions.Install).
func (f *fakeTools) install(_ context.Context, root string, argv, env []string, out io.Writer) (int, error) {
	f.installed = append(f.installed, argv)
	fmt.Fprintln(out, "Setting up fake (1.0) ...")
	return f.installExit, f.installErr
}

// installOK is an Installer that succeeds without doing anything.
func installOK(context.Context, string, []string, []string, io.Writer) (int, error) { return 0, nil }

func (f *fakeTools) toolchain() toolchain {
	if f.pkgs == nil {
		f.pkgs = map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7"}
	}
	// The build checks that the definition's packages were installed;
	// a package set to "" stays missing.
	def, _ := definition("python")
	for _, p := range def.Packages {
		if _, ok := f.pkgs[p]; !ok {
			f.pkgs[p] = "1.0-1"
		}
	}
	return toolchain{
		check:   func() error { return nil },
		version: func(context.Context) (string, error) { return "fakestrap 1.0", nil },
		bootstrap: func(ctx context.Context, def Definition, target string, progress io.Writer, _ []*os.File) error {
			f.booted = append(f.booted, def)
			files := map[string]string{
				"etc/passwd":                          "root:x:0:0:root:/root:/bin/bash\nhostadmin:x:1001:1001::/home/hostadmin:/bin/bash\n",
				"etc/group":                           "root:x:0:\nhostadmins:x:1001:\n",
				"etc/shadow":                          "root:$6$secret:19000:0:99999:7:::\n",
				"etc/hostname":                        "build-host.example.com\n",
				"usr/bin/python3":                     "#!/bin/fake\n",
				"usr/bin/su":                          "setuid binary\n",
				"var/log/dpkg.log":                    "2026-01-01 install ...\n",
				"var/cache/ldconfig/aux":              "cache\n",
				"tmp/leftover":                        "x\n",
				"var/lib/dpkg/status":                 "Package: python3\n",
				"usr/lib/python3/x/__pycache__/y.pyc": "pyc",
			}
			for p, c := range files {
				full := filepath.Join(target, p)
				if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
					return err
				}
			}
			if err := os.Chmod(filepath.Join(target, "usr/bin/su"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
				return err
			}
			if err := os.Symlink(f.hostFile, filepath.Join(target, "etc/resolv.conf")); err != nil {
				return err
			}
			if err := syscall.Mkfifo(filepath.Join(target, "var/fifo"), 0o644); err != nil {
				return err
			}
			if f.blockUntilCancel {
				<-ctx.Done()
				return ctx.Err()
			}
			if f.failBootstrap {
				return errors.New("fake bootstrap failed half-way")
			}
			return nil
		},
		packages: func(context.Context, string) (map[string]string, error) {
			if f.failPackages {
				return nil, errors.New("fake dpkg-query failed")
			}
			return f.pkgs, nil
		},
	}
}

func newFakeStore(t *testing.T, f *fakeTools) *Store {
	t.Helper()
	if f.hostFile == "" {
		f.hostFile = filepath.Join(t.TempDir(), "host-resolv.conf")
		if err := os.WriteFile(f.hostFile, []byte("nameserver 10.0.0.1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	s := NewStore(filepath.Join(t.TempDir(), "images"))
	s.tools = f.toolchain()
	return s
}

func TestLookupErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, s *Store)
		image   string
		wantIs  error
		wantMsg string
	}{
		{name: "empty store", image: "python", wantIs: ErrNotBuilt, wantMsg: "moat image build python"},
		{
			name:  "name dir without current",
			image: "python",
			setup: func(t *testing.T, s *Store) {
				if err := os.MkdirAll(filepath.Join(s.Dir, "python"), 0o755); err != nil {
					t.Fatal(err)
				}
			},
			wantIs: ErrNotBuilt, wantMsg: "moat image build python",
		},
		{name: "unknown image", image: "cobol", wantIs: ErrUnknown, wantMsg: "known images: base, code-interpreter, node, python"},
		{name: "path traversal name", image: "../etc", wantMsg: "must match"},
		{name: "empty name", image: "", wantMsg: "must match"},
		{
			name:  "current points outside the store",
			image: "python",
			setup: func(t *testing.T, s *Store) {
				nameDir := filepath.Join(s.Dir, "python")
				if err := os.MkdirAll(nameDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink("../../../etc", filepath.Join(nameDir, currentLink)); err != nil {
					t.Fatal(err)
				}
			},
			wantMsg: "not a digest",
		},
		{
			name:  "current names a missing build",
			image: "python",
			setup: func(t *testing.T, s *Store) {
				nameDir := filepath.Join(s.Dir, "python")
				if err := os.MkdirAll(nameDir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(strings.Repeat("ab", 32), filepath.Join(nameDir, currentLink)); err != nil {
					t.Fatal(err)
				}
			},
			wantIs: fs.ErrNotExist, wantMsg: "read metadata",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeStore(t, &fakeTools{})
			if tc.setup != nil {
				tc.setup(t, s)
			}
			img, err := s.Lookup(tc.image)
			if err == nil {
				t.Fatalf("Lookup(%q) = %+v, want error", tc.image, img)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Lookup(%q) error %q does not wrap %v", tc.image, err, tc.wantIs)
			}
			if tc.wantIs == nil && errors.Is(err, ErrNotBuilt) {
				t.Errorf("Lookup(%q) error %q wraps ErrNotBuilt; a bad name is not an unbuilt image", tc.image, err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Lookup(%q) error %q does not mention %q", tc.image, err, tc.wantMsg)
			}
		})
	}
}

func TestBuildAndLookup(t *testing.T) {
	f := &fakeTools{}
	s := newFakeStore(t, f)
	lockDir := t.TempDir()
	var progress bytes.Buffer
	img, err := s.Build(context.Background(), "python", BuildOptions{Install: f.install, Progress: &progress, LockfileDir: lockDir})
	if err != nil {
		t.Fatalf("Build: %v\nprogress:\n%s", err, progress.String())
	}
	// The host bootstraps the essential set and apt and only downloads
	// the definition's packages; they are installed by the Installer
	// (the sandbox), offline.
	def, _ := definition("python")
	if len(f.booted) != 1 || !slices.Equal(f.booted[0].Packages, []string{"apt"}) || !slices.Equal(f.booted[0].Download, def.Packages) {
		t.Errorf("bootstrap got %+v, want Packages [apt] and Download %v", f.booted, def.Packages)
	}
	if len(f.installed) != 1 || !slices.Equal(f.installed[0], AptInstallOffline(def.Packages)) {
		t.Errorf("installer ran %q, want once %q", f.installed, AptInstallOffline(def.Packages))
	}
	if !strings.Contains(progress.String(), "    Setting up fake (1.0) ...") {
		t.Errorf("progress lacks the install's lines:\n%s", progress.String())
	}
	got, err := s.Lookup("python")
	if err != nil {
		t.Fatalf("Lookup after Build: %v", err)
	}
	if got.Digest != img.Digest || got.Root != img.Root || !got.Current {
		t.Errorf("Lookup = %+v, want the built %+v", got, img)
	}
	if d := mustDigest(t, got.Root); d != img.Digest {
		t.Errorf("stored tree digests to %s, metadata says %s", d, img.Digest)
	}
	if img.Packages["python3"] != "3.11.2-1+b1" || img.BuiltWith != "fakestrap 1.0" {
		t.Errorf("metadata = %+v", img)
	}

	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(got.Root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if read("etc/passwd") != imagePasswd || read("etc/group") != imageGroup {
		t.Errorf("passwd/group are not the image's own:\n%s%s", read("etc/passwd"), read("etc/group"))
	}
	if read("etc/hosts") != imageHosts || read("etc/resolv.conf") != "" || read("etc/hostname") != imageHostname {
		t.Errorf("hosts/resolv.conf/hostname not scrubbed")
	}
	if b, _ := os.ReadFile(f.hostFile); string(b) != "nameserver 10.0.0.1\n" {
		t.Errorf("finalize wrote through the resolv.conf symlink to the host file: %q", b)
	}
	for _, p := range []string{"etc/shadow", "var/log/dpkg.log", "var/cache/ldconfig", "tmp/leftover", "var/fifo"} {
		if _, err := os.Lstat(filepath.Join(got.Root, p)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still exists (err %v)", p, err)
		}
	}
	for _, mp := range mountPoints {
		fi, err := os.Lstat(filepath.Join(got.Root, mp.path))
		if err != nil {
			t.Errorf("mount point /%s: %v", mp.path, err)
			continue
		}
		if !fi.IsDir() || fi.Mode()&(fs.ModePerm|fs.ModeSticky) != mp.mode {
			t.Errorf("mount point /%s mode = %v, want dir %v", mp.path, fi.Mode(), mp.mode)
		}
	}
	if fi, err := os.Stat(filepath.Join(got.Root, "usr/bin/su")); err != nil || fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		t.Errorf("usr/bin/su mode = %v (err %v), want setuid/setgid cleared", fi.Mode(), err)
	}
	for _, dir := range []string{s.Dir, filepath.Join(s.Dir, "python"), filepath.Dir(got.Root)} {
		fi, err := os.Stat(dir)
		if err != nil || fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s mode = %v (err %v), want not writable by group/others", dir, fi.Mode(), err)
		}
	}

	lf, err := ReadLockfile(lockDir, "python")
	if err != nil {
		t.Fatalf("lockfile not written: %v", err)
	}
	if lf.Digest != img.Digest || lf.Suite != "bookworm" || lf.BuiltWith != "fakestrap 1.0" || lf.Packages["bash"] != "5.2.15-2+b7" {
		t.Errorf("lockfile = %+v", lf)
	}

	// A rebuild of identical content reuses the stored build.
	again, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK, Locked: true, LockfileDir: lockDir})
	if err != nil {
		t.Fatalf("locked rebuild: %v", err)
	}
	if again.Digest != img.Digest {
		t.Errorf("rebuild digest %s != %s: the fake build is deterministic", again.Digest, img.Digest)
	}
	assertStoreClean(t, s, "python", 1)

	list, err := s.List()
	if err != nil || len(list) != 1 || !list[0].Current || list[0].Digest != img.Digest {
		t.Errorf("List = %+v, %v; want the one current image", list, err)
	}
	if err := s.Remove("python", img.Digest); err == nil || !strings.Contains(err.Error(), "current") {
		t.Errorf("Remove(current) = %v, want refusal", err)
	}
}

// assertStoreClean checks the name dir holds exactly wantBuilds published
// builds and no temp directories or files.
func assertStoreClean(t *testing.T, s *Store, name string, wantBuilds int) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.Dir, name))
	if errors.Is(err, fs.ErrNotExist) && wantBuilds == 0 {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	builds := 0
	for _, e := range entries {
		switch {
		case validHex(e.Name()):
			builds++
		case e.Name() == lockName, e.Name() == currentLink && wantBuilds > 0:
		case strings.HasPrefix(e.Name(), usePrefix) && validHex(strings.TrimPrefix(e.Name(), usePrefix)):
			// A use lock (Use) belongs to a build that is still there.
			if _, err := os.Lstat(filepath.Join(s.Dir, name, strings.TrimPrefix(e.Name(), usePrefix))); err != nil {
				t.Errorf("use lock %s outlived its build", e.Name())
			}
		default:
			t.Errorf("unexpected entry %s in store", e.Name())
		}
	}
	if builds != wantBuilds {
		t.Errorf("%d builds in store, want %d", builds, wantBuilds)
	}
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	writeLock := func(t *testing.T, dir string, pkgs map[string]string) {
		t.Helper()
		if err := WriteLockfile(dir, &Lockfile{Name: "python", Suite: "bookworm", Packages: pkgs}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		tools   fakeTools
		locked  bool
		lock    map[string]string // written to the lockfile dir if non-nil
		cancel  bool
		wantMsg string
		wantIs  error
	}{
		{name: "bootstrap fails", tools: fakeTools{failBootstrap: true}, wantMsg: "fake bootstrap failed"},
		{name: "package query fails", tools: fakeTools{failPackages: true}, wantMsg: "fake dpkg-query failed"},
		{name: "cancelled", tools: fakeTools{blockUntilCancel: true}, cancel: true, wantIs: context.Canceled},
		{name: "install fails", tools: fakeTools{installExit: 100}, wantMsg: "in the sandbox failed (exit 100); apt's last lines:\n  Setting up fake"},
		{name: "sandbox fails", tools: fakeTools{installErr: errors.New("fake sandbox refused")}, wantMsg: "install packages in a sandbox: fake sandbox refused"},
		{name: "a package is not installed after it", tools: fakeTools{pkgs: map[string]string{"python3": ""}}, wantMsg: "package python3 is not installed after the sandboxed install"},
		{
			name:    "locked versions differ",
			locked:  true,
			lock:    map[string]string{"python3": "3.11.2-1", "bash": "5.2.15-2+b7"},
			wantMsg: "python3: locked 3.11.2-1, resolved 3.11.2-1+b1",
		},
		{name: "locked without lockfile", locked: true, wantMsg: "without --locked"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newFakeStore(t, &tc.tools)
			lockDir := t.TempDir()
			if tc.lock != nil {
				writeLock(t, lockDir, tc.lock)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel {
				go func() {
					// Cancel once the build is under way (its temp dir exists).
					for {
						m, _ := filepath.Glob(filepath.Join(s.Dir, "python", buildPrefix+"*", rootfsDir, "var", "fifo"))
						if len(m) > 0 {
							cancel()
							return
						}
						select {
						case <-ctx.Done():
							return
						default:
						}
					}
				}()
			}
			img, err := s.Build(ctx, "python", BuildOptions{Install: tc.tools.install, Locked: tc.locked, LockfileDir: lockDir})
			if err == nil {
				t.Fatalf("Build = %+v, want error", img)
			}
			if tc.wantMsg != "" && !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Build error %q does not mention %q", err, tc.wantMsg)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Build error %q does not wrap %v", err, tc.wantIs)
			}
			assertStoreClean(t, s, "python", 0)
			if _, err := s.Lookup("python"); !errors.Is(err, ErrNotBuilt) {
				t.Errorf("Lookup after failed build = %v, want ErrNotBuilt", err)
			}
		})
	}
}

func TestBuildPreconditionError(t *testing.T) {
	s := newFakeStore(t, &fakeTools{})
	s.tools.check = checkMmdebstrapWith(func(string) (string, error) { return "", errors.New("not found") }, 0)
	_, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK})
	if err == nil || !strings.Contains(err.Error(), "apt-get install mmdebstrap") {
		t.Errorf("Build without mmdebstrap = %v, want the install hint", err)
	}
	s.tools.check = checkMmdebstrapWith(func(string) (string, error) { return "/usr/bin/x", nil }, 1000)
	_, err = s.Build(context.Background(), "python", BuildOptions{Install: installOK})
	if err == nil || !strings.Contains(err.Error(), "needs root") {
		t.Errorf("Build as non-root = %v, want the root hint", err)
	}
	if _, err := os.Stat(s.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a build refused for preconditions created the store (%v)", err)
	}
}

func TestConcurrentBuilds(t *testing.T) {
	s := newFakeStore(t, &fakeTools{})
	const n = 4
	var wg sync.WaitGroup
	digests := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK})
			errs[i] = err
			if err == nil {
				digests[i] = img.Digest
			}
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("build %d: %v", i, errs[i])
		}
		if digests[i] != digests[0] {
			t.Errorf("build %d digest %s != %s", i, digests[i], digests[0])
		}
	}
	assertStoreClean(t, s, "python", 1)
	if _, err := s.Lookup("python"); err != nil {
		t.Errorf("Lookup after concurrent builds: %v", err)
	}
}

func TestGC(t *testing.T) {
	s := newFakeStore(t, &fakeTools{})
	if _, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK}); err != nil {
		t.Fatal(err)
	}
	nameDir := filepath.Join(s.Dir, "python")
	stale := filepath.Join(nameDir, buildPrefix+"killed")
	mustWrite(t, filepath.Join(stale, rootfsDir, "etc", "passwd"), "x", 0o644)

	// While a build holds the lock, its directory is not stale.
	lock, err := lockNonBlocking(filepath.Join(nameDir, lockName))
	if err != nil {
		t.Fatal(err)
	}
	removed, err := s.GC()
	lock.Close()
	if err != nil || len(removed) != 0 {
		t.Errorf("GC while locked removed %v (err %v), want nothing", removed, err)
	}

	removed, err = s.GC()
	if err != nil || len(removed) != 1 || removed[0] != stale {
		t.Errorf("GC = %v, %v; want [%s]", removed, err, stale)
	}
	assertStoreClean(t, s, "python", 1)
	if _, err := s.Lookup("python"); err != nil {
		t.Errorf("GC broke the current image: %v", err)
	}
}

func TestRemove(t *testing.T) {
	s := newFakeStore(t, &fakeTools{})
	old, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK})
	if err != nil {
		t.Fatal(err)
	}
	// A second build with different content, through a second Store on
	// the same directory (as a second process would be).
	s2 := NewStore(s.Dir)
	f2 := &fakeTools{pkgs: map[string]string{"python3": "3.11.2-2"}}
	f2.hostFile = filepath.Join(t.TempDir(), "h")
	s2.tools = f2.toolchain()
	orig := s2.tools.bootstrap
	s2.tools.bootstrap = func(ctx context.Context, def Definition, target string, p io.Writer, fs []*os.File) error {
		if err := orig(ctx, def, target, p, fs); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(target, "usr/bin/python3"), []byte("#!/bin/fake2\n"), 0o755)
	}
	cur, err := s2.Build(context.Background(), "python", BuildOptions{Install: installOK})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Digest == old.Digest {
		t.Fatal("second build has the same digest; test is broken")
	}
	if err := s.Remove("python", "sha256:nothex"); err == nil {
		t.Error("Remove accepted a malformed digest")
	}
	if err := s.Remove("python", cur.Digest); err == nil {
		t.Error("Remove removed the current build")
	}
	if err := s.Remove("python", old.Digest); err != nil {
		t.Errorf("Remove(old): %v", err)
	}
	assertStoreClean(t, s, "python", 1)
}

func TestStoreWritableByOthersRefused(t *testing.T) {
	s := newFakeStore(t, &fakeTools{})
	if _, err := s.Build(context.Background(), "python", BuildOptions{Install: installOK}); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.Dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup("python"); err == nil || !strings.Contains(err.Error(), "chmod go-w") {
		t.Errorf("Lookup in a world-writable store = %v, want refusal with the fix", err)
	}
}
