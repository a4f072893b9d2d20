package imagebuild

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/image"
)

// Options configure Build. The zero value has no StepRunner (a plan with
// a RUN step is refused) and discards progress.
type Options struct {
	// Runner runs RUN steps in sandboxes (the engine's RunBuildStep).
	Runner StepRunner
	// Progress receives one line per step with the elapsed time, the
	// RUN steps' output and a final line with the digest and size. nil
	// discards it.
	Progress io.Writer
	// Terminal: Progress is a terminal; RUN output is indented under its
	// step instead of prefixed with the step number on every line.
	Terminal bool
	// Source is recorded as the image's Source; "" means
	// "dockerfile:<plan.File>".
	Source string
	// LockFile is where the build's Lock is written after it is stored
	// ("" writes none); the CLI passes LockPath(plan.File). A file of
	// that path inside the build context is never copied into the image
	// by a directory or pattern COPY: it changes with every build.
	LockFile string
	// Locked, when set, makes the build fail, publishing nothing, when
	// its Lock differs from this one (Lock.Compare lists how).
	Locked *Lock
	// AllowAddresses grants reserved IP addresses or prefixes to the
	// hosts of RUN steps with network (an index on a private network, or
	// a host this machine resolves to such an address): the operator's
	// grant, as a manifest's network.allow_addresses, never the file's.
	AllowAddresses []string
	// CAFile is a PEM bundle that RUN steps with network trust instead
	// of the image's own (a TLS-intercepting proxy between this host and
	// the indexes): placed in the tree at BuildCAPath for each such step,
	// named by the usual CA variables, and removed after the step, so
	// it never reaches the image.
	CAFile string
}

// BuildCAPath is where Options.CAFile is placed in the tree while a RUN
// step with network runs.
const BuildCAPath = "/.moat-build-ca.pem"

// caEnv names BuildCAPath to the clients a build step runs: OpenSSL's
// default (Python's ssl, curl), curl, pip, requests, git, npm and node.
var caEnv = []string{
	"SSL_CERT_FILE", "CURL_CA_BUNDLE", "PIP_CERT", "REQUESTS_CA_BUNDLE",
	"GIT_SSL_CAINFO", "NPM_CONFIG_CAFILE", "NODE_EXTRA_CA_CERTS",
}

// reproducibleEnv is set in every RUN step's environment (not in the
// image's) so that the same build file builds the same tree twice:
// SOURCE_DATE_EPOCH makes py_compile write hash-checked .pyc files (no
// timestamps) and dpkg, gzip and friends write fixed dates; pip keeps no
// cache of downloads (which would land in /root/.cache) and does not
// look up its own newer version; Python writes no __pycache__ while a
// step merely runs a script.
var reproducibleEnv = []string{
	"SOURCE_DATE_EPOCH=1686355200", // bookworm's release, as the built-in images
	"PIP_NO_CACHE_DIR=1",
	"PIP_DISABLE_PIP_VERSION_CHECK=1",
	// Root in a build step is its user namespace's root, on a tree that
	// becomes an image: pip's "running as root" warning is noise there.
	"PIP_ROOT_USER_ACTION=ignore",
	"PYTHONDONTWRITEBYTECODE=1",
	"NPM_CONFIG_UPDATE_NOTIFIER=false",
}

// mountedFresh are the directories every run mounts anew over the
// image's (see image/finalize.go): what a build put there would vanish.
var mountedFresh = []string{"/workspace", "/tmp", "/proc", "/dev", "/sys", "/run"}

// caches are removed after the last step: written by package managers
// even when told not to cache, they differ between builds.
var caches = []string{"root/.cache", "root/.npm", "home/sandbox/.cache", "home/sandbox/.npm"}

// config is the image config as the steps change it.
type config struct {
	env        []string
	workdir    string
	entrypoint []string
	cmd        []string
	user       string
	uid        int
}

