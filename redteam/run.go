package redteam

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// Verdict is the outcome of one case on one tier.
type Verdict struct {
	Case     string `json:"case"`
	Category string `json:"category"`
	Severity string `json:"severity"`
	Tier     string `json:"tier"`
	Verdict  string `json:"verdict"`
	// Evidence says what the host observed: for contained, what held;
	// for escaped, what broke; for not-applicable, why it could not run.
	Evidence string  `json:"evidence"`
	Runs     int     `json:"runs"`
	Seconds  float64 `json:"seconds"`
}

// Options select what to run.
type Options struct {
	Tiers []string // default: native
	Case  string   // only this case id (or category) when set
	// Parallel is how many cases run at once (default 2). Cases marked
	// exclusive (resource bombs, host-wide checks) always run alone.
	Parallel int
	// Progress receives a line per finished case; nil discards.
	Progress func(Verdict)
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
		r := &runner{e: e, tier: tierName, label: label, session: mode == "session"}
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
	// inProcess: the program runs inside moat's own process (wasm), so
	// the host-side process check is that the run created no host
	// process at all.
	inProcess bool
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
		if why := missing(req); why != "" {
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
	m := manifest.Default()
	if c.Manifest != "" {
		mm, err := manifest.Parse([]byte(c.Manifest), c.ID+".manifest")
		if err != nil {
			return Error, "case manifest: " + err.Error()
		}
		m = mm
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

// peakWithin says whether a run's peak memory respects limit, allowing the
// kernel's forced charges (cgroup.PeakWithin), and describes the peak.
func peakWithin(peak, limit int64) (bool, string) {
	note := fmt.Sprintf("peak memory %d MiB", peak>>20)
	if over := peak - limit; over > 0 {
		note += fmt.Sprintf(", %d KiB over the limit in forced charges", over>>10)
	}
	return cgroup.PeakWithin(peak, limit), note
}

// judge applies every expectation; the first that fails is the evidence of
// an escape.
func judge(c *Case, en *env, res *result.Result, procs *procWatch) (string, string) {
	e := c.Expect
	var held []string
	if res.Termination == result.InfraError {
		// Moat failed to run the attack: nothing was judged.
		return Error, "the tier failed to run the case (infra-error): " + clip(res.Error, 200)
	}
	out := decode(res.Stdout) + "\n" + decode(res.Stderr)
	for _, s := range e.OutputLacks {
		s = expand(s, en.vars)
		if s == "" || strings.Contains(s, "{") {
			return Error, "output_lacks refers to an unset value: " + s
		}
		if strings.Contains(out, s) {
			return Escaped, fmt.Sprintf("the output contains %q", clip(s, 60))
		}
		held = append(held, "output lacks the canary")
	}
	if e.CanaryIntact {
		if en.canaryFP == "" {
			return Error, "canary_intact without setup.canary"
		}
		if fp := fingerprint(en.vars["canary_path"]); fp != en.canaryFP {
			return Escaped, "the host canary file changed"
		}
		held = append(held, "host canary intact")
	}
	if e.NoConnections {
		if en.accepted == nil {
			return Error, "no_connections without setup.listener"
		}
		if n := en.accepted.Load(); n > 0 {
			return Escaped, fmt.Sprintf("the host listener accepted %d connection(s) from the sandbox", n)
		}
		held = append(held, "host listener saw no connection")
	}
	if len(e.Termination) > 0 {
		if !contains(e.Termination, string(res.Termination)) {
			return Escaped, fmt.Sprintf("termination %s (exit %d), want one of %v", res.Termination, res.ExitCode, e.Termination)
		}
		held = append(held, "terminated: "+string(res.Termination))
	}
	for _, k := range e.Violations {
		found := false
		for _, v := range res.Violations {
			found = found || v.Kind == k
		}
		if !found {
			return Escaped, fmt.Sprintf("no %s violation recorded (violations: %v)", k, res.Violations)
		}
		held = append(held, k+" limit enforced")
	}
	if e.MaxDurationMS > 0 {
		if res.DurationMS > e.MaxDurationMS {
			return Escaped, fmt.Sprintf("ran %.0f ms, bound %.0f ms", res.DurationMS, e.MaxDurationMS)
		}
		held = append(held, fmt.Sprintf("stopped after %.0f ms", res.DurationMS))
	}
	if e.MaxPeakMemory != "" {
		lim, err := manifest.ParseSize(e.MaxPeakMemory)
		if err != nil {
			return Error, "max_peak_memory: " + err.Error()
		}
		ok, note := peakWithin(res.PeakMemoryBytes, int64(lim))
		if !ok {
			return Escaped, fmt.Sprintf("peak memory %d bytes exceeds %s by more than the kernel's forced charges (%s)", res.PeakMemoryBytes, e.MaxPeakMemory, note)
		}
		held = append(held, note)
	}
	if len(e.Denied) > 0 {
		reports := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if name, rest, ok := strings.Cut(line, ": "); ok {
				reports[strings.TrimSpace(name)] = rest
			}
		}
		for _, op := range e.Denied {
			rep, ok := reports[op]
			switch {
			case !ok:
				return Error, fmt.Sprintf("the program never reported on %s (output %q)", op, clip(out, 300))
			case strings.HasPrefix(rep, "ok"):
				return Escaped, fmt.Sprintf("%s succeeded: %s", op, clip(rep, 120))
			}
		}
		held = append(held, fmt.Sprintf("%d operations refused", len(e.Denied)))
	}
	if e.HostProcs && procs.inProcess {
		if ev := procs.verdict(); ev != "" {
			if strings.HasPrefix(ev, "error: ") {
				return Error, ev
			}
			return Escaped, ev
		}
		held = append(held, fmt.Sprintf("host /proc: %d samples while the guest ran in moat's process, no host process created", procs.samples))
	} else if e.HostProcs {
		if ev := procs.verdict(); ev != "" {
			if strings.HasPrefix(ev, "error: ") {
				return Error, ev
			}
			return Escaped, ev
		}
		if procs.vmm {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples of the VMM (%d processes) are %s, jailed (%s) with no capability in any set, under Moat's seccomp filter and QEMU's -sandbox, no_new_privs, in their own mnt, pid, net, ipc, uts and cgroup namespaces and the run's cgroup, holding no writable host file outside moat's state and the root disk read-only (%d start-up samples before both filters were on, the jailer's setup included, not judged)", procs.threads, len(procs.pids), procs.runtimeExe, procs.vmmIDs, procs.preSandbox))
		} else if procs.runtime {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples of the runtime (%d processes) seccomp-filtered, no_new_privs, no capability beyond gVisor's, in their own namespaces", procs.threads, len(procs.pids)))
		} else {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples unprivileged and filtered", procs.threads))
		}
	}
	if e.CopyOutSafe {
		if ev := copyOutEvidence(en); ev != "" {
			return Escaped, ev
		}
		held = append(held, "copy-out wrote only plain files and directories inside the output directory, none writable by group or others, no setuid, setgid or sticky bit")
	}
	for _, p := range e.FilesAbsent {
		for _, f := range res.Files {
			if f.Path == p && f.Change != result.Deleted {
				return Escaped, fmt.Sprintf("%s is in the workspace diff (%s)", p, f.Change)
			}
		}
	}
	if len(e.FilesAbsent) > 0 {
		held = append(held, "forbidden paths absent from the diff")
	}
	if e.DiffBounded > 0 {
		if len(res.Files) > e.DiffBounded {
			return Escaped, fmt.Sprintf("diff has %d entries, bound %d", len(res.Files), e.DiffBounded)
		}
		held = append(held, fmt.Sprintf("diff bounded (%d entries)", len(res.Files)))
	}
	return Contained, strings.Join(held, "; ")
}

// decode returns a stream's bytes as the host received them: a canary
// hidden in binary (base64-encoded) output must be found too.
func decode(s result.Stream) string {
	if s.Encoding == "base64" {
		if b, err := base64.StdEncoding.DecodeString(s.Data); err == nil {
			return string(b)
		}
	}
	return s.Data
}

func copyOutEvidence(en *env) string {
	parent := filepath.Dir(en.outDir)
	if fp := treeFingerprint(parent, "out"); fp != en.sentFP {
		return "copy-out touched files outside the output directory"
	}
	var bad string
	filepath.Walk(en.outDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || bad != "" {
			return nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			bad = "copy-out created a symlink: " + p
		case !fi.Mode().IsRegular() && !fi.IsDir():
			bad = "copy-out created a special file: " + p
		case fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0:
			bad = "copy-out kept a setuid/setgid bit: " + p
		case fi.Mode()&os.ModeSticky != 0:
			bad = "copy-out kept a sticky bit: " + p
		case fi.Mode().Perm()&0o022 != 0 && p != en.outDir:
			// Another local user could plant or swap files in it.
			bad = fmt.Sprintf("copy-out created a group- or world-writable %v: %s", fi.Mode(), p)
		}
		return nil
	})
	return bad
}

// treeFingerprint hashes the names, modes and contents below dir, except
// the entry skip (the output directory itself).
func treeFingerprint(dir, skip string) string {
	h := sha256.New()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			fmt.Fprintf(h, "err %s\n", p)
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == skip || strings.HasPrefix(rel, skip+string(filepath.Separator)) {
			if fi.IsDir() && rel == skip {
				return filepath.SkipDir
			}
			return nil
		}
		fmt.Fprintf(h, "%s %v %d\n", rel, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			h.Write(b)
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))
}

func fingerprint(p string) string {
	fi, err := os.Lstat(p)
	if err != nil {
		return "missing"
	}
	b, _ := os.ReadFile(p)
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%v %x", fi.Mode(), sum)
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

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// missing explains why a required host facility is absent, or "".
func missing(req string) string {
	switch req {
	case "root":
		if os.Geteuid() != 0 {
			return "needs root"
		}
	default:
		return "unknown requirement " + req
	}
	return ""
}

// procWatch samples the sandbox's processes from the host side while the
// run lives.
type procWatch struct {
	poller
	// runtime: the tier runs the program inside a user-space kernel, and
	// the pids are the runtime's host processes (inspectRuntime), the
	// executable runtimeExe.
	runtime    bool
	runtimeExe string
	// vmm: the runtime is a virtual machine monitor (microvm's QEMU),
	// judged by inspectVMM against the run's cgroup (runID); vmmIDs
	// records the ids it ran as, for the evidence.
	vmm    bool
	vmmIDs string
	runID  string
	// filtered: VMM pids seen with both seccomp filters installed (Moat's
	// from the jailer, then QEMU's -sandbox); until then a sample is the
	// jailer or QEMU's own start-up (it installs -sandbox before creating
	// the machine and its vCPUs), counted in preSandbox.
	filtered   map[int]bool
	preSandbox int
	// inProcess: the program is a guest in moat's own process (wasm); the
	// pids are moat's child processes, of which there must be none.
	inProcess bool
	samples   int
	mu        sync.Mutex
	threads   int
	pids      map[int]bool
	bad       string
	errs      []string
}

func (w *procWatch) start(id string, procs func() ([]int, error)) {
	w.runID = id
	each := w.inspect
	if w.runtime {
		each = w.inspectRuntime
		if w.vmm {
			each = w.inspectVMM
		}
	}
	if w.inProcess {
		each = w.inspectChild
	}
	w.sample(procs, func(err error) {
		w.mu.Lock()
		w.errs = append(w.errs, err.Error())
		w.mu.Unlock()
	}, each)
}

// poller polls a run's host pids every 5 ms while the run lives and hands
// each to a function; every process watcher of the cases builds on it.
type poller struct {
	done chan struct{}
	wg   sync.WaitGroup
}

// sample starts polling; onErr gets the first listing error, which ends
// the sampling.
func (s *poller) sample(procs func() ([]int, error), onErr func(error), each func(pid int)) {
	s.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			pids, err := procs()
			if err != nil {
				if onErr != nil {
					onErr(err)
				}
				return
			}
			for _, pid := range pids {
				each(pid)
			}
		}
	}()
}

