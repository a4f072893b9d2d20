package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/bench"
	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/server"
)

func cmdBench(args []string) int {
	fs := newFlags("bench", `Usage: moat bench [--runs N] [--image NAME] [--against MOAT[:GUEST]] [--json]
       moat bench --image NAME --vs-image OTHER [--runs N] [--json] [-- COMMAND...]

Measures, in one run and interleaved, the wall time of python3 -c pass:
bare (the image's python under chroot), through 'moat run', through
'moat run --server' against a local server with a warm pool, through the
in-process engine with and without a warm pool, and under bubblewrap with
equivalent isolation; then the throughput of sequential /bin/true runs;
then the HTTP API: create-to-result latency of a one-shot run, cold (no
pool) against warm, and runs per second at concurrency 1, 4 and 16.
Reports medians and ratios against the peers, not absolute claims. Needs
root and a built python image.

With --against, another moat binary (an older build, say) runs the same
cold 'moat run' interleaved with this one, and the report adds the median
of their paired differences: how two builds compare under the same load.
GUEST is that moat's moat-guest (default: whatever that moat finds).

With --image, every contender runs on that stored image (default python;
it must have python3). With --vs-image, only that comparison runs: the
same COMMAND (default python3 -c pass) through 'moat run' and through the
in-process engine on both images, interleaved round by round (the image
that goes first alternates), and the report gives the medians, their
ratio (OTHER over NAME; 1.00 is the same cost) and the median paired
difference. An imported image against the built one it came from says
whether a run on an imported image costs the same.

Flags:
`)
	runs := fs.Int("runs", 50, "timed runs of each contender")
	through := fs.Int("throughput", 200, "sequential /bin/true runs for the runs/s figure")
	apiRuns := fs.Int("api-runs", 64, "runs at each API concurrency level (0: skip the API benchmark)")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	against := fs.String("against", "", "compare with another moat `BINARY[:GUEST]` (its moat-guest), interleaved")
	imageName := fs.String("image", "python", "run every contender on the stored image `NAME`")
	vsImage := fs.String("vs-image", "", "compare runs on --image with runs on the stored image `OTHER`, interleaved, and nothing else")
	// The COMMAND is what follows "--", split off first: parse takes
	// flags from anywhere, so it would read a COMMAND's -c as its own.
	var command []string
	if i := slices.Index(args, "--"); i >= 0 {
		args, command = args[:i], args[i+1:]
	}
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "moat bench: unexpected argument %q: a COMMAND for --vs-image goes after --\n", fs.Arg(0))
		return exitUsage
	}
	if *vsImage == "" && len(command) > 0 {
		fmt.Fprintf(os.Stderr, "moat bench: a COMMAND (%q) is for --vs-image only; the full benchmark runs python3 -c pass\n", command)
		return exitUsage
	}
	if *vsImage != "" && *against != "" {
		fmt.Fprintln(os.Stderr, "moat bench: --vs-image and --against are two different comparisons: give one of them")
		return exitUsage
	}
	refMoat, refGuest, _ := strings.Cut(*against, ":")
	for _, p := range []struct{ what, path string }{{"BINARY", refMoat}, {"GUEST", refGuest}} {
		if p.path == "" {
			continue
		}
		if fi, err := os.Stat(p.path); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			fmt.Fprintf(os.Stderr, "moat bench: --against %s: %s %q is not an executable file (want --against /path/to/moat[:/path/to/moat-guest])\n", *against, p.what, p.path)
			return exitUsage
		}
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true})
	if err != nil {
		return fail(err)
	}
	// Both images are looked up before anything starts, so a typo is one
	// line naming the stored images (Lookup's error), not a failed pool.
	for _, f := range []struct{ flag, name string }{{"image", *imageName}, {"vs-image", *vsImage}} {
		if f.name == "" {
			continue
		}
		if _, err := e.Images().Lookup(f.name); err != nil {
			fmt.Fprintf(os.Stderr, "moat bench: --%s %s: %v\n", f.flag, f.name, err)
			return exitUsage
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer stop()
	if *vsImage != "" {
		rep, err := bench.CompareImages(ctx, bench.ImageOptions{Image: *imageName, VsImage: *vsImage, Argv: command,
			Runs: *runs, Engine: e, Progress: os.Stderr})
		if err != nil {
			return fail(err)
		}
		if *jsonOut {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.Encode(rep)
			return 0
		}
		rep.Print(os.Stdout)
		return 0
	}
	// A second engine keeps a warm pool of the default manifest's
	// sandboxes, as 'moat serve --pool' does.
	pooled, err := engine.New(engine.Options{NoAutoBuild: true, Pools: []engine.PoolConfig{
		{Manifest: bench.Manifest(*imageName), Size: 4},
		{Manifest: bench.Manifest(*imageName), Size: 2, Session: true},
	}})
	if err != nil {
		return fail(err)
	}
	defer pooled.Close()
	if err := pooled.StartPools(); err != nil {
		return fail(err)
	}
	waitPool := func() { pooled.WaitPools(ctx) }

	// Two API servers in this process, on loopback: one on the pooled
	// engine, one on the plain one, with a throwaway audit log and key.
	dir, err := os.MkdirTemp("", "moat-bench-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	store, err := audit.Open(filepath.Join(dir, "audit.db"))
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	key, _, err := store.CreateKey("bench", audit.Quota{MaxSandboxes: 64})
	if err != nil {
		return fail(err)
	}
	warmURL, stopWarm, err := benchServer(pooled, store)
	if err != nil {
		return fail(err)
	}
	defer stopWarm()
	coldURL, stopCold, err := benchServer(e, store)
	if err != nil {
		return fail(err)
	}
	defer stopCold()

	rep, err := bench.Run(ctx, bench.Options{Runs: *runs, Throughput: *through, Engine: e, Pooled: pooled,
		ServerURL: warmURL, APIKey: key, ServerWait: waitPool, Image: *imageName, Against: refMoat, AgainstGuest: refGuest, Progress: os.Stderr})
	if err != nil {
		return fail(err)
	}
	var api *bench.APIReport
	if *apiRuns > 0 {
		warm, _ := client.New(warmURL, key)
		cold, _ := client.New(coldURL, key)
		api, err = bench.API(ctx, bench.APIOptions{Warm: warm, Cold: cold, WarmWait: waitPool, Image: *imageName, Runs: *runs, PerLevel: *apiRuns, Progress: os.Stderr})
		if err != nil {
			return fail(fmt.Errorf("API benchmark: %w", err))
		}
	}
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(struct {
			*bench.Report
			API *bench.APIReport `json:"api,omitempty"`
		}{rep, api})
		return 0
	}
	rep.Print(os.Stdout)
	if api != nil {
		api.Print(os.Stdout)
	}
	return 0
}

// benchServer serves the API of e on a loopback port until stop.
func benchServer(e *engine.Engine, store *audit.Store) (url string, stop func(), err error) {
	srv, err := server.New(server.Config{Backend: server.NewEngineBackend(e), Auditor: store,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: srv.Handler()}
	go hs.Serve(ln)
	return "http://" + ln.Addr().String(), func() {
		srv.Shutdown(context.Background())
		hs.Close()
	}, nil
}
