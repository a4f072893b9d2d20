package e2b

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The lifecycle routes: pause and resume, snapshots, fork. The service
// does the work (service/lifecycle.go); this translates E2B's bodies and
// answers. Every pause is filesystem-only: a request for a memory
// snapshot is refused (400), never silently downgraded, as E2B's own API
// answers where memory snapshots are not enabled.

func (h *Handler) lifecycleRoutes() {
	h.handle("POST /sandboxes/{id}/pause", h.pause)
	h.handle("POST /sandboxes/{id}/resume", h.resume)
	h.handle("POST /sandboxes/{id}/snapshots", h.createSnapshot)
	h.handle("GET /snapshots", h.listSnapshots)
	h.handle("DELETE /templates/{id}", h.deleteSnapshot)
	h.handle("POST /sandboxes/{id}/fork", h.fork)
}

// decodeOptional is decodeStrict for a body the SDKs may leave empty.
func decodeOptional(r *http.Request, v any) *apiError {
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 1<<20))
	if err != nil {
		return &apiError{http.StatusBadRequest, "the request body could not be read: " + err.Error()}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	return decodeStrict(r, v)
}

// noMemory refuses memory: true (keepMemory in the SDK).
func noMemory(field string, memory *bool) *apiError {
	if memory != nil && *memory {
		return badField(field, "true is not supported: Moat pauses filesystem-only (processes and memory are not kept; resume reboots the sandbox with its files); pass keepMemory: false or leave it unset")
	}
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	var req struct {
		Memory *bool `json:"memory"`
	}
	if e := decodeOptional(r, &req); e != nil {
		return e
	}
	notice := ""
	if e := noMemory("memory", req.Memory); e != nil {
		if !pauseMemoryByDefault(r) {
			return e
		}
		// Not the caller's choice: refusing would make pause unusable
		// with those releases; say what was kept instead.
		notice = pauseNotice
	}
	_, err := h.svc.PauseSandbox(r.Context(), key, id)
	switch service.KindOf(err) {
	case service.NotFound:
		return notFound(id)
	case service.Conflict:
		// The SDK's pause() answers false: already paused.
		return &apiError{http.StatusConflict, "sandbox \"" + id + "\" is already paused (or is being paused, resumed or deleted)"}
	}
	if err != nil {
		return h.fromService(err)
	}
	if notice != "" {
		w.Header().Set(NoticeHeader, notice)
		h.log.Info("e2b sandbox paused", "sandbox", id, "key", key.ID, "notice", notice)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resumePaused resumes key's sandbox id when it is paused, for ttl
// seconds (nil: E2B's default, 300), refusing memory: true (a pause
// keeps no memory). A running sandbox is left alone.
func (h *Handler) resumePaused(r *http.Request, key audit.Key, id string, seconds *int, memory *bool) *apiError {
	sb, err := h.svc.GetSandbox(r.Context(), key, id)
	if service.KindOf(err) == service.NotFound {
		return notFound(id)
	}
	if err != nil {
		return h.fromService(err)
	}
	if sb.State != service.StatePaused {
		return nil
	}
	if e := noMemory("memory", memory); e != nil {
		return e
	}
	ttl := 300 * time.Second
	if seconds != nil {
		if *seconds <= 0 {
			return badField("timeout", "%d is not a positive number of seconds", *seconds)
		}
		ttl = time.Duration(*seconds) * time.Second
	}
	_, err = h.svc.ResumeSandbox(r.Context(), key, id, ttl)
	switch service.KindOf(err) {
	case service.NotFound:
		return notFound(id)
	case service.Conflict:
		return nil // resumed by another request meanwhile
	}
	if err != nil {
		return h.fromService(err)
	}
	return nil
}

// resume is POST /sandboxes/{id}/resume (SDK releases before connect):
// 409 when the sandbox is not paused, as E2B answers.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	var req struct {
		Timeout   *int  `json:"timeout"`
		AutoPause *bool `json:"autoPause"`
	}
	if e := decodeOptional(r, &req); e != nil {
		return e
	}
	if req.AutoPause != nil && *req.AutoPause {
		return badField("autoPause", "true is not supported on resume: a sandbox's timeout action is set when it is created (lifecycle.onTimeout 'pause'); leave it unset or false")
	}
	b := h.box(key.ID, id)
	if b == nil {
		return notFound(id)
	}
	sb, err := h.svc.GetSandbox(r.Context(), key, id)
	if err != nil {
		return notFound(id)
	}
	if sb.State != service.StatePaused {
		return &apiError{http.StatusConflict, "sandbox \"" + id + "\" is not paused"}
	}
	if e := h.resumePaused(r, key, id, req.Timeout, nil); e != nil {
		return e
	}
	writeJSON(w, http.StatusCreated, h.createdView(b))
	return nil
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func infoOf(sn service.Snapshot) snapshotInfo {
	return snapshotInfo{SnapshotID: sn.ID, Names: append([]string{}, sn.Names...)}
}

func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	var req struct {
		Name string `json:"name"`
	}
	if e := decodeOptional(r, &req); e != nil {
		return e
	}
	sn, err := h.svc.CreateSnapshot(r.Context(), key, id, req.Name)
	if service.KindOf(err) == service.NotFound {
		return notFound(id)
	}
	if err != nil {
		return h.fromService(err)
	}
	writeJSON(w, http.StatusCreated, infoOf(sn))
	return nil
}