// stop ends the sampling and waits for it; safe to call twice.
func (s *poller) stop() {
	if s.done != nil {
		close(s.done)
		s.wg.Wait()
		s.done = nil
	}
}

// inspect reads every thread's status of one host pid. Moat's own init
// (argv[0] moat-init) is checked too: it is as unprivileged as the program
// once the program runs, but may still be setting up, so only its uid is
// judged.
func (w *procWatch) inspect(pid int) {
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	// Moat's init is PID 1 of the sandbox's PID namespace (NSpid ends in
	// 1); its cmdline says so too, except while it exits, when the kernel
	// empties cmdline but its threads are still there to be read.
	isInit := bytes.HasPrefix(cmdline, []byte("moat-init\x00"))
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		ns := strings.Fields(parseStatus(string(b))["NSpid"])
		isInit = isInit || len(ns) > 1 && ns[len(ns)-1] == "1"
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // exited meanwhile
		}
		st := parseStatus(string(b))
		if state := st["State"]; strings.HasPrefix(state, "Z") || strings.HasPrefix(state, "X") {
			continue
		}
		w.mu.Lock()
		w.threads++
		if w.bad == "" {
			uid, _ := strconv.ParseInt(firstField(st["Uid"]), 10, 64)
			switch {
			case uid < 0x70000000:
				w.bad = fmt.Sprintf("pid %d runs as host uid %d (not the sandbox's unprivileged range)", pid, uid)
			case isInit:
			case st["CapEff"] != "0000000000000000" || st["CapPrm"] != "0000000000000000" || st["CapBnd"] != "0000000000000000":
				w.bad = fmt.Sprintf("pid %d (%s) has capabilities: CapEff %s CapPrm %s CapBnd %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "), st["CapEff"], st["CapPrm"], st["CapBnd"])
			case st["NoNewPrivs"] != "1":
				w.bad = fmt.Sprintf("pid %d lacks no_new_privs", pid)
			case st["Seccomp"] != "2":
				w.bad = fmt.Sprintf("pid %d is not seccomp-filtered (Seccomp %s)", pid, st["Seccomp"])
			}
		}
		w.mu.Unlock()
	}
}

