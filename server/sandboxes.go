package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// sandbox is one live session in the registry.
type sandbox struct {
	id       string
	key      string // the key that created it: the only one that sees it
	sess     Session
	info     engine.SessionInfo
	manifest *manifest.Manifest
	metadata map[string]string
	created  time.Time
	release  func() // the key's sandbox slot
	untrack  func() // stops accruing the sandbox record's usage

	// state and expires are guarded by Server.mu.
	state   string
	expires time.Time

	mu    sync.Mutex
	dead  bool         // its init exited: destroyed as failed
	execs []*execution // in start order; ended ones beyond KeepExecs are dropped
	seq   int          // the last command number given out
	count int          // commands started, for the Sandbox view
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	key := keyOf(r)
	if e := requireJSON(r); e != nil {
		return e
	}
	data, e := readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	spec, e := decodeSandbox(data, s.cfg.MaxFiles, s.cfg.DefaultTTL, s.cfg.MaxTTL)
	if e != nil {
		return e
	}
	leave, e := s.enter()
	if e != nil {
		return e
	}
	defer leave()
	release, e := s.hold(key)
	if e != nil {
		return e
	}
	registered := false
	defer func() {
		if !registered {
			release()
		}
	}()
	if e := s.checkCPU(key); e != nil {
		return e
	}

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	sess, err := guard("backend", "a session", func() (Session, error) {
		return s.cfg.Backend.NewSession(ctx, &engine.SessionRequest{Manifest: spec.manifest, Files: engineFiles(spec.files)})
	})
	if err != nil {
		return backendError(err, "sandbox")
	}
	info := sess.Info()
	now := time.Now().UTC()
	created := info.Created.UTC()
	if info.Created.IsZero() {
		created = now
	}
	sb := &sandbox{
		id:       sess.ID(),
		key:      key.ID,
		sess:     sess,
		info:     info,
		manifest: spec.manifest,
		metadata: spec.metadata,
		created:  created,
		release:  release,
		state:    StateRunning,
		expires:  now.Add(spec.ttl),
	}
	rec := auditRecord(sb.id, audit.KindSandbox, key.ID, sb.id, spec.manifest, nil)
	rec.Tier, rec.Image, rec.ImageDigest, rec.Pooled = info.Tier, info.Image.Name, info.Image.Digest, info.Pooled
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		s.closeSession(sb, "audit failed")
		return internal(fmt.Errorf("audit: begin sandbox %s: %w", sb.id, err))
	}
	s.mu.Lock()
	if _, dup := s.sandboxes[sb.id]; dup || sb.id == "" {
		s.mu.Unlock()
		s.closeSession(sb, "duplicate id")
		s.cfg.Auditor.Finish(sb.id, nil, fmt.Errorf("backend returned sandbox id %q twice", sb.id))
		return internal(fmt.Errorf("backend returned sandbox id %q, which is empty or already live", sb.id))
	}
	s.sandboxes[sb.id] = sb
	registered = true
	// A sandbox's record accrues its lifetime; its CPU is its commands'.
	_, sb.untrack = s.track(sb.id, rec.Started)
	view := s.viewLocked(sb)
	s.mu.Unlock()
	s.log.Info("sandbox created", "sandbox", sb.id, "key", key.ID, "tier", info.Tier, "ttl", spec.ttl.String())
	return writeJSON(w, http.StatusCreated, view)
}

// lookup finds the caller's sandbox {id}. Another key's sandbox is as
// absent as an unknown one: ids must not be probeable.
func (s *Server) lookup(r *http.Request) (*sandbox, *Error) {
	id := r.PathValue("id")
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil || sb.key != keyOf(r).ID {
		return nil, notFound("sandbox " + quote(id))
	}
	return sb, nil
}

