package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// BuildStep is one untrusted step of an image build (a Dockerfile RUN, a
// pip or npm install): it runs in a native-tier sandbox whose root is the
// image tree being built, writable, and never on the host.
type BuildStep struct {
	// Argv is the command; Argv[0] is looked up in the tree's PATH.
	Argv []string
	// Env is the complete environment (nothing is inherited).
	Env []string
	// Dir is the absolute working directory inside the tree; it must
	// exist.
	Dir string
	// UID is the user the step runs as inside its user namespace: 0 (the
	// namespace's root, what a Dockerfile RUN gets by default) or the
	// sandbox user 1000. Never host root.
	UID int
	// Hosts is the step's egress allowlist ("host" or "host:port", as the
	// manifest's network.allow). Empty: no network at all.
	Hosts []string
	// AllowAddresses grants reserved IP addresses or prefixes to the
	// Hosts (as the manifest's network.allow_addresses): an index on a
	// private network, or one the host resolves to such an address. The
	// operator's choice, never the build file's.
	AllowAddresses []string
	// Stdout and Stderr receive the step's output as it runs (nil
	// discards).
	Stdout, Stderr io.Writer
	// Timeout bounds the step (0: DefaultBuildStepTimeout).
	Timeout time.Duration

	// CPUs, MemoryBytes and Pids bound the step's cgroup (0: the
	// DefaultBuildStep* values, generous enough for a compiler or an
	// npm install).
	CPUs        float64
	MemoryBytes int64
	Pids        int
}

// DefaultBuildStepTimeout bounds a build step that names no timeout.
const DefaultBuildStepTimeout = 30 * time.Minute

// The other bounds of a build step that names none.
const (
	DefaultBuildStepCPUs        = 2
	DefaultBuildStepMemoryBytes = 4 << 30
	DefaultBuildStepPids        = 1024
)

// buildStepTier is the tier every build step runs on: the one that can
// make an image tree its sandbox's writable root (tier.Capabilities.
// BuildSteps).
const buildStepTier = "native"

// ErrBuildStepTimeout is wrapped into the error of a build step that ran
// past its timeout (and was killed with everything it started).
var ErrBuildStepTimeout = errors.New("build step timed out")