// Build runs plan and stores the result under name as its current build:
// a base tree (a copy of a stored image, or a Debian bootstrap), then
// each step in order: RUN in a sandbox through opts.Runner, COPY from the
// plan's context into the tree (through an os.Root on the tree, so a
// symlink planted by an earlier RUN cannot redirect a write outside it),
// and the config steps. A failed or cancelled build leaves nothing in the
// store and the previous current build of name stays current.
func Build(ctx context.Context, store *image.Store, name string, plan *Plan, opts Options) (*image.Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	if err := checkPlan(plan, opts); err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	for _, d := range image.Definitions() {
		if d.Name == name {
			return nil, fmt.Errorf("build image %s: %w: %q is a built-in image definition (`moat image build %s` builds it); build under another name", name, image.ErrBadImage, name, name)
		}
	}
	var base *image.Image
	if plan.Base.Image != "" {
		var err error
		if base, err = store.Lookup(plan.Base.Image); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, baseLookupError(store, plan, err))
		}
	}
	pend, err := store.Begin(ctx, name, progress)
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	defer pend.Close()
	start := time.Now()
	for _, n := range plan.Notes {
		fmt.Fprintf(progress, "note: %s\n", n)
	}
	cfg := &config{workdir: "/"}
	var bootDebs []image.Deb
	if base != nil {
		pend.Phase("copying %s (%s) as the base", base.Name, base.Digest)
		if err := copyTree(base.Root, pend.Root()); err != nil {
			return nil, fmt.Errorf("build image %s: copy base %s: %w", name, base.Name, err)
		}
		cfg.env = slices.Clone(base.Env)
		cfg.entrypoint, cfg.cmd = base.Entrypoint, base.Cmd
		if base.WorkingDir != "" {
			cfg.workdir = base.WorkingDir
		}
		// The base's User is recorded only; its RUN steps start as root
		// like Docker's unless the file says USER.
	} else {
		if cfg.env, err = pend.Bootstrap(ctx, plan.Base.Debian, plan.Base.Download); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
		// Hashed now, host-side, while only Debian's signed archive (through
		// the host's apt) has written the cache: a later step could rewrite
		// the files, not these hashes.
		if bootDebs, err = image.ArchiveDebs(pend.Root()); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
	}
	b := &builder{plan: plan, root: pend.Root(), cfg: cfg, opts: opts, progress: progress, start: start, skip: lockPaths(plan, opts)}
	// Steps are counted by instruction: one ENV line with three pairs is
	// three Steps but one step of the file.
	total, n := instructions(plan.Steps), 0
	for i, s := range plan.Steps {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
		if i == 0 || s.Line != plan.Steps[i-1].Line || s.Op != plan.Steps[i-1].Op {
			n++
			fmt.Fprintf(progress, "[%5.1fs] step %d/%d (%s:%d): %s\n", time.Since(start).Seconds(), n, total, fileLabel(plan), s.Line, oneLine(s.Text))
		}
		if err := b.step(ctx, n, s); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
	}
	debs, err := treePackages(ctx, pend.Root())
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	// The .debs apt steps on an image base downloaded (in the sandbox)
	// are hashed after the steps; the bootstrap's hashes come first.
	// Only the installed version of an installed package counts.
	stepDebs, err := image.ArchiveDebs(pend.Root())
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	debHashes := image.DebHashes(append(bootDebs, stepDebs...), debs)
	if err := removeCaches(pend.Root()); err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	fileSHA := ""
	if plan.File != "" {
		if fileSHA, err = HashFile(plan.File); err != nil {
			return nil, fmt.Errorf("build image %s: %w", name, err)
		}
	}
	baseDigest := ""
	if base != nil {
		baseDigest = base.Digest
	}
	var lock *Lock
	pend.Check = func(digest string) error {
		lock = NewLock(plan, fileSHA, baseDigest, debs, debHashes, digest)
		if opts.Locked != nil {
			return opts.Locked.Compare(lock)
		}
		return nil
	}
	source := opts.Source
	if source == "" {
		source = "dockerfile:" + plan.File
	}
	suite := plan.Base.Debian
	if base != nil {
		suite = base.Suite
	}
	img, err := pend.Publish(ctx, &image.Image{
		Env:        cfg.env,
		Packages:   debs,
		Built:      time.Now().UTC().Truncate(time.Second),
		Suite:      suite,
		BuiltWith:  "moat image build",
		Source:     source,
		Entrypoint: cfg.entrypoint,
		Cmd:        cfg.cmd,
		WorkingDir: cfg.workdir,
		User:       cfg.user,
	})
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	if opts.LockFile != "" && opts.Locked == nil {
		if err := WriteLock(opts.LockFile, lock); err != nil {
			return nil, fmt.Errorf("build image %s: image stored as %s, but %w", name, img.Digest, err)
		}
		fmt.Fprintf(progress, "[%5.1fs] wrote %s\n", time.Since(start).Seconds(), opts.LockFile)
	}
	fmt.Fprintf(progress, "[%5.1fs] built %s %s (%.1f MB)\n", time.Since(start).Seconds(), img.Name, img.Digest, float64(img.Size)/1e6)
	return img, nil
}