// viewLocked renders sb; s.mu is held.
func (s *Server) viewLocked(sb *sandbox) Sandbox {
	sb.mu.Lock()
	started := sb.count
	sb.mu.Unlock()
	md := sb.metadata
	if md == nil {
		md = map[string]string{}
	}
	return Sandbox{
		ID:             sb.id,
		State:          sb.state,
		Tier:           sb.info.Tier,
		Image:          sb.info.Image,
		ManifestDigest: cmp.Or(sb.info.ManifestDigest, sb.manifest.Digest()),
		CreatedAt:      sb.created,
		ExpiresAt:      sb.expires,
		Pooled:         sb.info.Pooled,
		Metadata:       md,
		Execs:          started,
	}
}

func (s *Server) view(sb *sandbox) Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked(sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	key := keyOf(r).ID
	s.mu.Lock()
	list := []Sandbox{}
	for _, sb := range s.sandboxes {
		if sb.key == key {
			list = append(list, s.viewLocked(sb))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Sandbox) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return writeJSON(w, http.StatusOK, SandboxList{Sandboxes: list})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, e := s.lookup(r)
	if e != nil {
		return e
	}
	return writeJSON(w, http.StatusOK, s.view(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, e := s.lookup(r)
	if e != nil {
		return e
	}
	view, err := s.destroy(sb, "deleted by its key")
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, view)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	sb, e := s.lookup(r)
	if e != nil {
		return e
	}
	var req TimeoutRequest
	if e := readJSON(w, r, s.cfg.MaxBodyBytes, &req); e != nil {
		return e
	}
	if req.TTL == "" {
		return invalid("ttl", "is missing; give a duration such as \"5m\"")
	}
	ttl, e := parseTTL(req.TTL, s.cfg.MaxTTL)
	if e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.state != StateRunning {
		return conflict("sandbox %s is being deleted", sb.id)
	}
	sb.expires = time.Now().UTC().Add(ttl)
	return writeJSON(w, http.StatusOK, s.viewLocked(sb))
}

// destroy removes sb: it is marked deleting (so other requests get 409),
// closed, dropped from the registry and its audit record finished.
func (s *Server) destroy(sb *sandbox, reason string) (Sandbox, *Error) {
	s.mu.Lock()
	if sb.state != StateRunning {
		s.mu.Unlock()
		return Sandbox{}, conflict("sandbox %s is already being deleted", sb.id)
	}
	sb.state = StateDeleting
	s.tasks.Add(1)
	s.mu.Unlock()
	defer s.tasks.Done()
	return s.finishDestroy(sb, reason)
}

// finishDestroy closes a sandbox marked deleting.
func (s *Server) finishDestroy(sb *sandbox, reason string) (Sandbox, *Error) {
	err := s.closeSession(sb, reason)
	s.mu.Lock()
	delete(s.sandboxes, sb.id)
	sb.state = StateDeleted
	view := s.viewLocked(sb)
	s.mu.Unlock()
	sb.release()
	sb.untrack()
	// A sandbox that was deleted, expired or shut down normally is done;
	// one that could not be destroyed, or whose init had died, failed.
	var res *result.Result
	auditErr := err
	if auditErr == nil {
		auditErr = sb.endedErr()
	}
	if auditErr == nil {
		res = sandboxResult(sb, view.CreatedAt)
	}
	if ferr := s.cfg.Auditor.Finish(sb.id, res, auditErr); ferr != nil {
		s.log.Error("audit: finish sandbox", "sandbox", sb.id, "err", ferr)
	}
	if err != nil {
		return view, internal(fmt.Errorf("destroy sandbox %s: %w", sb.id, err))
	}
	return view, nil
}

// sandboxResult is what the audit log records of a sandbox that ended
// normally: its lifetime, and no program outcome (its commands have their
// own records, with their terminations and CPU time).
func sandboxResult(sb *sandbox, created time.Time) *result.Result {
	now := time.Now().UTC()
	return &result.Result{
		Schema:     result.SchemaVersion,
		ID:         sb.id,
		Tier:       sb.info.Tier,
		Image:      sb.info.Image,
		Manifest:   sb.info.ManifestDigest,
		Pooled:     sb.info.Pooled,
		StartedAt:  created,
		DurationMS: float64(now.Sub(created).Microseconds()) / 1000,
		Files:      []result.FileChange{},
		Network:    []result.NetworkAttempt{},
		Violations: []result.Violation{},
	}
}

// errSandboxEnded is the audit log's reason for a sandbox destroyed
// because its init had exited.
var errSandboxEnded = errors.New("the sandbox's init process exited (killed by a program inside it, e.g. kill 1?): the sandbox could run nothing more and was destroyed")

// ended records that sb's init has exited; endedErr reports it.
func (sb *sandbox) markEnded() {
	sb.mu.Lock()
	sb.dead = true
	sb.mu.Unlock()
}

func (sb *sandbox) endedErr() error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.dead {
		return errSandboxEnded
	}
	return nil
}

// checkEnded destroys sb if its sandbox has ended on its own (Ender):
// after a command failed as infra-error, or Start failed. It reports
// whether it had.
func (s *Server) checkEnded(sb *sandbox, startErr error) bool {
	e, ok := sb.sess.(Ender)
	if !errors.Is(startErr, engine.ErrSandboxEnded) && (!ok || !e.Ended()) {
		return false
	}
	sb.markEnded()
	s.log.Warn("sandbox ended on its own: its init exited", "sandbox", sb.id)
	s.destroy(sb, "its init exited")
	return true
}

// closeSession destroys the sandbox; a panicking Close is an error.
func (s *Server) closeSession(sb *sandbox, reason string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic in session Close: %v", p)
		}
		if err != nil {
			s.log.Error("destroy sandbox failed", "sandbox", sb.id, "reason", reason, "err", err)
		} else {
			s.log.Info("sandbox destroyed", "sandbox", sb.id, "reason", reason)
		}
	}()
	return sb.sess.Close()
}

