// Package engine orchestrates one run: it picks the tier, prepares a
// sandbox, copies the inputs in, starts the program, captures bounded
// output, collects the outcome and the workspace diff, copies results out
// and destroys the sandbox. It is the only place that knows the order of
// these steps; tiers know only their own mechanism.
//
// The engine must never hand a sandbox to a second run, and never return
// before the sandbox it prepared is destroyed.
package engine

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

// Options configure an Engine. The zero value uses DefaultHome and the
// running binary as init.
type Options struct {
	// Home is Moat's state directory ($MOAT_HOME).
	Home string
	// Exe is the executable the tiers start inside sandboxes (native's
	// init, gVisor's init, the microvm agent): moat itself or moat-guest.
	// Default: GuestBinary().
	Exe string
	// Moat is the moat binary re-executed for host-side helpers (the
	// microvm tier's VMM jailer), never moat-guest. Default: Exe when the
	// caller set it (tests pass a built moat), else /proc/self/exe.
	Moat string
	// Progress receives human-readable progress (image builds). Nil
	// discards it.
	Progress io.Writer
	// NoAutoBuild makes a missing image an error instead of building it.
	NoAutoBuild bool
	// Tiers adds tiers by name beside the built-in ones (tests use it to
	// run the red-team corpus against a deliberately unsandboxed runner).
	Tiers map[string]tier.Tier
	// Pools are warm pools, filled once StartPools is called.
	Pools []PoolConfig
	// Secrets gives the values of the secrets manifests name (the host's
	// secret store). Nil: a manifest with secrets is refused.
	Secrets SecretSource
	// UpstreamRootCAs verify the real hosts of secret-bound connections,
	// which the egress proxy re-originates TLS to. Nil (production): the
	// system roots. The red-team runner and tests set it to reach a local
	// test API that has its own certificate; it never changes what the
	// sandbox trusts (the run CA only).
	UpstreamRootCAs *x509.CertPool
	// Incidents keeps the evidence bundles of flagged runs (package
	// incident), normally incident.Open(IncidentDir(Home), policy): moat
	// run and moat serve set it unless the operator turned evidence off.
	// Nil: none are kept (a library user, the red-team runner and tests
	// opt in; a manifest cannot turn it on or off).
	Incidents *incident.Store
}

// Engine runs sandboxed programs.
type Engine struct {
	opts     Options
	images   *image.Store
	guestWhy string // which binary runs inside sandboxes, and why

	mu    sync.Mutex
	tiers map[string]tier.Tier

	// autoBuild admits one automatic image build at a time (a token in a
	// channel, so a waiter's context still ends its wait): the warm pool
	// and the first request of a fresh install both find the image
	// missing, and the second must find the first's build, not repeat it.
	autoBuild chan struct{}

	pools    []*pool
	startObs atomic.Pointer[func(tier string, poolHit bool, d time.Duration)] // ObserveStarts
	poolWG   sync.WaitGroup
	poolCtx  context.Context
	poolStop context.CancelFunc
}

// DefaultHome is $MOAT_HOME, else /var/lib/moat for root, else
// ~/.cache/moat.
func DefaultHome() string {
	if h := os.Getenv("MOAT_HOME"); h != "" {
		return h
	}
	if os.Geteuid() == 0 {
		return "/var/lib/moat"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "moat")
	}
	return filepath.Join(os.TempDir(), "moat-"+fmt.Sprint(os.Geteuid()))
}