// instructions counts the build file's instructions among steps.
func instructions(steps []Step) int {
	n := 0
	for i, s := range steps {
		if i == 0 || s.Line != steps[i-1].Line || s.Op != steps[i-1].Op {
			n++
		}
	}
	return n
}

// checkPlan refuses a plan the builder cannot run before anything is
// written.
func checkPlan(p *Plan, opts Options) error {
	if p == nil {
		return errors.New("no plan")
	}
	if (p.Base.Image == "") == (p.Base.Debian == "") {
		return fmt.Errorf("%s: the base must be exactly one of an image and a Debian suite", fileLabel(p))
	}
	for _, s := range p.Steps {
		if s.Op == OpRun && opts.Runner == nil {
			return fmt.Errorf("%s:%d: RUN needs a sandbox to run in (Options.Runner is nil)", fileLabel(p), s.Line)
		}
	}
	return nil
}

// builder carries one build's state across its steps.
type builder struct {
	plan     *Plan
	root     string
	cfg      *config
	opts     Options
	progress io.Writer
	start    time.Time
	// skip: host paths a directory or pattern COPY leaves out (lockPaths).
	skip map[string]bool
}

// lockPaths are the lockfiles of this build: written after every build,
// they must not be copied into the next one, or a `COPY . /app` beside
// its lockfile would never build the same digest twice.
func lockPaths(p *Plan, opts Options) map[string]bool {
	skip := map[string]bool{}
	files := []string{opts.LockFile}
	if p.File != "" {
		files = append(files, LockPath(p.File))
	}
	for _, f := range files {
		if abs, err := filepath.Abs(f); err == nil && f != "" {
			skip[abs] = true
		}
	}
	return skip
}

// treePackages is the Debian package set of the built tree, for the
// image's metadata and the lockfile; a tree without a dpkg database
// (an imported image of one static binary) has none.
func treePackages(ctx context.Context, root string) (map[string]string, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	fi, err := r.Lstat("var/lib/dpkg/status")
	r.Close()
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("/var/lib/dpkg/status in the built tree is not a regular file")
	}
	return image.InstalledPackages(ctx, root)
}

