package dashboard

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
)

// The dashboard's JSON endpoints, under /dashboard/api/. They speak for
// the whole server (every key's work): the session's key is an admin one.

// Limits on what one answer covers.
const (
	defaultRuns = 200
	maxRuns     = 2000
	// recentWindow is how many records the network, timeline and suggest
	// views read.
	recentWindow = 5000
)

// Session is GET /dashboard/api/session: who is logged in, and the CSRF
// token the page sends back on every POST.
type Session struct {
	KeyID   string `json:"key_id"`
	KeyName string `json:"key_name"`
	CSRF    string `json:"csrf"`
}

func (d *Dashboard) session(r *http.Request, key audit.Key, cookie string) (any, error) {
	return Session{KeyID: key.ID, KeyName: key.Name, CSRF: d.csrf(cookie)}, nil
}

// RunList is GET /dashboard/api/runs: audit records, newest first.
type RunList struct {
	Runs []audit.Record `json:"runs"`
}

func (d *Dashboard) runs(r *http.Request, key audit.Key, cookie string) (any, error) {
	limit := defaultRuns
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxRuns {
			return nil, &badRequest{"limit must be 1 to " + strconv.Itoa(maxRuns)}
		}
		limit = n
	}
	f := audit.Filter{Limit: limit}
	if k := r.URL.Query().Get("kind"); k != "" {
		f.Kind = audit.Kind(k)
	}
	recs, err := d.cfg.Records.Query(f)
	if err != nil {
		return nil, err
	}
	for i := range recs {
		recs[i].Manifest = "" // the run page has it
	}
	return RunList{Runs: recs}, nil
}

// RunView is GET /dashboard/api/runs/{id}: the audit record and, while
// the server keeps it (--keep-runs one-shot runs), the full result with
// its output decoded and sanitised into Stdout and Stderr.
type RunView struct {
	Record audit.Record   `json:"record"`
	Result *result.Result `json:"result,omitempty"`
	Stdout string         `json:"stdout"`
	Stderr string         `json:"stderr"`
	// Files is the result's workspace diff with every path and link
	// target shown Inert (a name that is not UTF-8 with \xNN escapes).
	Files []FileView `json:"files"`
}

// FileView is one entry of a run's workspace diff.
type FileView struct {
	Path   string        `json:"path"`
	Change result.Change `json:"change"`
	Type   string        `json:"type"`
	Size   int64         `json:"size"`
	Target string        `json:"target,omitempty"`
}

func (d *Dashboard) run(r *http.Request, key audit.Key, cookie string) (any, error) {
	id := r.PathValue("id")
	rec, err := d.cfg.Records.Get(id)
	if err != nil {
		return nil, err
	}
	v := RunView{Record: rec, Files: []FileView{}}
	res, err := d.resultOf(r, key, rec)
	if service.KindOf(err) == service.NotFound {
		return v, nil
	}
	if err != nil {
		return nil, err
	}
	if res != nil {
		// Sanitised here, before encoding/json would turn bytes that are
		// not UTF-8 into U+FFFD: the page shows them as \xNN.
		v.Stdout, v.Stderr = Inert(streamText(res.Stdout)), Inert(streamText(res.Stderr))
		res.Stdout.Data, res.Stderr.Data = "", ""
		for _, f := range res.Files {
			v.Files = append(v.Files, FileView{Path: Inert(f.Path), Change: f.Change, Type: f.Type, Size: f.Size, Target: Inert(f.Target)})
		}
		res.Files = nil
		v.Result = res
	}
	return v, nil
}

// resultOf is the full result of rec while the service holds it: a
// one-shot run's (the last --keep-runs), a command's of a live sandbox
// (its last KeepExecs), nil for one still running; NotFound otherwise.
func (d *Dashboard) resultOf(r *http.Request, key audit.Key, rec audit.Record) (*result.Result, error) {
	switch rec.Kind {
	case audit.KindRun:
		raw, err := d.cfg.Service.AnyRun(r.Context(), key, rec.ID)
		if err != nil {
			return nil, err
		}
		var resp service.RunResponse
		if err := json.Unmarshal(raw, &resp); err != nil {
			return nil, err
		}
		return resp.Result, nil
	case audit.KindExec:
		eid, ok := strings.CutPrefix(rec.ID, rec.SandboxID+"-")
		if !ok {
			return nil, &service.Error{Kind: service.NotFound, Message: "command " + rec.ID}
		}
		ex, err := d.cfg.Service.AnyExec(r.Context(), key, rec.SandboxID, eid)
		if err != nil {
			return nil, err
		}
		return ex.Result, nil
	}
	return nil, &service.Error{Kind: service.NotFound, Message: "result of " + rec.ID}
}

// streamText is a stream's bytes as text (writeJSON sanitises it).
func streamText(s result.Stream) string {
	if s.Encoding == "base64" {
		b, err := base64.StdEncoding.DecodeString(s.Data)
		if err != nil {
			return "(undecodable base64 output)"
		}
		return string(b)
	}
	return s.Data
}