// New returns an engine. It creates the state directory; callers run GC to
// remove what runs killed earlier left behind.
func New(opts Options) (*Engine, error) {
	if opts.Home == "" {
		opts.Home = DefaultHome()
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	// The home is traversable (not listable) by others: the sandbox's init
	// runs as an unprivileged host id and must reach the image root below
	// it. Run state below it stays private.
	if err := os.MkdirAll(opts.Home, 0o711); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w (set MOAT_HOME to a writable directory)", opts.Home, err)
	}
	if fi, err := os.Stat(opts.Home); err == nil && fi.Mode().Perm()&0o001 == 0 && os.Geteuid() == 0 {
		return nil, fmt.Errorf("state directory %s has mode %04o: the sandbox's unprivileged init cannot reach the images below it; fix with: chmod o+x %s", opts.Home, fi.Mode().Perm(), opts.Home)
	}
	if err := os.Mkdir(filepath.Join(opts.Home, "runs"), 0o700); err != nil && !os.IsExist(err) {
		return nil, fmt.Errorf("create %s: %w", filepath.Join(opts.Home, "runs"), err)
	}
	e := &Engine{opts: opts, images: image.NewStore(filepath.Join(opts.Home, "images")), tiers: map[string]tier.Tier{}, autoBuild: make(chan struct{}, 1)}
	if e.opts.Moat == "" {
		e.opts.Moat = cmp.Or(e.opts.Exe, "/proc/self/exe")
	}
	if e.opts.Exe == "" {
		e.opts.Exe, e.guestWhy = GuestBinary()
	} else {
		e.guestWhy = e.opts.Exe + " (Options.Exe)"
	}
	e.poolCtx, e.poolStop = context.WithCancel(context.Background())
	for name, t := range opts.Tiers {
		e.tiers[name] = t
	}
	return e, nil
}

// Images is the engine's image store.
func (e *Engine) Images() *image.Store { return e.images }

// Guest names the executable the tiers start inside sandboxes and why
// that one (moat doctor shows it).
func (e *Engine) Guest() string { return e.guestWhy }

// Home is the engine's state directory.
func (e *Engine) Home() string { return e.opts.Home }

// tierConfig is how this engine's tiers are built (moat doctor builds
// them through Tier too, so both agree).
func (e *Engine) tierConfig() tier.Config {
	return tier.Config{Home: e.opts.Home, Exe: e.opts.Exe, Moat: e.opts.Moat}
}

// Tier returns the named tier, initialising it on first use: the tier
// registered under that name (tier.Register; cmd/moat imports the four
// tiers), built with this engine's home and binaries.
func (e *Engine) Tier(name string) (tier.Tier, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.tiers[name]; ok {
		return t, nil
	}
	newTier, err := tier.Lookup(name)
	if err != nil {
		return nil, &manifest.FieldError{Field: "tier", Value: name, Problem: "is not implemented yet; available: " + strings.Join(tier.List(), ", ")}
	}
	t, err := newTier(e.tierConfig())
	if err != nil {
		return nil, err
	}
	e.tiers[name] = t
	return t, nil
}

// Request is one run.
type Request struct {
	// ID names the run in its Result; default: its sandbox's id. (A
	// server names runs before a sandbox is taken from a pool.)
	ID       string
	Manifest *manifest.Manifest
	// Argv is the command. Empty: the image config's Entrypoint followed
	// by its Cmd (an imported image's); an error when it has neither.
	Argv []string
	// Stdin is the program's standard input; nil means empty.
	Stdin io.Reader
	// LiveStdout and LiveStderr, when set, receive the captured output as
	// it arrives (never more than the caps).
	LiveStdout, LiveStderr io.Writer
	// OutputDir, when set, receives the added and modified files.
	OutputDir string
	// Files are written into /workspace after the inputs (API uploads).
	Files []File
	// Session runs the command as the only command of a session sandbox
	// (init serving commands) instead of a one-shot one: the same result,
	// through the session machinery. The red-team suite uses it to attack
	// that path too.
	Session bool
	// OnStart, when set, is called once the sandbox is prepared and the
	// program is about to start, with a way to list the host pids of the
	// sandbox's processes (for host-side inspection: the red-team suite
	// reads their /proc status from outside). It must not block.
	OnStart func(id string, procs func() ([]int, error))
	// OnRuntime, when set, is called just before OnStart on tiers whose
	// program runs inside a user-space kernel (tier.RuntimeLister), with a
	// way to list the host pids of that kernel's processes. It must not
	// block.
	OnRuntime func(procs func() ([]int, error))
	// Resolver, when set, resolves the host names this run's egress proxy
	// looks up, instead of the host's resolver (the red-team suite counts
	// with one of its own what would have left the host as DNS queries,
	// without sending any).
	Resolver egress.Resolver
	// Evidence says who asked for the run, for its incident bundle when
	// it ends flagged.
	Evidence Evidence
}

// ErrUsage marks errors in what the caller asked for (bad manifest, bad
// command), as opposed to Moat failing.
var ErrUsage = errors.New("invalid request")

