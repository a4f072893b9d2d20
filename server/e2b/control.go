package e2b

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The control plane: E2B's OpenAPI (spec/openapi.yml in e2b-dev/infra),
// the routes the SDKs call.

type controlFunc func(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError

func (h *Handler) routes() {
	h.control.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"message": "Health check successful"})
	})
	h.handle("POST /sandboxes", h.create)
	h.handle("POST /v2/sandboxes", h.create)
	h.handle("GET /sandboxes", h.listV1)
	h.handle("GET /v2/sandboxes", h.listV2)
	h.handle("GET /sandboxes/{id}", h.get)
	h.handle("DELETE /sandboxes/{id}", h.kill)
	h.handle("POST /sandboxes/{id}/timeout", h.setTimeout)
	h.handle("POST /sandboxes/{id}/connect", h.connect)
	h.handle("POST /v2/sandboxes/{id}/connect", h.connect)
	h.handle("POST /sandboxes/{id}/refreshes", h.refresh)
	h.lifecycleRoutes()
	h.control.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		(&apiError{http.StatusNotFound, fmt.Sprintf("%s %s is not part of the E2B API Moat serves (see docs/API.md, E2B compatibility)", r.Method, r.URL.Path)}).write(w)
	})
}

func (h *Handler) handle(pattern string, f controlFunc) {
	h.control.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		key, e := h.authenticate(r)
		if e == nil {
			e = f(w, r, key)
		}
		if e != nil {
			e.write(w)
		}
	})
}

func (h *Handler) serveControl(w http.ResponseWriter, r *http.Request) {
	h.control.ServeHTTP(w, r)
}

// newSandbox is E2B's NewSandbox body.
type newSandbox struct {
	TemplateID      string `json:"templateID"`
	Timeout         *int   `json:"timeout"`
	AutoPause       *bool  `json:"autoPause"`
	AutoPauseMemory *bool  `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkConfig    `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	MCP                 json.RawMessage   `json:"mcp"`
	VolumeMounts        json.RawMessage   `json:"volumeMounts"`
	IAM                 json.RawMessage   `json:"iam"`
}

type networkConfig struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	Rules              json.RawMessage `json:"rules"`
}

func isSet(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && !bytes.Equal(t, []byte("null"))
}

func badField(field, format string, a ...any) *apiError {
	return &apiError{http.StatusBadRequest, field + ": " + fmt.Sprintf(format, a...)}
}

// templateImage maps an E2B template onto the Moat image of the same name:
// any image the host's store has or can build. "base", E2B's default, is
// Moat's default image unless hasBase says the store holds a build of the
// image "base" (Config.HasImage). Whether any other image exists is the
// engine's to say (a FieldError on image, which create answers as the
// unknown template it is).
func templateImage(template string, hasBase bool) string {
	if template == "base" && !hasBase {
		return manifest.Default().Image
	}
	return template
}

// hasBaseImage reports whether the "base" template is the image "base".
func (h *Handler) hasBaseImage() bool {
	return h.cfg.HasImage != nil && h.cfg.HasImage("base")
}

// sandboxManifest turns an E2B request into a Moat manifest and TTL, or
// refuses a field Moat cannot honour.
func sandboxManifest(req *newSandbox) (m map[string]any, template string, ttl time.Duration, e *apiError) {
	return sandboxManifestWith(req, false)
}

