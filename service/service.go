// Package service is the business of a Moat host serving many callers
// (`moat serve`): one-shot runs, long-lived sandboxes with their commands,
// event logs and files, and everything around them: who may do what (API
// keys, ownership, per-key and server-wide quotas), the registry of live
// sandboxes, audit records and their accrued usage, TTL expiry, shutdown
// and cleanup.
//
// Its callers are front doors (the HTTP API in package server, the E2B
// layer in server/e2b): they authenticate, decode a request, call a
// method with the caller's audit.Key, and encode what it returns. Every
// method returns typed values and, on failure, a *Error whose Kind the
// front door maps onto its own protocol.
//
// It must never let one key see another's sandbox (another key's sandbox
// is NotFound, never Forbidden: ids must not be probeable), never start
// anything unaudited, never let a panic in a backend or a watcher take the
// process down, and never return from Shutdown with a sandbox alive. It
// knows nothing of HTTP.
package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/result"
)

// Config configures a Service. Backend and Auditor are required; every
// other zero value takes the default named on the field.
type Config struct {
	Backend Backend
	Auditor Auditor
	// Logger receives errors and lifecycle events. Nil: slog.Default().
	Logger *slog.Logger

	// MaxConcurrent bounds the programs running at once, server-wide:
	// one-shot runs and session commands (--max-concurrent). Default
	// 4 × runtime.NumCPU().
	MaxConcurrent int
	// QueueWait is how long a program waits for one of MaxConcurrent's
	// slots before it is refused with a Quota error. Default 10s;
	// negative: no waiting.
	QueueWait time.Duration
	// DefaultTTL is a sandbox's TTL when the caller gives none. Default
	// 10m.
	DefaultTTL time.Duration
	// MaxTTL bounds a sandbox's TTL (--max-ttl). Default 24h.
	MaxTTL time.Duration
	// KeepRuns is how many one-shot results GetRun can return
	// (--keep-runs). Default 1000.
	KeepRuns int
	// KeepExecs is how many ended commands a sandbox remembers (with
	// their output); running ones are always kept. Default 32.
	KeepExecs int
	// ReapInterval is how often expired sandboxes are looked for.
	// Default 1s.
	ReapInterval time.Duration
	// AccrueInterval is how often the usage of running records is written
	// to the audit log (when the Auditor is an Accruer): what a crash of
	// the server can lose of a run's accounting. Default 2s.
	AccrueInterval time.Duration
	// MetricsInterval is how often each live sandbox's usage is sampled
	// for SandboxMetrics (E2B's getMetrics). Default 5s, E2B's.
	MetricsInterval time.Duration
	// Observe, when set, is called with the result of every program that
	// ended (one-shot runs and commands), for metrics.
	Observe func(*result.Result)
	// ObserveStart, when set and the Backend is a StartReporter, is
	// called each time a sandbox is made ready for a program: its tier,
	// whether it came from a warm pool, and how long that took.
	ObserveStart func(tier string, poolHit bool, d time.Duration)
	// Policy, when set, is the operator's policy (--policy): every
	// manifest is checked against the caller's key's ceiling, and for
	// justifications, before anything is admitted. Nil: no ceiling
	// beyond the manifest's own ranges.
	Policy *policy.Policy
	// Effects is the operator's effects policy (--effects-policy): every
	// command is analysed (package effects) before it starts and is
	// allowed, refused, or held for approval. Nil: effects' default
	// policy.
	Effects *effects.Policy
	// NoEffects turns the analysis off (--effects-policy off).
	NoEffects bool
	// Incidents, when set, keeps an evidence bundle of every command the
	// effects policy denies (the engine keeps those of flagged runs).
	// Nil: none.
	Incidents IncidentKeeper
	// ApprovalTimeout is how long a held command waits for a decision
	// before it is denied (--approval-timeout). Default 5m.
	ApprovalTimeout time.Duration
	// SnapshotDir is where snapshots and paused sandboxes keep their
	// copies of a workspace ($MOAT_HOME/snapshots under moat serve). What
	// is in it when New is called is a crashed server's and is removed.
	// "": pause, resume, snapshots and fork are refused (Unavailable).
	SnapshotDir string
	// SnapshotTTL is how long a snapshot or a paused sandbox is kept
	// (--snapshot-ttl). Default 24h.
	SnapshotTTL time.Duration
}

