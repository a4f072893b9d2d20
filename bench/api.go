package bench

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// APIOptions configure the HTTP API benchmark: one-shot runs of
// python3 -c pass through 'moat serve' (Warm: a server with a warm pool;
// Cold: one without).
type APIOptions struct {
	Warm, Cold *client.Client
	// WarmWait, when set, blocks until the warm server's pool is full.
	WarmWait func()
	Runs     int   // timed runs of each of cold and warm (default 30)
	Levels   []int // concurrency levels of the throughput figures (default 1, 4, 16)
	// PerLevel is the runs at each level (default 64).
	PerLevel int
	// Image is the stored image the runs and sandboxes use (default: the
	// server's default image).
	Image    string
	Progress io.Writer
}

// APIReport is what the API benchmark measured.
type APIReport struct {
	Cold Sample `json:"cold"`
	Warm Sample `json:"warm"`
	// SessionCold and SessionWarm are create-to-first-byte of a sandbox:
	// POST /v1/sandboxes, then a command that prints one line, until its
	// output is back (without and with a session pool).
	SessionCold Sample `json:"session_cold"`
	SessionWarm Sample `json:"session_warm"`
	// WarmPooled is the share of warm runs that came from the pool.
	WarmPooled float64 `json:"warm_pooled"`
	// Throughput is runs per second at each concurrency level, against
	// the warm server (whose pool refills concurrently: past its size,
	// runs are prepared on demand).
	Throughput []Level `json:"throughput"`
}

// Level is one concurrency level's throughput.
type Level struct {
	Concurrency   int     `json:"concurrency"`
	Runs          int     `json:"runs"`
	RunsPerSecond float64 `json:"runs_per_second"`
	Pooled        int     `json:"pooled"`
	Errors        int     `json:"errors"`
}