// RunBuildStep runs one build step in a sandbox whose root is the host
// directory root, read-write, and returns the step's exit status. The
// error is for Moat's own failures and invalid steps; a step that ran and
// failed returns its non-zero status and a nil error. Files the step
// writes are owned, on the host, by the ids they have inside (uid 0
// inside: host root's files in the tree), so the tree can be hashed and
// published like any other.
//
// A step killed by its timeout (ErrBuildStepTimeout), its memory or CPU
// limit, or ctx returns -1 and an error that says which; the tree's
// ownership is restored then too.
func (e *Engine) RunBuildStep(ctx context.Context, root string, step BuildStep) (exitCode int, err error) {
	if err := checkBuildStep(&step); err != nil {
		return -1, err
	}
	root, err = e.checkBuildRoot(root)
	if err != nil {
		return -1, err
	}
	t, err := e.Tier(buildStepTier)
	if err != nil {
		return -1, fmt.Errorf("build step: %w", err)
	}
	if !t.Capabilities().BuildSteps {
		return -1, fmt.Errorf("build step: the %s tier cannot run build steps on this host", t.Name())
	}

	id := newID()
	release, err := e.claim(id)
	if err != nil {
		return -1, err
	}
	clean := true
	defer func() { release(clean) }()
	runDir := filepath.Join(e.opts.Home, "runs", id)
	spec := &tier.Spec{
		ID:        id,
		ImageRoot: root,
		Limits:    buildStepLimits(&step),
		StateDir:  runDir,
		Build:     &tier.BuildSpec{AsRoot: step.UID == 0},
	}
	env := tier.Environment(step.Env)
	if len(step.Hosts) > 0 {
		n := manifest.Default().Network
		n.Mode, n.Allow, n.AllowAddresses = "allowlist", step.Hosts, step.AllowAddresses
		// Package downloads: a larger budget than a run's.
		n.MaxBytesIn = 4 << 30
		eg, err := e.startEgress(runDir, n, nil)
		if err != nil {
			return -1, fmt.Errorf("build step: %w", err)
		}
		// Once the step is over: what the proxy refused goes to the
		// step's output, with the fix. A package manager shows a refused
		// CONNECT as a bare "403 Forbidden", which names neither the
		// reason nor the flag that grants it.
		defer func() {
			attempts, _, _ := eg.stop()
			if step.Stderr != nil {
				writeRefusals(step.Stderr, attempts, step.Hosts)
			}
		}()
		spec.EgressSocket = eg.socket
		env = tier.Environment(step.Env, buildProxyEnv())
	}

	sb, err := t.Prepare(ctx, spec)
	if err != nil {
		// The tier undid what it could; what it could not (a busy
		// cgroup, a tree still shifted) stays recorded in the run's
		// directory for GC.
		clean = !errors.Is(err, tier.ErrLeftovers)
		return -1, fmt.Errorf("build step: prepare sandbox: %w", err)
	}
	var mu sync.Mutex // one writer may serve both streams
	out, execErr := sb.Exec(ctx, &tier.Command{
		Argv:   step.Argv,
		Env:    env,
		Dir:    step.Dir,
		Stdout: lockedWriter(&mu, step.Stdout),
		Stderr: lockedWriter(&mu, step.Stderr),
	})
	// Destroy kills what is left and gives the tree back its ids; only
	// then is the step over.
	if derr := sb.Destroy(); derr != nil {
		clean = false
		return -1, fmt.Errorf("build step: destroy sandbox %s: %w", id, derr)
	}
	if execErr != nil {
		return -1, fmt.Errorf("build step %s: %w", step.Argv[0], execErr)
	}
	return buildStepStatus(ctx, out, spec.Limits)
}

// maxRefusalLines bounds the refusals a build step's output lists.
const maxRefusalLines = 5

// writeRefusals writes one line per destination the egress proxy refused
// a build step (host, port, reason), with how to grant it where the
// operator can: an index on a reserved address (--allow-address), a host
// the build file does not name.
func writeRefusals(w io.Writer, attempts []result.NetworkAttempt, hosts []string) {
	seen := map[string]bool{}
	n := 0
	for _, a := range attempts {
		if a.Allowed {
			continue
		}
		key := fmt.Sprintf("%s:%d %s", a.Host, a.Port, a.Reason)
		if seen[key] {
			continue
		}
		seen[key] = true
		if n++; n > maxRefusalLines {
			fmt.Fprintf(w, "moat: ... and more refused destinations\n")
			return
		}
		hint := ""
		switch a.Reason {
		case egress.ReasonPrivateAddress:
			addr := cmp.Or(a.Address, "ADDRESS")
			hint = fmt.Sprintf("; it resolves to %s, a reserved address: if that is really your index (or a TLS-intercepting proxy's), grant it with moat image build --allow-address %s (BuildStep.AllowAddresses)", addr, addr)
		case egress.ReasonNotAllowlisted:
			hint = fmt.Sprintf("; this step may reach only %s, the indexes its build file names", strings.Join(hosts, ", "))
		}
		fmt.Fprintf(w, "moat: the egress proxy refused %s port %d (%s)%s\n", a.Host, a.Port, a.Reason, hint)
	}
}