// sandboxManifestWith is sandboxManifest on a host whose store holds the
// image "base" (hasBase) or not.
func sandboxManifestWith(req *newSandbox, hasBase bool) (m map[string]any, template string, ttl time.Duration, e *apiError) {
	template = cmp.Or(req.TemplateID, "base")
	image := templateImage(template, hasBase)
	ttl = 15 * time.Second // E2B's default
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			return nil, "", 0, badField("timeout", "%d is not a positive number of seconds", *req.Timeout)
		}
		ttl = time.Duration(*req.Timeout) * time.Second
	}
	switch {
	case req.AutoPause != nil && *req.AutoPause:
		return nil, "", 0, badField("autoPause", "true is not supported: Moat sandboxes are destroyed, never paused, when they time out; leave it unset or false")
	case req.AutoPauseMemory != nil && *req.AutoPauseMemory:
		return nil, "", 0, badField("autoPauseMemory", "is not supported: Moat does not pause sandboxes")
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return nil, "", 0, badField("autoResume", "is not supported: Moat does not pause sandboxes")
	case isSet(req.MCP):
		return nil, "", 0, badField("mcp", "is not supported: Moat runs no MCP gateway in the sandbox")
	case isSet(req.VolumeMounts) && !bytes.Equal(bytes.TrimSpace(req.VolumeMounts), []byte("[]")):
		return nil, "", 0, badField("volumeMounts", "are not supported: a Moat sandbox sees only its own workspace")
	case isSet(req.IAM):
		return nil, "", 0, badField("iam", "is not supported by Moat")
	}
	m = map[string]any{"image": image}
	if len(req.EnvVars) > 0 {
		m["env"] = req.EnvVars
	}
	// Deny by default: E2B's default is the open internet, Moat's is no
	// network. Only the allowlist E2B calls network.allowOut is granted.
	if req.AllowInternetAccess != nil && *req.AllowInternetAccess {
		return nil, "", 0, badField("allow_internet_access", "true is not supported: Moat grants no unrestricted internet access; list the hosts the sandbox may reach in network.allowOut (Moat's network allowlist)")
	}
	if n := req.Network; n != nil {
		switch {
		case n.AllowPublicTraffic != nil && *n.AllowPublicTraffic:
			return nil, "", 0, badField("network.allowPublicTraffic", "true is not supported: nothing can connect into a Moat sandbox; leave it unset or false")
		case n.MaskRequestHost != nil:
			return nil, "", 0, badField("network.maskRequestHost", "is not supported: Moat exposes no sandbox port")
		case isSet(n.Rules):
			return nil, "", 0, rulesError(n.Rules)
		}
		for _, d := range n.DenyOut {
			// Everything not allowed is denied already; a narrower deny
			// inside an allow is not expressible.
			if d != "0.0.0.0/0" && d != "::/0" {
				return nil, "", 0, badField("network.denyOut", "%q is not supported: Moat denies everything not in network.allowOut, so only 0.0.0.0/0 may be given", d)
			}
		}
		if len(n.AllowOut) > 0 {
			if req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
				return nil, "", 0, badField("network.allowOut", "contradicts allow_internet_access false: give one or the other")
			}
			var hosts, addrs []string
			for _, a := range n.AllowOut {
				if _, _, err := net.ParseCIDR(a); err == nil || net.ParseIP(a) != nil {
					addrs = append(addrs, a)
				} else {
					hosts = append(hosts, a)
				}
			}
			net := map[string]any{"mode": "allowlist"}
			if len(hosts) > 0 {
				net["allow"] = hosts
			}
			if len(addrs) > 0 {
				net["allow_addresses"] = addrs
			}
			m["network"] = net
		}
	}
	return m, template, ttl, nil
}

// unknownTemplate answers a refusal of the manifest's image (a name that
// is not an image name, or no image this host has) as the unknown
// template it is, with the reason (the engine's names the images there
// are); nil for any other error.
func unknownTemplate(template string, err error) *apiError {
	var ie *service.Error
	if errors.As(err, &ie) && ie != nil && ie.Kind == service.Invalid && ie.Field == service.ManifestField("image") {
		return badField("templateID", "template '%s' not found: %s", template, ie.Message)
	}
	return nil
}

func decodeStrict(r *http.Request, v any) *apiError {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &apiError{http.StatusBadRequest, "the request body is not the JSON E2B expects: " + err.Error() + " (Moat refuses fields it does not know rather than ignore them)"}
	}
	return nil
}

// created is E2B's Sandbox (the answer to create and connect).
type created struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

func (h *Handler) createdView(b *box) created {
	c := created{SandboxID: b.id, TemplateID: b.template, Alias: b.template, ClientID: "moat", EnvdVersion: envdVersion, EnvdAccessToken: b.token}
	if h.cfg.Domain != "" {
		d := h.cfg.Domain
		c.Domain = &d
	}
	return c
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var req newSandbox
	if e := decodeStrict(r, &req); e != nil {
		return e
	}
	m, template, ttl, e := sandboxManifestWith(&req, h.hasBaseImage())
	if e != nil {
		return e
	}
	// A templateID naming one of the key's snapshots starts from it.
	snap, fromSnap := h.snapshotTemplate(r, key, req.TemplateID)
	if fromSnap {
		m["image"] = snap.Image
	}
	mdata, _ := json.Marshal(m)
	man, se := service.ParseManifest(mdata)
	if se != nil {
		if e := unknownTemplate(template, se); e != nil {
			return e
		}
		return h.fromService(se)
	}
	h.sweep()
	sb, err := h.svc.CreateSandbox(r.Context(), key, service.SandboxArgs{Manifest: man, TTL: ttl, Metadata: req.Metadata, Snapshot: snap.ID})
	if e := unknownTemplate(template, err); e != nil {
		return e
	}
	if err != nil {
		return h.fromService(err)
	}
	def := manifest.Default()
	b := &box{id: sb.ID, keyID: key.ID, key: key, token: newToken(), template: template,
		cpus: max(1, int(def.Resources.CPUs)), memoryMB: int(def.Resources.Memory >> 20), tags: map[string]uint32{}, watchers: map[string]*pollWatcher{}}
	h.mu.Lock()
	h.boxes[b.id] = b
	h.mu.Unlock()
	h.log.Info("e2b sandbox created", "sandbox", b.id, "key", key.ID, "template", template)
	writeJSON(w, http.StatusCreated, h.createdView(b))
	return nil
}

