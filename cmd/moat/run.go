package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
	"github.com/moat-sandbox/moat/workspace"
)

const runUsage = `Usage: moat run [FLAGS] [--] [COMMAND [ARG...]]

Runs COMMAND in a fresh, deny-by-default sandbox and destroys it afterwards.
Without COMMAND, runs the image's Entrypoint followed by its Cmd (an image
imported with moat image import can have them); a COMMAND replaces both.
The program starts in the image's WorkingDir when it has one, else in
/workspace, always as the sandbox's unprivileged user (never the image's
User, never root).
Everything the manifest does not grant is denied: no network, no host files
(inputs are copied in), no host environment.

Without --json, the program's stdout and stderr stream live (capped) and moat
exits with the program's status: 124 on timeout, 128+N when killed by signal N,
127 when the command does not exist, 2 for invalid flags or manifest, 125 when
moat itself failed. With --json, one result object is printed on stdout (see
docs/RESULT.md) and moat exits 0 whenever the run took place.

With --server URL (or MOAT_SERVER), the run takes place on a Moat server
(moat serve) instead of this host, with the same manifest, output (printed
when the run ends) and exit statuses. Inputs are read here, with the same
symlink rules, and sent as files; a symlink inside an input is sent as a
copy of the file it leads to. The API key comes from --api-key or, better
(flags are visible to other users in ps), MOAT_API_KEY. A request the server
refuses as invalid (HTTP 400, 401, 403, 413) exits 2, any other failure 125.

With --policy FILE (or MOAT_POLICY), a local run is checked against the
policy's default ceiling first, and refused (exit 2) naming the field, the
value and the ceiling; also when a widening lacks a justification the
policy requires. A run on a server is checked by the server's policy.
--output and --no-build are refused with --server. --server "" runs locally
even when MOAT_SERVER is set.

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
		canaries     = fs.Bool("canaries", false, "plant per-run decoy credentials (manifest output.canaries); one seen outside the sandbox is a canary violation")
		withhold     = fs.Bool("withhold-flagged", false, "withhold the output of a run flagged by a canary (manifest output.withhold_flagged)")
		noIncidents  = fs.Bool("no-incidents", false, "keep no evidence bundle when the run is flagged (moat incident; also MOAT_INCIDENTS=off)")
		serverURL    = fs.String("server", "", "run on the Moat server at `URL` instead of locally (default $MOAT_SERVER)")
		apiKey       = fs.String("api-key", "", "API `KEY` for --server (default $MOAT_API_KEY, which is safer: flags show in ps)")
		policyPath   = fs.String("policy", "", "operator policy `FILE` whose default ceiling a local run must fit (default $"+policy.EnvVar+")")
		effectsPath  = fs.String("effects-policy", "", "effects policy `FILE` the command is analysed against before it runs (default: Moat's, see moat analyse --default-policy; off: no analysis)")
		approve      = fs.Bool("approve", false, "run a command the effects policy wants approved without asking (it is printed on stderr)")
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
	fs.Usage = usageFunc(fs, "run", runUsage)
	fs.SetOutput(helpOutput(args))
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	// No command: the image's Entrypoint/Cmd, checked once the image
	// store is known (noCommand).
	argv := fs.Args()

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
	if *canaries {
		m.Output.Canaries = true
	}
	if *withhold {
		m.Output.WithholdFlagged = true
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

	server := os.Getenv("MOAT_SERVER")
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "server" {
			server = *serverURL // explicit, even "": run locally
		}
	})
	if server == "" && *apiKey != "" {
		fmt.Fprintln(os.Stderr, "moat run: --api-key is for a run on a server: add --server URL (or set MOAT_SERVER)")
		return exitUsage
	}
	if server == "" {
		if c := checkLocalPolicy(*policyPath, m); c >= 0 {
			return c
		}
		fx, err := loadEffectsPolicy(*effectsPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "moat run: %v\n", err)
			return exitUsage
		}
		var tty *os.File
		terminal := func() io.ReadWriter {
			if tty = openTerminal(); tty != nil {
				return tty
			}
			return nil
		}
		c := gateEffects(fx, argv, *approve, terminal, os.Stderr)
		if tty != nil {
			tty.Close()
		}
		if c >= 0 {
			return c
		}
	}
	if server != "" {
		// No command: the server runs the image's Entrypoint and Cmd,
		// or refuses on argv when the image has neither.
		key := *apiKey
		if key == "" {
			key = os.Getenv("MOAT_API_KEY")
		}
		return runRemote(remoteRun{
			server: server, key: key, m: m, argv: argv,
			stdin: *stdin, jsonOut: *jsonOut, outDir: *outDir, noBuild: *noBuild,
		})
	}

	opts := engine.Options{Progress: progressWriter(), NoAutoBuild: *noBuild, Secrets: openSecrets("")}
	if err := incidentOptions(&opts, *noIncidents); err != nil {
		return fail(err)
	}
	e, err := engine.New(opts)
	if err != nil {
		return fail(err)
	}
	if len(argv) == 0 {
		// Refused here, before a sandbox is prepared, with the usage
		// line; the engine makes the same decision for the API.
		img, err := e.Images().Lookup(m.Image)
		switch {
		case err != nil:
			return noCommand(fmt.Sprintf("image %q has none to run instead (%v)", m.Image, err))
		case len(img.Entrypoint)+len(img.Cmd) == 0:
			return noCommand(fmt.Sprintf("image %q has no Entrypoint or Cmd to run instead", m.Image))
		}
	}
	// Clean up after runs that were killed before they could.
	if rep, err := e.GC(); err == nil && len(rep.Runs)+len(rep.Cgroups) > 0 {
		fmt.Fprintf(os.Stderr, "moat: removed leftovers of %d killed run(s)\n", max(len(rep.Runs), len(rep.Cgroups)))
	}

	// ^C, SIGTERM and SIGHUP cancel the run, which destroys the sandbox.
	// os/signal starts threads of its own on first use, a few tenths of a
	// millisecond of a cold moat run: for a native run of a built image,
	// whose preparation takes milliseconds, handling starts once the
	// sandbox is prepared (OnStart), while its init boots. Until then a
	// signal ends moat as if killed, and the next moat start removes what
	// the run had set up. Anything slower (building the image, starting
	// gVisor, booting a VM) has it from here on.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	defer signal.Stop(sigs)
	var catchOnce sync.Once
	catch := func() {
		catchOnce.Do(func() {
			signal.Notify(sigs, unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
			go func() {
				select {
				case <-sigs:
					cancel()
				case <-ctx.Done():
				}
			}()
		})
	}
	if _, err := e.Images().Lookup(m.Image); err != nil || m.Tier != native.Name {
		catch()
	}
	req := &engine.Request{Manifest: m, Argv: argv, OutputDir: *outDir}
	req.OnStart = func(string, func() ([]int, error)) { catch() }
	if *stdin {
		req.Stdin = os.Stdin
	}
	if *outDir != "" {
		if abs, err := filepath.Abs(*outDir); err == nil {
			req.OutputDir = abs
		}
	}
	if !*jsonOut && !m.Output.WithholdFlagged {
		// With output.withhold_flagged nothing is streamed: the output
		// is shown once the run is known not to be flagged.
		stdout, stderr := liveWriter(os.Stdout), liveWriter(os.Stderr)
		req.LiveStdout, req.LiveStderr = stdout, stderr
	}
	res, err := e.Run(ctx, req)
	if err != nil {
		if refused(service.Classify(err, "run").Kind) {
			say("moat: %v\n", err)
			return exitUsage
		}
		if errors.Is(err, tier.ErrUnavailable) {
			say("moat: %v\nRun 'moat doctor' for details.\n", err)
			return exitMoat
		}
		if ctx.Err() != nil {
			// The error says why no result came (the program outlived
			// the grace period after SIGTERM, or never started).
			fmt.Fprintf(os.Stderr, "moat: interrupted; the sandbox was destroyed: %v\n", err)
			return 130
		}
		return fail(err)
	}
	if *jsonOut {
		// Escaped where a terminal would act on them, the same strings.
		if err := output.EncodeJSON(os.Stdout, res, "  "); err != nil {
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
	if req.LiveStdout == nil {
		if err := printStreams(res); err != nil {
			return fail(err)
		}
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
// Paths and reasons may hold what the sandbox chose (a file named with an
// OSC 52 clipboard write): every line goes through say, every path through
// output.Display.
func report(res *result.Result) {
	for _, v := range res.Violations {
		line := fmt.Sprintf("moat: %s: %s", v.Kind, v.Detail)
		if v.Limit != "" {
			line += fmt.Sprintf(" (limit %s)", v.Limit)
		}
		say("%s\n", line)
	}
	for _, d := range res.Degradations {
		say("moat: warning: ran without %s (accepted by the manifest)\n", d)
	}
	for i, f := range res.Findings {
		if i == maxFindingLines {
			say("moat: output guard: and %d more finding(s) (--json lists them)\n", len(res.Findings)-i)
			break
		}
		say("moat: output guard: %s in %s at offset %d, %d bytes (%s)\n", f.Kind, output.Display(f.Where), f.Offset, f.Length, output.Display(f.Preview))
	}
	if res.Withheld {
		say("moat: the output was withheld: the run was flagged (output.withhold_flagged)\n")
	}
	if co := res.CopyOut; co != nil {
		say("moat: copied %d file(s), %d bytes, to %s\n", co.Files, co.Bytes, output.Display(co.Dir))
		for _, s := range co.Skipped {
			say("moat: not copied: %s: %s\n", output.Display(s.Path), s.Reason)
		}
	}
	switch res.Termination {
	case result.OOM:
		say("moat: killed: out of memory (raise resources.memory or --memory)\n")
	case result.Signaled:
		say("moat: killed by signal %s\n", res.SignalName)
	case result.InfraError:
		say("moat: the sandbox failed: %s\n", res.Error)
	}
}

// maxFindingLines bounds the output guard's lines on a terminal.
const maxFindingLines = 10

// printStreams writes a finished run's stdout and stderr through the
// writers of live output (escaped on a terminal).
func printStreams(res *result.Result) error {
	for _, s := range []struct {
		f      *os.File
		stream result.Stream
	}{{os.Stdout, res.Stdout}, {os.Stderr, res.Stderr}} {
		data, err := client.StreamBytes(s.stream)
		if err != nil {
			return err
		}
		w := liveWriter(s.f)
		w.Write(data)
		w.Flush()
	}
	return nil
}

// remoteRun is a `moat run --server`: the manifest built from the flags,
// run by a Moat server through its HTTP API instead of on this host.
type remoteRun struct {
	server, key string
	m           *manifest.Manifest
	argv        []string
	stdin       bool
	jsonOut     bool
	outDir      string
	noBuild     bool
}

// maxRemoteStdin bounds what --stdin sends to a server: the whole input
// travels in the request, whose default limit (--max-body) is 64 MiB.
const maxRemoteStdin = 64 << 20

// runRemote sends r as POST /v1/runs and prints the result and exits as a
// local run does.
func runRemote(r remoteRun) int {
	switch {
	case r.outDir != "":
		fmt.Fprintln(os.Stderr, "moat run: --output cannot be used with --server: a one-shot run on a server has no file download.\n"+
			"Drop --output, or use a sandbox of the HTTP API (POST /v1/sandboxes, then GET .../files?path=P) to fetch files.")
		return exitUsage
	case r.noBuild:
		fmt.Fprintln(os.Stderr, "moat run: --no-build cannot be used with --server: the server builds (or refuses) images by its own configuration")
		return exitUsage
	case r.key == "":
		fmt.Fprintln(os.Stderr, "moat run: --server needs an API key: set MOAT_API_KEY (or pass --api-key KEY);\n"+
			"create one on the server's host with: moat keys create --name NAME")
		return exitUsage
	}
	c, err := client.New(r.server, r.key, client.WithUserAgent("moat/"+versionString()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "moat run: --server: %v\n", strings.TrimPrefix(err.Error(), "moat client: "))
		return exitUsage
	}

	// The server refuses host paths: the inputs travel as files.
	m := *r.m
	m.Inputs = []manifest.Input{}
	req := &client.RunRequest{Manifest: &m, Argv: r.argv}
	if r.stdin {
		// Read before signals are caught, so ^C still ends a wait for
		// input at once.
		data, err := io.ReadAll(io.LimitReader(os.Stdin, maxRemoteStdin+1))
		if err != nil {
			return fail(fmt.Errorf("read standard input: %w", err))
		}
		if len(data) > maxRemoteStdin {
			fmt.Fprintf(os.Stderr, "moat run: --stdin: more than %d MiB on standard input; a run on a server gets its whole input in one request\n", maxRemoteStdin>>20)
			return exitUsage
		}
		req.Stdin = data
	}

	// Caught from here on, so an interrupted run still removes the
	// temporary copy of the inputs.
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGINT, unix.SIGTERM, unix.SIGHUP)
	defer stop()
	files, err := inputFiles(r.m)
	if err != nil {
		say("moat: %v\n", err)
		return exitUsage
	}
	req.Files = files
	resp, err := c.Run(ctx, req)
	if err != nil {
		var apiErr *client.Error
		switch {
		case errors.As(err, &apiErr):
			msg := apiErr.Message
			if apiErr.Field != "" {
				msg += " (field: " + apiErr.Field + ")"
			}
			say("moat: %s\n", msg) // the server's words
			if refused(server.KindOfStatus(apiErr.Status)) {
				return exitUsage
			}
			return exitMoat
		case ctx.Err() != nil:
			fmt.Fprintln(os.Stderr, "moat: interrupted; the request to the server was cancelled")
			return 130
		}
		return fail(errors.New(strings.TrimPrefix(err.Error(), "moat client: ")))
	}
	if a := resp.Approval; a != nil {
		var b strings.Builder
		for _, e := range a.Effects {
			fmt.Fprintf(&b, "  - %s\n", e.Detail)
		}
		say("moat: the server holds this run for approval %s until %s (nothing ran):\n%s"+
			"approve or deny it with POST /v1/approvals/%s (docs/API.md)\n", a.ID, a.ExpiresAt.UTC().Format("2006-01-02T15:04:05Z"), b.String(), a.ID)
		return exitApprove
	}
	res := resp.Result
	if res == nil {
		return fail(fmt.Errorf("the server at %s answered run %q without a result", r.server, resp.ID))
	}
	if r.jsonOut {
		if err := output.EncodeJSON(os.Stdout, res, "  "); err != nil {
			return fail(err)
		}
		return 0
	}
	// The API returns the output once the run is over; it goes out through
	// the same writers as a local run's live output.
	if err := printStreams(res); err != nil {
		return fail(fmt.Errorf("the server's result: %w", err))
	}
	report(res)
	if ctx.Err() != nil {
		return 130
	}
	return res.ExitCode
}

// inputFiles reads the manifest's inputs into files for the API
// (workspace.InputFiles: the checks of a local run's copy-in, then
// symlinks sent as the files they lead to) and tells the user, on
// stderr, what the server will not receive as it is here.
func inputFiles(m *manifest.Manifest) ([]client.File, error) {
	in, warnings, err := workspace.InputFiles(m)
	for _, w := range warnings {
		switch w.Kind {
		case workspace.EmptyDirNotSent:
			say("moat: warning: empty directory %s is not sent: the HTTP API carries files only\n", output.Display(w.Path))
		case workspace.ModeZeroSentAsDefault:
			say("moat: warning: %s has mode 0000 here and is sent with the server's default mode 0644\n", output.Display(w.Path))
		case workspace.CopyNotRemoved:
			say("moat: warning: remove the temporary copy of the inputs: %v\n", w.Err)
		}
	}
	if err != nil || len(in) == 0 {
		return nil, err
	}
	files := make([]client.File, len(in))
	for i, f := range in {
		files[i] = client.File{Path: f.Path, Content: f.Content, Mode: f.Mode}
	}
	return files, nil
}

// refused reports whether an error of kind k (service.Classify's, locally;
// the server's status, with --server) refuses the request as given: it can
// never succeed until the flags, the manifest, the inputs or the key are
// fixed, and moat run exits 2 (exitUsage) rather than 125. One rule for
// both paths, so that a run refused here and one refused by a server exit
// alike.
func refused(k service.Kind) bool {
	switch k {
	case service.Invalid, service.BadRequest, service.TooLarge, service.Unauthenticated, service.Forbidden:
		return true
	}
	return false
}

// noCommand refuses a run that has no command, saying why none could be
// taken from the image and how to give one.
func noCommand(why string) int {
	fmt.Fprintf(os.Stderr, "moat run: no command given, and %s\nUsage: moat run [FLAGS] [--] COMMAND [ARG...]   (moat run --help for flags)\n", why)
	return exitUsage
}
