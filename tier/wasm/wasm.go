// Package wasm is the WebAssembly isolation tier: the program is a
// WebAssembly guest (CPython or QuickJS compiled to wasm32-wasi) run by
// wazero inside Moat's own process. A guest has no ambient authority: it
// reaches only what the host hands it through WASI, and this tier hands it
// very little:
//
//   - files: /workspace (read-write, through an os.Root-confined file
//     system that also enforces the workspace's size, file-count and
//     file-size limits) and the guest's runtime library (read-only);
//   - environment: only the variables the manifest names;
//   - stdin, stdout and stderr: the host's capped writers;
//   - clocks and random numbers, as WASI gives them;
//   - no network (WASI preview 1 cannot open sockets and wazero offers no
//     socket host functions here), no processes, no signals.
//
// Memory is bounded per run by refusing memory.grow past the manifest's
// limit; the wall-clock timeout closes the module from another goroutine
// (wazero's WithCloseOnContextDone), which stops even a loop that makes no
// system call. Compiled machine code is cached on disk by digest, so a run
// pays instantiation only.
//
// This package must never give a guest a host function beyond WASI
// preview 1, a preopen other than the two above, or a path outside them.
package wasm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"syscall"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/moat-sandbox/moat/internal/libdir"
	"github.com/moat-sandbox/moat/tier"
)

// Name is the tier's manifest name.
const Name = "wasm"

// DefaultGuests is where scripts/build-wasm-guests installs the guests.
// New looks first beside the running moat (libdir: /usr/lib/moat/wasm,
// where the moat-wasm .deb puts them, for /usr/bin/moat).
const DefaultGuests = libdir.Default + "/wasm"

// BuildHint says how to get the guests.
const BuildHint = "install the moat-wasm package (scripts/package --wasm builds it), or build them with scripts/build-wasm-guests (run by scripts/setup; once per machine, about 6 minutes)"

var _ tier.Tier = (*WASM)(nil)

// guest is one WebAssembly program the tier can run.
type guest struct {
	name   string // "python" or "js"
	wasm   string // host path of the module
	lib    string // host path of the read-only runtime library ("" if none)
	libAt  string // where the guest sees lib
	digest string // sha256 of the module

	once     sync.Once
	compiled wazero.CompiledModule
	err      error
}

// WASM runs WebAssembly guests through wazero.
type WASM struct {
	rt      wazero.Runtime
	guests  map[string]*guest
	version string
	caps    tier.Capabilities
}

// Options configure the tier. The zero value is ready to use.
type Options struct {
	// Guests is the directory holding python/ and js/. Default:
	// $MOAT_WASM_GUESTS, else the wasm directory beside moat, else
	// DefaultGuests.
	Guests string
	// CacheDir holds wazero's compiled code, by module digest. Default:
	// Guests/cache (created mode 0700).
	CacheDir string
}

