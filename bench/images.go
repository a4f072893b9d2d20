package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

// ImageOptions configure CompareImages.
type ImageOptions struct {
	// Image and VsImage are the two stored images compared; the ratios
	// are VsImage's medians over Image's.
	Image, VsImage string
	// Argv is the command run on both (default python3 -c pass).
	Argv []string
	// Runs is the number of timed runs of each contender (default 50).
	Runs int
	// Moat is the moat binary for the CLI contenders (default: this one).
	Moat string
	// Engine runs the in-process contenders.
	Engine *engine.Engine
	// Progress receives a line per phase; nil discards.
	Progress io.Writer
}

// ImageReport is CompareImages' result: the same command on two images,
// through the moat binary and through the in-process engine.
type ImageReport struct {
	// Image and VsImage are name@digest.
	Image   string   `json:"image"`
	VsImage string   `json:"vs_image"`
	Command string   `json:"command"`
	Samples []Sample `json:"samples"`
	// CLIRatio and EngineRatio are VsImage's median over Image's, for
	// `moat run` and for engine.Run: 1.00 means the same cost.
	CLIRatio    float64 `json:"cli_ratio"`
	EngineRatio float64 `json:"engine_ratio"`
	// CLIDiffMS and EngineDiffMS are the medians of the paired
	// differences (VsImage minus Image, same round), in milliseconds.
	CLIDiffMS    float64 `json:"cli_paired_diff_median_ms"`
	EngineDiffMS float64 `json:"engine_paired_diff_median_ms"`
}

// CompareImages measures the cost of a run on one stored image against a
// run on another, in one process and interleaved: every round runs all
// four contenders (moat run and engine.Run on each image), and which
// image goes first alternates between rounds, so machine noise and
// ordering effects (a warm page cache for the image just run) hit both.
func CompareImages(ctx context.Context, opts ImageOptions) (*ImageReport, error) {
	if opts.Runs <= 0 {
		opts.Runs = 50
	}
	if len(opts.Argv) == 0 {
		opts.Argv = []string{"python3", "-c", "pass"}
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
	rep := &ImageReport{Command: strings.Join(opts.Argv, " ")}
	// pair is one image's two contenders.
	type pair struct{ cli, eng *contender }
	var pairs [2]pair
	for i, name := range []string{opts.Image, opts.VsImage} {
		img, err := opts.Engine.Images().Lookup(name)
		if err != nil {
			return nil, fmt.Errorf("bench image %q: %w", name, err)
		}
		if i == 0 {
			rep.Image = img.Name + "@" + img.Digest
		} else {
			rep.VsImage = img.Name + "@" + img.Digest
		}
		m := manifest.Default()
		m.Image = name
		cliArgs := append([]string{"run", "--no-build", "--image", name, "--"}, opts.Argv...)
		pairs[i] = pair{
			cli: &contender{name: "moat-cli@" + name, command: "moat " + strings.Join(cliArgs, " "), run: func() error {
				return quiet(exec.Command(opts.Moat, cliArgs...), nil)
			}},
			eng: &contender{name: "moat-engine@" + name, command: "engine.Run(" + rep.Command + ") on " + name, run: func() error {
				return runOn(ctx, opts.Engine, m, opts.Argv)
			}},
		}
	}
	all := []*contender{pairs[0].cli, pairs[1].cli, pairs[0].eng, pairs[1].eng}

	fmt.Fprintf(opts.Progress, "bench: warming up %s and %s\n", opts.Image, opts.VsImage)
	for _, c := range all {
		for i := 0; i < 3; i++ {
			if err := c.run(); err != nil {
				return nil, fmt.Errorf("bench %s: %w", c.name, err)
			}
		}
	}
	fmt.Fprintf(opts.Progress, "bench: %d interleaved runs of each of %d contenders\n", opts.Runs, len(all))
	for round := 0; round < opts.Runs; round++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		order := []pair{pairs[0], pairs[1]}
		if round%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, p := range order {
			for _, c := range []*contender{p.cli, p.eng} {
				start := time.Now()
				if err := c.run(); err != nil {
					return nil, fmt.Errorf("bench %s: %w", c.name, err)
				}
				c.times = append(c.times, time.Since(start))
			}
		}
	}
	for _, c := range all {
		rep.Samples = append(rep.Samples, summarize(c.name, c.command, c.times))
	}
	rep.CLIRatio = ratio(rep.Samples[1].MedianMS, rep.Samples[0].MedianMS)
	rep.EngineRatio = ratio(rep.Samples[3].MedianMS, rep.Samples[2].MedianMS)
	_, rep.CLIDiffMS, _ = pairedDiff(pairs[1].cli.times, pairs[0].cli.times)
	_, rep.EngineDiffMS, _ = pairedDiff(pairs[1].eng.times, pairs[0].eng.times)
	return rep, nil
}

// ratio is a/b, or 0 when b is 0 (a run under the clock's resolution).
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Print writes the report as a table.
func (r *ImageReport) Print(w io.Writer) {
	fmt.Fprintf(w, "image %s\nvs    %s\n\n", r.Image, r.VsImage)
	width := 13
	for _, s := range r.Samples {
		width = max(width, len(s.Name))
	}
	fmt.Fprintf(w, "%-*s %9s %9s %9s  %s\n", width, "contender", "median", "p10", "p90", "command")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "%-*s %7.2fms %7.2fms %7.2fms  %s\n", width, s.Name, s.MedianMS, s.P10MS, s.P90MS, s.Command)
	}
	fmt.Fprintf(w, "\nvs / image (median): moat run %.3f, in-process engine %.3f   (1.00: the same cost)\n", r.CLIRatio, r.EngineRatio)
	fmt.Fprintf(w, "paired difference, vs minus image (same round, median): moat run %+.2f ms, in-process engine %+.2f ms\n", r.CLIDiffMS, r.EngineDiffMS)
}
