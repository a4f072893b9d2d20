package redteam

// Running the corpus: which cases run on which tier, how many at once
// (exclusive cases alone), each attempt's host-side preparation (canary,
// listener, inputs, output directory) and its request to the engine.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Options select what to run.
type Options struct {
	Tiers []string // default: native
	Case  string   // only this case id (or category) when set
	// Parallel is how many cases run at once (default 2). Cases marked
	// exclusive (resource bombs, host-wide checks) always run alone.
	Parallel int
	// Progress receives a line per finished case; nil discards.
	Progress func(Verdict)
	// Image is the image every case runs on (default: the manifest's
	// default, python). The corpus assumes what the python image has
	// (python3, sh, coreutils): an image imported from its rootfs, or
	// one built on it, keeps every case meaningful.
	Image string
	// Secrets is the secret source the engine was given (engine.Options
	// Secrets and UpstreamRootCAs): the secret cases bind their values in
	// it. Nil: those cases are not applicable.
	Secrets *SecretStore
}

// Run executes the selected cases on every selected tier, then the
// host-residue check, and returns one verdict per case and tier.
func Run(ctx context.Context, e *engine.Engine, opts Options) ([]Verdict, error) {
	cases, err := Cases()
	if err != nil {
		return nil, err
	}
	if len(opts.Tiers) == 0 {
		opts.Tiers = []string{"native"}
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 2
	}
	var selected []Case
	for _, c := range cases {
		if opts.Case == "" || opts.Case == c.ID || opts.Case == c.Category {
			selected = append(selected, c)
		}
	}
	if len(selected) == 0 {
		return nil, fmt.Errorf("no case or category named %q (moat redteam --list shows them)", opts.Case)
	}
	var out []Verdict
	for _, label := range opts.Tiers {
		tierName, mode, _ := strings.Cut(label, "+")
		r := &runner{e: e, tier: tierName, label: label, session: mode == "session", image: opts.Image, secrets: opts.Secrets}
		if mode != "" && mode != "session" {
			return nil, fmt.Errorf("tier %q: the only mode is +session (each case as the only command of a session sandbox)", label)
		}
		t, err := e.Tier(tierName)
		if err == nil && t.Capabilities().OnlyGuests {
			r.inProcess = true
			if g, ok := t.(interface{ RunsGuest(argv []string) bool }); ok {
				r.guests = g.RunsGuest
			} else {
				return nil, fmt.Errorf("tier %s runs only guests but cannot say which commands are guests", tierName)
			}
		}
		if err != nil {
			for _, c := range selected {
				v := Verdict{Case: c.ID, Category: c.Category, Severity: c.Severity, Tier: label, Verdict: NotApplicable, Evidence: "tier unavailable: " + err.Error()}
				out = append(out, v)
				report(opts, v)
			}
			continue
		}
		verdicts := make([]Verdict, len(selected))
		sem := make(chan struct{}, opts.Parallel)
		var exclusive sync.RWMutex
		var wg sync.WaitGroup
		for i := range selected {
			c := selected[i]
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if c.exclusive() {
					exclusive.Lock()
					defer exclusive.Unlock()
				} else {
					exclusive.RLock()
					defer exclusive.RUnlock()
				}
				verdicts[i] = r.run(ctx, &c)
				report(opts, verdicts[i])
			}()
		}
		wg.Wait()
		out = append(out, verdicts...)
		if opts.Case == "" {
			v := r.residue()
			out = append(out, v)
			report(opts, v)
		}
	}
	return out, nil
}

func report(opts Options, v Verdict) {
	if opts.Progress != nil {
		opts.Progress(v)
	}
}

// exclusive cases must not share the machine with other cases: they
// exhaust a resource on purpose, or judge host-wide state.
func (c *Case) exclusive() bool {
	return c.Category == "resources" || c.custom != nil && c.alone
}

type runner struct {
	e    *engine.Engine
	tier string // the manifest's tier
	// label names the tier in verdicts: "native", or "native+session"
	// when every case runs as the only command of a session sandbox.
	label   string
	session bool
	// guests, on a tier that runs only its own WebAssembly guests, says
	// whether it runs argv (nil: every command runs).
	guests func(argv []string) bool
	// image is the image cases run on; "" for the manifest default.
	image string
	// inProcess: the program runs inside moat's own process (wasm), so
	// the host-side process check is that the run created no host
	// process at all.
	inProcess bool
	// secrets is the engine's secret source, nil without one.
	secrets *SecretStore
}

