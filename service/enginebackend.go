package service

import (
	"context"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
)

// NewEngineBackend serves the service from a real engine. The engine's
// tier.ErrUnavailable needs no translation: Classify knows it.
func NewEngineBackend(e *engine.Engine) Backend { return engineBackend{e} }

type engineBackend struct{ e *engine.Engine }

var (
	_ PoolReporter  = engineBackend{}
	_ StartReporter = engineBackend{}
)

func (b engineBackend) ObserveStarts(fn func(tier string, poolHit bool, d time.Duration)) {
	b.e.ObserveStarts(fn)
}

func (b engineBackend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	return b.e.Run(ctx, req)
}

func (b engineBackend) NewSession(ctx context.Context, req *engine.SessionRequest) (Session, error) {
	s, err := b.e.NewSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return engineSession{s}, nil
}

func (b engineBackend) PoolStats() []PoolStat {
	var out []PoolStat
	for _, p := range b.e.PoolStats() {
		out = append(out, PoolStat{Pool: p.Name, Ready: p.Ready, Taken: uint64(p.Taken), Misses: uint64(p.Misses)})
	}
	return out
}

type engineSession struct{ *engine.Session }

func (s engineSession) Start(ctx context.Context, req *engine.ExecRequest) (Process, error) {
	p, err := s.Session.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return p, nil
}
