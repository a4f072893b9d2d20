package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	moatmcp "github.com/moat-sandbox/moat/server/mcp"
	"github.com/moat-sandbox/moat/service"
)

const mcpUsage = `Usage: moat mcp [FLAGS]

Serves Moat's tools to one local agent over the Model Context Protocol on
stdin and stdout (the agent, or a desktop client such as Claude Desktop,
starts this command): run_code, create_sandbox, exec, write_file,
read_file, list_files, download, kill_sandbox and get_approval
(docs/MCP.md). stdout carries only the protocol; logs go to stderr.

The session acts as one API key of this host's audit database, given in
MOAT_API_KEY (or --key, which other local users can read in the process
list): its quotas, its policy ceiling (--policy) and its secrets apply,
and its runs are recorded in the audit log. Create one with
'moat keys create --name agent'. The sandboxes the session creates are
destroyed when it ends (the agent closes stdin, or SIGTERM/SIGINT), or
before, when their TTL passes.

For remote agents, 'moat serve --mcp' serves the same tools over
Streamable HTTP at /mcp.

Flags:
`

func cmdMCP(args []string) int {
	fs := newFlags("mcp", mcpUsage)
	var (
		keyFlag     = fs.String("key", "", "API `KEY` the session acts as (default $MOAT_API_KEY; the environment keeps it out of the process list)")
		dbPath      = fs.String("db", "", "audit database `FILE` holding the key (default $MOAT_HOME/audit.db)")
		maxTTL      = fs.Duration("max-ttl", 24*time.Hour, "longest sandbox TTL a tool call may ask for")
		policyPath  = fs.String("policy", "", "operator policy `FILE`: per-key ceilings and required justifications (default $MOAT_POLICY; see README)")
		effectsPath = fs.String("effects-policy", "", "effects policy `FILE` every command is analysed against before it starts (default: Moat's; off: no analysis)")
		approvalTTL = fs.Duration("approval-timeout", 5*time.Minute, "how long a command held for approval waits for a decision before it is denied")
		noIncidents = fs.Bool("no-incidents", false, "keep no evidence bundles of flagged runs (also MOAT_INCIDENTS=off)")
		logf        = addLogFlags(fs)
	)
	if c := parse(fs, args); c >= 0 {
		return c
	}
	if fs.NArg() > 0 {
		return fail(usageError{fmt.Errorf("mcp takes no arguments, got %q", fs.Args())})
	}
	token := *keyFlag
	if token == "" {
		token = os.Getenv("MOAT_API_KEY")
	}
	if token == "" {
		return fail(usageError{errors.New("moat mcp acts as an API key: set MOAT_API_KEY (or --key) to one from 'moat keys create --name agent'")})
	}
	if *maxTTL <= 0 || *approvalTTL <= 0 {
		return fail(usageError{fmt.Errorf("--max-ttl %s and --approval-timeout %s: want positive durations such as 1h", *maxTTL, *approvalTTL)})
	}
	log, err := logf.logger(os.Stderr, nil)
	if err != nil {
		return fail(usageError{err})
	}
	pol, err := loadPolicy(*policyPath)
	if err != nil {
		return fail(usageError{err})
	}
	fx, err := loadEffectsPolicy(*effectsPath)
	if err != nil {
		return fail(usageError{err})
	}
	if *dbPath == "" {
		*dbPath = defaultDB()
	}
	store, err := openAudit(*dbPath, false)
	if err != nil {
		return fail(err)
	}
	if store == nil {
		return fail(fmt.Errorf("no audit database at %s, so no API key: create one with 'moat keys create --name agent' (--db names another database)", *dbPath))
	}
	defer store.Close()
	key, err := store.Authenticate(token)
	if err != nil {
		if errors.Is(err, audit.ErrBadKey) {
			return fail(fmt.Errorf("MOAT_API_KEY (or --key) is not a valid key of %s: create one with 'moat keys create --name agent'", *dbPath))
		}
		return fail(err)
	}

	// No pools: a local session starts its sandboxes on demand, and an
	// idle agent keeps nothing prepared. Progress goes to stderr: stdout
	// is the protocol's.
	opts := engine.Options{Progress: os.Stderr, Secrets: openSecrets("")}
	if err := incidentOptions(&opts, *noIncidents); err != nil {
		return fail(err)
	}
	e, err := engine.New(opts)
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	// Snapshots (snapshot_sandbox) live in a directory of this process's
	// own, removed when it ends: moat serve's is not this process's to
	// clear, and a session's snapshots end with it, as its sandboxes do.
	snapParent := filepath.Join(e.Home(), "mcp-snapshots")
	if err := os.MkdirAll(snapParent, 0o700); err != nil {
		return fail(fmt.Errorf("snapshot directory: %w", err))
	}
	snapDir, err := os.MkdirTemp(snapParent, "session-")
	if err != nil {
		return fail(fmt.Errorf("snapshot directory: %w", err))
	}
	defer os.RemoveAll(snapDir)
	sc := service.Config{
		Backend: service.NewEngineBackend(e), Auditor: store, Logger: log,
		MaxTTL: *maxTTL, Policy: pol, Effects: fx, NoEffects: fx == nil, ApprovalTimeout: *approvalTTL,
		SnapshotDir: snapDir,
	}
	if opts.Incidents != nil {
		sc.Incidents = opts.Incidents
	}
	svc, err := service.New(sc)
	if err != nil {
		return fail(err)
	}
	srv, err := moatmcp.New(moatmcp.Config{Service: svc, Keys: store, Logger: log, Version: versionString()})
	if err != nil {
		return fail(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	log.Info("moat mcp serving on stdio", "key", key.ID, "audit", store.Path())
	serr := srv.Serve(ctx, &mcp.StdioTransport{}, key)
	// Serve destroyed the session's sandboxes; Shutdown ends what is left
	// (one-shot runs of calls the agent abandoned).
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := svc.Shutdown(sctx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	if serr != nil {
		return fail(fmt.Errorf("mcp: %w", serr))
	}
	return 0
}