// step applies one step to the tree or the config.
func (b *builder) step(ctx context.Context, n int, s Step) error {
	where := fmt.Sprintf("%s:%d", fileLabel(b.plan), s.Line)
	switch s.Op {
	case OpRun:
		return b.run(ctx, n, s, where)
	case OpCopy:
		dest := s.Dest
		if s.Expand {
			var err error
			if dest, err = Expand(dest, b.cfg.env); err != nil {
				return fmt.Errorf("%s: COPY destination %s: %w", where, s.Dest, err)
			}
		}
		if !path.IsAbs(dest) {
			trail := strings.HasSuffix(dest, "/")
			dest = path.Join(b.cfg.workdir, dest)
			if trail {
				dest += "/"
			}
		}
		if err := checkDest(dest); err != nil {
			return fmt.Errorf("%s: COPY to %s: %w", where, dest, err)
		}
		uid := 0
		if s.Chown == "1000" || s.Chown == "sandbox" {
			uid = 1000
		}
		if err := copyIn(b.plan.Context, s.Sources, b.root, dest, uid, b.skip); err != nil {
			return fmt.Errorf("%s: COPY: %w", where, err)
		}
	case OpEnv:
		v := s.Value
		if s.Expand {
			var err error
			if v, err = Expand(v, b.cfg.env); err != nil {
				return fmt.Errorf("%s: ENV %s: %w", where, s.Key, err)
			}
		}
		if !validVarName(s.Key) || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%s: ENV %q: a name is letters, digits and _, and a value has no NUL byte", where, s.Key)
		}
		b.cfg.env = setEnv(b.cfg.env, s.Key, v)
	case OpWorkdir:
		dir := s.Dir
		if s.Expand {
			var err error
			if dir, err = Expand(dir, b.cfg.env); err != nil {
				return fmt.Errorf("%s: WORKDIR %s: %w", where, s.Dir, err)
			}
		}
		if !path.IsAbs(dir) {
			dir = path.Join(b.cfg.workdir, dir)
		}
		dir = path.Clean(dir)
		if err := checkDest(dir); err != nil {
			return fmt.Errorf("%s: WORKDIR %s: %w", where, dir, err)
		}
		if err := mkdirIn(b.root, dir); err != nil {
			return fmt.Errorf("%s: WORKDIR %s: %w", where, dir, err)
		}
		b.cfg.workdir = dir
	case OpUser:
		uid, note := userID(s.User)
		if note != "" {
			fmt.Fprintf(b.progress, "note: %s: USER %s: %s\n", where, s.User, note)
		}
		b.cfg.user, b.cfg.uid = s.User, uid
	case OpEntrypoint:
		// As in Docker, a new ENTRYPOINT drops a CMD inherited from the
		// base (it was meant as the old entrypoint's arguments).
		b.cfg.entrypoint, b.cfg.cmd = s.Argv, nil
	case OpCmd:
		b.cfg.cmd = s.Argv
	default:
		return fmt.Errorf("%s: step %q is not one the builder knows", where, s.Op)
	}
	return nil
}

// checkNeeds refuses a step whose Needs are not on its PATH in the tree.
// Only a definite "not there" in every PATH directory refuses: a lookup
// the tree's links make undecidable from the host (an absolute symlink,
// as Debian's alternatives use) lets the step run and speak for itself.
// The lookup goes through an os.Root, so no link in the tree takes it
// outside.
func (b *builder) checkNeeds(s Step, env []string) error {
	if len(s.Needs) == 0 {
		return nil
	}
	root, err := os.OpenRoot(b.root)
	if err != nil {
		return err
	}
	defer root.Close()
	pathVar := envMap(env)["PATH"]
	for _, prog := range s.Needs {
		found := false
		for _, dir := range strings.Split(pathVar, ":") {
			if !path.IsAbs(dir) {
				continue
			}
			rel := strings.TrimPrefix(path.Join(dir, prog), "/")
			if _, err := root.Lstat(rel); err == nil || !errors.Is(err, fs.ErrNotExist) {
				found = true
				break
			}
		}
		if !found {
			base := "the base"
			if b.plan.Base.Image != "" {
				base = "the base image " + b.plan.Base.Image
			}
			// ErrBadImage: the build file asks for something its base
			// cannot do, which is the user's to fix (the CLI's exit 2).
			return fmt.Errorf("%w: %s: %s has no %s on its PATH (%s); %s", image.ErrBadImage, oneLine(s.Text), base, prog, pathVar, s.NeedsFix)
		}
	}
	return nil
}