func (w *procWatch) verdict() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bad != "" {
		return w.bad
	}
	if w.vmm && w.threads == 0 && w.preSandbox > 0 {
		return fmt.Sprintf("the VMM was sampled %d times and never had both seccomp filters installed (Moat's, from the jailer, and QEMU's -sandbox)", w.preSandbox)
	}
	if w.inProcess {
		if w.samples == 0 {
			if len(w.errs) > 0 {
				return "error: " + w.errs[0]
			}
			return "error: the host never sampled moat's processes while the guest ran (the program ended too fast: make it sleep)"
		}
		return ""
	}
	if w.threads == 0 {
		if len(w.errs) > 0 {
			return "error: " + w.errs[0]
		}
		return "error: the host never saw a sandbox process (the program ended too fast to inspect: make it sleep)"
	}
	return ""
}

func parseStatus(s string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

func firstField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// runtimeCaps are the capabilities gVisor's own processes keep on the host
// (within their user namespace, whose map is the identity: gVisor's
// standard model runs them as root): the Sentry CHOWN, DAC_OVERRIDE,
// DAC_READ_SEARCH, FOWNER, FSETID, SYS_PTRACE (it traces its systrap
// stubs); the gofer the first five and SYS_CHROOT, plus SETUID and SETGID
// when it serves host sockets. Any other bit (SYS_ADMIN, NET_ADMIN,
// SYS_MODULE...) is a gain.
const runtimeCaps = 1<<0 | 1<<1 | 1<<2 | 1<<3 | 1<<4 | 1<<6 | 1<<7 | 1<<18 | 1<<19

// runtimeExe is the executable of the tier's runtime processes (runsc for
// gVisor), resolved, or "" for tiers without one.
func (r *runner) runtimeExe() string {
	t, err := r.e.Tier(r.tier)
	if err != nil {
		return ""
	}
	var exe string
	switch x := t.(type) {
	case interface{ Runsc() string }:
		exe = x.Runsc()
	case interface{ VMMBinary() string }:
		exe = x.VMMBinary()
	default:
		return ""
	}
	p, err := filepath.EvalSymlinks(exe)
	if err != nil {
		return exe
	}
	return p
}

// hostNamespaces are the namespaces moat itself runs in, which no runtime
// process may share (the cgroup namespace is not listed: runsc leaves its
// processes in the host's, and they see cgroupfs only as far as their
// mount namespace, an empty chroot, shows it).
var hostNamespaces = []string{"user", "mnt", "pid", "net", "ipc", "uts"}

// inspectRuntime judges one host process of a user-space kernel's runtime
// (the Sentry, a systrap stub where the program's instructions execute,
// the gofer): it must be the runtime's executable, every thread
// seccomp-filtered with no_new_privs, no capability beyond runtimeCaps in
// any set, in none of the host's namespaces.
func (w *procWatch) inspectRuntime(pid int) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return // exited meanwhile
	}
	var shared []string
	for _, ns := range hostNamespaces {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 == nil && err2 == nil && mine == its {
			shared = append(shared, ns)
		}
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		st := parseStatus(string(b))
		w.mu.Lock()
		w.threads++
		if w.pids == nil {
			w.pids = map[int]bool{}
		}
		w.pids[pid] = true
		if w.bad == "" {
			var extra uint64
			for _, set := range []string{"CapEff", "CapPrm", "CapBnd", "CapAmb", "CapInh"} {
				v, _ := strconv.ParseUint(st[set], 16, 64)
				extra |= v &^ runtimeCaps
			}
			switch {
			case w.runtimeExe == "" || strings.TrimSuffix(exe, " (deleted)") != w.runtimeExe:
				w.bad = fmt.Sprintf("host pid %d in the run's cgroup runs %s, not the runtime %s", pid, exe, w.runtimeExe)
			case st["Seccomp"] != "2":
				w.bad = fmt.Sprintf("runtime pid %d (%s) is not seccomp-filtered (Seccomp %s)", pid, t, st["Seccomp"])
			case st["NoNewPrivs"] != "1":
				w.bad = fmt.Sprintf("runtime pid %d (%s) lacks no_new_privs", pid, t)
			case extra != 0:
				w.bad = fmt.Sprintf("runtime pid %d (%s) has capabilities beyond gVisor's own: %#x", pid, t, extra)
			case len(shared) > 0:
				w.bad = fmt.Sprintf("runtime pid %d shares the host's %v namespaces", pid, shared)
			}
		}
		w.mu.Unlock()
	}
}

