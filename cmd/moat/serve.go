package main

import (
	"context"
	"fmt"
	"github.com/moat-sandbox/moat/policy"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/sdnotify"
	"github.com/moat-sandbox/moat/internal/sourceid"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/server"
	"github.com/moat-sandbox/moat/server/accesslog"
	"github.com/moat-sandbox/moat/server/e2b"
	moatmcp "github.com/moat-sandbox/moat/server/mcp"
	"github.com/moat-sandbox/moat/service"
)

const serveUsage = `Usage: moat serve [FLAGS]

Serves Moat's HTTP API (docs/API.md): one-shot runs, sandboxes with
sessions, file transfer, live output. Every request but GET /v1/health
and GET /v1/openapi.yaml needs an API key from 'moat keys create'. Runs
and sandboxes are recorded in the audit log ('moat audit').

Warm pools keep sandboxes of the default manifest's resource class prepared,
so that a request that matches takes one instead of building it; each is
used once and destroyed. A request with another class (or with network
access) is prepared on demand.

With --e2b the same listener also serves E2B's API, so the unmodified E2B
SDKs run their sandboxes here (E2B_API_URL and E2B_SANDBOX_URL set to this
server's URL, E2B_API_KEY a Moat key): see the README, "Using Moat with the
E2B SDK".

With --mcp the same listener also serves the Model Context Protocol
(Streamable HTTP) at /mcp, the API key as "Authorization: Bearer", for
remote agents: the tools of 'moat mcp' (docs/MCP.md).

The same listener serves a web dashboard at /dashboard/ for admin keys
(moat keys create --admin): runs, sandboxes, network, approvals,
incidents, costs and policy suggestions (README, "Dashboard").

On SIGTERM or SIGINT the server stops taking requests, lets running
one-shot runs finish (--drain), destroys every sandbox and exits. After a
crash, the next start destroys what the dead server left and marks its
unfinished runs failed in the audit log, keeping the time and CPU they had
used (recorded every few seconds while they ran). One server serves one
audit database (and $MOAT_HOME): a second one started on it exits with an
error naming the first.

Every flag can also come from the environment, as MOAT_ and its name
upper-cased with - as _ (MOAT_LISTEN, MOAT_SESSION_POOL), or from a YAML
config file (--config FILE or MOAT_CONFIG; keys are the flag names:
"pool: 4"). A flag given wins over the environment, which wins over the
file (docs/OPERATIONS.md). One log line per request goes to the log at
info level (--log-level; health checks at debug).

Flags:
`

