package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
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

	// state, expires and paused are guarded by Service.mu. paused is the
	// stored workspace of a paused sandbox (lifecycle.go).
	state   string
	expires time.Time
	paused  *snapshot
	// autoPause: the reaper pauses it rather than destroy it when its TTL
	// passes (autopause.go). Set at creation, kept across resumes.
	autoPause bool

	mu   sync.Mutex
	dead bool // its init exited: destroyed as failed
	// closing is why the sandbox is being destroyed or paused, set before
	// its session is closed: a command that ends after it was killed by
	// it (Exec.Interrupted).
	closing string
	execs   []*execution // in start order; ended ones beyond KeepExecs are dropped
	seq     int          // the last command number given out
	count   int          // commands started, for the Sandbox view
	// fx is what the commands allowed or approved so far did, for the
	// effects analysis of the next one (approvals.go); remembered are
	// the effects a person approved (RememberApprovals: session).
	fx         *effects.Session
	remembered map[string]bool
	// kernels are the code interpreter's kernels (kernel.go) by context:
	// the default one from its first cell, others from CreateContext; a
	// nil value is a context whose kernel is not running. kernelTurn
	// orders starting them and sending them cells.
	kernels    map[string]*kernel
	contextSeq int
	kernelTurn sync.Mutex
}

// CreateSandbox creates a sandbox owned by key: it takes one of the key's
// sandbox slots until the sandbox is destroyed, and is audited from now.
// ctx bounds the preparation only.
func (s *Service) CreateSandbox(ctx context.Context, key audit.Key, args SandboxArgs) (Sandbox, error) {
	ttl := args.TTL
	if ttl == 0 {
		ttl = s.cfg.DefaultTTL
	}
	if e := s.checkTTL(ttl); e != nil {
		return Sandbox{}, e
	}
	if e := CheckMetadata(args.Metadata); e != nil {
		return Sandbox{}, e
	}
	if args.Snapshot != "" {
		done, e := s.snapshotArgs(key, &args)
		if e != nil {
			return Sandbox{}, e
		}
		defer done()
	}
	if args.Manifest == nil {
		args.Manifest = manifest.Default()
	}
	if args.AutoPause {
		if e := s.needSnapshots(); e != nil {
			return Sandbox{}, InvalidField("auto_pause", "%s", e.Message)
		}
	}
	if e := CheckSecretGrants(key, args.Manifest); e != nil {
		return Sandbox{}, e
	}
	if e := CheckPolicy(s.cfg.Policy, key, args.Manifest); e != nil {
		return Sandbox{}, e
	}
	leave, release, e := s.admit(key)
	if e != nil {
		return Sandbox{}, e
	}
	defer leave()
	registered := false
	defer func() {
		if !registered {
			release()
		}
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	sess, err := guard("backend", "a session", func() (Session, error) {
		return s.cfg.Backend.NewSession(ctx, &engine.SessionRequest{Manifest: args.Manifest, Files: args.Files})
	})
	if err != nil {
		return Sandbox{}, backendError(err, "sandbox")
	}
	info := sess.Info()
	now := time.Now().UTC()
	created := info.Created.UTC()
	if info.Created.IsZero() {
		created = now
	}
	sb := &sandbox{
		fx:         effects.NewSession(),
		remembered: map[string]bool{},
		id:         sess.ID(),
		key:        key.ID,
		sess:       sess,
		info:       info,
		manifest:   args.Manifest,
		metadata:   args.Metadata,
		created:    created,
		release:    release,
		state:      StateRunning,
		expires:    now.Add(ttl),
		autoPause:  args.AutoPause,
	}
	rec := auditRecord(sb.id, audit.KindSandbox, key.ID, sb.id, args.Manifest, nil)
	rec.Tier, rec.Image, rec.ImageDigest, rec.Pooled = info.Tier, info.Image.Name, info.Image.Digest, info.Pooled
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		s.closeSession(sb, "audit failed")
		return Sandbox{}, InternalError(fmt.Errorf("audit: begin sandbox %s: %w", sb.id, err))
	}
	s.mu.Lock()
	if _, dup := s.sandboxes[sb.id]; dup || sb.id == "" {
		s.mu.Unlock()
		s.closeSession(sb, "duplicate id")
		s.cfg.Auditor.Finish(sb.id, nil, fmt.Errorf("backend returned sandbox id %q twice", sb.id))
		return Sandbox{}, InternalError(fmt.Errorf("backend returned sandbox id %q, which is empty or already live", sb.id))
	}
	s.sandboxes[sb.id] = sb
	registered = true
	// A sandbox's record accrues its lifetime; its CPU is its commands'.
	_, sb.untrack = s.track(sb.id, rec.Started)
	view := s.viewLocked(sb)
	s.mu.Unlock()
	s.log.Info("sandbox created", "sandbox", sb.id, "key", key.ID, "tier", info.Tier, "ttl", ttl.String())
	return view, nil
}

// checkTTL refuses a TTL that is not positive or above MaxTTL.
func (s *Service) checkTTL(ttl time.Duration) *Error {
	switch {
	case ttl <= 0:
		return InvalidField("ttl", "%s is not positive", Quote(ttl.String()))
	case ttl > s.cfg.MaxTTL:
		return InvalidField("ttl", "%s is above the maximum %s (--max-ttl)", Quote(ttl.String()), s.cfg.MaxTTL)
	}
	return nil
}

