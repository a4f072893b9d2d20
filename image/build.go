package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BuildOptions configure Build. The zero value builds without reading or
// writing a repository lockfile and discards progress output.
type BuildOptions struct {
	// Progress receives human-readable phases and mmdebstrap's condensed
	// output. nil discards it.
	Progress io.Writer
	// Locked makes the build fail, and publish nothing, if the resolved
	// package versions differ from LockfileDir/<name>.lock.
	Locked bool
	// LockfileDir is where <name>.lock lives (the repo's images/). "" means
	// no lockfile is read or written; Locked then is an error.
	LockfileDir string
	// Install runs the install of the definition's packages in a sandbox
	// (the engine's build steps). Required: nothing of a package runs on
	// the host, only mmdebstrap's bootstrap of the essential set and apt.
	Install Installer
}

// Installer runs argv with env (the complete environment) in a sandbox
// whose root is the tree at root, writable, as root of the sandbox's
// user namespace and with no network, its output going to out. It
// returns the command's exit status; the error is for a sandbox that
// could not run it (the engine's RunBuildStep).
type Installer func(ctx context.Context, root string, argv, env []string, out io.Writer) (exitCode int, err error)

// AptGet is apt-get as a build step runs it: as root of the step's user
// namespace, which has no _apt user for apt's own sandbox to drop to.
const AptGet = "apt-get -o APT::Sandbox::User=root"

// AptInstallOffline is the command that installs pkgs in a tree whose
// apt cache already holds them and their dependencies, with their
// package lists (Definition.Download): in a sandbox with no network, as
// root of its user namespace (apt's own sandbox user would need a
// second mapping). The lists are removed after it; the cache stays, for
// ArchiveDebs, until finalisation empties it.
func AptInstallOffline(pkgs []string) []string {
	return []string{"/bin/sh", "-c", "set -e; DEBIAN_FRONTEND=noninteractive " + AptGet +
		" install -y --no-install-recommends --no-download " + strings.Join(pkgs, " ") +
		"; rm -rf /var/lib/apt/lists/*"}
}

// ErrMirror means a package mirror could not be reached or served bad data.
var ErrMirror = errors.New("package mirror failed")

// toolchain is the set of external programs a build runs. Store.tools is
// replaced in tests to exercise the store logic without root or network.
type toolchain struct {
	// check reports a missing precondition (tool not installed, not root).
	check func() error
	// version names the bootstrap tool, e.g. "mmdebstrap 1.3.5".
	version func(ctx context.Context) (string, error)
	// bootstrap creates the root tree at target (which does not exist yet).
	// extraFiles are inherited by the bootstrap process (the store lock).
	bootstrap func(ctx context.Context, def Definition, target string, progress io.Writer, extraFiles []*os.File) error
	// packages returns package -> version installed in the tree at root.
	packages func(ctx context.Context, root string) (map[string]string, error)
}