func cmdServe(args []string) int {
	fs := newFlags("serve", serveUsage)
	var (
		listen        = fs.String("listen", "127.0.0.1:7070", "`ADDR` to listen on; anything but loopback should use --tls-cert")
		tlsCert       = fs.String("tls-cert", "", "serve HTTPS with this certificate `FILE` (PEM; needs --tls-key)")
		tlsKey        = fs.String("tls-key", "", "private key `FILE` of --tls-cert (PEM)")
		dbPath        = fs.String("db", "", "audit database `FILE` (default $MOAT_HOME/audit.db)")
		pool          = fs.Int("pool", 2, "one-shot sandboxes of the default resource class kept prepared (0: none)")
		sessionPool   = fs.Int("session-pool", 1, "session sandboxes of the default resource class kept prepared (0: none)")
		poolManifest  = fs.String("pool-manifest", "", "manifest `FILE` whose resource class the pools prepare (default: the default manifest)")
		maxBody       = fs.String("max-body", "64MiB", "largest request body `SIZE`")
		maxFiles      = fs.Int("max-files", 1000, "most files in one request")
		maxConcurrent = fs.Int("max-concurrent", 0, "programs running at once, server-wide (default 4 per CPU)")
		maxTTL        = fs.Duration("max-ttl", 24*time.Hour, "longest sandbox TTL a request may ask for")
		keepRuns      = fs.Int("keep-runs", 1000, "one-shot results kept for GET /v1/runs/{id}")
		drain         = fs.Duration("drain", 30*time.Second, "how long shutdown waits for running one-shot runs")
		noIncidents   = fs.Bool("no-incidents", false, "keep no evidence bundles of flagged runs (moat incident; also MOAT_INCIDENTS=off)")
		e2bAPI        = fs.Bool("e2b", false, "also serve E2B's API on the same listener, for the unmodified E2B SDKs (E2B_API_URL and E2B_SANDBOX_URL = this server's URL; see README)")
		policyPath    = fs.String("policy", "", "operator policy `FILE`: per-key ceilings and required justifications (default $"+policy.EnvVar+"; see README)")
		effectsPath   = fs.String("effects-policy", "", "effects policy `FILE` every command is analysed against before it starts (default: Moat's, see moat analyse --default-policy; off: no analysis)")
		approvalTTL   = fs.Duration("approval-timeout", 5*time.Minute, "how long a command held for approval waits for POST /v1/approvals/{id} before it is denied")
		e2bInternet   = fs.String("e2b-internet", "none", "with --e2b, what E2B sandboxes that ask for internet access (allow_internet_access, true by default in e2b JS before 2.51 and the Python SDK) get: none (loopback only; the create answer's X-Moat-Notice header says so), refuse (answer 400), or a comma-separated `ALLOWLIST` of hosts and addresses (pypi.org,*.npmjs.org,192.0.2.0/24); never the open internet")
		snapshotTTL   = fs.Duration("snapshot-ttl", 24*time.Hour, "how long a snapshot or a paused sandbox is kept before it is removed (they live under $MOAT_HOME/snapshots and do not survive a restart)")
		noDashboard   = fs.Bool("no-dashboard", false, "do not serve the web dashboard at /dashboard/ (admin keys only; see README, \"Dashboard\")")
		mcpHTTP       = fs.Bool("mcp", false, "also serve MCP (Streamable HTTP) at /mcp on the same listener, the API key as bearer token (docs/MCP.md)")
		e2bDomain     = fs.String("e2b-domain", "", "with --e2b, also route host names 49983-<sandbox>.`DOMAIN` to the sandbox's envd (E2B_DOMAIN)")
		_             = fs.String(configFlag, "", "YAML `FILE` of settings, keys the flag names (pool: 4); flags and MOAT_* variables win over it (default $MOAT_CONFIG)")
		metricsListen = fs.String("metrics-listen", "", "also serve GET /metrics without a key on this `ADDR` (loopback only, e.g. 127.0.0.1:9464, unless --metrics-public)")
		metricsPublic = fs.Bool("metrics-public", false, "let --metrics-listen take a non-loopback address: whoever reaches it reads every tenant's series")
		logf          = addLogFlags(fs)
	)
	if c := parse(fs, args); c >= 0 {
		return c
	}
	src, err := applySettings(fs, os.Getenv)
	if err != nil {
		return fail(usageError{err})
	}
	log, err := logf.logger(os.Stderr, src.of)
	if err != nil {
		return fail(usageError{err})
	}
	if fs.NArg() > 0 {
		return fail(usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())})
	}
	if (*tlsCert == "") != (*tlsKey == "") {
		return fail(usageError{fmt.Errorf("%s and %s go together", src.of("tls-cert"), src.of("tls-key"))})
	}
	if *metricsListen != "" {
		if err := checkMetricsAddr(*metricsListen, *metricsPublic, src.of); err != nil {
			return fail(usageError{err})
		}
	}
	pol, err := loadPolicy(*policyPath)
	if err != nil {
		return fail(usageError{err})
	}
	fx, err := loadEffectsPolicy(*effectsPath)
	if err != nil {
		return fail(usageError{err})
	}
	if *approvalTTL <= 0 {
		return fail(usageError{fmt.Errorf("%s %s: want a positive duration such as 5m", src.of("approval-timeout"), *approvalTTL)})
	}
	internet, err := e2b.ParseInternet(*e2bInternet)
	if err != nil {
		if s := src.of("e2b-internet"); s != "--e2b-internet" {
			err = fmt.Errorf("%s: %w", s, err)
		}
		return fail(usageError{err})
	}
	if !*e2bAPI && *e2bInternet != "none" {
		return fail(usageError{fmt.Errorf("%s needs --e2b", src.of("e2b-internet"))})
	}
	if *snapshotTTL <= 0 {
		return fail(usageError{fmt.Errorf("%s %s: want a positive duration such as 24h", src.of("snapshot-ttl"), *snapshotTTL)})
	}
	body, err := manifest.ParseSize(*maxBody)
	if err != nil || body <= 0 {
		return fail(usageError{fmt.Errorf("%s %q: want a size such as 64MiB", src.of("max-body"), *maxBody)})
	}
	for _, p := range []struct {
		flag string
		n    int
	}{{"pool", *pool}, {"session-pool", *sessionPool}} {
		if p.n < 0 || p.n > 128 {
			return fail(usageError{fmt.Errorf("%s %d: want 0 to 128", src.of(p.flag), p.n)})
		}
	}
	class := manifest.Default()
	if *poolManifest != "" {
		if class, err = manifest.Load(*poolManifest); err != nil {
			return fail(usageError{fmt.Errorf("%s: %w", src.of("pool-manifest"), err)})
		}
	}

	var pools []engine.PoolConfig
	if *pool > 0 {
		pools = append(pools, engine.PoolConfig{Manifest: class, Size: *pool})
	}
	if *sessionPool > 0 {
		pools = append(pools, engine.PoolConfig{Manifest: class, Size: *sessionPool, Session: true})
	}
	// Caught from here on, not from READY: a SIGTERM right after READY=1
	// (systemctl stop at once, CI's test) or during the setup below (the
	// GC of a killed server's leftovers, pools starting) found the default
	// action and killed the server without its drain and without closing
	// the engine. One that arrives before the listener serves waits in the
	// channel and stops the server as soon as it is up.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
	defer signal.Stop(sigs)
	opts := engine.Options{Progress: os.Stderr, Pools: pools, Secrets: openSecrets("")}
	if err := incidentOptions(&opts, *noIncidents); err != nil {
		return fail(err)
	}
	e, err := engine.New(opts)
	if err != nil {
		return fail(err)
	}
	defer e.Close()
	if *dbPath == "" {
		*dbPath = filepath.Join(e.Home(), "audit.db")
	}
	store, err := audit.Open(*dbPath)
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	// One server per audit database, before anything else: a second one
	// must not settle the first one's live runs as dead, nor start pools
	// beside it. The claim lasts until the process exits.
	if err := store.Claim(); err != nil {
		return fail(err)
	}
	// Destroy what a killed server (or moat run) left behind: its
	// sandboxes' cgroups and run directories. Their processes died with it.
	if rep, err := e.GC(); err != nil {
		log.Warn("collecting what killed runs left behind", "err", err)
	} else if len(rep.Runs)+len(rep.Cgroups) > 0 {
		log.Warn("destroyed the leftovers of sandboxes of a previous server", "runs", len(rep.Runs), "cgroups", len(rep.Cgroups))
	}
	// What the dead server was running keeps the usage it accrued.
	if n, err := store.FailRunning("the server stopped while this ran"); err != nil {
		return fail(err)
	} else if n > 0 {
		log.Warn("marked runs of a previous server failed", "count", n)
	}
	if len(pools) > 0 {
		// Build the image first if needed (with progress), so the pools
		// fill and the first request does not pay for it.
		if _, err := e.Images().Lookup(class.Image); err != nil {
			fmt.Fprintf(os.Stderr, "moat: building image %q for the pools (once per machine)\n", class.Image)
		}
		if err := e.StartPools(); err != nil {
			return fail(err)
		}
	}

	var incidents server.IncidentStore
	if opts.Incidents != nil {
		incidents = opts.Incidents
	}
	srv, err := server.New(server.Config{
		Backend:         service.NewEngineBackend(e),
		Auditor:         store,
		Logger:          log,
		Version:         versionString(),
		Source:          sourceid.ID,
		MaxBodyBytes:    int64(body),
		MaxFiles:        *maxFiles,
		MaxConcurrent:   *maxConcurrent,
		MaxTTL:          *maxTTL,
		KeepRuns:        *keepRuns,
		Policy:          pol,
		Effects:         fx,
		NoEffects:       fx == nil,
		ApprovalTimeout: *approvalTTL,
		Incidents:       incidents,
		SnapshotDir:     filepath.Join(e.Home(), "snapshots"),
		SnapshotTTL:     *snapshotTTL,
		NoDashboard:     *noDashboard,
	})
	if err != nil {
		return fail(usageError{err})
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(fmt.Errorf("%s: listen on %s: %w", src.of("listen"), *listen, err))
	}
	if *metricsListen != "" {
		stopMetrics, err := serveMetrics(*metricsListen, srv.MetricsHandler(), log)
		if err != nil {
			return fail(err)
		}
		defer stopMetrics()
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); *tlsCert == "" && !isLoopback(host) {
		log.Warn("serving plain HTTP on a non-loopback address: API keys travel in clear text; use --tls-cert and --tls-key", "addr", ln.Addr().String())
	}
	handler := srv.Handler()
	if *e2bAPI {
		log.Info("e2b: sandboxes that ask for internet access get", "e2b_internet", internet.String())
		handler = e2b.New(e2b.Config{Service: srv.Service(), Auditor: store, Keys: store, Domain: *e2bDomain, Logger: log, MaxBodyBytes: int64(body),
			HasImage: func(name string) bool { _, err := e.Images().Lookup(name); return err == nil }, Internet: internet}).Wrap(handler)
	} else if *e2bDomain != "" {
		return fail(usageError{fmt.Errorf("%s needs --e2b", src.of("e2b-domain"))})
	}
	closeMCP := func() {}
	if *mcpHTTP {
		ms, err := moatmcp.New(moatmcp.Config{Service: srv.Service(), Keys: store, Logger: log, Version: versionString(), MaxRequestBytes: int64(body), MaxFiles: *maxFiles})
		if err != nil {
			return fail(err)
		}
		mh, err := ms.Handler()
		if err != nil {
			return fail(err)
		}
		closeMCP = ms.CloseSessions
		// In front of E2B's front door, which would answer /mcp as an
		// E2B path.
		api := handler
		mux := http.NewServeMux()
		mux.Handle("/mcp", mh)
		mux.Handle("/", api)
		handler = mux
	}
	// The access log around every front door (API, E2B, MCP): one line
	// per request, whichever answered it.
	handler = accesslog.Handler(log, handler)
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	// MCP clients hold an event stream open (GET /mcp): end them, or
	// Shutdown waits for its deadline.
	hs.RegisterOnShutdown(closeMCP)
	served := make(chan error, 1)
	go func() {
		if *tlsCert != "" {
			served <- hs.ServeTLS(ln, *tlsCert, *tlsKey)
		} else {
			served <- hs.Serve(ln)
		}
	}()
	scheme := "http"
	if *tlsCert != "" {
		scheme = "https"
	}
	log.Info("moat serve listening", "url", scheme+"://"+ln.Addr().String(), "pools", len(pools), "audit", store.Path())
	// Under systemd (Type=notify, packaging/moat.service) the unit becomes
	// active only now, when the listener accepts connections: a unit
	// ordered After=moat.service, or a script that waits for
	// systemctl start, can call the API at once.
	if _, err := sdnotify.Notify(sdnotify.Ready); err != nil {
		log.Warn("could not tell systemd the server is ready", "err", err)
	}

	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String(), "drain", drain.String())
		if _, err := sdnotify.Notify(sdnotify.Stopping); err != nil {
			log.Warn("could not tell systemd the server is stopping", "err", err)
		}
	case err := <-served:
		return fail(fmt.Errorf("serve: %w", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	go func() {
		// A second signal: stop waiting for the drain.
		<-sigs
		cancel()
	}()
	// The API first (new requests get 503 and running runs finish or are
	// cancelled at the deadline, sessions are destroyed), then the
	// listener, then the pools.
	serr := srv.Shutdown(ctx)
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer hcancel()
	hs.Shutdown(hctx)
	e.Close()
	if serr != nil {
		log.Warn("shutdown", "err", serr)
	}
	log.Info("stopped", "sandboxes_left", srv.Sessions())
	return 0
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