// Run executes one request in a fresh sandbox and destroys it. The error
// is for Moat's own failures and invalid requests; the program's fate is in
// the Result.
func (e *Engine) Run(ctx context.Context, req *Request) (*result.Result, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: no request", ErrUsage)
	}
	m := req.Manifest
	if m == nil {
		return nil, fmt.Errorf("%w: no manifest", ErrUsage)
	}
	if len(req.Argv) > 0 && req.Argv[0] == "" {
		return nil, fmt.Errorf("%w: no command given: the command name is empty (%s)", ErrUsage, usageHint)
	}
	if len(req.Argv) == 0 {
		// The image's Entrypoint/Cmd stand in for the command. Refuse
		// before preparing anything when there is none to use.
		img, err := e.images.Lookup(m.Image)
		if err != nil {
			return nil, fmt.Errorf("%w: no command given (%s), and image %q has none to run instead: %w", ErrUsage, usageHint, m.Image, err)
		}
		if _, err := imageCommand(img, nil); err != nil {
			return nil, err
		}
	}
	if req.OutputDir != "" {
		// Refuse before running anything, not after.
		if err := workspace.CheckOutDir(req.OutputDir); err != nil {
			return nil, fmt.Errorf("%w: --output %s: %w", ErrUsage, req.OutputDir, err)
		}
	}
	t, img, err := e.resolve(ctx, m, req.Session)
	if err != nil {
		return nil, err
	}
	argv, err := imageCommand(img, req.Argv)
	if err != nil {
		return nil, err
	}
	p, err := e.take(ctx, t, img, m, req.Session, req.Resolver)
	if err != nil {
		return nil, err
	}
	defer p.close()
	if m.Output.Canaries && p.canaries == nil {
		// A sandbox without egress (from a warm pool, whose key does
		// not hold output:, or new) gets its decoys here; with egress,
		// prepare made them for the proxy.
		if p.canaries, err = output.NewCanaries(); err != nil {
			return nil, err
		}
	}

	ws := p.sb.Workspace()
	owner := workspace.Owner{UID: ws.UID, GID: ws.GID}
	wsLim := workspace.Limits{Bytes: p.lim.WorkspaceBytes, Files: p.lim.WorkspaceFiles, FileBytes: p.lim.FileSizeBytes}
	snap, err := workspace.CopyIn(ws.Dir, m.Inputs, owner, wsLim)
	if err != nil {
		return nil, fmt.Errorf("%w: copy inputs: %w", ErrUsage, err)
	}
	if err := p.plantCanaries(ws.Dir, owner, wsLim); err != nil {
		return nil, err
	}
	if err := p.plantSecretFiles(ws.Dir, owner, wsLim); err != nil {
		return nil, err
	}
	if (p.canaries != nil || len(p.secretFiles) > 0) && len(req.Files) == 0 {
		// The decoys and placeholder files are part of the baseline:
		// the diff shows them only when the program changed them.
		if snap, err = workspace.Scan(ws.Dir, workspace.DiffLimits{MaxEntries: wsLim.Files + 1, MaxHashBytes: wsLim.Bytes}); err != nil {
			return nil, fmt.Errorf("%w: canaries: %w", ErrUsage, err)
		}
	}
	if len(req.Files) > 0 {
		if snap, err = writeFiles(ws.Dir, owner, wsLim, req.Files); err != nil {
			return nil, err
		}
	}

	dir, err := workDir(img, ws.Dir)
	if err != nil {
		return nil, err
	}

	if rl, ok := p.sb.(tier.RuntimeLister); ok && req.OnRuntime != nil {
		req.OnRuntime(rl.RuntimeProcs)
	}
	if req.OnStart != nil {
		procs := func() ([]int, error) { return nil, errors.New("this tier cannot list its processes") }
		if pl, ok := p.sb.(tier.ProcessLister); ok {
			procs = pl.Procs
		}
		req.OnStart(p.id, procs)
	}
	mode := execOnce
	if req.Session {
		mode = execSessionOnce
	}
	x, err := p.start(ctx, m, &execSpec{
		mode:     mode,
		id:       cmp.Or(req.ID, p.id),
		argv:     argv,
		dir:      dir,
		stdin:    req.Stdin,
		stdout:   req.LiveStdout,
		stderr:   req.LiveStderr,
		baseline: snap,
	})
	if err != nil {
		return nil, fmt.Errorf("run: %w", err)
	}
	res, err := x.wait(ctx)
	if err != nil {
		return nil, err
	}
	if req.OutputDir != "" && !res.Withheld {
		rep, err := workspace.CopyOut(ws.Dir, res.Files, req.OutputDir, wsLim)
		if err != nil {
			return nil, fmt.Errorf("copy results to %s: %w", req.OutputDir, err)
		}
		co := &result.CopyOut{Dir: req.OutputDir, Files: len(rep.Copied), Bytes: rep.Bytes, Skipped: []result.Skip{}}
		for _, s := range rep.Skipped {
			co.Skipped = append(co.Skipped, result.Skip{Path: s.Path, Reason: s.Reason})
		}
		res.CopyOut = co
		res.Violations = append(res.Violations, rep.Violations...)
	}
	// The result is final: a flagged run's evidence is copied out while
	// the sandbox (its workspace, its processes) still exists; then the
	// sandbox is destroyed like any other.
	e.keepEvidence(x, res, req.Evidence, ws.Dir)
	if err := p.close(); err != nil {
		return nil, err
	}

	return res, nil
}