// API measures create-to-result latency and throughput through the API.
func API(ctx context.Context, o APIOptions) (*APIReport, error) {
	if o.Runs <= 0 {
		o.Runs = 30
	}
	if len(o.Levels) == 0 {
		o.Levels = []int{1, 4, 16}
	}
	if o.PerLevel <= 0 {
		o.PerLevel = 64
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.WarmWait == nil {
		o.WarmWait = func() {}
	}
	req := &client.RunRequest{Argv: []string{"python3", "-c", "pass"}}
	sreq := &client.SandboxRequest{}
	// The default image's runs send no manifest, as before --image.
	if o.Image != "" && o.Image != manifest.Default().Image {
		req.Manifest = Manifest(o.Image)
		sreq.Manifest = Manifest(o.Image)
	}
	once := func(c *client.Client) (time.Duration, bool, error) {
		start := time.Now()
		r, err := c.Run(ctx, req)
		d := time.Since(start)
		if err != nil {
			return 0, false, err
		}
		if r.Result.Termination != result.Exited || r.Result.ExitCode != 0 {
			return 0, false, fmt.Errorf("python3 -c pass: %s exit %d: %s", r.Result.Termination, r.Result.ExitCode, r.Result.Stderr.Data)
		}
		return d, r.Pooled, nil
	}
	fmt.Fprintf(o.Progress, "bench: %d interleaved API runs, cold server and warm pool\n", o.Runs)
	for i := 0; i < 2; i++ { // warm-up
		for _, c := range []*client.Client{o.Cold, o.Warm} {
			if _, _, err := once(c); err != nil {
				return nil, err
			}
		}
	}
	var cold, warm []time.Duration
	pooled := 0
	for i := 0; i < o.Runs; i++ {
		d, _, err := once(o.Cold)
		if err != nil {
			return nil, err
		}
		cold = append(cold, d)
		o.WarmWait()
		d, p, err := once(o.Warm)
		if err != nil {
			return nil, err
		}
		warm = append(warm, d)
		if p {
			pooled++
		}
	}
	session := func(c *client.Client) (time.Duration, error) {
		start := time.Now()
		sb, err := c.CreateSandbox(ctx, sreq)
		if err != nil {
			return 0, err
		}
		defer sb.Delete(context.Background())
		ex, err := sb.Exec(ctx, &client.ExecRequest{Argv: []string{"echo", "hi"}})
		d := time.Since(start)
		if err != nil {
			return 0, err
		}
		if ex.Result == nil || ex.Result.Stdout.Data != "hi\n" {
			return 0, fmt.Errorf("echo hi in a sandbox: %+v", ex.Result)
		}
		return d, nil
	}
	var scold, swarm []time.Duration
	fmt.Fprintf(o.Progress, "bench: %d interleaved sandbox creations with a first command, cold and warm\n", o.Runs)
	for i := 0; i < o.Runs; i++ {
		d, err := session(o.Cold)
		if err != nil {
			return nil, err
		}
		scold = append(scold, d)
		o.WarmWait()
		d, err = session(o.Warm)
		if err != nil {
			return nil, err
		}
		swarm = append(swarm, d)
	}
	rep := &APIReport{
		SessionCold: summarize("sandbox-cold", "POST /v1/sandboxes + exec echo hi, no pool", scold),
		SessionWarm: summarize("sandbox-warm", "POST /v1/sandboxes + exec echo hi, session pool", swarm),
		Cold:        summarize("api-cold", "POST /v1/runs python3 -c pass, no pool", cold),
		Warm:        summarize("api-warm", "POST /v1/runs python3 -c pass, warm pool", warm),
		WarmPooled:  float64(pooled) / float64(o.Runs),
	}
	for _, n := range o.Levels {
		fmt.Fprintf(o.Progress, "bench: %d API runs at concurrency %d\n", o.PerLevel, n)
		o.WarmWait()
		lv := Level{Concurrency: n, Runs: o.PerLevel}
		var mu sync.Mutex
		jobs := make(chan struct{}, o.PerLevel)
		for i := 0; i < o.PerLevel; i++ {
			jobs <- struct{}{}
		}
		close(jobs)
		start := time.Now()
		var wg sync.WaitGroup
		for w := 0; w < n; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs {
					_, p, err := once(o.Warm)
					mu.Lock()
					if err != nil {
						lv.Errors++
					} else if p {
						lv.Pooled++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		lv.RunsPerSecond = float64(o.PerLevel) / time.Since(start).Seconds()
		rep.Throughput = append(rep.Throughput, lv)
	}
	return rep, nil
}

// Print writes the API report for humans.
func (r *APIReport) Print(w io.Writer) {
	fmt.Fprintf(w, "\nHTTP API (moat serve), one-shot python3 -c pass, create to result:\n")
	for _, s := range []Sample{r.Cold, r.Warm, r.SessionCold, r.SessionWarm} {
		fmt.Fprintf(w, "%-13s %7.2fms %7.2fms %7.2fms  %s\n", s.Name, s.MedianMS, s.P10MS, s.P90MS, s.Command)
	}
	if r.Warm.MedianMS > 0 {
		fmt.Fprintf(w, "warm / cold (median): one-shot run %.2f (%.0f%% of warm runs came from the pool), sandbox create to first byte %.2f\n",
			r.Warm.MedianMS/r.Cold.MedianMS, 100*r.WarmPooled, r.SessionWarm.MedianMS/r.SessionCold.MedianMS)
	}
	for _, l := range r.Throughput {
		fmt.Fprintf(w, "concurrency %2d: %6.1f runs/s (%d runs, %d from the pool, %d errors)\n", l.Concurrency, l.RunsPerSecond, l.Runs, l.Pooled, l.Errors)
	}
}

// serverCLI is the moat-cli-server contender: 'moat run --server'.
func serverCLI(moat, url, key, image string, argv []string) error {
	return quiet(exec.Command(moat, append([]string{"run", "--server", url, "--api-key", key, "--image", image, "--"}, argv...)...), nil)
}
