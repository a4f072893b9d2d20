package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

// PoolConfig keeps sandboxes prepared ahead of demand for one resource
// class: the tier, image, resources, workspace and security of Manifest.
// A run or session whose manifest has the same class (and network mode
// none) takes a ready sandbox instead of preparing one; it is used once and
// destroyed, and the pool prepares a replacement in the background.
type PoolConfig struct {
	// Name labels the pool in metrics; default "tier/image".
	Name string
	// Manifest is the class; its inputs, env and command are irrelevant.
	Manifest *manifest.Manifest
	// Size is how many sandboxes are kept ready.
	Size int
	// Session makes the pool's sandboxes sessions (NewSession) rather
	// than one-shot (Run).
	Session bool
}

// PoolStat is one pool's state.
type PoolStat struct {
	Name      string `json:"name"`
	Session   bool   `json:"session"`
	Size      int    `json:"size"`
	Ready     int    `json:"ready"`
	Taken     int64  `json:"taken"`
	Misses    int64  `json:"misses"`
	LastError string `json:"last_error,omitempty"`
}

type pool struct {
	cfg    PoolConfig
	ready  chan *prepared
	refill chan struct{}

	mu      sync.Mutex
	key     string
	lastErr string

	taken, misses atomic.Int64
}

// poolKey is a resource class: what a prepared sandbox is made of.
func poolKey(t tier.Tier, img *image.Image, m *manifest.Manifest, session bool) string {
	allow := slices.Clone(m.Security.AllowMissing)
	slices.Sort(allow)
	return fmt.Sprintf("%s|%s|%s|%+v|%v|%v", t.Name(), img.Name, img.Digest, limits(m), allow, session)
}

// StartPools starts filling the configured pools. Close stops them and
// destroys every sandbox still waiting.
func (e *Engine) StartPools() error {
	for i, c := range e.opts.Pools {
		if c.Manifest == nil || c.Size <= 0 {
			return fmt.Errorf("pool %d: needs a manifest and a size of at least 1", i)
		}
		if c.Manifest.Network.Mode != "none" {
			return &manifest.FieldError{Field: "network.mode", Value: c.Manifest.Network.Mode, Problem: "pools hold sandboxes without network only: an egress grant is per run"}
		}
		if c.Name == "" {
			c.Name = c.Manifest.Tier + "/" + c.Manifest.Image
			if c.Session {
				c.Name += "/session"
			}
		}
		p := &pool{cfg: c, ready: make(chan *prepared, c.Size), refill: make(chan struct{}, 1)}
		e.pools = append(e.pools, p)
		e.poolWG.Add(1)
		go e.fill(p)
	}
	return nil
}

// fill keeps p full until the engine closes.
func (e *Engine) fill(p *pool) {
	defer e.poolWG.Done()
	ctx := e.poolCtx
	for {
		t, img, err := e.resolve(ctx, p.cfg.Manifest, p.cfg.Session)
		if err == nil {
			key := poolKey(t, img, p.cfg.Manifest, p.cfg.Session)
			p.mu.Lock()
			stale := p.key != "" && p.key != key
			p.key = key
			p.mu.Unlock()
			if stale {
				// The image was rebuilt: what waits is of the old one.
				p.drain()
			}
			for len(p.ready) < cap(p.ready) && ctx.Err() == nil {
				var s *prepared
				s, err = e.prepare(ctx, t, img, p.cfg.Manifest, p.cfg.Session, nil)
				if err != nil {
					break
				}
				if r, ok := s.sb.(tier.Readier); ok {
					// Offer only what has nothing left to set up.
					wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					err = r.WaitReady(wctx)
					cancel()
					if err != nil {
						s.close()
						err = fmt.Errorf("sandbox did not become ready: %w", err)
						break
					}
				}
				s.pooled = true
				p.ready <- s
			}
		}
		p.mu.Lock()
		p.lastErr = ""
		if err != nil && ctx.Err() == nil {
			p.lastErr = err.Error()
		}
		p.mu.Unlock()
		retry := time.Second
		if err != nil {
			retry = 5 * time.Second
		}
		select {
		case <-ctx.Done():
			p.drain()
			return
		case <-p.refill:
		case <-time.After(retry):
		}
	}
}

func (p *pool) drain() {
	for {
		select {
		case s := <-p.ready:
			s.close()
		default:
			return
		}
	}
}

// take returns a sandbox for m: a ready one from a matching pool, or a new
// one whose egress proxy (if any) resolves names with res (nil: the host's
// resolver).
func (e *Engine) take(ctx context.Context, t tier.Tier, img *image.Image, m *manifest.Manifest, session bool, res egress.Resolver) (*prepared, error) {
	start := time.Now()
	if m.Network.Mode == "none" && len(e.pools) > 0 {
		key := poolKey(t, img, m, session)
		for _, p := range e.pools {
			p.mu.Lock()
			match := p.key == key
			p.mu.Unlock()
			if !match {
				continue
			}
			select {
			case s := <-p.ready:
				p.taken.Add(1)
				select {
				case p.refill <- struct{}{}:
				default:
				}
				e.observeStart(t.Name(), true, time.Since(start))
				return s, nil
			default:
				p.misses.Add(1)
			}
		}
	}
	s, err := e.prepare(ctx, t, img, m, session, res)
	if err == nil {
		e.observeStart(t.Name(), false, time.Since(start))
	}
	return s, err
}

// ObserveStarts sets the function called each time a sandbox is ready for
// a program (taken from a warm pool, or prepared on demand), with its
// tier, whether a pool had it, and how long take took: moat serve's
// moat_sandbox_start_seconds. Nil stops the calls.
func (e *Engine) ObserveStarts(fn func(tier string, poolHit bool, d time.Duration)) {
	if fn == nil {
		e.startObs.Store(nil)
		return
	}
	e.startObs.Store(&fn)
}

func (e *Engine) observeStart(tier string, poolHit bool, d time.Duration) {
	if fn := e.startObs.Load(); fn != nil {
		(*fn)(tier, poolHit, d)
	}
}

// PoolStats reports every pool's state.
func (e *Engine) PoolStats() []PoolStat {
	var out []PoolStat
	for _, p := range e.pools {
		p.mu.Lock()
		lastErr := p.lastErr
		p.mu.Unlock()
		out = append(out, PoolStat{Name: p.cfg.Name, Session: p.cfg.Session, Size: p.cfg.Size, Ready: len(p.ready),
			Taken: p.taken.Load(), Misses: p.misses.Load(), LastError: lastErr})
	}
	return out
}

// WaitPools blocks until every pool is full or ctx ends (benchmarks and
// tests use it to measure warm runs).
func (e *Engine) WaitPools(ctx context.Context) error {
	for {
		full := true
		for _, p := range e.pools {
			if len(p.ready) < cap(p.ready) {
				full = false
			}
		}
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Close stops the pools and destroys every sandbox waiting in them.
// Sessions and runs in flight are their owners' to end.
func (e *Engine) Close() error {
	e.poolStop()
	e.poolWG.Wait()
	return nil
}
