package wasm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/experimental"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	experimentalsysfs "github.com/tetratelabs/wazero/experimental/sysfs"
	"github.com/tetratelabs/wazero/sys"

	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// Prepare implements tier.Tier: a workspace directory under the run's
// state directory. Nothing else exists until Exec.
func (w *WASM) Prepare(ctx context.Context, spec *tier.Spec) (tier.Sandbox, error) {
	if err := tier.CheckNoBuild(Name, spec); err != nil {
		return nil, err
	}
	if spec.EgressSocket != "" {
		return nil, errors.New("network.mode: allowlist is not supported by the wasm tier: a WebAssembly guest has no sockets here; use network.mode: none, or the native tier for network access")
	}
	if spec.Session {
		return nil, errors.New("tier: the wasm tier cannot run sessions (many commands); use one-shot runs")
	}
	if spec.StateDir == "" {
		return nil, errors.New("wasm: no state directory in the spec")
	}
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", spec.StateDir, err)
	}
	ws := filepath.Join(spec.StateDir, "workspace")
	if err := os.Mkdir(ws, 0o700); err != nil {
		return nil, fmt.Errorf("create workspace %s: %w", ws, err)
	}
	return &sandbox{w: w, spec: spec, ws: ws}, nil
}

type sandbox struct {
	w    *WASM
	spec *tier.Spec
	ws   string

	mu        sync.Mutex
	destroyed bool
}

// Workspace implements tier.Sandbox. The guest runs in Moat's own process:
// files belong to Moat's user.
func (s *sandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: s.ws, UID: os.Geteuid(), GID: os.Getegid()}
}

// Destroy implements tier.Sandbox.
func (s *sandbox) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return nil
	}
	s.destroyed = true
	if err := os.RemoveAll(s.ws); err != nil {
		return fmt.Errorf("remove workspace %s: %w", s.ws, err)
	}
	return nil
}

// Commands the tier accepts, by argv[0] (a path's last element counts).
var (
	pythonNames = map[string]bool{"python3": true, "python": true, "python3.11": true}
	jsNames     = map[string]bool{"node": true, "qjs": true, "js": true, "quickjs": true}
)

// ErrNotFound-style outcome: argv[0] names no guest.
const notFoundExit = 127

// guestArgv maps a command to a guest and its argv, or explains why not.
//
//	python3 [python options] -c CODE [ARG...] | FILE [ARG...] | -m MODULE | -
//	node|qjs -e CODE [ARG...] | --eval CODE [ARG...] | FILE [ARG...]
//
// A relative FILE is in /workspace.
func (w *WASM) guestArgv(argv []string) (*guest, []string, string) {
	base := filepath.Base(argv[0])
	switch {
	case pythonNames[base]:
		return w.guests["python"], append([]string{"python3"}, argv[1:]...), ""
	case jsNames[base]:
		a := append([]string{"qjs"}, argv[1:]...)
		if len(a) > 1 && a[1] == "--eval" {
			a[1] = "-e"
		}
		if len(a) < 2 || (a[1] == "-e" && len(a) < 3) || (a[1] != "-e" && strings.HasPrefix(a[1], "-")) {
			return nil, nil, fmt.Sprintf("moat wasm tier: %s accepts only: %s -e CODE [ARG...] or %s FILE [ARG...]\n", base, base, base)
		}
		if a[1] != "-e" && !strings.HasPrefix(a[1], "/") {
			a[1] = "/workspace/" + a[1]
		}
		return w.guests["js"], a, ""
	}
	return nil, nil, fmt.Sprintf("moat wasm tier: %s: command not found (this tier runs only WebAssembly guests: python3 and node/qjs; use the native tier for other programs)\n", argv[0])
}

