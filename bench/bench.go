// Package bench measures Moat's per-run overhead against peers measured in
// the same run: the bare command (the image's python3 under a plain chroot)
// and bubblewrap with equivalent isolation. Performance claims come from
// these ratios, never from absolute timings on one machine.
//
// It must never change anything but what a normal run changes.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Options configure a benchmark.
type Options struct {
	// Runs is the number of timed runs of each contender (default 50).
	Runs int
	// Throughput is the number of sequential /bin/true runs (default 200).
	Throughput int
	// Moat is the moat binary for the CLI contender (default: this one).
	Moat string
	// Image is the stored image every contender runs on (default
	// "python"); it must have python3. Pooled's pools must be of
	// Manifest(Image).
	Image string
	// Engine runs the in-process contender.
	Engine *engine.Engine
	// Pooled, when set, is an engine with a warm pool for the default
	// manifest: the moat-pool contender (what 'moat serve' does per run).
	Pooled *engine.Engine
	// ServerURL and APIKey, when set, add the moat-cli-server contender:
	// 'moat run --server URL' against a server with a warm pool, so the
	// run's sandbox is prepared before it is asked for.
	ServerURL, APIKey string
	// ServerWait blocks until that server's pool is full.
	ServerWait func()
	// Against, when set, is another moat binary (with AgainstGuest as its
	// moat-guest, or its own default when empty): the moat-cli-ref
	// contender, interleaved with moat-cli, so that two builds compare in
	// one run under the same load (Report.Reference).
	Against, AgainstGuest string
	// Progress receives a line per phase; nil discards.
	Progress io.Writer
}

// Comparison is this moat's cold moat run against Options.Against's.
type Comparison struct {
	Moat string `json:"moat"`
	// MedianMS is the reference's median; ThisMedianMS this moat's.
	MedianMS     float64 `json:"median_ms"`
	ThisMedianMS float64 `json:"this_median_ms"`
	// DiffMS are quantiles of the per-round differences, this moat's run
	// minus the reference's run of the same round: negative is faster.
	DiffMS    float64 `json:"paired_diff_median_ms"`
	DiffP25MS float64 `json:"paired_diff_p25_ms"`
	DiffP75MS float64 `json:"paired_diff_p75_ms"`
}

// Sample summarises one contender's wall times.
type Sample struct {
	Name     string  `json:"name"`
	Command  string  `json:"command"`
	Runs     int     `json:"runs"`
	MedianMS float64 `json:"median_ms"`
	P10MS    float64 `json:"p10_ms"`
	P90MS    float64 `json:"p90_ms"`
	MinMS    float64 `json:"min_ms"`
}

// Report is what Run measured.
type Report struct {
	Image       string   `json:"image"`
	Samples     []Sample `json:"samples"`
	Bubblewrap  bool     `json:"bubblewrap"`
	SkipReasons []string `json:"skip_reasons,omitempty"`

	// OverheadMS is moat run (CLI) minus bare, at the median.
	OverheadMS float64 `json:"overhead_ms"`
	// EngineOverheadMS is the in-process engine minus bare, at the median.
	EngineOverheadMS float64 `json:"engine_overhead_ms"`
	// RatioBwrap is moat run (CLI) over bubblewrap, at the median.
	RatioBwrap float64 `json:"ratio_bwrap"`
	// ServerOverheadMS is 'moat run --server' (warm pool) minus bare, and
	// RatioBwrapServer the same over bubblewrap.
	ServerOverheadMS float64 `json:"server_overhead_ms,omitempty"`
	RatioBwrapServer float64 `json:"ratio_bwrap_server,omitempty"`
	// PoolOverheadMS is the in-process engine with a warm pool minus bare.
	PoolOverheadMS float64 `json:"pool_overhead_ms,omitempty"`
	// RatioBwrapPool is the pooled engine over bubblewrap.
	RatioBwrapPool float64 `json:"ratio_bwrap_pool,omitempty"`
	// RunsPerSecond is sequential /bin/true runs through the engine.
	RunsPerSecond float64 `json:"runs_per_second"`
	// PoolRunsPerSecond is the same through the pooled engine (the pool
	// refills in the background, concurrently).
	PoolRunsPerSecond float64 `json:"pool_runs_per_second,omitempty"`
	// CLIRunsPerSecond is the same through the moat binary.
	CLIRunsPerSecond float64 `json:"cli_runs_per_second"`
	// Reference compares with Options.Against, when set.
	Reference *Comparison `json:"reference,omitempty"`
	// CgroupV1MigrationMS is the median time to move a process into a v1
	// cgroup by pid after 50 ms without migrations (what a cold run would
	// pay if its init did not move its own threads in); 0 on v2, where
	// runs are born in their cgroup.
	CgroupV1MigrationMS float64 `json:"cgroup_v1_migration_ms"`
}