func (d *Dashboard) sandboxes(r *http.Request, key audit.Key, cookie string) (any, error) {
	list, err := d.cfg.Service.AllSandboxes(r.Context(), key)
	if err != nil {
		return nil, err
	}
	return struct {
		Sandboxes []service.KeyedSandbox `json:"sandboxes"`
	}{list}, nil
}

// Destination is one host:port the recent runs tried, with how often it
// was let through and refused, and why.
type Destination struct {
	Host    string         `json:"host"`
	Port    int            `json:"port"`
	Allowed int            `json:"allowed"`
	Denied  int            `json:"denied"`
	Reasons map[string]int `json:"reasons"`
	Last    time.Time      `json:"last,omitzero"`
}

// NetworkView is GET /dashboard/api/network.
type NetworkView struct {
	Records      int           `json:"records"`
	Destinations []Destination `json:"destinations"`
}

func (d *Dashboard) network(r *http.Request, key audit.Key, cookie string) (any, error) {
	recs, err := d.cfg.Records.Query(audit.Filter{Limit: recentWindow})
	if err != nil {
		return nil, err
	}
	return networkOf(recs), nil
}

// networkOf adds up the network attempts of recs by destination: those
// stored one by one, and the denied ones only counted in a summary.
func networkOf(recs []audit.Record) NetworkView {
	byDest := map[string]*Destination{}
	get := func(host string, port int) *Destination {
		k := host + "\x00" + strconv.Itoa(port)
		if byDest[k] == nil {
			byDest[k] = &Destination{Host: host, Port: port, Reasons: map[string]int{}}
		}
		return byDest[k]
	}
	for _, rec := range recs {
		for _, a := range rec.Network {
			dst := get(a.Host, a.Port)
			if a.Allowed {
				dst.Allowed++
			} else {
				dst.Denied++
				dst.Reasons[a.Reason]++
			}
			if a.Time.After(dst.Last) {
				dst.Last = a.Time
			}
		}
		if ns := rec.NetworkSummary; ns != nil {
			for _, o := range ns.OmittedDestinations {
				dst := get(o.Host, o.Port)
				dst.Denied += o.Count
				dst.Reasons[o.Reason] += o.Count
			}
		}
	}
	out := NetworkView{Records: len(recs), Destinations: []Destination{}}
	for _, d := range byDest {
		out.Destinations = append(out.Destinations, *d)
	}
	sort.Slice(out.Destinations, func(i, j int) bool {
		a, b := out.Destinations[i], out.Destinations[j]
		if a.Allowed+a.Denied != b.Allowed+b.Denied {
			return a.Allowed+a.Denied > b.Allowed+b.Denied
		}
		return a.Host+strconv.Itoa(a.Port) < b.Host+strconv.Itoa(b.Port)
	})
	return out
}

// Bucket is one hour of the timeline.
type Bucket struct {
	Start      time.Time `json:"start"`
	Runs       int       `json:"runs"`
	Denials    int       `json:"denials"`
	Violations int       `json:"violations"`
}

// Timeline is GET /dashboard/api/timeline: the last 24 hours by hour,
// oldest first.
type Timeline struct {
	Buckets []Bucket `json:"buckets"`
}

func (d *Dashboard) timeline(r *http.Request, key audit.Key, cookie string) (any, error) {
	now := d.cfg.now().UTC()
	since := now.Truncate(time.Hour).Add(-23 * time.Hour)
	recs, err := d.cfg.Records.Query(audit.Filter{Since: since, Limit: 10000})
	if err != nil {
		return nil, err
	}
	return timelineOf(recs, since), nil
}

// timelineOf counts recs' programs (runs and commands: not sessions or
// approvals), their refused network attempts and their violations by the
// hour they started, for the 24 hours from since.
func timelineOf(recs []audit.Record, since time.Time) Timeline {
	t := Timeline{Buckets: make([]Bucket, 24)}
	for i := range t.Buckets {
		t.Buckets[i].Start = since.Add(time.Duration(i) * time.Hour)
	}
	for _, rec := range recs {
		if rec.Kind != audit.KindRun && rec.Kind != audit.KindExec {
			continue
		}
		i := int(rec.Started.Sub(since) / time.Hour)
		if i < 0 || i >= len(t.Buckets) {
			continue
		}
		b := &t.Buckets[i]
		b.Runs++
		b.Violations += len(rec.Violations) + rec.ViolationsOmitted
		for _, a := range rec.Network {
			if !a.Allowed {
				b.Denials++
			}
		}
		if ns := rec.NetworkSummary; ns != nil {
			b.Denials += ns.Omitted
		}
	}
	return t
}

