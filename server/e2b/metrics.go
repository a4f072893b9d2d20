package e2b

import (
	"net/http"
	"strconv"
	"time"

	"github.com/moat-sandbox/moat/audit"
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
		out = append(out, sandboxMetric{Timestamp: m.Time, TimestampUnix: m.Time.Unix(), CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
			MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	writeJSON(w, http.StatusOK, out)
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
