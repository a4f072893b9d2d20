package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// createRun serves POST /v1/runs: one program in a fresh sandbox, answered
// with its result. A client that goes away cancels its run: nobody could
// learn its id.
func (s *Server) createRun(w http.ResponseWriter, r *http.Request) error {
	key := keyOf(r)
	spec, e := readRun(w, r, s.cfg.MaxBodyBytes, s.cfg.MaxFiles)
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
	defer release()
	if e := s.checkCPU(key); e != nil {
		return e
	}
	slot, e := s.acquire(r.Context())
	if e != nil {
		return e
	}
	defer slot()

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()

	m := spec.manifest
	id := newID(8)
	rec := auditRecord(id, audit.KindRun, key.ID, "", m, spec.argv)
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		// Fail closed: nothing runs unaudited.
		return internal(fmt.Errorf("audit: begin run %s: %w", id, err))
	}
	usage, untrack := s.track(id, rec.Started)
	req := &engine.Request{ID: id, Manifest: m, Argv: spec.argv, Files: engineFiles(spec.files),
		OnRuntime: usage.setProcs,
		OnStart:   func(_ string, procs func() ([]int, error)) { usage.setProcs(procs) },
	}
	if len(spec.stdin) > 0 {
		req.Stdin = bytes.NewReader(spec.stdin)
	}
	res, err := guard("backend", "a result", func() (*result.Result, error) { return s.cfg.Backend.Run(ctx, req) })
	untrack()
	if ferr := s.cfg.Auditor.Finish(id, res, err); ferr != nil {
		s.log.Error("audit: finish run", "run", id, "err", ferr)
	}
	if err != nil {
		return backendError(err, "run")
	}
	s.metrics.observe(res)
	resp := RunResponse{ID: id, Pooled: res.Pooled, Result: res}
	s.runs.put(id, key.ID, resp)
	return writeJSON(w, http.StatusOK, resp)
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) error {
	resp, ok := s.runs.get(r.PathValue("id"), keyOf(r).ID)
	if !ok {
		return notFound("run " + quote(r.PathValue("id")))
	}
	return writeJSON(w, http.StatusOK, resp)
}

// auditRecord starts the audit record of a run, a sandbox or an exec.
func auditRecord(id string, kind audit.Kind, keyID, sandboxID string, m *manifest.Manifest, argv []string) audit.Record {
	canon, _ := json.Marshal(m)
	return audit.Record{
		ID:             id,
		Kind:           kind,
		KeyID:          keyID,
		SandboxID:      sandboxID,
		Started:        time.Now().UTC(),
		Status:         audit.Running,
		Tier:           m.Tier,
		Image:          m.Image,
		ManifestDigest: m.Digest(),
		Manifest:       string(canon),
		Command:        argv,
		MemoryLimit:    int64(m.Resources.Memory),
	}
}

// runStore keeps the last max results for GET /v1/runs/{id}. Each is
// stored as its JSON, so a result is not kept alive twice.
type runStore struct {
	mu    sync.Mutex
	max   int
	byID  map[string]*storedRun
	order []string // oldest first
}

type storedRun struct {
	key  string
	json []byte
}

func (rs *runStore) put(id, key string, resp RunResponse) {
	b, err := json.Marshal(resp)
	if err != nil {
		return
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.byID[id] = &storedRun{key: key, json: b}
	rs.order = append(rs.order, id)
	for len(rs.order) > rs.max {
		delete(rs.byID, rs.order[0])
		rs.order[0] = ""
		rs.order = rs.order[1:]
	}
}

// get returns the run if it belongs to key: another key's run is as absent
// as an unknown one.
func (rs *runStore) get(id, key string) (json.RawMessage, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	sr, ok := rs.byID[id]
	if !ok || sr.key != key {
		return nil, false
	}
	return sr.json, true
}
