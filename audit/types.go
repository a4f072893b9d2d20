package audit

import (
	"errors"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// Key is an API key as stored: never its secret, only a hash of it.
type Key struct {
	ID      string     `json:"id"` // public part of the token, "k" + 12 hex digits
	Name    string     `json:"name"`
	Created time.Time  `json:"created"`
	Revoked *time.Time `json:"revoked,omitempty"`
	Quota   Quota      `json:"quota"`
	// Admin keys may read what concerns the whole server and every key
	// (GET /metrics); a tenant's key sees only its own sandboxes and runs.
	Admin bool `json:"admin,omitempty"`
	// Secrets are the names of the host's secrets the key's manifests may
	// name (GrantSecret), sorted; none by default.
	Secrets []string `json:"secrets,omitempty"`
	// Scope is "" for a full key, or what a scoped key may do and nothing
	// else: ScopeMetrics. Authenticate refuses a scoped key, so that every
	// front door that authenticates (API, E2B, MCP, dashboard) refuses it
	// without knowing scopes; the one route a scope serves asks
	// AuthenticateScope.
	Scope string `json:"scope,omitempty"`
}

// ScopeMetrics is the scope of a key that reads GET /metrics and nothing
// else: for a remote scraper, which must not be able to run sandboxes.
const ScopeMetrics = "metrics"

// Scopes are the scopes CreateScopedKey accepts.
var Scopes = []string{ScopeMetrics}

// Quota bounds what one key may use.
type Quota struct {
	// MaxSandboxes is the number of sandboxes (sessions and one-shot runs
	// in flight) the key may hold at once. Default 8.
	MaxSandboxes int `json:"max_sandboxes"`
	// CPUSecondsPerDay bounds the CPU time of the key's runs per UTC day.
	// Default 36000.
	CPUSecondsPerDay float64 `json:"cpu_seconds_per_day"`
}

// DefaultQuota is what a key gets unless its creator says otherwise.
var DefaultQuota = Quota{MaxSandboxes: 8, CPUSecondsPerDay: 36000}

// ErrBadKey is returned by Authenticate for a missing, malformed, unknown
// or revoked key. It never says which.
var ErrBadKey = errors.New("unknown or revoked API key")

// Kind is what a record is about.
type Kind string

// Record kinds.
const (
	KindRun     Kind = "run"     // a one-shot run (POST /v1/runs, moat run)
	KindSandbox Kind = "sandbox" // a session's lifetime
	KindExec    Kind = "exec"    // one command in a session
	// KindApproval is a command held for a person's approval: running
	// while pending; its termination is exited when approved, policy when
	// denied or expired; Error holds the decision and its reason, and
	// Violations (kind "effect") the effects asked about.
	KindApproval Kind = "approval"
	// KindSnapshot is a stored copy of a sandbox's workspace: a snapshot
	// (moat serve's snapshots API) or a paused sandbox's files. Running
	// while it is kept; done when deleted, expired or resumed; SandboxID
	// is the sandbox it was copied from.
	KindSnapshot Kind = "snapshot"
	// KindNetwork is a change of a live sandbox's network allowlist (E2B's
	// updateNetwork): its Manifest is the sandbox's with the new
	// allowlist, SandboxID the sandbox; done at once, or failed with the
	// refusal in Error.
	KindNetwork Kind = "network"
)

// Status is where a record is in its life.
type Status string

// Record statuses.
const (
	Running Status = "running"
	Done    Status = "done"   // finished; Termination says how the program ended
	Failed  Status = "failed" // Moat failed, or the server died while it ran
)

// Record is one audited run, sandbox or exec.
type Record struct {
	ID        string    `json:"id"`
	Kind      Kind      `json:"kind"`
	KeyID     string    `json:"key_id"`     // "" for the local CLI
	SandboxID string    `json:"sandbox_id"` // the session of an exec
	Started   time.Time `json:"started"`
	Ended     time.Time `json:"ended,omitzero"`
	Status    Status    `json:"status"`

	Tier           string   `json:"tier"`
	Image          string   `json:"image"`
	ImageDigest    string   `json:"image_digest"`
	ManifestDigest string   `json:"manifest_digest"`
	Manifest       string   `json:"manifest"` // canonical JSON
	Command        []string `json:"command"`
	Pooled         bool     `json:"pooled"`

	Termination     result.Termination      `json:"termination,omitempty"`
	ExitCode        int                     `json:"exit_code"`
	WallMS          float64                 `json:"wall_ms"`
	CPUMS           float64                 `json:"cpu_ms"`
	PeakMemoryBytes int64                   `json:"peak_memory_bytes"`
	MemoryLimit     int64                   `json:"memory_limit_bytes"`
	Network         []result.NetworkAttempt `json:"network"`
	Violations      []result.Violation      `json:"violations"`
	Files           int                     `json:"files_changed"`
	Error           string                  `json:"error,omitempty"`

	// NetworkOmitted and ViolationsOmitted count the entries not stored
	// one by one: denied network attempts past the proxy's log or past
	// MaxNetworkAttempts, violations past MaxViolations (a hostile
	// program can make many). Records written before network summaries
	// existed count every attempt not stored, allowed or not.
	NetworkOmitted int `json:"network_omitted,omitempty"`
	// NetworkSummary accounts for every network attempt of the run, the
	// omitted ones by reason and destination (nil for a run without the
	// egress proxy, and for records written before it existed).
	NetworkSummary    *result.NetworkSummary `json:"network_summary,omitempty"`
	ViolationsOmitted int                    `json:"violations_omitted,omitempty"`
}

// Filter selects records. Zero fields select everything.
type Filter struct {
	KeyID       string
	SandboxID   string
	Kind        Kind
	Status      Status
	Termination result.Termination // "exited", "timeout", ...
	Since       time.Time
	Until       time.Time // exclusive: records started before Until
	Limit       int       // default 100, at most 10000
}