// moatChildren lists moat's own child processes, for a tier whose guest
// runs inside moat (wasm): the guest has no way to create a process, so any
// child that appears while it runs (other than the red-team's own "moat
// run" helpers) is one it made the host start. Each listing is a sample.
func (w *procWatch) moatChildren() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	me := os.Getpid()
	exe, _ := os.Executable()
	var kids []int
	for _, d := range ents {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The fields after the command's closing parenthesis: state ppid ...
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 || f[1] != strconv.Itoa(me) {
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if exe != "" && bytes.HasPrefix(cmd, []byte(exe+"\x00run\x00")) {
			continue // a case's own "moat run" helper
		}
		kids = append(kids, pid)
	}
	w.mu.Lock()
	w.samples++
	w.mu.Unlock()
	return kids, nil
}

// inspectChild judges a child of moat seen during an in-process run: its
// existence is the escape.
func (w *procWatch) inspectChild(pid int) {
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bad == "" {
		w.bad = fmt.Sprintf("host pid %d (%s) is a child of moat while the in-process guest ran", pid, strings.ReplaceAll(string(cmd), "\x00", " "))
	}
}

// inspectVMM judges one host process of a microvm run: it must be the VMM
// executable, every thread seccomp-filtered (QEMU's -sandbox) with
// no_new_privs and confined by the tier's jail (judgeVMMThread: the jail's
// unprivileged ids, no capability, its own namespaces, the run's cgroup),
// and hold no host file open for writing except under moat's state
// directories, the shared root disk image only read-only.
func (w *procWatch) inspectVMM(pid int) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return
	}
	st0, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	ps := parseStatus(string(st0))
	w.mu.Lock()
	if w.filtered == nil {
		w.filtered = map[int]bool{}
	}
	if !w.filtered[pid] {
		// Judged from the moment both filters are on: Moat's, which the
		// jailer installs last before its exec, and QEMU's -sandbox, one
		// of QEMU's first acts. A VMM missing either is never judged, and
		// that is itself an escape (see the end of the run).
		if ps["Seccomp"] != "2" || ps["Seccomp_filters"] != "2" {
			w.preSandbox++
			w.mu.Unlock()
			return
		}
		w.filtered[pid] = true
	}
	w.mu.Unlock()
	var bad string
	if w.runtimeExe == "" || strings.TrimSuffix(exe, " (deleted)") != w.runtimeExe {
		bad = fmt.Sprintf("host pid %d of the run runs %s, not the VMM %s", pid, exe, w.runtimeExe)
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || !strings.HasPrefix(target, "/") || target == "/dev/null" {
			continue // pipes, sockets, eventfds, exited meanwhile
		}
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		var flags int64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			}
		}
		writable := flags&3 != 0
		switch {
		case strings.Contains(target, "/microvm/images/") && writable:
			bad = fmt.Sprintf("the VMM (pid %d) holds the shared root disk %s writable (flags %o)", pid, target, flags)
		case writable && !strings.HasPrefix(target, "/var/lib/moat") && !strings.HasPrefix(target, os.Getenv("MOAT_HOME")+"/"):
			bad = fmt.Sprintf("the VMM (pid %d) holds host file %s open for writing (flags %o)", pid, target, flags)
		}
	}
	var shared []string
	for _, ns := range vmmNamespaces {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err1 == nil && err2 == nil && mine == its {
			shared = append(shared, ns)
		}
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	// A VMM being killed (the end of every run) shows the root cgroups and
	// no threads' details once it has exited: judge only what was read
	// while it still ran, so check it still does after the reads.
	if !running(pid) {
		return
	}
	ids := fmt.Sprintf("uid %s, gid %s", firstField(ps["Uid"]), firstField(ps["Gid"]))
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		st := parseStatus(string(b))
		w.mu.Lock()
		w.threads++
		if w.pids == nil {
			w.pids = map[int]bool{}
		}
		w.pids[pid] = true
		w.vmmIDs = ids
		switch {
		case w.bad != "":
		case bad != "":
			w.bad = bad
		case st["Seccomp"] != "2" || st["Seccomp_filters"] != "2":
			w.bad = fmt.Sprintf("VMM pid %d (%s) is not under Moat's and QEMU's seccomp filters (Seccomp %s, Seccomp_filters %s)", pid, t, st["Seccomp"], st["Seccomp_filters"])
		case st["NoNewPrivs"] != "1":
			w.bad = fmt.Sprintf("VMM pid %d (%s) lacks no_new_privs", pid, t)
		default:
			if ev := judgeVMMThread(st, shared, string(cg), w.runID); ev != "" {
				w.bad = fmt.Sprintf("VMM pid %d (%s) %s", pid, t, ev)
			}
		}
		w.mu.Unlock()
	}
}