// reap destroys sandboxes whose TTL has passed, until Shutdown.
func (s *Server) reap() {
	defer close(s.reaped)
	t := time.NewTicker(s.cfg.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case now := <-t.C:
			s.mu.Lock()
			var expired []*sandbox
			for _, sb := range s.sandboxes {
				if sb.state == StateRunning && now.After(sb.expires) {
					expired = append(expired, sb)
				}
			}
			s.mu.Unlock()
			for _, sb := range expired {
				// One at a time would let a slow Close delay every other
				// expiry.
				go func() {
					defer func() {
						if p := recover(); p != nil {
							s.log.Error("panic destroying an expired sandbox", "sandbox", sb.id, "panic", fmt.Sprint(p))
						}
					}()
					s.destroy(sb, "ttl expired")
				}()
			}
		}
	}
}

// Shutdown stops the server taking new work (503), lets in-flight one-shot
// runs finish, then destroys every sandbox and waits for their commands'
// records to be finished. If ctx ends first, in-flight runs and sandbox
// creations are cancelled (their sandboxes are killed) and Shutdown still
// waits until each is destroyed, then returns ctx's error: it never
// returns with a sandbox alive. Later calls wait for the first.
func (s *Server) Shutdown(ctx context.Context) error {
	first := false
	s.shutdownOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.shutdownDone:
			return s.shutdownErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer close(s.shutdownDone)
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	close(s.stopping) // queued requests get 503; the reaper stops
	<-s.reaped
	s.log.Info("shutting down: waiting for in-flight runs")

	var err error
	if !waitCtx(ctx, &s.inflight) {
		err = ctx.Err()
		s.log.Warn("shutdown deadline reached: cancelling in-flight runs")
		s.stop()
		s.inflight.Wait()
	}

	s.mu.Lock()
	var all []*sandbox
	for _, sb := range s.sandboxes {
		if sb.state == StateRunning {
			sb.state = StateDeleting
			s.tasks.Add(1)
			all = append(all, sb)
		}
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, sb := range all {
		wg.Go(func() {
			defer s.tasks.Done()
			s.finishDestroy(sb, "server shutting down")
		})
	}
	wg.Wait()
	s.tasks.Wait()
	s.stop()
	<-s.accrued // no accrual is written after Shutdown returns
	s.log.Info("shut down", "sandboxes_destroyed", len(all))
	s.shutdownErr = err
	return err
}

// waitCtx waits for wg or ctx, whichever is first; false means ctx.
func waitCtx(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