func (d *Dashboard) approvals(r *http.Request, key audit.Key, cookie string) (any, error) {
	list, err := d.cfg.Service.AllApprovals(r.Context(), key)
	if err != nil {
		return nil, err
	}
	return struct {
		Approvals []service.KeyedApproval `json:"approvals"`
	}{list}, nil
}

// DecisionBody is POST /dashboard/api/approvals/{id}.
type DecisionBody struct {
	Approve *bool  `json:"approve"`
	Reason  string `json:"reason"`
}

func (d *Dashboard) decide(r *http.Request, key audit.Key, cookie string) (any, error) {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return nil, &badRequest{"Content-Type must be application/json"}
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 16<<10))
	if err != nil {
		return nil, &badRequest{"unreadable body"}
	}
	var body DecisionBody
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil || body.Approve == nil {
		return nil, &badRequest{`want {"approve": true|false, "reason": "..."}`}
	}
	return d.cfg.Service.DecideAnyApproval(r.Context(), key, r.PathValue("id"), service.Decision{Approve: *body.Approve, Reason: body.Reason})
}

// IncidentList is GET /dashboard/api/incidents; Kept is false when the
// server keeps no bundles.
type IncidentList struct {
	Kept      bool               `json:"kept"`
	Incidents []incident.Summary `json:"incidents"`
}

func (d *Dashboard) incidents(r *http.Request, key audit.Key, cookie string) (any, error) {
	if d.cfg.Incidents == nil {
		return IncidentList{Incidents: []incident.Summary{}}, nil
	}
	list, err := d.cfg.Incidents.List()
	if err != nil {
		return nil, err
	}
	return IncidentList{Kept: true, Incidents: list}, nil
}

func (d *Dashboard) incident(r *http.Request, key audit.Key, cookie string) (any, error) {
	if d.cfg.Incidents == nil {
		return nil, incident.ErrNotFound
	}
	return d.cfg.Incidents.Get(r.PathValue("id"))
}

// Costs is GET /dashboard/api/costs: every record's usage at the
// server's prices, in total and per key.
type Costs struct {
	Prices  audit.Prices    `json:"prices"`
	Records int             `json:"records"`
	Total   audit.Cost      `json:"total"`
	PerKey  []audit.KeyCost `json:"per_key"`
}

func (d *Dashboard) costs(r *http.Request, key audit.Key, cookie string) (any, error) {
	rep, err := d.cfg.Records.Report(audit.Filter{}, d.cfg.Prices)
	if err != nil {
		return nil, err
	}
	return Costs{Prices: rep.Prices, Records: rep.Records, Total: rep.Total, PerKey: rep.PerKey}, nil
}

// SuggestView is GET /dashboard/api/suggest: `moat policy suggest`'s
// proposal from the recent records, as YAML with its reasons; Error says
// why there is none.
type SuggestView struct {
	YAML       string              `json:"yaml,omitempty"`
	Reasons    []audit.FieldReason `json:"reasons"`
	Considered int                 `json:"considered"`
	Ignored    []audit.Count       `json:"ignored"`
	Error      string              `json:"error,omitempty"`
}

func (d *Dashboard) suggest(r *http.Request, key audit.Key, cookie string) (any, error) {
	recs, err := d.cfg.Records.Query(audit.Filter{Limit: recentWindow})
	if err != nil {
		return nil, err
	}
	s, err := audit.Suggest(recs)
	if errors.Is(err, audit.ErrNoLegitimateRuns) {
		return SuggestView{Reasons: []audit.FieldReason{}, Ignored: []audit.Count{}, Error: err.Error()}, nil
	}
	if err != nil {
		return nil, err
	}
	var y bytes.Buffer
	if err := s.WriteYAML(&y); err != nil {
		return nil, err
	}
	return SuggestView{YAML: y.String(), Reasons: s.Reasons, Considered: s.Considered, Ignored: s.Ignored}, nil
}

// writeJSON sends v with every string in it (object keys too) passed
// through inert: whatever a sandbox wrote reaches the page as visible,
// harmless text.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err == nil {
		var tree any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		if err = dec.Decode(&tree); err == nil {
			b, err = json.Marshal(inert(tree))
		}
	}
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"error":"the dashboard could not encode its answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, struct {
		Error string `json:"error"`
	}{msg})
}

// inert returns v (a decoded JSON value) with every string, and every
// object key, made Inert.
func inert(v any) any {
	switch x := v.(type) {
	case string:
		return Inert(x)
	case []any:
		for i := range x {
			x[i] = inert(x[i])
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[Inert(k)] = inert(e)
		}
		return out
	}
	return v
}

// Inert is s as the dashboard shows it: output.Sanitize's escapes for
// terminal controls (ESC, so CSI and OSC sequences), NUL and the other C0
// and C1 controls, bidirectional overrides and isolates (U+202E ...) and
// bytes that are not UTF-8; newlines and tabs kept. Markup (<script>)
// stays as text: the page only ever sets it as textContent.
func Inert(s string) string { return string(output.Sanitize([]byte(s))) }