// buildStepStatus turns a step's outcome into RunBuildStep's answer: an
// exit status for a step that ended by itself, an error for one that
// Moat ended.
func buildStepStatus(ctx context.Context, out *tier.Outcome, lim tier.Limits) (int, error) {
	if ctx.Err() != nil {
		return -1, fmt.Errorf("build step cancelled, everything it started was killed: %w", context.Cause(ctx))
	}
	switch out.Termination {
	case result.Exited, result.Signaled:
		return out.ExitCode, nil
	case result.Timeout:
		return -1, fmt.Errorf("%w after %s: everything it started was killed (BuildStep.Timeout)", ErrBuildStepTimeout, lim.Timeout)
	case result.OOM:
		return -1, fmt.Errorf("build step ran out of memory (%d bytes, BuildStep.MemoryBytes) and was killed", lim.MemoryBytes)
	case result.Pids:
		return -1, fmt.Errorf("build step hit its process limit (%d, BuildStep.Pids)", lim.Pids)
	case result.CPUTime:
		return -1, fmt.Errorf("build step used up its CPU time (%s) and was killed", lim.CPUTime)
	}
	return -1, fmt.Errorf("build step ended with %s: %s", out.Termination, out.Error)
}

// buildStepLimits are the step's cgroup and rlimit bounds: its own where
// it names them, generous build defaults otherwise. /tmp is memory-backed
// and charged to the step's memory; /workspace stays a small tmpfs (it is
// not part of the image).
func buildStepLimits(step *BuildStep) tier.Limits {
	timeout := step.Timeout
	if timeout == 0 {
		timeout = DefaultBuildStepTimeout
	}
	cpus := step.CPUs
	if cpus == 0 {
		cpus = DefaultBuildStepCPUs
	}
	mem := step.MemoryBytes
	if mem == 0 {
		mem = DefaultBuildStepMemoryBytes
	}
	pids := step.Pids
	if pids == 0 {
		pids = DefaultBuildStepPids
	}
	return tier.Limits{
		CPUs:        cpus,
		MemoryBytes: mem,
		Pids:        pids,
		Timeout:     timeout,
		// RLIMIT_CPU is per process: a backstop, every CPU busy for the
		// whole timeout.
		CPUTime:        timeout * time.Duration(max(1, int(cpus+0.999))),
		OpenFiles:      8192,
		FileSizeBytes:  8 << 30,
		WorkspaceBytes: 64 << 20,
		WorkspaceFiles: 4096,
		TmpBytes:       min(2<<30, mem/2),
	}
}

// buildProxyEnv is proxyEnv plus the variables of the package managers
// that do not read the usual ones (npm, pip's own).
func buildProxyEnv() map[string]string {
	env := proxyEnv()
	url := env["HTTP_PROXY"]
	env["npm_config_proxy"] = url
	env["npm_config_https_proxy"] = url
	env["PIP_PROXY"] = url
	return env
}

// checkBuildStep refuses a step Moat cannot run as asked, naming the
// field, and fills in the default timeout.
func checkBuildStep(step *BuildStep) error {
	if len(step.Argv) == 0 || step.Argv[0] == "" {
		return fmt.Errorf("%w: build step Argv %q: no command", ErrUsage, step.Argv)
	}
	if step.UID != 0 && step.UID != 1000 {
		return fmt.Errorf("%w: build step UID %d: must be 0 (root of the step's own user namespace) or 1000 (the sandbox user)", ErrUsage, step.UID)
	}
	if !filepath.IsAbs(step.Dir) {
		return fmt.Errorf("%w: build step Dir %q: must be an absolute path inside the tree (e.g. /)", ErrUsage, step.Dir)
	}
	if step.Timeout < 0 {
		return fmt.Errorf("%w: build step Timeout %s: must be positive (0: %s)", ErrUsage, step.Timeout, DefaultBuildStepTimeout)
	}
	if step.CPUs < 0 || step.MemoryBytes < 0 || step.Pids < 0 {
		return fmt.Errorf("%w: build step CPUs %g, MemoryBytes %d, Pids %d: must not be negative (0: the defaults)", ErrUsage, step.CPUs, step.MemoryBytes, step.Pids)
	}
	for i, h := range step.Hosts {
		if _, err := egress.ParseRule(h); err != nil {
			return fmt.Errorf("%w: build step Hosts[%d] %q: %v", ErrUsage, i, h, err)
		}
	}
	if len(step.AllowAddresses) > 0 && len(step.Hosts) == 0 {
		return fmt.Errorf("%w: build step AllowAddresses %q: grants addresses to Hosts, and the step has none", ErrUsage, step.AllowAddresses)
	}
	for i, a := range step.AllowAddresses {
		if _, err := egress.ParsePrefix(a); err != nil {
			return fmt.Errorf("%w: build step AllowAddresses[%d] %q: %v", ErrUsage, i, a, err)
		}
	}
	return nil
}

