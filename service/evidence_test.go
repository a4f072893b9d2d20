package service_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
)

// evidenceBackend records the Evidence the service hands the engine with
// each run and command.
type evidenceBackend struct {
	service.Backend
	mu  sync.Mutex
	got []engine.Evidence
}

func (b *evidenceBackend) add(ev engine.Evidence) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.got = append(b.got, ev)
}

func (b *evidenceBackend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	b.add(req.Evidence)
	return b.Backend.Run(ctx, req)
}

func (b *evidenceBackend) NewSession(ctx context.Context, req *engine.SessionRequest) (service.Session, error) {
	s, err := b.Backend.NewSession(ctx, req)
	if err != nil {
		return nil, err
	}
	return evidenceSession{s, b}, nil
}

type evidenceSession struct {
	service.Session
	b *evidenceBackend
}

func (s evidenceSession) Start(ctx context.Context, req *engine.ExecRequest) (service.Process, error) {
	s.b.add(req.Evidence)
	return s.Session.Start(ctx, req)
}

// TestEvidenceNamesKeyAndAudit: every run and command reaches the engine
// with the key that asked for it and its audit record as begun, so that
// an incident bundle names them (docs/INCIDENTS.md).
func TestEvidenceNamesKeyAndAudit(t *testing.T) {
	var eb *evidenceBackend
	s, _, _ := newService(t, func(c *service.Config) {
		eb = &evidenceBackend{Backend: c.Backend}
		c.Backend = eb
	})
	ctx := t.Context()
	run, err := s.Run(ctx, keyA, service.RunArgs{Argv: []string{"echo", "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := s.CreateSandbox(ctx, keyB, service.SandboxArgs{})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := s.RunExec(ctx, keyB, sb.ID, service.ExecArgs{Argv: []string{"echo", "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteSandbox(ctx, keyB, sb.ID); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		key    string
		record string
		kind   audit.Kind
	}{
		{"run", keyA.ID, run.ID, audit.KindRun},
		{"exec", keyB.ID, sb.ID + "-" + ex.ID, audit.KindExec},
	}
	eb.mu.Lock()
	got := eb.got
	eb.mu.Unlock()
	if len(got) != len(tests) {
		t.Fatalf("the engine got %d evidences, want %d", len(got), len(tests))
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ev := got[i]
			if ev.Key != tc.key {
				t.Errorf("key %q, want %q", ev.Key, tc.key)
			}
			var rec audit.Record
			if err := json.Unmarshal(ev.Audit, &rec); err != nil {
				t.Fatalf("audit %q: %v", ev.Audit, err)
			}
			if rec.ID != tc.record || rec.Kind != tc.kind || rec.KeyID != tc.key || rec.Status != audit.Running {
				t.Errorf("audit record %+v, want id %s kind %s key %s running", rec, tc.record, tc.kind, tc.key)
			}
		})
	}
}
