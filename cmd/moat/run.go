package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

const runUsage = `Usage: moat run [FLAGS] [--] COMMAND [ARG...]

Runs COMMAND in a fresh, deny-by-default sandbox and destroys it afterwards.
Everything the manifest does not grant is denied: no network, no host files
(inputs are copied in), no host environment.

Without --json, the program's stdout and stderr stream live (capped) and moat
exits with the program's status: 124 on timeout, 128+N when killed by signal N,
127 when the command does not exist, 2 for invalid flags or manifest, 125 when
moat itself failed. With --json, one result object is printed on stdout (see
docs/RESULT.md) and moat exits 0 whenever the run took place.

Flags (override the manifest's fields):
`

func cmdRun(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	var (
		manifestPath = fs.String("manifest", "", "capability manifest `FILE` (YAML or JSON)")
		img          = fs.String("image", "", "root image `NAME` (default python)")
		tierName     = fs.String("tier", "", "isolation `TIER` (default native)")
		timeout      = fs.String("timeout", "", "wall-clock `DURATION`, e.g. 30s (default 30s)")
		memory       = fs.String("memory", "", "memory limit `SIZE`, e.g. 512MiB, no swap (default 512MiB)")
		cpus         = fs.String("cpus", "", "CPU quota in `CORES`, e.g. 0.5 (default 1)")
		pids         = fs.String("pids", "", "process and thread `LIMIT` (default 128)")
		jsonOut      = fs.Bool("json", false, "print the structured result as JSON instead of streaming")
		outDir       = fs.String("output", "", "copy added and modified workspace files into `DIR` (must be empty or absent)")
		stdin        = fs.Bool("stdin", false, "forward moat's standard input to the program (default: empty input)")
		noBuild      = fs.Bool("no-build", false, "fail instead of building a missing image")
	)
	var inputs []manifest.Input
	var envs [][2]string
	fs.Func("input", "copy host `SRC[:DST]` into /workspace/DST (repeatable; DST defaults to SRC's base name)", func(s string) error {
		in, err := manifest.ParseInputFlag(s)
		if err != nil {
			return err
		}
		inputs = append(inputs, in)
		return nil
	})
	var netFlags []string
	fs.Func("net", "network grant: `none`, allow=HOST[,HOST...] (through Moat's egress proxy), or allow-address=IP[,IP...] (repeatable)", func(s string) error {
		netFlags = append(netFlags, s)
		return nil
	})
	fs.Func("env", "set `K=V` in the program's environment (repeatable)", func(s string) error {
		k, v, err := manifest.ParseEnvFlag(s)
		if err != nil {
			return err
		}
		envs = append(envs, [2]string{k, v})
		return nil
	})
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), runUsage)
		fs.PrintDefaults()
	}
	fs.SetOutput(helpOutput(args))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "moat run: no command given\nUsage: moat run [FLAGS] [--] COMMAND [ARG...]   (moat run --help for flags)")
		return exitUsage
	}

	// The manifest first, then flags on top, then one validation.
	var m *manifest.Manifest
	var err error
	if *manifestPath != "" {
		if m, err = manifest.Load(*manifestPath); err != nil {
			fmt.Fprintf(os.Stderr, "moat: %v\n", err)
			return exitUsage
		}
	} else {
		m = manifest.Default()
	}
	flagErr := func(field, value string, err error) int {
		fmt.Fprintf(os.Stderr, "moat run: --%s %q: %v\n", field, value, err)
		return exitUsage
	}
	if *img != "" {
		m.Image = *img
	}
	if *tierName != "" {
		m.Tier = *tierName
	}
	if *timeout != "" {
		d, err := manifest.ParseDuration(*timeout)
		if err != nil {
			return flagErr("timeout", *timeout, err)
		}
		// cpu_time follows the timeout unless it was set apart from it.
		m.Resources.SetTimeout(d)
	}
	if *memory != "" {
		s, err := manifest.ParseSize(*memory)
		if err != nil {
			return flagErr("memory", *memory, err)
		}
		m.Resources.Memory = s
	}
	if *cpus != "" {
		f, err := strconv.ParseFloat(*cpus, 64)
		if err != nil {
			return flagErr("cpus", *cpus, errors.New("want a number of cores such as 1 or 0.5"))
		}
		m.Resources.CPUs = f
	}
	if *pids != "" {
		n, err := strconv.Atoi(*pids)
		if err != nil {
			return flagErr("pids", *pids, errors.New("want a whole number such as 128"))
		}
		m.Resources.Pids = n
	}
	if len(inputs) > 0 {
		wd, _ := os.Getwd()
		flagInputs := &manifest.Manifest{Inputs: inputs}
		if err := flagInputs.ResolveInputs(wd); err != nil {
			fmt.Fprintf(os.Stderr, "moat run: --input: %v\n", err)
			return exitUsage
		}
		m.Inputs = append(m.Inputs, flagInputs.Inputs...)
	}
	for _, nf := range netFlags {
		switch k, v, _ := strings.Cut(nf, "="); k {
		case "none":
			m.Network = manifest.Network{Mode: "none"}
		case "allow":
			m.Network.Mode = "allowlist"
			m.Network.Allow = append(m.Network.Allow, splitList(v)...)
		case "allow-address":
			m.Network.AllowAddresses = append(m.Network.AllowAddresses, splitList(v)...)
		default:
			fmt.Fprintf(os.Stderr, "moat run: --net %q: want none, allow=HOST[,HOST...] or allow-address=IP[,IP...]\n", nf)
			return exitUsage
		}
	}
	for _, kv := range envs {
		if m.Env == nil {
			m.Env = map[string]string{}
		}
		m.Env[kv[0]] = kv[1]
	}
	if err := m.Validate(); err != nil {
		fmt.Fprintf(os.Stderr, "moat: invalid manifest:\n%v\n", err)
		return exitUsage
	}

	e, err := engine.New(engine.Options{Progress: progressWriter(), NoAutoBuild: *noBuild})
	if err != nil {
		return fail(err)
	}
	// Clean up after runs that were killed before they could.
	if rep, err := e.GC(); err == nil && len(rep.Runs)+len(rep.Cgroups) > 0 {
		fmt.Fprintf(os.Stderr, "moat: removed leftovers of %d killed run(s)\n", max(len(rep.Runs), len(rep.Cgroups)))
	}

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
	defer stop()
	req := &engine.Request{Manifest: m, Argv: argv, OutputDir: *outDir}
	if *stdin {
		req.Stdin = os.Stdin
	}
	if *outDir != "" {
		if abs, err := filepath.Abs(*outDir); err == nil {
			req.OutputDir = abs
		}
	}
	if !*jsonOut {
		stdout, stderr := liveWriter(os.Stdout), liveWriter(os.Stderr)
		req.LiveStdout, req.LiveStderr = stdout, stderr
	}
	res, err := e.Run(ctx, req)
	if err != nil {
		var fe *manifest.FieldError
		if errors.Is(err, engine.ErrUsage) || errors.As(err, &fe) {
			fmt.Fprintf(os.Stderr, "moat: %v\n", err)
			return exitUsage
		}
		if errors.Is(err, tier.ErrUnavailable) {
			fmt.Fprintf(os.Stderr, "moat: %v\nRun 'moat doctor' for details.\n", err)
			return exitMoat
		}
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "moat: interrupted; the sandbox was destroyed")
			return 130
		}
		return fail(err)
	}
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return fail(err)
		}
		return 0
	}
	if f, ok := req.LiveStdout.(flusher); ok {
		f.Flush()
	}
	if f, ok := req.LiveStderr.(flusher); ok {
		f.Flush()
	}
	report(res)
	if ctx.Err() != nil {
		return 130
	}
	return res.ExitCode
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// report tells the user, on stderr, what the streamed output cannot show.
func report(res *result.Result) {
	for _, v := range res.Violations {
		fmt.Fprintf(os.Stderr, "moat: %s: %s", v.Kind, v.Detail)
		if v.Limit != "" {
			fmt.Fprintf(os.Stderr, " (limit %s)", v.Limit)
		}
		fmt.Fprintln(os.Stderr)
	}
	for _, d := range res.Degradations {
		fmt.Fprintf(os.Stderr, "moat: warning: ran without %s (accepted by the manifest)\n", d)
	}
	if co := res.CopyOut; co != nil {
		fmt.Fprintf(os.Stderr, "moat: copied %d file(s), %d bytes, to %s\n", co.Files, co.Bytes, co.Dir)
		for _, s := range co.Skipped {
			fmt.Fprintf(os.Stderr, "moat: not copied: %s: %s\n", s.Path, s.Reason)
		}
	}
	switch res.Termination {
	case result.OOM:
		fmt.Fprintln(os.Stderr, "moat: killed: out of memory (raise resources.memory or --memory)")
	case result.Signaled:
		fmt.Fprintf(os.Stderr, "moat: killed by signal %s\n", res.SignalName)
	case result.InfraError:
		fmt.Fprintf(os.Stderr, "moat: the sandbox failed: %s\n", res.Error)
	}
}

type flusher interface{ Flush() error }

// liveWriter streams untrusted output to the user. On a terminal, control
// sequences are neutralised so the program cannot rewrite the screen, set
// the clipboard (OSC 52) or retitle the window; pipes get the bytes as is.
func liveWriter(f *os.File) interface {
	io.Writer
	flusher
} {
	if isTerminal(f) {
		return output.NewSanitizingWriter(f)
	}
	return plain{f}
}

type plain struct{ io.Writer }

func (plain) Flush() error { return nil }

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressWriter is where long operations (image builds) report progress.
func progressWriter() io.Writer { return os.Stderr }