// IncidentKeeper keeps an incident bundle (*incident.Store).
type IncidentKeeper interface {
	Keep(ev *incident.Evidence) (incident.Summary, error)
}

// SetDefaults checks the required fields and fills in the defaults.
func (c *Config) SetDefaults() error {
	if c.Backend == nil {
		return errors.New("server: Config.Backend is required")
	}
	if c.Auditor == nil {
		return errors.New("server: Config.Auditor is required")
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 4 * runtime.NumCPU()
	}
	if c.QueueWait == 0 {
		c.QueueWait = 10 * time.Second
	}
	if c.DefaultTTL <= 0 {
		c.DefaultTTL = 10 * time.Minute
	}
	if c.MaxTTL <= 0 {
		c.MaxTTL = 24 * time.Hour
	}
	if c.DefaultTTL > c.MaxTTL {
		return fmt.Errorf("server: DefaultTTL %s is above MaxTTL %s", c.DefaultTTL, c.MaxTTL)
	}
	if c.KeepRuns <= 0 {
		c.KeepRuns = 1000
	}
	if c.KeepExecs <= 0 {
		c.KeepExecs = 32
	}
	if c.ReapInterval <= 0 {
		c.ReapInterval = time.Second
	}
	if c.MetricsInterval <= 0 {
		c.MetricsInterval = 5 * time.Second
	}
	if c.AccrueInterval <= 0 {
		c.AccrueInterval = 2 * time.Second
	}
	if c.Effects == nil {
		c.Effects = effects.DefaultPolicy()
	}
	if c.ApprovalTimeout <= 0 {
		c.ApprovalTimeout = 5 * time.Minute
	}
	if c.SnapshotTTL <= 0 {
		c.SnapshotTTL = 24 * time.Hour
	}
	return nil
}

// Service is the business of `moat serve`. Create it with New; stop it
// with Shutdown. All methods are safe to call concurrently.
type Service struct {
	cfg Config
	log *slog.Logger

	// slots is the server-wide semaphore of MaxConcurrent.
	slots chan struct{}

	// stop is cancelled when Shutdown gives up waiting: in-flight runs are
	// killed. stopping is closed when Shutdown starts.
	stopCtx  context.Context
	stop     context.CancelFunc
	stopping chan struct{}
	reaped   chan struct{}
	accrued  chan struct{} // closed when accrueLoop has returned
	history  metricsHistory

	mu        sync.Mutex
	closing   bool
	sandboxes map[string]*sandbox
	// snapshots are the stored workspace copies, by id (lifecycle.go).
	snapshots map[string]*snapshot
	// held counts, per key, its sandboxes and in-flight runs.
	held map[string]int
	// active counts sandboxes and in-flight runs, server-wide.
	active int
	runs   runStore
	// approvals are the held commands, by id (approvals.go).
	approvals map[string]*pending
	// meters accrue the usage of running records (accrue.go).
	meters meters

	// inflight counts calls starting work (see enter); tasks counts what
	// outlives them: command watchers and sandbox destruction.
	inflight sync.WaitGroup
	tasks    sync.WaitGroup

	shutdownOnce sync.Once
	shutdownErr  error
	shutdownDone chan struct{}
}