type contender struct {
	name, command string
	// before runs untimed ahead of each timed run.
	before func()
	run    func() error
	times  []time.Duration
}

// Run measures. The contenders are interleaved round-robin so drift in the
// machine's load affects all of them alike.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if opts.Runs <= 0 {
		opts.Runs = 50
	}
	if opts.Throughput <= 0 {
		opts.Throughput = 200
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.Moat == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		opts.Moat = exe
	}
	if opts.Image == "" {
		opts.Image = "python"
	}
	img, err := opts.Engine.Images().Lookup(opts.Image)
	if err != nil {
		return nil, fmt.Errorf("bench image %q: %w", opts.Image, err)
	}
	rep := &Report{Image: img.Name + "@" + img.Digest}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/workspace"}
	py := []string{"python3", "-c", "pass"}

	m := Manifest(opts.Image)
	engineRun := func(argv []string) error { return runOn(ctx, opts.Engine, m, argv) }
	contenders := []*contender{
		{name: "bare", command: "chroot IMAGE python3 -c pass", run: func() error {
			return quiet(exec.Command("/usr/bin/python3", "-c", "pass"), func(c *exec.Cmd) {
				c.Env = env
				c.Dir = "/"
				c.SysProcAttr = &syscall.SysProcAttr{Chroot: img.Root}
			})
		}},
		{name: "moat-cli", command: "moat run -- python3 -c pass", run: func() error {
			return quiet(exec.Command(opts.Moat, append([]string{"run", "--no-build", "--image", opts.Image, "--"}, py...)...), nil)
		}},
		{name: "moat-engine", command: "engine.Run(python3 -c pass) in-process", run: func() error { return engineRun(py) }},
	}
	var ref *contender
	if opts.Against != "" {
		ref = &contender{name: "moat-cli-ref", command: opts.Against + " run -- python3 -c pass", run: func() error {
			args := []string{"run", "--no-build"}
			if opts.Image != "python" {
				// Only then: an older build may predate --image.
				args = append(args, "--image", opts.Image)
			}
			return quiet(exec.Command(opts.Against, append(append(args, "--"), py...)...), func(c *exec.Cmd) {
				c.Env = withGuest(os.Environ(), opts.AgainstGuest)
			})
		}}
		contenders = append(contenders, ref)
	}
	if opts.ServerURL != "" {
		contenders = append(contenders, &contender{name: "moat-cli-srv", command: "moat run --server URL -- python3 -c pass (warm pool)",
			before: opts.ServerWait,
			run:    func() error { return serverCLI(opts.Moat, opts.ServerURL, opts.APIKey, opts.Image, py) }})
	}
	if opts.Pooled != nil {
		// The pool refills between runs, untimed: each timed run takes a
		// prepared sandbox, as a server's request does when its pool
		// keeps up.
		contenders = append(contenders, &contender{name: "moat-pool", command: "engine.Run(python3 -c pass) from a warm pool",
			before: func() { opts.Pooled.WaitPools(ctx) },
			run:    func() error { return runOn(ctx, opts.Pooled, m, py) }})
	}
	if bwrap, err := exec.LookPath("bwrap"); err == nil {
		rep.Bubblewrap = true
		args := []string{"--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
			"--ro-bind", img.Root, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/workspace",
			"--chdir", "/workspace", "--uid", "1000", "--gid", "1000"}
		for _, kv := range env {
			k, v, _ := cut(kv)
			args = append(args, "--setenv", k, v)
		}
		contenders = append(contenders, &contender{name: "bwrap", command: "bwrap --unshare-all --ro-bind IMAGE / ... python3 -c pass", run: func() error {
			return quiet(exec.Command(bwrap, append(args, py...)...), nil)
		}})
	} else {
		rep.SkipReasons = append(rep.SkipReasons, "bubblewrap not installed (apt-get install bubblewrap): no moat/bwrap ratio")
	}

	// Warm up page cache and lazy initialisation: not measured.
	fmt.Fprintf(opts.Progress, "bench: warming up\n")
	for _, c := range contenders {
		for i := 0; i < 3; i++ {
			if err := c.run(); err != nil {
				return nil, fmt.Errorf("bench %s: %w", c.name, err)
			}
		}
	}
	fmt.Fprintf(opts.Progress, "bench: %d interleaved runs of each of %d contenders\n", opts.Runs, len(contenders))
	for i := 0; i < opts.Runs; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, c := range contenders {
			if c.before != nil {
				c.before()
			}
			start := time.Now()
			if err := c.run(); err != nil {
				return nil, fmt.Errorf("bench %s: %w", c.name, err)
			}
			c.times = append(c.times, time.Since(start))
		}
	}
	med := map[string]float64{}
	for _, c := range contenders {
		s := summarize(c.name, c.command, c.times)
		rep.Samples = append(rep.Samples, s)
		med[c.name] = s.MedianMS
	}
	rep.OverheadMS = med["moat-cli"] - med["bare"]
	rep.EngineOverheadMS = med["moat-engine"] - med["bare"]
	if rep.Bubblewrap {
		rep.RatioBwrap = med["moat-cli"] / med["bwrap"]
	}
	if opts.ServerURL != "" {
		rep.ServerOverheadMS = med["moat-cli-srv"] - med["bare"]
		if rep.Bubblewrap {
			rep.RatioBwrapServer = med["moat-cli-srv"] / med["bwrap"]
		}
	}
	if ref != nil {
		c := &Comparison{Moat: opts.Against, MedianMS: med["moat-cli-ref"], ThisMedianMS: med["moat-cli"]}
		i := slices.IndexFunc(contenders, func(c *contender) bool { return c.name == "moat-cli" })
		c.DiffP25MS, c.DiffMS, c.DiffP75MS = pairedDiff(contenders[i].times, ref.times)
		rep.Reference = c
	}
	if opts.Pooled != nil {
		rep.PoolOverheadMS = med["moat-pool"] - med["bare"]
		if rep.Bubblewrap {
			rep.RatioBwrapPool = med["moat-pool"] / med["bwrap"]
		}
	}

	fmt.Fprintf(opts.Progress, "bench: %d sequential /bin/true runs through the engine\n", opts.Throughput)
	start := time.Now()
	for i := 0; i < opts.Throughput; i++ {
		if err := engineRun([]string{"/bin/true"}); err != nil {
			return nil, fmt.Errorf("bench throughput: %w", err)
		}
	}
	rep.RunsPerSecond = float64(opts.Throughput) / time.Since(start).Seconds()
	if opts.Pooled != nil {
		opts.Pooled.WaitPools(ctx)
		fmt.Fprintf(opts.Progress, "bench: %d sequential /bin/true runs through the pooled engine\n", opts.Throughput)
		start = time.Now()
		for i := 0; i < opts.Throughput; i++ {
			if err := runOn(ctx, opts.Pooled, m, []string{"/bin/true"}); err != nil {
				return nil, fmt.Errorf("bench pooled throughput: %w", err)
			}
		}
		rep.PoolRunsPerSecond = float64(opts.Throughput) / time.Since(start).Seconds()
	}
	n := opts.Throughput / 4
	fmt.Fprintf(opts.Progress, "bench: %d sequential /bin/true runs through the moat binary\n", n)
	start = time.Now()
	for i := 0; i < n; i++ {
		if err := quiet(exec.Command(opts.Moat, "run", "--no-build", "--image", opts.Image, "--", "/bin/true"), nil); err != nil {
			return nil, fmt.Errorf("bench cli throughput: %w", err)
		}
	}
	rep.CLIRunsPerSecond = float64(n) / time.Since(start).Seconds()
	if ms, err := MigrationCost(); err == nil {
		rep.CgroupV1MigrationMS = ms
	} else {
		rep.SkipReasons = append(rep.SkipReasons, "cgroup migration not measured: "+err.Error())
	}
	return rep, nil
}

