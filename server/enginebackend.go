package server

import (
	"context"
	"errors"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// NewEngineBackend serves the API from a real engine.
func NewEngineBackend(e *engine.Engine) Backend { return engineBackend{e} }

type engineBackend struct{ e *engine.Engine }

var _ PoolReporter = engineBackend{}

func (b engineBackend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	res, err := b.e.Run(ctx, req)
	return res, unavailable503(err)
}

func (b engineBackend) NewSession(ctx context.Context, req *engine.SessionRequest) (Session, error) {
	s, err := b.e.NewSession(ctx, req)
	if err != nil {
		return nil, unavailable503(err)
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

// unavailable503 marks a tier this host cannot run as the server's
// ErrUnavailable (503), keeping the engine's message.
func unavailable503(err error) error {
	if err != nil && errors.Is(err, tier.ErrUnavailable) {
		return &wrapped{err: err, also: ErrUnavailable}
	}
	return err
}

type engineSession struct{ *engine.Session }

func (s engineSession) Start(ctx context.Context, req *engine.ExecRequest) (Process, error) {
	p, err := s.Session.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// wrapped is err that also matches also with errors.Is.
type wrapped struct{ err, also error }

func (w *wrapped) Error() string   { return w.err.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.err, w.also} }
