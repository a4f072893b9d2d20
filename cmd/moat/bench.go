package main

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/bench"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

func cmdBench(args []string) int {
	fs := newFlags("bench", `Usage: moat bench [--runs N] [--json]

Measures, in one run and interleaved, the wall time of python3 -c pass:
bare (the image's python under chroot), through 'moat run', through the
in-process engine, and under bubblewrap with equivalent isolation; then the
throughput of sequential /bin/true runs. Reports medians and ratios against
the peers, not absolute claims. Needs root and a built python image.

Flags:
`)
	runs := fs.Int("runs", 50, "timed runs of each contender")
	through := fs.Int("throughput", 200, "sequential /bin/true runs for the runs/s figure")
	jsonOut := fs.Bool("json", false, "print the report as JSON")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true})
	if err != nil {
		return fail(err)
	}
	// A second engine keeps a warm pool of the default manifest's
	// sandboxes, as 'moat serve --pool' does.
	pooled, err := engine.New(engine.Options{NoAutoBuild: true, Pools: []engine.PoolConfig{{Manifest: manifest.Default(), Size: 4}}})
	if err != nil {
		return fail(err)
	}
	defer pooled.Close()
	if err := pooled.StartPools(); err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM)
	defer stop()
	rep, err := bench.Run(ctx, bench.Options{Runs: *runs, Throughput: *through, Engine: e, Pooled: pooled, Progress: os.Stderr})
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