// run runs one RUN step in a sandbox on the tree.
func (b *builder) run(ctx context.Context, n int, s Step, where string) error {
	if len(s.Argv) == 0 {
		return fmt.Errorf("%s: RUN has no command", where)
	}
	if err := mkdirIn(b.root, b.cfg.workdir); err != nil {
		return fmt.Errorf("%s: working directory %s: %w", where, b.cfg.workdir, err)
	}
	env := stepEnv(b.cfg, s.BuildEnv)
	if err := b.checkNeeds(s, env); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	var addrs []string
	if len(s.Hosts) > 0 {
		addrs = b.opts.AllowAddresses
		if b.opts.CAFile != "" {
			if err := b.placeCA(); err != nil {
				return fmt.Errorf("%s: --ca-file %s: %w", where, b.opts.CAFile, err)
			}
			defer b.removeCA()
			for _, k := range caEnv {
				env = setEnv(env, k, BuildCAPath)
			}
		}
	}
	out := newStepOutput(b.progress, n, b.opts.Terminal)
	code, err := b.opts.Runner.RunStep(ctx, b.root, RunStep{
		Argv:           s.Argv,
		Env:            env,
		Dir:            b.cfg.workdir,
		UID:            b.cfg.uid,
		Hosts:          s.Hosts,
		AllowAddresses: addrs,
		Stdout:         out,
		Stderr:         out,
	})
	out.Flush()
	// A step of an image file (apt: jq) is named as the file says it
	// before the command it became; a Dockerfile's RUN and an image
	// file's run: are their command already.
	if !strings.HasPrefix(s.Text, "RUN") && !strings.HasSuffix(s.Text, commandText(s)) {
		where += ": " + oneLine(s.Text)
	}
	if err != nil {
		return fmt.Errorf("%s: RUN %s: %w", where, oneLine(commandText(s)), err)
	}
	if code != 0 {
		return &StepError{Where: where, Command: oneLine(commandText(s)), Code: code, Tail: out.Tail()}
	}
	return ctx.Err()
}

// StepError is a RUN step (a Dockerfile's RUN; an image file's run,
// apt, pip or npm step) that ran in its sandbox and exited non-zero:
// the build file failed, not Moat, and the CLI says so by its exit
// status. A step that could not be run at all is another error.
type StepError struct {
	// Where is FILE:LINE of the step, followed for an image file's
	// step by how the file says it ("jq.yaml:3: apt: jq").
	Where string
	// Command is the step's command, shortened to one line.
	Command string
	// Code is its exit status.
	Code int
	// Tail is the end of its output ("" when it printed nothing).
	Tail string
}

func (e *StepError) Error() string {
	msg := fmt.Sprintf("%s: RUN %s exited with status %d", e.Where, e.Command, e.Code)
	if e.Tail != "" {
		msg += "; its last output:\n" + e.Tail
	}
	return msg
}

// baseLookupError says, in the build file's terms (its line, the
// instruction as written), why store has no base for plan: an unknown
// name lists the stored images and the built-in ones not among them,
// each once.
func baseLookupError(store *image.Store, plan *Plan, err error) error {
	where := fileLabel(plan)
	if plan.Base.Line > 0 {
		where += ":" + strconv.Itoa(plan.Base.Line)
	}
	text := cmp.Or(plan.Base.Text, "FROM "+plan.Base.Image)
	if !errors.Is(err, image.ErrUnknown) {
		// Not built yet, or built from an older definition: the
		// store's error says how to build it.
		return fmt.Errorf("%s: %s: %w", where, text, err)
	}
	// Names holds each name once: the built-in definitions and the
	// stored names. A name is stored when Lookup finds its build (a
	// built-in one built from its current definition).
	var stored, builtin []string
	for _, n := range store.Names() {
		if _, err := store.Lookup(n); err == nil {
			stored = append(stored, n)
		} else if slices.ContainsFunc(image.Definitions(), func(d image.Definition) bool { return d.Name == n }) {
			builtin = append(builtin, n)
		}
	}
	msg := fmt.Sprintf("%s: %s: no image named %q; stored images: %s; built-in images you can build: %s (or add %s with `moat image import %s SOURCE` or `moat image build %s -f FILE`)",
		where, text, plan.Base.Image, cmp.Or(strings.Join(stored, ", "), "none"), cmp.Or(strings.Join(builtin, ", "), "none"),
		plan.Base.Image, plan.Base.Image, plan.Base.Image)
	return &baseError{msg: msg, err: err}
}