// Exec implements tier.Sandbox.
func (s *sandbox) Exec(ctx context.Context, cmd *tier.Command) (_ *tier.Outcome, err error) {
	// wazero turns a guest's trap into an error; a panic here would be a
	// bug in Moat or wazero, and must not take down a server's process.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("wasm tier: panic while running the guest: %v", r)
		}
	}()
	start := time.Now()
	out := &tier.Outcome{Runtime: s.w.version}
	g, argv, refusal := s.w.guestArgv(cmd.Argv)
	if g == nil {
		io.WriteString(stderrOf(cmd), refusal)
		out.Termination, out.ExitCode = result.Exited, notFoundExit
		if !strings.Contains(refusal, "not found") {
			out.ExitCode = 2
		}
		out.Duration = time.Since(start)
		return out, nil
	}
	lim := s.spec.Limits
	compiled, err := s.w.compile(ctx, g)
	if err != nil {
		return nil, fmt.Errorf("compile %s guest: %w", g.name, err)
	}
	wsRoot, err := os.OpenRoot(s.ws)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	defer wsRoot.Close()
	q, err := newQuota(s.ws, lim.WorkspaceBytes, int64(lim.WorkspaceFiles), lim.FileSizeBytes)
	if err != nil {
		return nil, fmt.Errorf("measure workspace: %w", err)
	}
	q.maxOpen = lim.OpenFiles
	wsFS := &rootFS{root: wsRoot, q: q}
	// The workspace is both /workspace and the root: wasi-libc resolves a
	// relative path against "/" (WASI has no working directory), so "/"
	// makes relative paths mean /workspace, as on the other tiers. Any
	// other absolute path (/etc/passwd) lands inside the workspace too.
	fsc := wazero.NewFSConfig().(experimentalsysfs.FSConfig).WithSysFSMount(wsFS, "/")
	fsc = fsc.(experimentalsysfs.FSConfig).WithSysFSMount(wsFS, "/workspace")
	if g.lib != "" {
		libRoot, err := os.OpenRoot(g.lib)
		if err != nil {
			return nil, fmt.Errorf("open %s: %w", g.lib, err)
		}
		defer libRoot.Close()
		// Read-only, and through os.Root: the library is Moat's own files,
		// but a path trick must not leave it either.
		fsc = fsc.(experimentalsysfs.FSConfig).WithSysFSMount(readOnly(libRoot), g.libAt)
	}

	timeout := lim.Timeout
	if lim.CPUTime > 0 && (timeout == 0 || lim.CPUTime < timeout) {
		// One guest thread: CPU time never exceeds wall time, so a wall
		// limit at the CPU-time limit is at least as strict.
		timeout = lim.CPUTime
	}
	if cmd.Timeout > 0 && cmd.Timeout < timeout {
		timeout = cmd.Timeout
	}
	runCtx := ctx
	var cancel context.CancelFunc
	if timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		runCtx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	mem := &memLimit{max: uint64(lim.MemoryBytes)}
	runCtx = experimental.WithMemoryAllocator(runCtx, mem)

	mc := wazero.NewModuleConfig().
		WithName(""). // anonymous: many instances of one guest at once
		WithArgs(argv...).
		WithFSConfig(fsc).
		WithStdout(writerOf(cmd.Stdout)).
		WithStderr(stderrOf(cmd)).
		WithSysWalltime().WithSysNanotime().WithSysNanosleep().
		WithRandSource(rand.Reader).
		WithStartFunctions() // _start is called below, to keep the memory readable
	if cmd.Stdin != nil {
		mc = mc.WithStdin(cmd.Stdin)
	}
	for _, kv := range s.env(g, cmd.Env) {
		k, v, _ := strings.Cut(kv, "=")
		mc = mc.WithEnv(k, v)
	}

	if lim.MemoryBytes > 0 {
		for _, md := range compiled.ExportedMemories() {
			if need := uint64(md.Min()) * 65536; need > uint64(lim.MemoryBytes) {
				fmt.Fprintf(stderrOf(cmd), "moat wasm tier: the %s guest needs %d bytes of memory to start; resources.memory is %d\n", g.name, need, lim.MemoryBytes)
				out.Termination, out.Duration = result.OOM, time.Since(start)
				out.Violations = append(out.Violations, result.Violation{Kind: "memory", Detail: fmt.Sprintf("the guest's initial memory (%d bytes) exceeds the limit", need), Limit: fmt.Sprint(lim.MemoryBytes)})
				return out, nil
			}
		}
	}
	mod, err := s.w.rt.InstantiateModule(runCtx, compiled, mc)
	if err != nil {
		return s.finish(out, start, runCtx, mem, q, 0, err)
	}
	defer mod.Close(context.Background())
	var peak uint64
	if m := mod.Memory(); m != nil {
		peak = uint64(m.Size())
	}
	_, err = mod.ExportedFunction("_start").Call(runCtx)
	if m := mod.Memory(); m != nil && uint64(m.Size()) > peak {
		peak = uint64(m.Size())
	}
	if mem.peak > peak {
		peak = mem.peak
	}
	return s.finish(out, start, runCtx, mem, q, peak, err)
}