// exec runs one request the way this runner attacks the tier. On a tier
// that runs only its own guests (wasm), a command that is not one of them
// (sh, sleep, a Linux binary) is marked on the case's context: the attack
// never ran, so the case cannot be contained (run turns it into
// not-applicable unless the host saw an escape).
func (r *runner) exec(ctx context.Context, req *engine.Request) (*result.Result, error) {
	req.Session = r.session
	if r.guests != nil {
		if m, ok := ctx.Value(notGuestKey{}).(*notGuest); ok {
			m.mark(req.Argv, r.guests(req.Argv))
		}
	}
	return r.e.Run(ctx, req)
}

// notGuest records the first command of a case that the tier could not
// run as a guest.
type notGuest struct {
	mu     sync.Mutex
	argv   []string
	guests int // commands of the case that did run as guests
}

type notGuestKey struct{}

func (n *notGuest) mark(argv []string, guest bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if guest {
		n.guests++
	} else if n.argv == nil {
		n.argv = append([]string{}, argv...)
	}
}

// command names the refused command ("" if none) and whether every
// command of the case was refused (nothing of the attack ran at all).
func (n *notGuest) command() (string, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.argv == nil {
		return "", false
	}
	return strings.Join(n.argv[:min(len(n.argv), 2)], " "), n.guests == 0
}

// run executes one case (all its repeats) and judges it.
func (r *runner) run(ctx context.Context, c *Case) (v Verdict) {
	start := time.Now()
	v = Verdict{Case: c.ID, Category: c.Category, Severity: c.Severity, Tier: r.label}
	defer func() { v.Seconds = time.Since(start).Seconds() }()
	if len(c.Tiers) > 0 && !contains(c.Tiers, r.tier) {
		v.Verdict, v.Evidence = NotApplicable, "the case does not apply to the "+r.tier+" tier"
		return v
	}
	cc, te := c.forTier(r.tier)
	c = &cc
	if te != nil {
		if te.NotApplicable {
			v.Verdict, v.Evidence = NotApplicable, "not applicable on "+r.tier+": "+te.Reason
			return v
		}
		defer func() { v.Evidence = "[" + r.tier + " expectation] " + v.Evidence }()
	}
	for _, req := range c.Requires {
		if why := missing(req, r.tier); why != "" {
			v.Verdict, v.Evidence = NotApplicable, why
			return v
		}
	}
	if r.guests != nil {
		// A command the tier refused (not a guest): that part of the
		// attack never ran, so the case cannot be contained.
		ng := &notGuest{}
		// Named result: the deferred functions below rewrite what run
		// returns.
		ctx = context.WithValue(ctx, notGuestKey{}, ng)
		defer func() {
			// An escape stands if part of the attack ran as a guest;
			// when nothing ran, an unmet expectation is no escape.
			if cmd, none := ng.command(); cmd != "" && (v.Verdict != Escaped || none) {
				v.Verdict, v.Evidence = NotApplicable, fmt.Sprintf("not applicable on %s: the attack's command %q is not a guest the tier runs (python3, node); the tier refused it, so the attack never ran (was: %s: %s)", r.tier, cmd, v.Verdict, clip(v.Evidence, 120))
			}
		}()
	}
	if c.custom != nil {
		v.Verdict, v.Evidence, v.Runs = c.custom(ctx, r)
		return v
	}
	n := max(c.Repeat, 1)
	var last string
	for i := 0; i < n; i++ {
		verdict, evidence := r.once(ctx, c)
		v.Runs = i + 1
		if verdict != Contained {
			v.Verdict, v.Evidence = verdict, evidence
			if n > 1 {
				v.Evidence = fmt.Sprintf("run %d of %d: %s", i+1, n, evidence)
			}
			return v
		}
		last = evidence
	}
	v.Verdict, v.Evidence = Contained, last
	if n > 1 {
		v.Evidence = fmt.Sprintf("%d runs: %s", n, last)
	}
	return v
}

// env is one attempt's host-side preparation.
type env struct {
	vars      map[string]string
	canary    string
	canaryDir string
	canaryFP  string // content+mode fingerprint
	accepted  *atomic.Int64
	listener  net.Listener
	inputDir  string
	outDir    string
	sentinel  string
	sentFP    string
}

func (e *env) close() {
	if e.listener != nil {
		e.listener.Close()
	}
	for _, d := range []string{e.canaryDir, e.inputDir, e.outDir, e.sentinel} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
	if e.outDir != "" {
		os.RemoveAll(filepath.Dir(e.outDir))
	}
}