// baseError reads as msg and wraps the store's error, so that callers
// still find image.ErrUnknown with errors.Is.
type baseError struct {
	msg string
	err error
}

func (e *baseError) Error() string { return e.msg }
func (e *baseError) Unwrap() error { return e.err }

// placeCA writes Options.CAFile into the tree at BuildCAPath, readable
// by the step's user. Whatever an earlier step left at that name is
// removed first, through an os.Root on the tree, so a planted symlink
// cannot redirect the write.
func (b *builder) placeCA() error {
	pem, err := os.ReadFile(b.opts.CAFile)
	if err != nil {
		return err
	}
	r, err := os.OpenRoot(b.root)
	if err != nil {
		return err
	}
	defer r.Close()
	name := strings.TrimPrefix(BuildCAPath, "/")
	if err := r.RemoveAll(name); err != nil {
		return err
	}
	f, err := r.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(pem); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// removeCA takes BuildCAPath (or whatever the step made of it) out of
// the tree again.
func (b *builder) removeCA() {
	r, err := os.OpenRoot(b.root)
	if err != nil {
		return
	}
	defer r.Close()
	if err := r.RemoveAll(strings.TrimPrefix(BuildCAPath, "/")); err != nil {
		fmt.Fprintf(b.progress, "warning: could not remove %s from the tree: %v\n", BuildCAPath, err)
	}
}

// stepEnv is a RUN step's environment: the build-time variables, then
// the image's env (which wins, as ENV wins over ARG in Docker), the
// reproducibility settings where the image sets none, and a HOME for
// the step's user.
func stepEnv(cfg *config, buildEnv []string) []string {
	env := slices.Clone(buildEnv)
	for _, kv := range cfg.env {
		k, v, _ := strings.Cut(kv, "=")
		env = setEnv(env, k, v)
	}
	set := envMap(env)
	for _, kv := range reproducibleEnv {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, k+"="+v)
		}
	}
	if _, ok := set["HOME"]; !ok {
		home := "/root"
		if cfg.uid != 0 {
			home = "/home/sandbox"
		}
		env = append(env, "HOME="+home)
	}
	if _, ok := set["PATH"]; !ok {
		env = append(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	return env
}

// setEnv sets k=v in env, replacing an earlier value in place.
func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			out := slices.Clone(env)
			out[i] = k + "=" + v
			return out
		}
	}
	return append(slices.Clone(env), k+"="+v)
}

// userID maps USER to the two users a Moat image has. Any other user is
// built as the sandbox user with a note: the image's passwd is Moat's own
// (finalize), so a user a RUN step created does not survive the build,
// and every run uses the sandbox user anyway.
func userID(u string) (uid int, note string) {
	name, _, _ := strings.Cut(u, ":")
	switch name {
	case "root", "0":
		return 0, ""
	case "sandbox", "1000":
		return 1000, ""
	}
	return 1000, "later RUN steps run as the sandbox user (1000): a Moat image has root and sandbox only"
}

// checkDest refuses a COPY or WORKDIR target that every run mounts anew.
func checkDest(dest string) error {
	c := path.Clean(dest)
	for _, m := range mountedFresh {
		if c == m || strings.HasPrefix(c, m+"/") {
			return fmt.Errorf("%s is mounted fresh for every run, so nothing a build puts there survives; use another directory (e.g. /app)", m)
		}
	}
	return nil
}

func fileLabel(p *Plan) string {
	if p.File == "" {
		return "Dockerfile"
	}
	return path.Base(strings.ReplaceAll(p.File, "\\", "/"))
}

// commandText is how a RUN is shown in its error: the shell text, or
// the exec form's argv.
func commandText(s Step) string {
	if len(s.Argv) == 3 && s.Argv[0] == "/bin/sh" && s.Argv[1] == "-c" {
		return s.Argv[2]
	}
	return strings.Join(s.Argv, " ")
}

// oneLine shortens text for a progress line.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
