package service

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
)

// admit lets key start a one-shot run or a sandbox: the service is taking
// work, the key holds fewer than its quota of sandboxes and runs, and it
// has CPU time left today. leave ends the request's in-flight mark;
// release frees the key's slot (a sandbox keeps it until destroyed). On
// an error nothing is held.
func (s *Service) admit(key audit.Key) (leave, release func(), e *Error) {
	if leave, e = s.enter(); e != nil {
		return nil, nil, e
	}
	if release, e = s.hold(key); e != nil {
		leave()
		return nil, nil, e
	}
	if e = s.checkCPU(key); e != nil {
		release()
		leave()
		return nil, nil, e
	}
	return leave, release, nil
}

// enter admits a request that starts work (a run, a sandbox, a command)
// unless the server is shutting down. leave is called once the work is
// registered (or over), so Shutdown knows when nothing new can appear.
func (s *Service) enter() (leave func(), e *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, shuttingDown
	}
	s.inflight.Add(1)
	return sync.OnceFunc(s.inflight.Done), nil
}

// hold takes one of the key's sandbox slots (sessions and one-shot runs in
// flight count alike). release gives it back; it may be called more than
// once.
func (s *Service) hold(key audit.Key) (release func(), e *Error) {
	limit := key.Quota.MaxSandboxes
	if limit <= 0 {
		limit = audit.DefaultQuota.MaxSandboxes
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.held[key.ID]; n >= limit {
		return nil, quotaExceeded(5, "key %s holds %d sandboxes and in-flight runs, its limit; delete a sandbox (DELETE /v1/sandboxes/{id}) or wait for a run to end (the limit is the key's --max-sandboxes)", key.ID, n)
	}
	s.held[key.ID]++
	s.active++
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.held[key.ID]--; s.held[key.ID] <= 0 {
			delete(s.held, key.ID)
		}
		s.active--
	}), nil
}

// checkCPU refuses a key that has used its CPU-seconds for the day. It is
// checked before each start; a program already running may overshoot by
// at most its own CPU limit.
func (s *Service) checkCPU(key audit.Key) *Error {
	limit := key.Quota.CPUSecondsPerDay
	if limit <= 0 {
		limit = audit.DefaultQuota.CPUSecondsPerDay
	}
	used, err := s.cfg.Auditor.CPUSecondsToday(key.ID)
	if err != nil {
		return InternalError(fmt.Errorf("read CPU usage of key %s: %w", key.ID, err))
	}
	if used >= limit {
		now := time.Now().UTC()
		reset := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
		return quotaExceeded(int(reset.Sub(now).Seconds())+1,
			"key %s used %.0f of its %.0f CPU-seconds today; the quota resets at 00:00 UTC (in %s)", key.ID, used, limit, reset.Sub(now).Round(time.Minute))
	}
	return nil
}

// acquire takes one of the MaxConcurrent slots for a program, waiting up to
// QueueWait for one to free up. Waiting, not refusing at once, smooths
// bursts; the bound keeps a client from hanging behind a saturated server
// (it gets a Quota error with RetryAfter and may try again or elsewhere).
func (s *Service) acquire(ctx context.Context) (release func(), e *Error) {
	release = sync.OnceFunc(func() { <-s.slots })
	select {
	case s.slots <- struct{}{}:
		return release, nil
	default:
	}
	busy := quotaExceeded(1, "the server is running %d programs, its limit (--max-concurrent); retry shortly", s.cfg.MaxConcurrent)
	if s.cfg.QueueWait < 0 {
		return nil, busy
	}
	t := time.NewTimer(s.cfg.QueueWait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return release, nil
	case <-t.C:
		return nil, busy
	case <-s.stopping:
		return nil, shuttingDown
	case <-ctx.Done():
		return nil, backendError(ctx.Err(), "")
	}
}