func (r *runner) setup(c *Case) (*env, error) {
	en := &env{vars: map[string]string{}}
	exe, _ := os.Executable()
	en.vars["moat_exe"] = exe
	en.vars["host_pid"] = strconv.Itoa(os.Getpid())
	if c.Setup.Canary {
		en.canary = secret()
		d, err := os.MkdirTemp("", "moat-redteam-canary-")
		if err != nil {
			return en, err
		}
		// World-readable on purpose: the sandbox is the only barrier.
		os.Chmod(d, 0o755)
		en.canaryDir = d
		p := filepath.Join(d, "secret.txt")
		if err := os.WriteFile(p, []byte(en.canary+"\n"), 0o644); err != nil {
			return en, err
		}
		en.canaryFP = fingerprint(p)
		en.vars["canary"], en.vars["canary_path"] = en.canary, p
	}
	if c.Setup.Listener {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return en, err
		}
		en.listener, en.accepted = l, &atomic.Int64{}
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				en.accepted.Add(1)
				conn.Close()
			}
		}()
		en.vars["port"] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	if len(c.Setup.Inputs) > 0 {
		d, err := os.MkdirTemp("", "moat-redteam-in-")
		if err != nil {
			return en, err
		}
		en.inputDir = d
		for p, content := range c.Setup.Inputs {
			full := filepath.Join(d, filepath.FromSlash(p))
			os.MkdirAll(filepath.Dir(full), 0o755)
			if t, ok := strings.CutPrefix(content, "symlink:"); ok {
				err = os.Symlink(expand(t, en.vars), full)
			} else {
				err = os.WriteFile(full, []byte(expand(content, en.vars)), 0o644)
			}
			if err != nil {
				return en, err
			}
		}
	}
	if c.Setup.Output {
		d, err := os.MkdirTemp("", "moat-redteam-out-")
		if err != nil {
			return en, err
		}
		en.outDir = filepath.Join(d, "out")
		en.sentinel = filepath.Join(d, "sentinel")
		os.Mkdir(en.sentinel, 0o755)
		os.WriteFile(filepath.Join(en.sentinel, "keep"), []byte("keep"), 0o644)
		en.sentFP = treeFingerprint(d, "out")
		en.vars["out_parent"] = d
	}
	return en, nil
}

// hostHooks extend one declarative attempt with host-side steps.
type hostHooks struct {
	// prepare runs after the declarative setup, before the run: it may add
	// {vars} and record host state.
	prepare func(en *env) error
	// request adjusts the request (stdin, say).
	request func(req *engine.Request)
	// onStart is called with the run's id and process lister.
	onStart func(id string, procs func() ([]int, error))
	// onRuntime is called, before onStart, on tiers with a user-space
	// kernel, with the lister of its host processes.
	onRuntime func(procs func() ([]int, error))
	// check judges host state after the run; it runs before the
	// declarative checks, so its evidence comes first.
	check func(en *env, res *result.Result) (verdict, evidence string)
}

// once runs one attempt and judges it.
func (r *runner) once(ctx context.Context, c *Case) (string, string) {
	return r.onceWith(ctx, c, hostHooks{})
}

// onceWith is one attempt with host-side hooks (Go-written cases): setup,
// the request, the run, then the hooks' check and the declarative checks.
func (r *runner) onceWith(ctx context.Context, c *Case, h hostHooks) (string, string) {
	en, err := r.setup(c)
	defer en.close()
	if err != nil {
		return Error, "host setup: " + err.Error()
	}
	if h.prepare != nil {
		if err := h.prepare(en); err != nil {
			return Error, "host setup: " + err.Error()
		}
	}
	m := r.defaults()
	if c.Manifest != "" {
		mm, err := manifest.Parse([]byte(c.Manifest), c.ID+".manifest")
		if err != nil {
			return Error, "case manifest: " + err.Error()
		}
		m = mm
		if r.image != "" {
			m.Image = r.image
		}
	}
	if en.inputDir != "" {
		m.Inputs = append(m.Inputs, manifest.Input{Src: en.inputDir, Dst: "in"})
	}
	if err := m.Validate(); err != nil {
		return Error, "case manifest: " + err.Error()
	}
	// After validation: the test suite's unsandboxed runner is not a tier a
	// manifest may name.
	m.Tier = r.tier
	argv := c.Program()
	for i := range argv {
		argv[i] = expand(argv[i], en.vars)
	}
	if r.inProcess && c.Python != "" {
		// The pauses the cases take so the host can sample the run must
		// last on the wasm guest too, whose WASI has no sleep.
		argv[len(argv)-1] = guestSleepPrelude + argv[len(argv)-1]
	}
	if en.canary != "" {
		// A careless host keeps secrets in its environment; moat's own
		// environment must never reach the program.
		os.Setenv("MOAT_REDTEAM_CANARY_"+c.envKey(), en.canary)
		defer os.Unsetenv("MOAT_REDTEAM_CANARY_" + c.envKey())
	}
	procs := procWatch{runtimeExe: r.runtimeExe(), vmm: r.tier == "microvm"}
	req := &engine.Request{Manifest: m, Argv: argv, OutputDir: en.outDir}
	// A VMM is judged against the run's cgroup, whose name OnStart (called
	// right after OnRuntime) gives: its sampling starts there.
	var vmmProcs func() ([]int, error)
	req.OnRuntime = func(pl func() ([]int, error)) {
		if c.Expect.HostProcs {
			procs.runtime = true
			if procs.vmm {
				vmmProcs = pl
			} else {
				procs.start("", pl)
			}
		}
		if h.onRuntime != nil {
			h.onRuntime(pl)
		}
	}
	req.OnStart = func(id string, pl func() ([]int, error)) {
		if c.Expect.HostProcs && r.inProcess {
			procs.inProcess = true
			pl = procs.moatChildren
		}
		if vmmProcs != nil {
			procs.start(id, vmmProcs)
		}
		if c.Expect.HostProcs && !procs.runtime {
			procs.start(id, pl)
		}
		if h.onStart != nil {
			h.onStart(id, pl)
		}
	}
	if h.request != nil {
		h.request(req)
	}
	res, err := r.exec(ctx, req)
	procs.stop()
	if err != nil {
		return Error, "run: " + err.Error()
	}
	var extra string
	if h.check != nil {
		v, ev := h.check(en, res)
		if v != Contained {
			return v, ev
		}
		extra = ev
	}
	v, ev := judge(c, en, res, &procs)
	if v == Contained && extra != "" {
		ev = strings.Trim(extra+"; "+ev, "; ")
	}
	return v, ev
}

