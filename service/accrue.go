package service

import (
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
)

// Usage accrued while records run. A record's final usage is written by
// Finish when its program ends; if the server dies first, Finish never
// comes. So every AccrueInterval the server writes what each running
// record has used so far (its wall time, and its CPU time where the
// backend can tell), and the next server's start-up keeps it when it
// settles the dead records (audit.Store.FailRunning). The daily CPU quota
// also sees programs while they run.

// Accruer is implemented by an Auditor that records usage while records
// run (*audit.Store). Without it nothing is accrued.
type Accruer interface {
	Accrue([]audit.Accrual) error
}

// CPUReporter is implemented by a Session that can tell the CPU time its
// sandbox's processes have used so far (engine.Session). A command's
// accrued CPU is the sandbox's since the command started.
type CPUReporter interface {
	CPU() (time.Duration, error)
}

// meter is the usage source of one running record.
type meter struct {
	started time.Time

	mu   sync.Mutex
	cpu  func() (time.Duration, error) // nil: wall time only
	base time.Duration                 // subtracted from cpu()
}

// setCPU sets where the record's CPU time comes from; base is subtracted.
func (m *meter) setCPU(cpu func() (time.Duration, error), base time.Duration) {
	m.mu.Lock()
	m.cpu, m.base = cpu, base
	m.mu.Unlock()
}

// setProcs makes the CPU time of the host processes procs lists the
// record's (engine.Request.OnStart and OnRuntime). A lister that fails
// (a tier that cannot list its processes) leaves the source as it was,
// and so does a second lister: the engine calls OnRuntime (the user-space
// kernel's processes, which do the program's work) before OnStart.
func (m *meter) setProcs(procs func() ([]int, error)) {
	if _, err := procs(); err != nil {
		return
	}
	m.mu.Lock()
	set := m.cpu != nil
	m.mu.Unlock()
	if set {
		return
	}
	m.setCPU(func() (time.Duration, error) {
		pids, err := procs()
		if err != nil {
			return 0, err
		}
		return engine.ProcsCPU(pids), nil
	}, 0)
}

func (m *meter) read(now time.Time) audit.Accrual {
	a := audit.Accrual{WallMS: float64(now.Sub(m.started).Microseconds()) / 1000}
	m.mu.Lock()
	cpu, base := m.cpu, m.base
	m.mu.Unlock()
	if cpu != nil {
		if d, err := cpu(); err == nil && d > base {
			a.CPUMS = float64((d - base).Microseconds()) / 1000
		}
	}
	return a
}

// meters are the running records' meters, by audit record id.
type meters struct {
	mu sync.Mutex
	m  map[string]*meter
}

// track starts metering record id from started; stop ends it (before the
// record's Finish, so no accrual is written after the final numbers).
func (s *Service) track(id string, started time.Time) (m *meter, stop func()) {
	m = &meter{started: started}
	s.meters.mu.Lock()
	if s.meters.m == nil {
		s.meters.m = map[string]*meter{}
	}
	s.meters.m[id] = m
	s.meters.mu.Unlock()
	return m, sync.OnceFunc(func() {
		s.meters.mu.Lock()
		delete(s.meters.m, id)
		s.meters.mu.Unlock()
	})
}

// accrue writes every running record's usage so far.
func (s *Service) accrue() {
	ac, ok := s.cfg.Auditor.(Accruer)
	if !ok {
		return
	}
	now := time.Now()
	s.meters.mu.Lock()
	ms := make(map[string]*meter, len(s.meters.m))
	for id, m := range s.meters.m {
		ms[id] = m
	}
	s.meters.mu.Unlock()
	if len(ms) == 0 {
		return
	}
	as := make([]audit.Accrual, 0, len(ms))
	for id, m := range ms {
		a := m.read(now)
		a.ID = id
		as = append(as, a)
	}
	if err := ac.Accrue(as); err != nil {
		s.log.Error("audit: accrue usage of running records", "records", len(as), "err", err)
	}
}

// accrueLoop accrues every AccrueInterval until Shutdown has finished
// every record (runs still draining keep accruing).
func (s *Service) accrueLoop() {
	defer close(s.accrued)
	t := time.NewTicker(s.cfg.AccrueInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stopCtx.Done():
			return
		case <-t.C:
			s.accrue()
		}
	}
}