// Build builds the named image, stores it by digest, makes it current and
// returns it. Builds of the same name are serialised by a flock on the
// store; a failed or cancelled build leaves nothing behind.
func (s *Store) Build(ctx context.Context, name string, opts BuildOptions) (*Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	def, err := definition(name)
	if err != nil {
		return nil, fmt.Errorf("build image: %w", err)
	}
	// Read the lockfile before spending half a minute on a build that
	// could not pass.
	var locked *Lockfile
	if opts.Locked {
		if opts.LockfileDir == "" {
			return nil, fmt.Errorf("build image %s: --locked needs a lockfile directory (BuildOptions.LockfileDir)", name)
		}
		if locked, err = ReadLockfile(opts.LockfileDir, name); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
		if locked.Suite != def.Suite {
			return nil, fmt.Errorf("build image %s: lockfile %s is for suite %q but the definition uses %q; rebuild without --locked",
				name, lockfilePath(opts.LockfileDir, name), locked.Suite, def.Suite)
		}
	}
	if opts.Install == nil {
		return nil, fmt.Errorf("build image %s: no sandbox to install its packages in (BuildOptions.Install is nil); build it through the engine, e.g. `moat image build %s`", name, name)
	}
	if err := s.tools.check(); err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	pend, err := s.Begin(ctx, name, progress)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	defer pend.Close()
	pend.keepExisting = true

	builtWith, err := s.tools.version(ctx)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	rootfs := pend.Root()
	// The host bootstraps the essential set and apt, and downloads the
	// definition's packages from the signed archive without installing
	// them; they are installed in a sandbox (as an image file's apt
	// packages are), so that no maintainer script of theirs runs on the
	// host.
	boot := def.bootstrap()
	pend.Phase("bootstrapping %s (%s + apt) with %s, downloading %s", name, def.Suite, builtWith, strings.Join(def.Packages, ", "))
	if err := s.tools.bootstrap(ctx, boot, rootfs, progress, []*os.File{pend.Lock()}); err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	// Hashed host-side right after mmdebstrap, before the sandboxed
	// install could touch the cache; finalisation (Publish) then empties
	// var/cache, so the kept .debs never reach the digest.
	debs, err := ArchiveDebs(rootfs)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	pend.Phase("installing %s in a sandbox (no network)", strings.Join(def.Packages, ", "))
	out := &condenser{w: progress, install: true}
	code, err := opts.Install(ctx, rootfs, AptInstallOffline(def.Packages), def.installEnv(), out)
	out.flush()
	if err != nil {
		return nil, fmt.Errorf("build image %s: install packages in a sandbox: %w", name, err)
	}
	if code != 0 {
		return nil, fmt.Errorf("build image %s: installing %s in the sandbox failed (exit %d); apt's last lines:\n  %s",
			name, strings.Join(def.Packages, ", "), code, strings.Join(out.tail(), "\n  "))
	}
	// The tree's dpkg database was written in the sandbox: what it says
	// is checked against what was asked for, and the versions it lists
	// get hashes only from the .debs hashed above.
	pkgs, err := s.tools.packages(ctx, rootfs)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	for _, p := range def.Packages {
		if pkgs[p] == "" {
			return nil, fmt.Errorf("build image %s: package %s is not installed after the sandboxed install", name, p)
		}
	}
	hashes := DebHashes(debs, pkgs)
	if locked != nil {
		if err := compareLock(lockfilePath(opts.LockfileDir, name), locked, pkgs, hashes); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
	}
	img, err := pend.Publish(ctx, &Image{
		Env:        def.Env,
		Packages:   pkgs,
		Built:      time.Now().UTC().Truncate(time.Second),
		Suite:      def.Suite,
		BuiltWith:  builtWith,
		Definition: def.Fingerprint(),
	})
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	phase := pend.Phase

	if opts.LockfileDir != "" && !opts.Locked {
		lf := &Lockfile{Name: name, Suite: def.Suite, Digest: img.Digest, Packages: img.Packages, SHA256: hashes, BuiltWith: img.BuiltWith}
		if err := WriteLockfile(opts.LockfileDir, lf); err != nil {
			return nil, fmt.Errorf("build image %s: image stored, but %w", name, err)
		}
		phase("wrote %s", lockfilePath(opts.LockfileDir, name))
	} else if locked != nil && locked.Digest != img.Digest {
		// Same package versions, different bytes: the build is not fully
		// reproducible. Worth knowing, not worth failing over.
		phase("note: digest %s differs from lockfile's %s although package versions match", img.Digest, locked.Digest)
	}
	return img, nil
}

// syncFS flushes the filesystem holding dir to disk with syncfs(2): only
// the store's filesystem, where sync(2) would also wait for every other
// one on the host, and unlike sync(2) it reports a writeback error.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// prepareDirs creates the store and name directories (0755, ours) and
// refuses a store that others could write to.
func (s *Store) prepareDirs(name string) (string, error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return "", fmt.Errorf("create image store: %w", err)
	}
	if err := s.checkPrivate(); err != nil {
		return "", err
	}
	nameDir := filepath.Join(s.Dir, name)
	if err := os.Mkdir(nameDir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("create image store: %w", err)
	}
	fi, err := os.Lstat(nameDir)
	if err != nil {
		return "", fmt.Errorf("create image store: %w", err)
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o022 != 0 {
		return "", fmt.Errorf("image store %s must be a directory not writable by group or others (mode %s)", nameDir, fi.Mode())
	}
	return nameDir, nil
}