// Manifest is the default manifest on image: what every contender runs
// under, and what a warm pool for them must hold.
func Manifest(image string) *manifest.Manifest {
	m := manifest.Default()
	if image != "" {
		m.Image = image
	}
	return m
}

func runOn(ctx context.Context, e *engine.Engine, m *manifest.Manifest, argv []string) error {
	res, err := e.Run(ctx, &engine.Request{Manifest: m, Argv: argv})
	if err != nil {
		return err
	}
	if res.Termination != result.Exited || res.ExitCode != 0 {
		return fmt.Errorf("%v: %s exit %d: %s", argv, res.Termination, res.ExitCode, res.Stderr.Data)
	}
	return nil
}

// MigrationCost is cgroup.Host.MigrationCost on this host, in
// milliseconds (0 on cgroup v2).
func MigrationCost() (float64, error) {
	h, err := cgroup.Detect()
	if err != nil {
		return 0, err
	}
	d, err := h.MigrationCost()
	return float64(d.Microseconds()) / 1000, err
}

func quiet(c *exec.Cmd, set func(*exec.Cmd)) error {
	if set != nil {
		set(c)
	}
	out, err := c.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("%s exited %d: %s", c.Path, ee.ExitCode(), out)
		}
		return err
	}
	return nil
}

func cut(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// withGuest is env with MOAT_GUEST set to guest, or removed when guest is
// empty (so that a reference moat finds its own moat-guest, not ours).
func withGuest(env []string, guest string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "MOAT_GUEST=") })
	if guest != "" {
		out = append(out, "MOAT_GUEST="+guest)
	}
	return out
}