// running reports whether pid is alive and not exiting: its state is
// neither zombie nor dead, and it has not begun to exit (PF_EXITING in
// its flags: an exiting task leaves its cgroups, and reads as in the root
// ones, before it becomes a zombie).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	// After the command: state, ppid, pgrp, session, tty_nr, tpgid, flags.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	const pfExiting = 0x4
	flags, err := strconv.ParseUint(f[6], 10, 64)
	if err != nil || flags&pfExiting != 0 {
		return false
	}
	return f[0] != "Z" && f[0] != "X" && f[0] != "x"
}

// vmmNamespaces are the host namespaces a jailed VMM must not share. The
// user namespace is the host's by design: the jail makes none, so its
// namespaces belong to the host's user namespace, in which the VMM holds
// no capability (judged below).
var vmmNamespaces = []string{"mnt", "pid", "net", "ipc", "uts", "cgroup"}

// judgeVMMThread says what of the microvm tier's jail one VMM thread
// lacks, or "": every uid the jail's (jail.UIDBase+1 .. jail.UIDLimit,
// never root), every gid the jail's, no supplementary group, every
// capability set empty, none of the host's namespaces (shared lists those
// it shares), and in the run's cgroup in every hierarchy Moat uses
// (cgroups is /proc/PID/cgroup).
func judgeVMMThread(st map[string]string, shared []string, cgroups, runID string) string {
	for _, f := range strings.Fields(st["Uid"]) {
		if id, err := strconv.ParseInt(f, 10, 64); err != nil || id <= jail.UIDBase || id > jail.UIDLimit {
			return fmt.Sprintf("runs as host uid %s (Uid %s), not the jail's unprivileged range", f, st["Uid"])
		}
	}
	for _, f := range strings.Fields(st["Gid"]) {
		if f != strconv.Itoa(jail.GID) {
			return fmt.Sprintf("runs as host gid %s (Gid %s), not the jail's", f, st["Gid"])
		}
	}
	if g := strings.TrimSpace(st["Groups"]); g != "" {
		return "keeps supplementary groups " + g
	}
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if v := st[set]; v != "0000000000000000" {
			return fmt.Sprintf("has capabilities: %s %s", set, v)
		}
	}
	if len(shared) > 0 {
		return fmt.Sprintf("shares the host's %v namespaces", shared)
	}
	return inRunCgroup(cgroups, runID)
}

// inRunCgroup says "" when /proc/PID/cgroup (cgroups) puts the process in
// moat/<runID> in every hierarchy Moat's cgroups use (cgroup.InRun).
func inRunCgroup(cgroups, runID string) string {
	if runID == "" {
		return "could not be matched to its run's cgroup (no run id)"
	}
	if err := cgroup.InRun([]byte(cgroups), runID); err != nil {
		return "is " + err.Error()
	}
	return ""
}