// writeFiles writes a caller's uploads into the workspace and returns the
// workspace's state after them (the diff's baseline).
func writeFiles(wsDir string, owner workspace.Owner, lim workspace.Limits, files []File) (*workspace.Snapshot, error) {
	fs, err := workspace.OpenFiles(wsDir, owner, lim)
	if err != nil {
		return nil, err
	}
	defer fs.Close()
	for i, f := range files {
		if _, err := fs.WriteFile(f.Path, f.Data, f.Mode); err != nil {
			return nil, fmt.Errorf("%w: files[%d] %s: %w", ErrUsage, i, f.Path, err)
		}
	}
	snap, err := workspace.Scan(wsDir, workspace.DiffLimits{MaxEntries: lim.Files + 1, MaxHashBytes: lim.Bytes})
	if err != nil {
		return nil, fmt.Errorf("%w: files: %w", ErrUsage, err)
	}
	return snap, nil
}

func (e *Engine) image(ctx context.Context, name string) (*image.Image, error) {
	img, err := e.images.Lookup(name)
	if err == nil || !errors.Is(err, image.ErrNotBuilt) || e.opts.NoAutoBuild {
		return img, err
	}
	select {
	case e.autoBuild <- struct{}{}:
		defer func() { <-e.autoBuild }()
	case <-ctx.Done():
		return nil, fmt.Errorf("build image %s: %w", name, ctx.Err())
	}
	// Built while this call waited for its turn?
	if img, err = e.images.Lookup(name); err == nil || !errors.Is(err, image.ErrNotBuilt) {
		return img, err
	}
	fmt.Fprintf(e.opts.Progress, "moat: image %q is not built yet; building it now (once per machine)\n", name)
	img, err = e.BuildImage(ctx, name, image.BuildOptions{Progress: e.opts.Progress})
	if err != nil {
		return nil, fmt.Errorf("build image %s: %w", name, err)
	}
	return img, nil
}

// limits turns the manifest's resources into the tier's enforced limits.
func limits(m *manifest.Manifest) tier.Limits {
	r := m.Resources
	l := tier.Limits{
		CPUs:           r.CPUs,
		MemoryBytes:    int64(r.Memory),
		Pids:           r.Pids,
		Timeout:        r.Timeout.D(),
		CPUTime:        r.CPUTime.D(),
		OpenFiles:      r.OpenFiles,
		FileSizeBytes:  int64(r.FileSize),
		WorkspaceBytes: int64(m.Workspace.Size),
		WorkspaceFiles: m.Workspace.Files,
		// /tmp is memory-backed like the workspace: a quarter of the
		// memory limit, at most 64 MiB.
		TmpBytes: min(64<<20, int64(r.Memory)/4),
	}
	if l.CPUTime == 0 {
		l.CPUTime = l.Timeout
	}
	return l
}

// environment is the program's whole environment (tier.Environment).
func environment(imageEnv []string, layers ...map[string]string) []string {
	return tier.Environment(imageEnv, layers...)
}

func newID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