// pairedDiff returns the 25th, 50th and 75th percentiles of a[i] - b[i],
// in milliseconds: rounds are interleaved, so each pair ran under the same
// load, and the distribution of differences is far narrower than either's.
func pairedDiff(a, b []time.Duration) (p25, p50, p75 float64) {
	n := min(len(a), len(b))
	if n == 0 {
		return 0, 0, 0
	}
	d := make([]time.Duration, n)
	for i := range d {
		d[i] = a[i] - b[i]
	}
	slices.Sort(d)
	q := func(p float64) float64 { return float64(d[int(p*float64(n-1))].Microseconds()) / 1000 }
	return q(0.25), q(0.5), q(0.75)
}

func summarize(name, command string, ts []time.Duration) Sample {
	s := slices.Clone(ts)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(p * float64(len(s)-1))
		return float64(s[i].Microseconds()) / 1000
	}
	return Sample{Name: name, Command: command, Runs: len(s), MedianMS: q(0.5), P10MS: q(0.1), P90MS: q(0.9), MinMS: q(0)}
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "image %s\n\n", r.Image)
	fmt.Fprintf(w, "%-13s %9s %9s %9s  %s\n", "contender", "median", "p10", "p90", "command")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "%-13s %7.2fms %7.2fms %7.2fms  %s\n", s.Name, s.MedianMS, s.P10MS, s.P90MS, s.Command)
	}
	fmt.Fprintf(w, "\noverhead over bare (median): moat run %.2f ms, in-process engine %.2f ms   (target <= 5 ms)\n", r.OverheadMS, r.EngineOverheadMS)
	if r.Bubblewrap {
		fmt.Fprintf(w, "moat run / bubblewrap (median): %.2f   (target <= 1.3)\n", r.RatioBwrap)
	}
	if r.ServerOverheadMS != 0 {
		fmt.Fprintf(w, "moat run --server (warm pool): overhead %.2f ms, / bubblewrap %.2f\n", r.ServerOverheadMS, r.RatioBwrapServer)
	}
	if r.PoolOverheadMS != 0 {
		fmt.Fprintf(w, "warm pool (in-process): overhead %.2f ms, / bubblewrap %.2f, %.0f sequential /bin/true runs/s\n", r.PoolOverheadMS, r.RatioBwrapPool, r.PoolRunsPerSecond)
	}
	fmt.Fprintf(w, "sequential /bin/true: %.0f runs/s in-process, %.0f runs/s through the moat binary   (target >= 100)\n", r.RunsPerSecond, r.CLIRunsPerSecond)
	if c := r.Reference; c != nil {
		fmt.Fprintf(w, "this moat against %s: medians %.2f ms and %.2f ms; paired difference (this minus reference, same round) median %+.2f ms, p25 %+.2f, p75 %+.2f\n",
			c.Moat, c.ThisMedianMS, c.MedianMS, c.DiffMS, c.DiffP25MS, c.DiffP75MS)
	}
	if r.CgroupV1MigrationMS > 0 {
		fmt.Fprintf(w, "cgroup v1 migration by pid after 50 ms idle: %.2f ms median (what a cold run would wait if init did not move itself in; see cgroup.JoinFiles)\n", r.CgroupV1MigrationMS)
	}
	for _, s := range r.SkipReasons {
		fmt.Fprintf(w, "note: %s\n", s)
	}
}