// listSnapshots is GET /snapshots: ?sandboxID= and ?name= filters, pages
// of ?limit= (default and most 100) continued by ?nextToken= from the
// X-Next-Token header, oldest first.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	q := r.URL.Query()
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return badField("limit", "%q is not a number from 1 to 100", l)
		}
		limit = n
	}
	list, err := h.svc.ListSnapshots(r.Context(), key, q.Get("sandboxID"), q.Get("name"))
	if err != nil {
		return h.fromService(err)
	}
	if tok := q.Get("nextToken"); tok != "" {
		i := slices.IndexFunc(list, func(sn service.Snapshot) bool { return sn.ID == tok })
		if i < 0 {
			return badField("nextToken", "%q is not a token this server gave (the snapshot it points at may be gone)", tok)
		}
		list = list[i:]
	}
	if len(list) > limit {
		w.Header().Set("X-Next-Token", list[limit].ID)
		list = list[:limit]
	}
	out := make([]snapshotInfo, 0, len(list))
	for _, sn := range list {
		out = append(out, infoOf(sn))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteSnapshot is DELETE /templates/{id}: Moat builds no templates
// through E2B, so the id is a snapshot's (its id or name).
func (h *Handler) deleteSnapshot(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	err := h.svc.DeleteSnapshot(r.Context(), key, id)
	if service.KindOf(err) == service.NotFound {
		return &apiError{http.StatusNotFound, "snapshot \"" + id + "\" doesn't exist or you don't have access to it"}
	}
	if err != nil {
		return h.fromService(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// forkResult is E2B's SandboxForkResult.
type forkResult struct {
	Sandbox *created  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

func (h *Handler) fork(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	var req struct {
		Timeout *int `json:"timeout"`
		Count   *int `json:"count"`
	}
	if e := decodeOptional(r, &req); e != nil {
		return e
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	ttl := 15 * time.Second // E2B's default, as for create
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			return badField("timeout", "%d is not a positive number of seconds", *req.Timeout)
		}
		ttl = time.Duration(*req.Timeout) * time.Second
	}
	src := h.box(key.ID, id)
	forks, err := h.svc.ForkSandbox(r.Context(), key, id, count, ttl)
	if service.KindOf(err) == service.NotFound {
		return notFound(id)
	}
	if err != nil {
		return h.fromService(err)
	}
	template := "base"
	if src != nil {
		template = src.template
	}
	out := make([]forkResult, 0, len(forks))
	for _, f := range forks {
		if f.Err != nil {
			out = append(out, forkResult{Error: h.fromService(f.Err)})
			continue
		}
		c := h.createdView(h.register(key, f.Sandbox.ID, template))
		out = append(out, forkResult{Sandbox: &c})
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// register keeps the E2B record (access token, template) of a sandbox the
// service created for key.
func (h *Handler) register(key audit.Key, id, template string) *box {
	def := manifest.Default()
	// Its ports need a traffic token of its own (a fork or a resumed
	// sandbox is never public, whatever its source was).
	b := &box{id: id, keyID: key.ID, key: key, token: newToken(), traffic: newToken(), template: template,
		cpus: max(1, int(def.Resources.CPUs)), memoryMB: int(def.Resources.Memory >> 20), tags: map[string]uint32{}, watchers: map[string]*pollWatcher{}}
	h.mu.Lock()
	h.boxes[b.id] = b
	h.mu.Unlock()
	return b
}

// snapshotTemplate is the snapshot of key a create's templateID names, if
// any: create then starts from its files and image.
func (h *Handler) snapshotTemplate(r *http.Request, key audit.Key, template string) (service.Snapshot, bool) {
	if template == "" {
		return service.Snapshot{}, false
	}
	sn, err := h.svc.GetSnapshot(r.Context(), key, template)
	return sn, err == nil
}