func (c *Case) envKey() string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' {
			return r - 'a' + 'A'
		}
		if r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, c.ID)
}

func expand(s string, vars map[string]string) string {
	for k, v := range vars {
		s = strings.ReplaceAll(s, "{"+k+"}", v)
	}
	return s
}

func secret() string {
	var b [12]byte
	rand.Read(b[:])
	return "moat-canary-" + hex.EncodeToString(b[:])
}

// missing explains why a required host facility is absent for a case
// run on tier, or "".
func missing(req, tier string) string {
	switch req {
	case "root":
		if os.Geteuid() != 0 {
			return "needs root"
		}
	case "ia32":
		// The 32-bit system call gate of the kernel that runs the
		// program: the host's, but for the microVM's own guest kernel
		// (which has it).
		if tier != "microvm" {
			return hostLacksIA32()
		}
	default:
		return "unknown requirement " + req
	}
	return ""
}

// ia32Probe is a program that makes one 32-bit system call (getpid
// through int 0x80) on the host: it exits 0 where the kernel has the
// gate, and dies of SIGSEGV where it has none (IA32 emulation off:
// CONFIG_IA32_EMULATION unset, or ia32_emulation=0).
const ia32Probe = `import ctypes, mmap
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xb8, 20, 0, 0, 0,  0xcd, 0x80,  0xc3]))
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
`

var ia32Once struct {
	sync.Once
	why string
}

// hostLacksIA32 says why this host's kernel has no 32-bit system call
// entry, or "" when it has one (or the probe cannot tell: then the case
// runs and judges).
func hostLacksIA32() string {
	ia32Once.Do(func() {
		py, err := exec.LookPath("python3")
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = exec.CommandContext(ctx, py, "-c", ia32Probe).Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGSEGV {
				ia32Once.why = "this host's kernel has no 32-bit system call entry (int 0x80 dies of SIGSEGV unsandboxed too: IA32 emulation is off), so the gate the case attacks does not exist here"
			}
		}
	})
	return ia32Once.why
}

// guestSleepPrelude makes time.sleep wait on a guest whose WASI lacks it
// (CPython on wasm32-wasi raises OSError ENOTSUP): a case's
// time.sleep(0.2), there so that the host samples its processes while it
// runs, would otherwise end the program at once, and whether the host
// sampled it at all became luck (the case was judged an error). The wait
// is a busy loop on the monotonic clock, which the guest has.
const guestSleepPrelude = `import time as _moat_time
def _moat_sleep(s, _sleep=_moat_time.sleep):
    try:
        _sleep(s)
    except OSError:
        end = _moat_time.monotonic() + s
        while _moat_time.monotonic() < end:
            pass
_moat_time.sleep = _moat_sleep
del _moat_sleep
`

// defaults is the default manifest on the runner's image: where every
// case's manifest starts.
func (r *runner) defaults() *manifest.Manifest {
	m := manifest.Default()
	if r.image != "" {
		m.Image = r.image
	}
	return m
}