// finish classifies how the guest ended.
func (s *sandbox) finish(out *tier.Outcome, start time.Time, runCtx context.Context, mem *memLimit, q *quota, peak uint64, err error) (*tier.Outcome, error) {
	out.Duration = time.Since(start)
	out.CPU = out.Duration // one guest thread, busy or sleeping: an upper bound
	out.PeakMemory = int64(peak)
	var exit *sys.ExitError
	switch {
	case err == nil:
		out.Termination = result.Exited
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded:
		out.Termination, out.ExitCode, out.Signal = result.Timeout, 124, 9
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeContextCanceled:
		out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+9, 9
	case errors.As(err, &exit):
		out.Termination, out.ExitCode = result.Exited, int(exit.ExitCode())
	case runCtx.Err() != nil && errors.Is(runCtx.Err(), context.DeadlineExceeded):
		out.Termination, out.ExitCode, out.Signal = result.Timeout, 124, 9
	default:
		// A trap: unreachable, out-of-bounds access, stack exhaustion. The
		// guest is dead, Moat is fine: like a signal on the other tiers.
		out.Termination, out.ExitCode, out.Signal = result.Signaled, 128+11, 11
		out.Violations = append(out.Violations, result.Violation{Kind: "trap", Detail: firstLine(err.Error())})
	}
	if mem.denied {
		out.Violations = append(out.Violations, result.Violation{Kind: "memory", Detail: fmt.Sprintf("linear memory growth to %d bytes refused", mem.deniedAt), Limit: fmt.Sprint(mem.max)})
		if out.Termination != result.Exited || out.ExitCode != 0 {
			out.Termination, out.ExitCode, out.Signal = result.OOM, 128+9, 9
		}
	}
	q.mu.Lock()
	hitDisk, hitFiles, hitFile, hitOpen := q.hitDisk, q.hitFiles, q.hitFileSize, q.hitOpen
	q.mu.Unlock()
	if hitOpen {
		out.Violations = append(out.Violations, result.Violation{Kind: "open-files", Detail: "an open past the open-files limit was refused", Limit: fmt.Sprint(q.maxOpen)})
	}
	if hitFile {
		out.Violations = append(out.Violations, result.Violation{Kind: "file-size", Detail: "a write past the file-size limit was refused (EFBIG)", Limit: fmt.Sprint(q.maxFile)})
	}
	if hitDisk {
		out.Violations = append(out.Violations, result.Violation{Kind: "disk", Detail: "a write past the workspace size limit was refused", Limit: fmt.Sprint(q.maxBytes)})
	}
	if hitFiles {
		out.Violations = append(out.Violations, result.Violation{Kind: "files", Detail: "a new file past the workspace file-count limit was refused", Limit: fmt.Sprint(q.maxFiles)})
	}
	if (hitDisk || hitFiles) && out.Termination == result.Exited && out.ExitCode != 0 {
		out.Termination = result.DiskLimit
	}
	return out, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// env is what the guest sees: the variables the command carries minus the
// image's defaults (the image is not the guest's world here), plus what
// the guest needs to find its library.
func (s *sandbox) env(g *guest, env []string) []string {
	img := map[string]bool{}
	for _, kv := range s.spec.ImageEnv {
		img[kv] = true
	}
	var out []string
	for _, kv := range env {
		if !img[kv] && strings.Contains(kv, "=") {
			out = append(out, kv)
		}
	}
	if g.name == "python" {
		// The stdlib is read-only and precompiled: never write .pyc.
		out = append(out, "PYTHONHOME=/usr/local", "PYTHONDONTWRITEBYTECODE=1")
	}
	return out
}

func writerOf(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

func stderrOf(cmd *tier.Command) io.Writer { return writerOf(cmd.Stderr) }

// memLimit backs a run's linear memory and refuses growth past max: the
// manifest's memory limit, per run, on a runtime shared by all runs.
type memLimit struct {
	max      uint64
	peak     uint64
	denied   bool
	deniedAt uint64
}

// Allocate implements experimental.MemoryAllocator.
func (m *memLimit) Allocate(capacity, max uint64) experimental.LinearMemory {
	return &linearMemory{lim: m}
}

type linearMemory struct {
	lim *memLimit
	buf []byte
}

// Reallocate implements experimental.LinearMemory.
func (l *linearMemory) Reallocate(size uint64) []byte {
	if l.lim.max > 0 && size > l.lim.max {
		l.lim.denied, l.lim.deniedAt = true, size
		return nil
	}
	if size > l.lim.peak {
		l.lim.peak = size
	}
	if uint64(cap(l.buf)) >= size {
		l.buf = l.buf[:size]
		return l.buf
	}
	// Grow with headroom so a guest growing a page at a time is not
	// quadratic; never past the limit.
	c := size * 5 / 4
	if l.lim.max > 0 && c > l.lim.max {
		c = l.lim.max
	}
	nb := make([]byte, size, c)
	copy(nb, l.buf)
	l.buf = nb
	return l.buf
}

// Free implements experimental.LinearMemory.
func (l *linearMemory) Free() { l.buf = nil }

// readOnly serves root's files read-only (os.Root's fs.FS refuses ".."
// and symlinks out of the root; wazero's ReadFS refuses every write).
func readOnly(root *os.Root) experimentalsys.FS {
	return &experimentalsysfs.ReadFS{FS: &experimentalsysfs.AdaptFS{FS: root.FS()}}
}

// RunsGuest reports whether argv names one of the tier's guests (python3,
// node/qjs): anything else (sh, a Linux program) is refused with exit 127.
// The red-team suite uses it to tell an attack that never ran from one
// that was contained.
func (w *WASM) RunsGuest(argv []string) bool {
	if len(argv) == 0 {
		return false
	}
	g, _, _ := w.guestArgv(argv)
	return g != nil
}