// New finds the guests and starts the runtime. The error names what is
// missing and wraps tier.ErrUnavailable.
func New(opts Options) (*WASM, error) {
	dir := opts.Guests
	if dir == "" {
		dir = os.Getenv("MOAT_WASM_GUESTS")
	}
	if dir == "" {
		dir = libdir.Find("wasm")
	}
	gs := map[string]*guest{}
	var missing []string
	py := &guest{name: "python", wasm: filepath.Join(dir, "python", "python.wasm"), lib: filepath.Join(dir, "python", "lib", "python3.11"), libAt: "/usr/local/lib/python3.11"}
	js := &guest{name: "js", wasm: filepath.Join(dir, "js", "qjs.wasm")}
	for _, g := range []*guest{py, js} {
		d, err := fileDigest(g.wasm)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s guest (%s): %v", g.name, g.wasm, err))
			continue
		}
		if g.lib != "" {
			if fi, err := os.Stat(filepath.Join(g.lib, "os.py")); err != nil || !fi.Mode().IsRegular() {
				missing = append(missing, fmt.Sprintf("%s guest's library %s has no os.py", g.name, g.lib))
				continue
			}
		}
		g.digest = d
		gs[g.name] = g
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: missing WebAssembly guests: %v; %s", tier.ErrUnavailable, missing, BuildHint)
	}
	cacheDir := opts.CacheDir
	if cacheDir == "" {
		cacheDir = filepath.Join(dir, "cache")
		if os.Geteuid() != 0 {
			// Not root: the shared cache is root's; a private one.
			if uc, err := os.UserCacheDir(); err == nil {
				cacheDir = filepath.Join(uc, "moat", "wasm")
			}
		}
	}
	if err := checkCacheDir(cacheDir); err != nil {
		return nil, fmt.Errorf("%w: compilation cache: %v", tier.ErrUnavailable, err)
	}
	cache, err := wazero.NewCompilationCacheWithDir(cacheDir)
	if err != nil {
		return nil, fmt.Errorf("%w: compilation cache %s: %v", tier.ErrUnavailable, cacheDir, err)
	}
	ctx := context.Background()
	// One runtime for every run: the per-run memory limit is applied by
	// the run's memory allocator (see limitedMemory), so compiled modules
	// are shared and a run only instantiates.
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(cache).
		WithCloseOnContextDone(true))
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		rt.Close(ctx)
		return nil, fmt.Errorf("%w: WASI: %v", tier.ErrUnavailable, err)
	}
	w := &WASM{rt: rt, guests: gs, version: "wazero " + wazeroVersion(), caps: tier.Capabilities{
		MemoryLimit:  true,
		NetworkNone:  true,
		WorkspaceCap: true,
		CPULimit:     false,
		OnlyGuests:   true,
		Missing: []string{
			"network egress: a WebAssembly guest has no sockets in this tier (network.mode must be none)",
			"sessions are not implemented for the wasm tier",
			"cpu time: a guest is one thread in Moat's process; the CPU-time limit is enforced as a wall-clock limit",
			"pids, seccomp, landlock: not applicable; the guest is not a process and makes no system calls, only WASI calls the host answers",
		},
	}}
	return w, nil
}

// Name implements tier.Tier.
func (w *WASM) Name() string { return Name }

// Capabilities implements tier.Tier.
func (w *WASM) Capabilities() tier.Capabilities { return w.caps }

// Version names the runtime.
func (w *WASM) Version() string { return w.version }

// Guests lists the guests and their module digests.
func (w *WASM) Guests() map[string]string {
	out := map[string]string{}
	for n, g := range w.guests {
		out[n] = g.digest
	}
	return out
}

// Close releases the runtime (compiled code stays in the disk cache).
func (w *WASM) Close() error { return w.rt.Close(context.Background()) }

// compile compiles g once per process (from the disk cache after the
// first time on this machine).
func (w *WASM) compile(ctx context.Context, g *guest) (wazero.CompiledModule, error) {
	g.once.Do(func() {
		b, err := os.ReadFile(g.wasm)
		if err != nil {
			g.err = err
			return
		}
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) != g.digest {
			g.err = fmt.Errorf("%s changed since the tier started (digest %s, was %s)", g.wasm, hex.EncodeToString(sum[:]), g.digest)
			return
		}
		// A fresh context: the first run's cancellation must not poison
		// the cached compilation for everyone.
		g.compiled, g.err = w.rt.CompileModule(context.WithoutCancel(ctx), b)
	})
	return g.compiled, g.err
}

// Precompile compiles every guest now (warming the disk cache).
func (w *WASM) Precompile(ctx context.Context) error {
	for _, g := range w.guests {
		if _, err := w.compile(ctx, g); err != nil {
			return fmt.Errorf("compile %s: %w", g.wasm, err)
		}
	}
	return nil
}

func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func wazeroVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/tetratelabs/wazero" {
				return d.Version
			}
		}
	}
	// Test binaries carry no dependency list.
	return pinnedWazero
}

// pinnedWazero is go.mod's wazero version (TestPinnedWazero keeps them
// equal).
const pinnedWazero = "v1.12.0"

// checkCacheDir creates the compilation cache directory and refuses one
// that someone else could write: wazero loads machine code from it and
// runs it in Moat's process, so a writable cache is code execution as Moat.
func checkCacheDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("%s is owned by uid %d with mode %04o: wazero runs the machine code cached there, so it must belong to uid %d and be private (fix: chown %d %s && chmod 0700 %s)", dir, st.Uid, fi.Mode().Perm(), os.Geteuid(), os.Geteuid(), dir, dir)
	}
	return nil
}
