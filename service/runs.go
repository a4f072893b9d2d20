package service

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Run runs one program in a fresh sandbox as key and returns its result;
// the sandbox is destroyed before Run returns. The program's fate is in
// the Result; the error is for refused requests and Moat's failures.
// Cancelling ctx kills the run. The result is kept for GetRun.
func (s *Service) Run(ctx context.Context, key audit.Key, args RunArgs) (RunResponse, error) {
	return s.run(ctx, key, args, false)
}

// run is Run; approved skips the effects screening (a person approved it).
func (s *Service) run(ctx context.Context, key audit.Key, args RunArgs, approved bool) (RunResponse, error) {
	if args.Manifest == nil {
		args.Manifest = manifest.Default()
	}
	// No argv runs the image config's Entrypoint and Cmd (an imported
	// image's), as `moat run` with no command does; the backend refuses
	// an image without them, and the refusal names argv.
	if len(args.Argv) > 0 && args.Argv[0] == "" {
		return RunResponse{}, InvalidField("argv[0]", "is empty; it names the program, e.g. \"python3\"")
	}
	if e := CheckSecretGrants(key, args.Manifest); e != nil {
		return RunResponse{}, e
	}
	if e := CheckPolicy(s.cfg.Policy, key, args.Manifest); e != nil {
		return RunResponse{}, e
	}
	// A one-shot run is a session of one command. No argv runs the
	// image's entrypoint, which only the image's author wrote: it is not
	// screened, as a manifest's image is the operator's choice.
	if p := s.effectsPolicy(); p != nil && !approved && len(args.Argv) > 0 {
		held, denied := screen(p, effects.NewSession(), args.Argv, nil)
		if denied != nil {
			return RunResponse{}, s.refuse(key, "", args.Manifest, args.Argv, denied)
		}
		if held != nil {
			a := args
			return RunResponse{}, s.holdForApproval(key, "", args.Manifest, args.Argv, held, &a, nil)
		}
	}
	leave, release, e := s.admit(key)
	if e != nil {
		return RunResponse{}, e
	}
	defer leave()
	defer release()
	slot, e := s.acquire(ctx)
	if e != nil {
		return RunResponse{}, e
	}
	defer slot()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()

	m := args.Manifest
	id := NewID(8)
	rec := auditRecord(id, audit.KindRun, key.ID, "", m, args.Argv)
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		// Fail closed: nothing runs unaudited.
		return RunResponse{}, InternalError(fmt.Errorf("audit: begin run %s: %w", id, err))
	}
	usage, untrack := s.track(id, rec.Started)
	req := &engine.Request{ID: id, Manifest: m, Argv: args.Argv, Files: args.Files, Stdin: args.Stdin,
		OnRuntime: usage.setProcs,
		OnStart:   func(_ string, procs func() ([]int, error)) { usage.setProcs(procs) },
		Evidence:  evidence(key, rec),
	}
	res, err := guard("backend", "a result", func() (*result.Result, error) { return s.cfg.Backend.Run(ctx, req) })
	untrack()
	if ferr := s.cfg.Auditor.Finish(id, res, err); ferr != nil {
		s.log.Error("audit: finish run", "run", id, "err", ferr)
	}
	if err != nil {
		if len(args.Argv) == 0 {
			return RunResponse{}, classify(err, "run", ManifestField, "argv")
		}
		return RunResponse{}, backendError(err, "run")
	}
	s.observe(res)
	resp := RunResponse{ID: id, Pooled: res.Pooled, Result: res}
	s.runs.put(id, key.ID, resp)
	return resp, nil
}

// GetRun returns the stored result of key's run id as its JSON (the last
// KeepRuns runs are kept). Another key's run is NotFound.
func (s *Service) GetRun(ctx context.Context, key audit.Key, id string) (json.RawMessage, error) {
	resp, ok := s.runs.get(id, key.ID)
	if !ok || key.ID == "" {
		return nil, notFound("run " + Quote(id))
	}
	return resp, nil
}

// evidence is who asked for a run or command, for the incident bundle
// the engine keeps when it ends flagged: the key and the audit record as
// it began.
func evidence(key audit.Key, rec audit.Record) engine.Evidence {
	b, err := json.Marshal(rec)
	if err != nil {
		b = nil
	}
	return engine.Evidence{Key: key.ID, Audit: b}
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