// checkBuildRoot returns root, refusing what must never become a
// sandbox's writable root: a relative, missing or symlinked path, a
// non-directory, "/" or any directory that holds Moat's home, a run's
// private directory, or a published image.
func (e *Engine) checkBuildRoot(root string) (string, error) {
	bad := func(why string) error {
		return fmt.Errorf("%w: build step root %q: %s", ErrUsage, root, why)
	}
	if !filepath.IsAbs(root) {
		return "", bad("not an absolute path")
	}
	clean := filepath.Clean(root)
	fi, err := os.Lstat(clean)
	if err != nil {
		return "", bad(fmt.Sprintf("%v; pass the directory that holds the image tree", err))
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return "", bad("is a symbolic link; pass the directory it names")
	}
	if !fi.IsDir() {
		return "", bad(fmt.Sprintf("not a directory (%s); pass the directory itself", fi.Mode().Type()))
	}
	// The tier binds and walks the tree by this path: no link may
	// redirect it elsewhere.
	real, err := filepath.EvalSymlinks(clean)
	if err != nil {
		return "", bad(err.Error())
	}
	if real != clean {
		return "", bad(fmt.Sprintf("goes through a symbolic link; pass the resolved path %s", real))
	}
	home, err := filepath.EvalSymlinks(e.opts.Home)
	if err != nil {
		home = filepath.Clean(e.opts.Home)
	}
	if clean == "/" || within(home, clean) {
		return "", bad(fmt.Sprintf("is / or holds Moat's home %s: the step would own the host's files; pass the image tree's own directory", home))
	}
	if within(clean, filepath.Join(home, "runs")) {
		return "", bad(fmt.Sprintf("is inside Moat's run directories (%s)", filepath.Join(home, "runs")))
	}
	if rel, err := filepath.Rel(filepath.Join(home, "images"), clean); err == nil && !strings.HasPrefix(rel, "..") {
		if parts := strings.Split(rel, string(filepath.Separator)); len(parts) >= 2 && isDigestHex(parts[1]) {
			return "", bad("is inside a published image, which never changes; build in a new tree")
		}
	}
	// The sandbox's init reaches the tree by path as an unprivileged host
	// id (the run's range): every directory above it must let others
	// through, as Moat's home does (0711).
	for d := filepath.Dir(clean); ; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "", bad(fmt.Sprintf("its parent %s cannot be traversed by the sandbox's unprivileged ids (mode %v); fix with: chmod o+x %s", d, modeOf(fi), d))
		}
		if d == "/" {
			break
		}
	}
	return clean, nil
}

func modeOf(fi os.FileInfo) any {
	if fi == nil {
		return "unknown"
	}
	return fi.Mode().Perm()
}

// within reports whether path is dir or below it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

func isDigestHex(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// lockedWriter serialises the step's two output streams, which the tier
// copies from two goroutines, into writers that may be one and the same.
func lockedWriter(mu *sync.Mutex, w io.Writer) io.Writer {
	if w == nil {
		return nil
	}
	return writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return w.Write(b)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// BuildImage builds the built-in image name (image.Store.Build) with this
// engine's build steps as its sandbox: the host bootstraps the essential
// set and downloads the packages, and their install (with every
// maintainer script) runs in a native-tier sandbox with no network.
func (e *Engine) BuildImage(ctx context.Context, name string, opts image.BuildOptions) (*image.Image, error) {
	opts.Install = func(ctx context.Context, root string, argv, env []string, out io.Writer) (int, error) {
		return e.RunBuildStep(ctx, root, BuildStep{Argv: argv, Env: env, Dir: "/", UID: 0, Stdout: out, Stderr: out})
	}
	return e.images.Build(ctx, name, opts)
}