// lookup finds key's sandbox id. Another key's sandbox is as absent as an
// unknown one: ids must not be probeable.
func (s *Service) lookup(key audit.Key, id string) (*sandbox, *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[id]
	if sb == nil || key.ID == "" || sb.key != key.ID {
		return nil, notFound("sandbox " + Quote(id))
	}
	return sb, nil
}

// viewLocked renders sb; s.mu is held.
func (s *Service) viewLocked(sb *sandbox) Sandbox {
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
		AutoPause:      sb.autoPause,
	}
}

func (s *Service) view(sb *sandbox) Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.viewLocked(sb)
}

// ListSandboxes is key's sandboxes (those being deleted too), oldest
// first.
func (s *Service) ListSandboxes(ctx context.Context, key audit.Key) ([]Sandbox, error) {
	s.mu.Lock()
	list := []Sandbox{}
	for _, sb := range s.sandboxes {
		if key.ID != "" && sb.key == key.ID {
			list = append(list, s.viewLocked(sb))
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Sandbox) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return list, nil
}

// GetSandbox describes key's sandbox id.
func (s *Service) GetSandbox(ctx context.Context, key audit.Key, id string) (Sandbox, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	return s.view(sb), nil
}

// SandboxManifest is the manifest key's sandbox id was created with (what
// a command's request is checked against).
func (s *Service) SandboxManifest(ctx context.Context, key audit.Key, id string) (*manifest.Manifest, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	return sb.manifest, nil
}

// DeleteSandbox destroys key's sandbox id and returns its last view
// (state deleted). A sandbox already being deleted is a Conflict.
func (s *Service) DeleteSandbox(ctx context.Context, key audit.Key, id string) (Sandbox, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	view, e := s.destroy(sb, reasonDeleted)
	if e != nil {
		return view, e
	}
	return view, nil
}

// SetTimeout makes key's sandbox id expire ttl from now.
func (s *Service) SetTimeout(ctx context.Context, key audit.Key, id string, ttl time.Duration) (Sandbox, error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	if e := s.checkTTL(ttl); e != nil {
		return Sandbox{}, e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb.state != StateRunning {
		return Sandbox{}, conflict("sandbox %s is being deleted", sb.id)
	}
	sb.expires = time.Now().UTC().Add(ttl)
	return s.viewLocked(sb), nil
}

// destroy removes sb: it is marked deleting (so other requests get 409),
// closed, dropped from the registry and its audit record finished.
func (s *Service) destroy(sb *sandbox, reason string) (Sandbox, *Error) {
	s.mu.Lock()
	if state := sb.state; state != StateRunning && state != StatePaused {
		// state read under s.mu: the sandbox's state is not ours once
		// it is unlocked.
		s.mu.Unlock()
		return Sandbox{}, conflict("sandbox %s is %s: it cannot be deleted now; retry shortly", sb.id, state)
	}
	sb.state = StateDeleting
	s.tasks.Add(1)
	s.mu.Unlock()
	defer s.tasks.Done()
	return s.finishDestroy(sb, reason)
}

// finishDestroy closes a sandbox marked deleting.
func (s *Service) finishDestroy(sb *sandbox, reason string) (Sandbox, *Error) {
	err := s.closeSession(sb, reason)
	s.mu.Lock()
	if s.sandboxes[sb.id] == sb {
		delete(s.sandboxes, sb.id)
	}
	sb.state = StateDeleted
	view := s.viewLocked(sb)
	paused := sb.paused
	sb.paused = nil
	s.mu.Unlock()
	if paused != nil {
		s.remove(paused, reason)
	}
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
		return view, InternalError(fmt.Errorf("destroy sandbox %s: %w", sb.id, err))
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
func (s *Service) checkEnded(sb *sandbox, startErr error) bool {
	e, ok := sb.sess.(Ender)
	if !errors.Is(startErr, engine.ErrSandboxEnded) && (!ok || !e.Ended()) {
		return false
	}
	sb.markEnded()
	s.log.Warn("sandbox ended on its own: its init exited", "sandbox", sb.id)
	s.destroy(sb, reasonInitExited)
	return true
}

// closeSession destroys the sandbox; a panicking Close is an error.
func (s *Service) closeSession(sb *sandbox, reason string) (err error) {
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
	sb.mu.Lock()
	if sb.closing == "" {
		sb.closing = reason
	}
	sb.mu.Unlock()
	return sb.sess.Close()
}

// reap destroys sandboxes whose TTL has passed, until Shutdown.
func (s *Service) reap() {
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
				if (sb.state == StateRunning || sb.state == StatePaused) && now.After(sb.expires) {
					expired = append(expired, sb)
				}
			}
			s.mu.Unlock()
			s.expireSnapshots(now)
			for _, sb := range expired {
				// One at a time would let a slow Close delay every other
				// expiry.
				go func() {
					defer func() {
						if p := recover(); p != nil {
							s.log.Error("panic destroying an expired sandbox", "sandbox", sb.id, "panic", fmt.Sprint(p))
						}
					}()
					if s.autoPauseExpired(sb) {
						return
					}
					s.destroy(sb, reasonExpired)
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
func (s *Service) Shutdown(ctx context.Context) error {
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
	s.stopApprovals()
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
		if sb.state == StateRunning || sb.state == StatePaused {
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
			s.finishDestroy(sb, reasonShutdown)
		})
	}
	wg.Wait()
	s.tasks.Wait()
	s.dropSnapshots()
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
