package e2b

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// getMetrics is GET /sandboxes/{id}/metrics (the SDKs' getMetrics): the
// samples the service keeps of the sandbox's usage, between ?start= and
// ?end= (unix seconds, both optional). CPU and memory are those of the
// sandbox's host processes, disk the bytes of its workspace's files; the
// totals are its manifest's limits (README, What differs from E2B's
// cloud).
func (h *Handler) getMetrics(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	q := r.URL.Query()
	var bounds [2]time.Time
	for i, name := range []string{"start", "end"} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxUnixSeconds {
			return badField(name, "%q is not a time in unix seconds (0 to %d)", truncate(v, 32), int64(maxUnixSeconds))
		}
		bounds[i] = time.Unix(n, 0)
	}
	ms, err := h.svc.SandboxMetrics(r.Context(), key, r.PathValue("id"), bounds[0], bounds[1])
	if err != nil {
		return h.fromService(err)
	}
	out := make([]sandboxMetric, 0, len(ms))
	for _, m := range ms {
		out = append(out, metricOf(m))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// maxMetricsIDs bounds the sandboxes one GET /sandboxes/metrics names.
const maxMetricsIDs = 100

// listMetrics is GET /sandboxes/metrics?sandbox_ids=a,b (E2B's "list
// sandbox metrics"): the newest sample of each named sandbox of the
// caller's that is running, keyed by id. Ids that name no running
// sandbox of the key's (another key's, ended, paused) are left out, as
// E2B's answer lists running sandboxes only. The ids may come as one
// comma-separated value or repeated.
func (h *Handler) listMetrics(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var ids []string
	seen := map[string]bool{}
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for id := range strings.SplitSeq(v, ",") {
			id = strings.TrimSpace(id)
			if id == "" || seen[id] {
				continue
			}
			seen[id] = true
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0:
		return badField("sandbox_ids", "is missing: give the ids of the sandboxes, comma-separated (?sandbox_ids=ID1,ID2)")
	case len(ids) > maxMetricsIDs:
		return badField("sandbox_ids", "names %d sandboxes; at most %d at a time", len(ids), maxMetricsIDs)
	}
	out := map[string]sandboxMetric{}
	for _, id := range ids {
		sb, err := h.svc.GetSandbox(r.Context(), key, id)
		if err != nil || sb.State != service.StateRunning {
			continue
		}
		ms, err := h.svc.SandboxMetrics(r.Context(), key, id, time.Time{}, time.Time{})
		if err != nil || len(ms) == 0 {
			continue
		}
		out[id] = metricOf(ms[len(ms)-1])
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// maxUnixSeconds bounds a time given in unix seconds (the year 9999).
const maxUnixSeconds = 253402300799

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

func metricOf(m service.Metric) sandboxMetric {
	return sandboxMetric{Timestamp: m.Time, TimestampUnix: m.Time.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}