// listed is E2B's ListedSandbox; detail adds the access token.
type listed struct {
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	VolumeMounts    []any             `json:"volumeMounts"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Domain          *string           `json:"domain,omitempty"`
}

// listedView renders a Moat sandbox as E2B lists it. The CPU and memory
// are known for the sandboxes created through E2B (the default manifest's);
// for one created through Moat's API they are left 0, unknown here.
func (h *Handler) listedView(sb service.Sandbox) listed {
	l := listed{TemplateID: sb.Image.Name, SandboxID: sb.ID, ClientID: "moat", StartedAt: sb.CreatedAt, EndAt: sb.ExpiresAt,
		Metadata: sb.Metadata, State: "running", EnvdVersion: envdVersion, VolumeMounts: []any{}}
	h.mu.Lock()
	b := h.boxes[sb.ID]
	h.mu.Unlock()
	if b != nil {
		l.TemplateID, l.Alias, l.CPUCount, l.MemoryMB = b.template, b.template, b.cpus, b.memoryMB
	}
	if l.Metadata == nil {
		l.Metadata = map[string]string{}
	}
	return l
}

// moatSandboxes is the key's live sandboxes, oldest first.
func (h *Handler) moatSandboxes(r *http.Request, key audit.Key) ([]service.Sandbox, *apiError) {
	list, err := h.svc.ListSandboxes(r.Context(), key)
	if err != nil {
		return nil, h.fromService(err)
	}
	out := list[:0]
	for _, sb := range list {
		if sb.State == service.StateRunning {
			out = append(out, sb)
		}
	}
	return out, nil
}

// metadataFilter parses ?metadata=k1=v1&k2=v2 (itself URL-encoded, keys
// and values encoded once more, as the SDKs send it).
func metadataFilter(q url.Values) (map[string]string, *apiError) {
	raw := q.Get("metadata")
	if raw == "" {
		return nil, nil
	}
	pairs, err := url.ParseQuery(raw)
	if err != nil {
		return nil, badField("metadata", "%q is not key=value pairs joined by &: %v", raw, err)
	}
	want := map[string]string{}
	for k, vs := range pairs {
		k2, err1 := url.QueryUnescape(k)
		v2, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, badField("metadata", "%q is not URL-encoded", raw)
		}
		want[k2] = v2
	}
	return want, nil
}

func matches(md, want map[string]string) bool {
	for k, v := range want {
		if md[k] != v {
			return false
		}
	}
	return true
}

func (h *Handler) filtered(r *http.Request, key audit.Key) ([]listed, *apiError) {
	q := r.URL.Query()
	want, e := metadataFilter(q)
	if e != nil {
		return nil, e
	}
	all, e := h.moatSandboxes(r, key)
	if e != nil {
		return nil, e
	}
	var out []listed
	for _, sb := range all {
		if matches(sb.Metadata, want) {
			out = append(out, h.listedView(sb))
		}
	}
	return out, nil
}

func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	out, e := h.filtered(r, key)
	if e != nil {
		return e
	}
	writeJSON(w, http.StatusOK, nonNil(out))
	return nil
}

// listV2 is GET /v2/sandboxes: state and metadata filters, pages of
// ?limit= (default and most 100) continued by ?nextToken= from the
// X-Next-Token header.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	q := r.URL.Query()
	running := true
	if s := q.Get("state"); s != "" {
		running = false
		for st := range strings.SplitSeq(s, ",") {
			switch st {
			case "running":
				running = true
			case "paused":
				// Moat never pauses: no sandbox is in this state.
			default:
				return badField("state", "%q is not a sandbox state; give running or paused", st)
			}
		}
	}
	limit := 100
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return badField("limit", "%q is not a number from 1 to 100", l)
		}
		limit = n
	}
	out, e := h.filtered(r, key)
	if e != nil {
		return e
	}
	if !running {
		out = nil
	}
	if o := q.Get("order"); o == "desc" {
		slices.Reverse(out)
	} else if o != "" && o != "asc" {
		return badField("order", "%q is not asc or desc", o)
	}
	if tok := q.Get("nextToken"); tok != "" {
		i := slices.IndexFunc(out, func(l listed) bool { return l.SandboxID == tok })
		if i < 0 {
			return badField("nextToken", "%q is not a token this server gave (the sandbox it points at may have ended)", tok)
		}
		out = out[i:]
	}
	if len(out) > limit {
		w.Header().Set("X-Next-Token", out[limit].SandboxID)
		out = out[:limit]
	}
	writeJSON(w, http.StatusOK, nonNil(out))
	return nil
}

func notFound(id string) *apiError {
	return &apiError{http.StatusNotFound, fmt.Sprintf("sandbox \"%s\" doesn't exist or you don't have access to it", id)}
}

func (h *Handler) moatSandbox(r *http.Request, key audit.Key, id string) (service.Sandbox, *apiError) {
	sb, err := h.svc.GetSandbox(r.Context(), key, id)
	if service.KindOf(err) == service.NotFound {
		return service.Sandbox{}, notFound(id)
	}
	if err != nil {
		return service.Sandbox{}, h.fromService(err)
	}
	if sb.State != service.StateRunning {
		return sb, notFound(id)
	}
	return sb, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	sb, e := h.moatSandbox(r, key, id)
	if e != nil {
		return e
	}
	l := h.listedView(sb)
	if b := h.box(key.ID, id); b != nil {
		l.EnvdAccessToken = b.token
		if h.cfg.Domain != "" {
			d := h.cfg.Domain
			l.Domain = &d
		}
	}
	writeJSON(w, http.StatusOK, l)
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	_, err := h.svc.DeleteSandbox(r.Context(), key, id)
	switch service.KindOf(err) {
	case service.NotFound, service.Conflict:
		return notFound(id)
	}
	if err != nil {
		return h.fromService(err)
	}
	h.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type timeoutBody struct {
	Timeout *int `json:"timeout"`
}

func (h *Handler) extend(r *http.Request, key audit.Key, id string, seconds int) *apiError {
	_, err := h.svc.SetTimeout(r.Context(), key, id, time.Duration(seconds)*time.Second)
	switch service.KindOf(err) {
	case service.NotFound, service.Conflict:
		return notFound(id)
	}
	if err != nil {
		return h.fromService(err)
	}
	return nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var req timeoutBody
	if e := decodeStrict(r, &req); e != nil {
		return e
	}
	if req.Timeout == nil || *req.Timeout < 0 {
		return badField("timeout", "is missing or negative: give the seconds the sandbox may live from now")
	}
	if *req.Timeout == 0 {
		// E2B: a zero timeout ends the sandbox now.
		return h.kill(w, r, key)
	}
	if e := h.extend(r, key, r.PathValue("id"), *req.Timeout); e != nil {
		return e
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) refresh(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var req struct {
		Duration *int `json:"duration"`
	}
	if e := decodeStrict(r, &req); e != nil {
		return e
	}
	secs := 60
	if req.Duration != nil {
		secs = *req.Duration
	}
	if secs <= 0 {
		return badField("duration", "%d is not a positive number of seconds", secs)
	}
	if e := h.extend(r, key, r.PathValue("id"), secs); e != nil {
		return e
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect is POST /v2/sandboxes/{id}/connect: a running sandbox is
// returned (its timeout set if given); there are no paused ones to resume.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	id := r.PathValue("id")
	var req struct {
		Timeout *int  `json:"timeout"`
		Memory  *bool `json:"memory"`
	}
	if e := decodeStrict(r, &req); e != nil {
		return e
	}
	b := h.box(key.ID, id)
	if b == nil {
		return notFound(id)
	}
	if e := noMemory("memory", req.Memory); e != nil {
		return e
	}
	if e := h.resumePaused(r, key, id, req.Timeout); e != nil {
		return e
	}
	if req.Timeout != nil {
		if *req.Timeout <= 0 {
			return badField("timeout", "%d is not a positive number of seconds", *req.Timeout)
		}
		if e := h.extend(r, key, id, *req.Timeout); e != nil {
			return e
		}
	}
	writeJSON(w, http.StatusOK, h.createdView(b))
	return nil
}

func nonNil(l []listed) []listed {
	if l == nil {
		return []listed{}
	}
	return l
}