// writeMetadata writes dir/image.json.
func writeMetadata(dir string, img *Image) error {
	data, err := jsonIndent(img)
	if err != nil {
		return fmt.Errorf("encode metadata: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, metadataFile), data, 0o644); err != nil {
		return fmt.Errorf("write metadata: %w", err)
	}
	return nil
}

// setCurrent points nameDir/current at hexDigest by renaming a fresh
// symlink over it: readers see the old or the new target, never none.
func setCurrent(nameDir, hexDigest string) error {
	tmp := filepath.Join(nameDir, ".current-"+strconv.Itoa(os.Getpid()))
	_ = os.Remove(tmp) // left by a killed build with our pid; we hold the lock
	if err := os.Symlink(hexDigest, tmp); err != nil {
		return fmt.Errorf("set current image: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(nameDir, currentLink)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("set current image: %w", err)
	}
	if d, err := os.Open(nameDir); err == nil {
		_ = d.Sync() // make the rename durable; best effort
		d.Close()
	}
	return nil
}

// mmdebstrapTools is the real toolchain.
func mmdebstrapTools() toolchain {
	return toolchain{
		check:     checkMmdebstrap,
		version:   mmdebstrapVersion,
		bootstrap: runMmdebstrap,
		packages:  dpkgPackages,
	}
}

func checkMmdebstrap() error {
	return checkMmdebstrapWith(exec.LookPath, os.Geteuid())()
}

// checkMmdebstrapWith checks build preconditions with injectable lookups,
// so tests can see the messages without uninstalling anything.
func checkMmdebstrapWith(lookPath func(string) (string, error), euid int) func() error {
	return func() error {
		if _, err := lookPath("mmdebstrap"); err != nil {
			return fmt.Errorf("mmdebstrap not found in PATH; install it with `apt-get install mmdebstrap`")
		}
		if euid != 0 {
			// --mode=unshare would work unprivileged, but it maps file
			// ownership through a user namespace and the store must be
			// root-owned for the mount tiers; keep one well-tested mode.
			return fmt.Errorf("building images runs mmdebstrap --mode=root, which needs root (euid is %d); run as root, e.g. `sudo moat image build`", euid)
		}
		if _, err := os.Stat(mergedUsrHook); err != nil {
			return fmt.Errorf("mmdebstrap hook %s missing (%v); reinstall it with `apt-get install --reinstall mmdebstrap`", mergedUsrHook, err)
		}
		if _, err := lookPath("dpkg-query"); err != nil {
			return fmt.Errorf("dpkg-query not found in PATH; install it with `apt-get install dpkg`")
		}
		return nil
	}
}

func mmdebstrapVersion(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "mmdebstrap", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("mmdebstrap --version: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// dpkgExcludes drop documentation, manuals and translations from the image
// (about 40 MB for python). Copyright files stay: they are the licences of
// what we ship.
var dpkgExcludes = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-exclude=/usr/share/lintian/*",
}

// mergedUsrHook ships with the mmdebstrap package.
const mergedUsrHook = "/usr/share/mmdebstrap/hooks/merged-usr"

// mmdebstrapArgs returns mmdebstrap's command line for def.
func mmdebstrapArgs(def Definition, target string) []string {
	args := []string{
		"--mode=root",
		"--variant=essential",
		"--format=directory",
		"--include=" + strings.Join(def.Packages, ","),
		// Recommends would pull in whatever the archive suggests this
		// week; the package list is the definition, nothing more.
		"--aptopt=APT::Install-Recommends \"false\"",
		"--aptopt=Acquire::Languages \"none\"",
		// Bookworm's essential init-system-helpers depends on
		// "usrmerge | usr-is-merged"; left alone, apt picks usrmerge and
		// with it ~50 MB of perl. mmdebstrap's merged-usr hook lays out
		// the merged /usr itself and installs the 13 kB usr-is-merged.
		"--hook-dir=" + mergedUsrHook,
	}
	for _, o := range dpkgExcludes {
		args = append(args, "--dpkgopt="+o)
	}
	// Keep every downloaded .deb in the tree's apt cache (the essential
	// set's too, which mmdebstrap would unlink), so the build can hash
	// what it installed for the lockfile (ArchiveDebs); finalize empties
	// var/cache before the digest, so the image does not change.
	skip := "--skip=essential/unlink,cleanup/apt/cache"
	if len(def.Download) > 0 {
		// The package lists stay for the sandboxed install step, which
		// has no network (apt-get install --no-download); finalize
		// empties them too.
		skip += ",cleanup/apt/lists"
		// Downloaded only, by the host's apt with mmdebstrap's config
		// for the tree (MMDEBSTRAP_APT_CONFIG: the tree's sources,
		// Install-Recommends false, its cache), verified against the
		// signed archive; no maintainer script runs. The names are
		// checked (debPackage) before they reach this shell line.
		args = append(args, "--customize-hook=APT_CONFIG=\"$MMDEBSTRAP_APT_CONFIG\" apt-get install --download-only -y --no-install-recommends "+
			strings.Join(def.Download, " "))
	}
	args = append(args, skip, def.Suite, target)
	return append(args, def.Sources...)
}

// runMmdebstrap bootstraps def into target.
func runMmdebstrap(ctx context.Context, def Definition, target string, progress io.Writer, extraFiles []*os.File) error {
	cmd := exec.CommandContext(ctx, "mmdebstrap", mmdebstrapArgs(def, target)...)
	// A clean environment: maintainer scripts run as root inside the
	// tree, and variables like LD_PRELOAD or PYTHONPATH from the caller's
	// shell must not reach them or change the result. Proxy settings are
	// the one thing the host legitimately needs to pass on.
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C.UTF-8",
		"SOURCE_DATE_EPOCH=" + strconv.FormatInt(def.SourceDateEpoch, 10),
	}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	// mmdebstrap runs in its own process group so cancellation reaches
	// apt, dpkg and maintainer scripts too: signalled alone, mmdebstrap
	// defers SIGTERM until its current phase (the whole package install)
	// is done. With its children gone it fails fast and unmounts the /dev,
	// /proc and /sys it bind-mounted into the tree.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 15 * time.Second
	// The store lock is inherited: flock stays held while any process of
	// the build lives, so GC cannot delete a tree an orphaned mmdebstrap
	// (its parent SIGKILLed) is still writing.
	cmd.ExtraFiles = extraFiles
	out := &condenser{w: progress}
	cmd.Stdout = out
	cmd.Stderr = out
	err := cmd.Run()
	out.flush()
	if ctx.Err() != nil {
		// Whatever survived SIGTERM and WaitDelay dies now, before the
		// caller removes the tree under it. The group still exists only
		// if a member lives, so this cannot hit an unrelated process.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("mmdebstrap: %w", ctx.Err())
	}
	if err != nil {
		return classifyFailure(def, err, out.tail())
	}
	return nil
}

// networkMarkers are apt/mmdebstrap phrases that mean the mirror, not the
// package set, is the problem.
var networkMarkers = []string{
	"Temporary failure resolving", "Could not resolve", "Failed to fetch",
	"Unable to connect", "Connection failed", "Connection timed out",
	"No route to host", "Network is unreachable", "Could not connect",
	"Hash Sum mismatch", "not signed", "NO_PUBKEY", "Release file",
	"apt-get update failed",
}

// classifyFailure turns an mmdebstrap failure into an error that says what
// to fix: which mirror failed, or the last lines of output.
func classifyFailure(def Definition, runErr error, tail []string) error {
	for _, line := range tail {
		for _, m := range networkMarkers {
			if !strings.Contains(line, m) {
				continue
			}
			// Only the failing line names the failed mirror: other lines
			// mention the mirrors that worked ("Hit:1 http://...").
			mirror := failedMirror(def, []string{line})
			if mirror == "" {
				mirror = allMirrors(def)
			}
			return fmt.Errorf("mmdebstrap: %w: mirror %s: %s (check the network, a proxy in http_proxy, or the sources in the definition)",
				ErrMirror, mirror, strings.TrimSpace(line))
		}
	}
	last := tail
	if len(last) > 8 {
		last = last[len(last)-8:]
	}
	return fmt.Errorf("mmdebstrap: %w; last output:\n  %s", runErr, strings.Join(last, "\n  "))
}

// failedMirror returns the first source URL whose host appears in lines,
// or "".
func failedMirror(def Definition, lines []string) string {
	for _, line := range lines {
		for _, src := range def.Sources {
			f := strings.Fields(src)
			if len(f) < 3 {
				continue
			}
			// Match the host and path: deb.debian.org serves both
			// /debian and /debian-security.
			hostPath := strings.TrimPrefix(strings.TrimPrefix(f[1], "http://"), "https://")
			if strings.Contains(line, hostPath+"/") || strings.Contains(line, hostPath+" ") {
				return f[1]
			}
		}
	}
	return ""
}

// allMirrors lists every distinct source URL of def.
func allMirrors(def Definition) string {
	var urls []string
	for _, src := range def.Sources {
		if f := strings.Fields(src); len(f) >= 3 && !slices.Contains(urls, f[1]) {
			urls = append(urls, f[1])
		}
	}
	return strings.Join(urls, ", ")
}

// condenser forwards mmdebstrap's status lines ("I: ...", "W: ...",
// "E: ...") or apt-get install's ("Setting up ...", warnings, errors)
// to the progress writer, indented, and keeps the last lines of
// all output for error messages. apt's own chatter is long and only useful
// when something fails.
type condenser struct {
	mu      sync.Mutex
	w       io.Writer
	install bool // apt-get install's output, not mmdebstrap's
	partial []byte
	last    []string
}

const condenserKeep = 40

func (c *condenser) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.partial = append(c.partial, p...)
	for {
		i := bytes.IndexByte(c.partial, '\n')
		if i < 0 {
			break
		}
		c.line(string(c.partial[:i]))
		c.partial = c.partial[i+1:]
	}
	// A progress bar without newlines must not grow without bound.
	if len(c.partial) > 64*1024 {
		c.line(string(c.partial))
		c.partial = nil
	}
	return len(p), nil
}

func (c *condenser) line(l string) {
	l = strings.TrimRight(l, "\r")
	if l == "" {
		return
	}
	c.last = append(c.last, l)
	if len(c.last) > condenserKeep {
		c.last = c.last[len(c.last)-condenserKeep:]
	}
	if c.install {
		// apt and dpkg in the sandbox: one line per package configured,
		// and apt's warnings and errors.
		if strings.HasPrefix(l, "Setting up ") || strings.HasPrefix(l, "W: ") || strings.HasPrefix(l, "E: ") {
			fmt.Fprintf(c.w, "    %s\n", l)
		}
		return
	}
	if strings.HasPrefix(l, "I: ") || strings.HasPrefix(l, "W: ") || strings.HasPrefix(l, "E: ") {
		fmt.Fprintf(c.w, "    mmdebstrap %s\n", l)
	}
}

func (c *condenser) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.partial) > 0 {
		c.line(string(c.partial))
		c.partial = nil
	}
}

func (c *condenser) tail() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.last...)
}

// dpkgPackages reads the installed package set from the tree's dpkg
// database (not the host's: --admindir).
func dpkgPackages(ctx context.Context, root string) (map[string]string, error) {
	cmd := exec.CommandContext(ctx, "dpkg-query",
		"--admindir="+filepath.Join(root, "var/lib/dpkg"),
		"-W", "-f", "${db:Status-Abbrev}\t${Package}\t${Version}\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-query in %s: %w: %s", root, err, strings.TrimSpace(stderr.String()))
	}
	return parsePackages(out)
}

// parsePackages parses "status\tpackage\tversion" lines, keeping only
// installed packages ("ii"): removed-but-configured ones are not in the tree.
func parsePackages(out []byte) (map[string]string, error) {
	pkgs := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("dpkg-query: unexpected line %q", sc.Text())
		}
		if strings.TrimSpace(f[0]) != "ii" {
			continue
		}
		pkgs[f[1]] = f[2]
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dpkg-query: %w", err)
	}
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("dpkg-query: no installed packages found")
	}
	return pkgs, nil
}
