package server

import "github.com/moat-sandbox/moat/service"

// The interfaces the API's Config takes are the service's: the names are
// kept here so that a caller of server.New needs no second import.
type (
	// Backend runs sandboxes (see service.Backend).
	Backend = service.Backend
	// Session is one long-lived sandbox (see service.Session).
	Session = service.Session
	// Process is one command started in a Session.
	Process = service.Process
	// Auditor authenticates API keys and records what ran.
	Auditor = service.Auditor
	// PoolStat is the state of one warm pool, for the moat_pool_* metrics.
	PoolStat = service.PoolStat
	// PoolReporter is a Backend with warm pools.
	PoolReporter = service.PoolReporter
	// Ender is a Session that can tell its sandbox has ended on its own.
	Ender = service.Ender
	// CPUReporter is a Session that can tell its CPU time so far.
	CPUReporter = service.CPUReporter
	// Accruer is an Auditor that records usage while records run.
	Accruer = service.Accruer
)

// ErrUnavailable and ErrTooLarge, wrapped in a Backend's error, are
// answered 503 and 413 (see service.Classify).
var (
	ErrUnavailable = service.ErrUnavailable
	ErrTooLarge    = service.ErrTooLarge
)

// NewEngineBackend serves the API from a real engine.
var NewEngineBackend = service.NewEngineBackend