// New returns a Service. It starts the goroutines that destroy expired
// sandboxes and accrue usage; Shutdown stops them.
func New(cfg Config) (*Service, error) {
	if err := cfg.SetDefaults(); err != nil {
		return nil, err
	}
	s := &Service{
		cfg:          cfg,
		log:          cfg.Logger,
		slots:        make(chan struct{}, cfg.MaxConcurrent),
		stopping:     make(chan struct{}),
		reaped:       make(chan struct{}),
		accrued:      make(chan struct{}),
		sandboxes:    map[string]*sandbox{},
		snapshots:    map[string]*snapshot{},
		held:         map[string]int{},
		approvals:    map[string]*pending{},
		runs:         runStore{max: cfg.KeepRuns, byID: map[string]*storedRun{}},
		shutdownDone: make(chan struct{}),
	}
	if err := s.clearSnapshotDir(); err != nil {
		return nil, err
	}
	if sr, ok := cfg.Backend.(StartReporter); ok && cfg.ObserveStart != nil {
		sr.ObserveStarts(cfg.ObserveStart)
	}
	s.stopCtx, s.stop = context.WithCancel(context.Background())
	go s.reap()
	go s.accrueLoop()
	go s.metricsLoop()
	return s, nil
}

// Sessions is the number of live sandboxes (for tests and metrics).
func (s *Service) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sandboxes)
}

// Active is the number of sandboxes alive: sessions plus one-shot runs in
// flight (the moat_sandboxes_active gauge).
func (s *Service) Active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

// Held is the number of sandbox slots key keyID holds: its sandboxes and
// its one-shot runs in flight.
func (s *Service) Held(keyID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[keyID]
}

// HeldKeys is the number of keys holding any slot (0 once everything has
// ended: a leak check).
func (s *Service) HeldKeys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// Closing reports whether Shutdown has begun.
func (s *Service) Closing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// Stopped is closed when Shutdown stops waiting for in-flight work: a
// caller streaming events ends its stream then.
func (s *Service) Stopped() <-chan struct{} { return s.stopCtx.Done() }

// PoolStats are the Backend's warm pools (nil without a PoolReporter), for
// the moat_pool_* metrics.
func (s *Service) PoolStats() []PoolStat {
	if pr, ok := s.cfg.Backend.(PoolReporter); ok {
		return pr.PoolStats()
	}
	return nil
}

// MaxTTL is the longest TTL a sandbox may be given.
func (s *Service) MaxTTL() time.Duration { return s.cfg.MaxTTL }

// DefaultTTL is a sandbox's TTL when the caller gives none.
func (s *Service) DefaultTTL() time.Duration { return s.cfg.DefaultTTL }

func (s *Service) observe(res *result.Result) {
	if s.cfg.Observe != nil && res != nil {
		s.cfg.Observe(res)
	}
}

// NewID returns n random bytes in hex.
func NewID(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// guard calls f, turning its panic into an error (with the stack) and a
// zero value without an error into one, so that the caller's bookkeeping
// (the audit record, the quota) is finished whatever the backend does.
// what names the callee and noun what it should have returned.
func guard[T any](what, noun string, f func() (T, error)) (v T, err error) {
	defer func() {
		if p := recover(); p != nil {
			buf := make([]byte, 16<<10)
			buf = buf[:runtime.Stack(buf, false)]
			var zero T
			v, err = zero, fmt.Errorf("panic in %s: %v\n%s", what, p, buf)
		}
	}()
	v, err = f()
	if err == nil && reflect.ValueOf(&v).Elem().IsZero() {
		err = fmt.Errorf("%s returned neither %s nor an error", what, noun)
	}
	return v, err
}

// goSafe runs f in a goroutine tracked by s.tasks, turning a panic into a
// logged error: a bug in one watcher must not take the server down.
func (s *Service) goSafe(what string, f func()) {
	s.tasks.Add(1)
	go func() {
		defer s.tasks.Done()
		defer func() {
			if p := recover(); p != nil {
				buf := make([]byte, 16<<10)
				buf = buf[:runtime.Stack(buf, false)]
				s.log.Error("panic in "+what, "panic", fmt.Sprint(p), "stack", string(buf))
			}
		}()
		f()
	}()
}
