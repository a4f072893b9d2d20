package servicetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
)

var _ service.Auditor = (*Auditor)(nil)

// Auditor is a service.Auditor that keeps keys and records in memory.
// Make one with NewAuditor.
type Auditor struct {
	mu       sync.Mutex
	keys     map[string]audit.Key // by token
	records  map[string]*audit.Record
	cpu      map[string]float64
	failNext error
}

// NewAuditor returns an Auditor that knows no key yet.
func NewAuditor() *Auditor {
	return &Auditor{keys: map[string]audit.Key{}, records: map[string]*audit.Record{}, cpu: map[string]float64{}}
}

// AddKey makes token authenticate as k.
func (a *Auditor) AddKey(token string, k audit.Key) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys[token] = k
}

// Authenticate returns the key of token unless it is unknown or revoked.
func (a *Auditor) Authenticate(token string) (audit.Key, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[token]
	if !ok || k.Revoked != nil || k.Scope != "" {
		// A scoped key only authenticates for its scope, as in the
		// audit store.
		return audit.Key{}, audit.ErrBadKey
	}
	return k, nil
}

// AuthenticateScope returns the key of a token when it is a live key of
// this scope (audit.Store.AuthenticateScope).
func (a *Auditor) AuthenticateScope(token, scope string) (audit.Key, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k, ok := a.keys[token]
	if !ok || k.Revoked != nil || scope == "" || k.Scope != scope {
		return audit.Key{}, audit.ErrBadKey
	}
	return k, nil
}

// FailNextBegin makes the next Begin fail with err.
func (a *Auditor) FailNextBegin(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failNext = err
}

// SetCPUToday sets the CPU seconds key keyID has used today.
func (a *Auditor) SetCPUToday(keyID string, seconds float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cpu[keyID] = seconds
}

// Begin stores r; a second record with the same id is an error.
func (a *Auditor) Begin(r audit.Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failNext != nil {
		err := a.failNext
		a.failNext = nil
		return err
	}
	if _, dup := a.records[r.ID]; dup {
		return fmt.Errorf("record %s exists", r.ID)
	}
	a.records[r.ID] = &r
	return nil
}

// Finish ends record id with res or runErr and adds res's CPU time to the
// key's day; finishing twice is an error.
func (a *Auditor) Finish(id string, res *result.Result, runErr error) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.records[id]
	if !ok {
		return fmt.Errorf("no record %s", id)
	}
	if r.Status != audit.Running {
		return fmt.Errorf("record %s finished twice", id)
	}
	r.Ended = time.Now()
	r.Status = audit.Done
	if runErr != nil {
		r.Status, r.Error = audit.Failed, runErr.Error()
	}
	if res != nil {
		r.Termination, r.ExitCode, r.CPUMS = res.Termination, res.ExitCode, res.CPUMS
		// As audit.Store does: the result's error text and violations.
		if res.Error != "" && r.Error == "" {
			r.Error = res.Error
		}
		r.Violations = append([]result.Violation(nil), res.Violations...)
		a.cpu[r.KeyID] += res.CPUMS / 1000
	}
	return nil
}

// CPUSecondsToday is the CPU seconds keyID has used today.
func (a *Auditor) CPUSecondsToday(keyID string) (float64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cpu[keyID], nil
}

// Record returns a copy of record id.
func (a *Auditor) Record(id string) (audit.Record, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.records[id]
	if !ok {
		return audit.Record{}, false
	}
	return *r, true
}

// Unfinished lists records still running.
func (a *Auditor) Unfinished() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []string
	for id, r := range a.records {
		if r.Status == audit.Running {
			ids = append(ids, id)
		}
	}
	return ids
}

// Records returns copies of the records of kind, in no order.
func (a *Auditor) Records(kind audit.Kind) []audit.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []audit.Record
	for _, r := range a.records {
		if r.Kind == kind {
			out = append(out, *r)
		}
	}
	return out
}
