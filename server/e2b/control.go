package e2b

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
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
	h.handle("GET /sandboxes/{id}/metrics", h.getMetrics)
	// Not the sandbox "metrics": the route of many sandboxes' metrics.
	h.handle("GET /sandboxes/metrics", h.listMetrics)
	h.handle("PUT /sandboxes/{id}/network", h.updateNetwork)
	h.control.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		notServed(r).write(w)
	})
}

// unserved names the parts of E2B's API Moat does not serve, by path, with
// the reason; the first whose pattern matches explains a 501.
var unserved = []struct {
	re     *regexp.Regexp
	reason string
}{
	{regexp.MustCompile(`^/(v[0-9]+/)?sandboxes/[^/]+/logs$`), "Moat records each command's output in its result, not as sandbox logs"},
	{regexp.MustCompile(`^/(v[0-9]+/)?templates(/|$)`), "a template is a Moat image: build one with moat image build on the host (DELETE /templates/{id} deletes a snapshot)"},
	{regexp.MustCompile(`^/volumes(/|$)`), "a Moat sandbox sees only its own workspace"},
}

// notServed is the answer to a route of E2B's API Moat does not serve: 501
// with the reason, never 404, which the SDKs turn into a misleading
// "sandbox not found".
func notServed(r *http.Request) *apiError {
	reason := "it is not part of the E2B API Moat serves"
	for _, u := range unserved {
		if u.re.MatchString(r.URL.Path) {
			reason = u.reason
			break
		}
	}
	return &apiError{http.StatusNotImplemented, fmt.Sprintf("%s %s is not implemented by Moat: %s (README, What differs from E2B's cloud)", r.Method, r.URL.Path, reason)}
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

// codeInterpreterImage is the image that E2B's code interpreter templates
// (codeInterpreterTemplates) run on when the store has it: Python with
// ipykernel and matplotlib; without it, Moat's default image runs the
// kernel too (plain Python, no IPython, no charts).
const codeInterpreterImage = "code-interpreter"

// codeInterpreterTemplates are the template names of E2B's code
// interpreter: @e2b/code-interpreter's default, and its older name.
var codeInterpreterTemplates = map[string]bool{"code-interpreter-v1": true, "code-interpreter": true}

// templateImageOn maps an E2B template onto the Moat image of the same
// name, on a host whose store holds the images has reports: "base" (E2B's
// default) and the code interpreter's templates fall back to Moat's
// default image when the store lacks theirs. Whether any other image
// exists is the engine's to say (a FieldError on image, which create
// answers as the unknown template it is).
func templateImageOn(template string, has func(string) bool) string {
	switch {
	case template == "base" && !has("base"):
		return manifest.Default().Image
	case codeInterpreterTemplates[template] && has(codeInterpreterImage):
		return codeInterpreterImage
	case codeInterpreterTemplates[template]:
		return manifest.Default().Image
	}
	return template
}

// hasImage reports whether the store holds image (Config.HasImage).
func (h *Handler) hasImage(image string) bool {
	return h.cfg.HasImage != nil && h.cfg.HasImage(image)
}

// sandboxManifest turns an E2B request into a Moat manifest and TTL, or
// refuses a field Moat cannot honour, on a host without the image "base"
// and with no internet for E2B sandboxes (Internet's zero value).
func sandboxManifest(req *newSandbox) (m map[string]any, template string, ttl time.Duration, e *apiError) {
	return sandboxManifestWith(req, false)
}

// sandboxManifestWith is sandboxManifest on a host whose store holds the
// image "base" (hasBase) or not.
func sandboxManifestWith(req *newSandbox, hasBase bool) (m map[string]any, template string, ttl time.Duration, e *apiError) {
	p, e := translate(req, hasBase, Internet{})
	if e != nil {
		return nil, "", 0, e
	}
	return p.manifest, p.template, p.ttl, nil
}

// plan is what create makes of an E2B request: the Moat manifest, the
// template, the TTL, and the notice (NoticeHeader) that says what network
// the sandbox got when it asked for more, or "".
type plan struct {
	manifest map[string]any
	template string
	ttl      time.Duration
	notice   string
	// autoPause: pause rather than destroy the sandbox when it expires.
	autoPause bool
	// public: network.allowPublicTraffic true, ports without the traffic
	// token.
	public bool
}

// translate turns an E2B create request into a plan, under the operator's
// definition of internet, or refuses a field Moat cannot honour.
func translate(req *newSandbox, hasBase bool, internet Internet) (plan, *apiError) {
	return translateOn(req, func(image string) bool { return hasBase && image == "base" }, internet)
}

// translateOn is translate on a host whose store holds the images has
// reports.
func translateOn(req *newSandbox, has func(string) bool, internet Internet) (plan, *apiError) {
	template := cmp.Or(req.TemplateID, "base")
	image := templateImageOn(template, has)
	ttl := 15 * time.Second // E2B's default
	if req.Timeout != nil {
		if *req.Timeout <= 0 || *req.Timeout > maxSeconds {
			return plan{}, badField("timeout", "%d is not a positive number of seconds up to %d", *req.Timeout, maxSeconds)
		}
		ttl = time.Duration(*req.Timeout) * time.Second
	}
	autoPause := req.AutoPause != nil && *req.AutoPause
	switch {
	case autoPause && req.AutoPauseMemory != nil && *req.AutoPauseMemory:
		return plan{}, badField("autoPauseMemory", "true is not supported: Moat pauses filesystem-only (processes and memory are not kept; connect resumes the sandbox with its files); pass lifecycle.onTimeout {action: 'pause', keepMemory: false} or leave keepMemory unset")
	case req.AutoPauseMemory != nil && !autoPause:
		return plan{}, badField("autoPauseMemory", "is only meaningful with autoPause true")
	case req.AutoResume != nil && req.AutoResume.Enabled:
		return plan{}, badField("autoResume", "is not supported: a Moat pause is filesystem-only, and such a sandbox is resumed explicitly with connect, as E2B's filesystem-only snapshots are")
	case isSet(req.MCP):
		return plan{}, badField("mcp", "is not supported: Moat runs no MCP gateway in the sandbox")
	case isSet(req.VolumeMounts) && !bytes.Equal(bytes.TrimSpace(req.VolumeMounts), []byte("[]")):
		return plan{}, badField("volumeMounts", "are not supported: a Moat sandbox sees only its own workspace")
	case isSet(req.IAM):
		return plan{}, badField("iam", "is not supported by Moat")
	}
	m := map[string]any{"image": image}
	if len(req.EnvVars) > 0 {
		m["env"] = req.EnvVars
	}
	// Deny by default: E2B's default is the open internet, Moat's is no
	// network. A sandbox that asks for internet access (true, or unset:
	// E2B's default, and the same request from e2b 2.51 as from 2.50)
	// gets what the operator calls internet (Internet), never more; the
	// allowlist E2B calls network.allowOut is granted as asked.
	explicit := req.AllowInternetAccess != nil && *req.AllowInternetAccess
	if explicit && internet.Refuse {
		return plan{}, badField("allow_internet_access", "true is refused by this server (moat serve --e2b-internet=refuse): Moat grants no unrestricted internet access; set allowInternetAccess: false and list the hosts the sandbox may reach in network.allowOut (Moat's network allowlist)")
	}
	var allowOut []string
	denyAll := false
	if n := req.Network; n != nil {
		switch {
		case n.MaskRequestHost != nil:
			return plan{}, badField("network.maskRequestHost", "is not supported: Moat exposes no sandbox port")
		case isSet(n.Rules):
			return plan{}, rulesError(n.Rules)
		}
		for _, d := range n.DenyOut {
			// Everything not allowed is denied already; a narrower deny
			// inside an allow is not expressible.
			if d != "0.0.0.0/0" && d != "::/0" {
				return plan{}, badField("network.denyOut", "%q is not supported: Moat denies everything not in network.allowOut, so only 0.0.0.0/0 may be given", d)
			}
			denyAll = true
		}
		if len(n.AllowOut) > 0 && req.AllowInternetAccess != nil && !*req.AllowInternetAccess {
			return plan{}, badField("network.allowOut", "contradicts allow_internet_access false: give one or the other")
		}
		allowOut = n.AllowOut
	}
	allow := slices.Clone(allowOut)
	notice := ""
	// E2B would give the open internet here: neither false nor a deny of
	// everything but network.allowOut.
	if wantsInternet := req.AllowInternetAccess == nil || *req.AllowInternetAccess; wantsInternet && !denyAll {
		for _, a := range internet.Allow {
			if !slices.Contains(allow, a) {
				allow = append(allow, a)
			}
		}
		notice = internetNotice(internet, allowOut)
	}
	net := networkSection(allow)
	if net == nil {
		net = map[string]any{}
	}
	if autoPause && req.AutoPauseMemory == nil {
		// E2B's default is a memory snapshot: say what this one keeps.
		notice = joinNotice(notice, autoPauseNotice)
	}
	// Ports (ports.go): every port, as E2B's; the traffic token, or the
	// creator's allowPublicTraffic, decides who reaches them.
	public := req.Network != nil && req.Network.AllowPublicTraffic != nil && *req.Network.AllowPublicTraffic
	net["inbound"] = []string{inboundAll}
	m["network"] = net
	m["justifications"] = map[string]string{"network.inbound": inboundJustification(public)}
	return plan{manifest: m, template: template, ttl: ttl, notice: notice, autoPause: autoPause, public: public}, nil
}

// maxCommandLimit is the longest resources.timeout a manifest may give.
const maxCommandLimit = 24 * time.Hour

// commandLimits sets the E2B sandbox's resources.timeout (the longest a
// command may run) and cpu_time. E2B's envd bounds a command by the
// request's Connect-Timeout-Ms only (the SDKs' timeoutMs, 60 s by default,
// 0 for none), so a command may run as long as its sandbox: Moat's 30 s
// default would end every longer command a team's code runs. Each
// command's own limit is its request's (processService.Start).
func (p *plan) commandLimits(timeout, cpu time.Duration) {
	def := manifest.Default().Resources
	timeout, cpu = min(timeout, maxCommandLimit), min(cpu, maxCommandLimit)
	if timeout <= def.Timeout.D() {
		return // Moat's default already, or a ceiling below it
	}
	p.manifest["resources"] = map[string]any{"timeout": timeout.String(), "cpu_time": cpu.String()}
	just, _ := p.manifest["justifications"].(map[string]string)
	if just == nil {
		just = map[string]string{}
		p.manifest["justifications"] = just
	}
	const why = "E2B API: a command runs until its own timeoutMs or its sandbox's end, as in E2B"
	just["resources.timeout"] = why
	if cpu > def.CPUTime.D() {
		just["resources.cpu_time"] = why
	}
}

// narrowInbound grants the sandbox only the inbound ports in ceiling (the
// key's policy ceiling) rather than every port: an operator's policy
// narrows E2B's open ports instead of refusing every create. The notice
// says what is left.
func (p *plan) narrowInbound(ceiling []manifest.PortRange) {
	net, _ := p.manifest["network"].(map[string]any)
	if net == nil {
		return
	}
	if len(ceiling) == 0 {
		delete(net, "inbound")
		delete(p.manifest, "justifications")
		p.notice = joinNotice(p.notice, "ports: this server's policy opens no ports of this key's sandboxes to inbound connections, so getHost URLs answer 403")
		return
	}
	ports := make([]string, len(ceiling))
	for i, r := range ceiling {
		ports[i] = string(r)
	}
	net["inbound"] = ports
	p.notice = joinNotice(p.notice, "ports: this server's policy opens only ports "+strings.Join(ports, ", ")+" of this key's sandboxes to inbound connections")
}

// autoPauseNotice is what create says of autoPause without
// autoPauseMemory, whose E2B default is a memory snapshot.
const autoPauseNotice = "autoPause: this sandbox is paused filesystem-only when it times out (its processes and memory are not kept); connect resumes it with its files"

// joinNotice joins two notices of one create.
func joinNotice(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// internetNotice says what a sandbox that E2B would have given the open
// internet gets on this server.
func internetNotice(internet Internet, allowOut []string) string {
	const field = "allow_internet_access: Moat grants no open internet"
	var got string
	switch {
	case len(internet.Allow) > 0:
		got = "this sandbox may reach the operator's internet allowlist (moat serve --e2b-internet) " + strings.Join(internet.Allow, ",")
	case internet.Refuse:
		got = "this server refuses allow_internet_access true (moat serve --e2b-internet=refuse) and gives this sandbox no network"
	default:
		got = "this server defines none for E2B sandboxes (moat serve --e2b-internet), so this sandbox has no network beyond loopback"
	}
	if len(allowOut) > 0 {
		got += ", plus its network.allowOut " + strings.Join(allowOut, ",")
	}
	return field + ": " + got
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
	if b.traffic != "" {
		t := b.traffic
		c.TrafficAccessToken = &t
	}
	return c
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	var req newSandbox
	if e := decodeStrict(r, &req); e != nil {
		return e
	}
	p, e := translateOn(&req, h.hasImage, h.cfg.Internet)
	if e != nil {
		return e
	}
	// Commands run until their own timeout or the sandbox's end, as in
	// E2B (commandLimits); under a policy, within the key's ceiling.
	limit := h.svc.MaxTTL()
	cpu := limit
	if c, limited := h.svc.PolicyCeiling(key); limited {
		p.narrowInbound(c.Network.Inbound)
		limit, cpu = min(limit, c.Resources.Timeout.D()), min(limit, c.Resources.CPUTime.D())
	}
	p.commandLimits(limit, cpu)
	template := p.template
	// A templateID naming one of the key's snapshots starts from it.
	snap, fromSnap := h.snapshotTemplate(r, key, req.TemplateID)
	if fromSnap {
		p.manifest["image"] = snap.Image
	}
	mdata, _ := json.Marshal(p.manifest)
	man, se := service.ParseManifest(mdata)
	if se != nil {
		if e := unknownTemplate(template, se); e != nil {
			return e
		}
		return h.fromService(se)
	}
	h.sweep()
	sb, err := h.svc.CreateSandbox(r.Context(), key, service.SandboxArgs{Manifest: man, TTL: p.ttl, Metadata: req.Metadata, Snapshot: snap.ID, AutoPause: p.autoPause})
	if e := unknownTemplate(template, err); e != nil {
		return e
	}
	if err != nil {
		return h.fromService(err)
	}
	def := manifest.Default()
	b := &box{id: sb.ID, keyID: key.ID, key: key, token: newToken(), public: p.public, template: template,
		cpus: max(1, int(def.Resources.CPUs)), memoryMB: int(def.Resources.Memory >> 20), tags: map[string]uint32{}, watchers: map[string]*pollWatcher{}}
	if !b.public {
		b.traffic = newToken()
	}
	h.mu.Lock()
	h.boxes[b.id] = b
	h.mu.Unlock()
	if p.notice != "" {
		// The E2B SDKs have no field for it: a header (curl, proxies,
		// the SDK's raw response) and the server's log.
		w.Header().Set(NoticeHeader, p.notice)
		h.log.Info("e2b sandbox created", "sandbox", b.id, "key", key.ID, "template", template, "notice", p.notice)
	} else {
		h.log.Info("e2b sandbox created", "sandbox", b.id, "key", key.ID, "template", template)
	}
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
	Lifecycle       lifecycleInfo     `json:"lifecycle"`
}

// lifecycleInfo is E2B's SandboxLifecycle: what happens on timeout.
// autoResume is always false: a filesystem-only pause is resumed by
// connect.
type lifecycleInfo struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

// e2bState is the E2B state of a Moat sandbox state: "running",
// "paused", or "" for one E2B does not show (being deleted, deleted). A
// sandbox being paused is still running; one being resumed still paused.
func e2bState(state string) string {
	switch state {
	case service.StateRunning, service.StatePausing:
		return "running"
	case service.StatePaused, service.StateResuming:
		return "paused"
	}
	return ""
}

// listedView renders a Moat sandbox as E2B lists it. The CPU and memory
// are known for the sandboxes created through E2B (the default manifest's);
// for one created through Moat's API they are left 0, unknown here.
func (h *Handler) listedView(sb service.Sandbox) listed {
	l := listed{TemplateID: sb.Image.Name, SandboxID: sb.ID, ClientID: "moat", StartedAt: sb.CreatedAt, EndAt: sb.ExpiresAt,
		Metadata: sb.Metadata, State: "running", EnvdVersion: envdVersion, VolumeMounts: []any{},
		Lifecycle: lifecycleInfo{OnTimeout: "kill"}}
	if sb.AutoPause {
		l.Lifecycle.OnTimeout = "pause"
	}
	// E2B has two states: a sandbox being paused is still running,
	// one being resumed still paused.
	if e2bState(sb.State) == "paused" {
		l.State = "paused"
	}
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

// moatSandboxes is the key's live sandboxes, running and paused, oldest first.
func (h *Handler) moatSandboxes(r *http.Request, key audit.Key) ([]service.Sandbox, *apiError) {
	list, err := h.svc.ListSandboxes(r.Context(), key)
	if err != nil {
		return nil, h.fromService(err)
	}
	out := list[:0]
	for _, sb := range list {
		if e2bState(sb.State) != "" {
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

// listQuery is a parsed list request: every filter E2B's GET
// /v2/sandboxes takes, so that none is ignored.
type listQuery struct {
	metadata     map[string]string
	running      bool // state includes running
	paused       bool // state includes paused
	startedAfter time.Time
	template     string
	desc         bool
	limit        int
	after        *pageToken
}

// listParams are the query parameters GET /v2/sandboxes takes; GET
// /sandboxes (v1) takes metadata and state.
var listParams = map[string]bool{"metadata": true, "state": true, "startedAfter": true, "template": true, "order": true, "limit": true, "nextToken": true}

// parseList reads a list request's query, refusing (400, naming it) a
// parameter or value it does not know rather than ignore it.
func parseList(q url.Values, v2 bool) (listQuery, *apiError) {
	lq := listQuery{running: true, paused: true, desc: true, limit: 100}
	for k := range q {
		if !listParams[k] || !v2 && k != "metadata" && k != "state" {
			return listQuery{}, badField(k, "is not a filter Moat knows for this list; it takes metadata, state, startedAfter, template, order, limit and nextToken (GET /v2/sandboxes)")
		}
	}
	var e *apiError
	if lq.metadata, e = metadataFilter(q); e != nil {
		return listQuery{}, e
	}
	if states := q["state"]; len(states) > 0 {
		// The SDKs send state=running&state=paused; a comma list is
		// taken too.
		lq.running, lq.paused = false, false
		for _, v := range states {
			for st := range strings.SplitSeq(v, ",") {
				switch st {
				case "running":
					lq.running = true
				case "paused":
					lq.paused = true
				default:
					return listQuery{}, badField("state", "%q is not a sandbox state; give running or paused", st)
				}
			}
		}
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return listQuery{}, badField("startedAfter", "%q is not an RFC 3339 time such as 2026-01-02T15:04:05Z", v)
		}
		lq.startedAfter = t
	}
	lq.template = q.Get("template")
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.desc = false
	default:
		return listQuery{}, badField("order", "%q is not asc or desc", o)
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return listQuery{}, badField("limit", "%q is not a number from 1 to 100", l)
		}
		lq.limit = n
	}
	if tok := q.Get("nextToken"); tok != "" {
		pt, ok := parsePageToken(tok)
		if !ok {
			return listQuery{}, badField("nextToken", "%q is not a token this server gave (X-Next-Token)", tok)
		}
		lq.after = &pt
	}
	return lq, nil
}

// pageToken is where the next page starts: the start time and id of its
// first sandbox, so that a page continues in order even when sandboxes
// end between the calls.
type pageToken struct {
	started time.Time
	id      string
}

func (p pageToken) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(p.started.UnixNano(), 10) + "_" + p.id))
}

func parsePageToken(s string) (pageToken, bool) {
	raw, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(raw) > 256 {
		return pageToken{}, false
	}
	ns, id, ok := strings.Cut(string(raw), "_")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil || id == "" {
		return pageToken{}, false
	}
	return pageToken{time.Unix(0, n), id}, true
}

// before reports whether sandbox a comes before b in the order asked for:
// by start time, then id, so the order is total and stable across pages.
func (lq listQuery) before(a, b pageToken) bool {
	c := a.started.Compare(b.started)
	if c == 0 {
		c = strings.Compare(a.id, b.id)
	}
	if lq.desc {
		return c > 0
	}
	return c < 0
}

// list is the key's live sandboxes lq selects, in its order, and the
// token of the next page ("" when this is the last).
func (h *Handler) list(r *http.Request, key audit.Key, lq listQuery) ([]listed, string, *apiError) {
	all, e := h.moatSandboxes(r, key)
	if e != nil {
		return nil, "", e
	}
	var out []listed
	for _, sb := range all {
		if (e2bState(sb.State) == "paused" && !lq.paused) || (e2bState(sb.State) == "running" && !lq.running) ||
			!matches(sb.Metadata, lq.metadata) || sb.CreatedAt.Before(lq.startedAfter) {
			continue
		}
		l := h.listedView(sb)
		if lq.template != "" && l.TemplateID != lq.template && l.Alias != lq.template {
			continue
		}
		if lq.after != nil && lq.before(pageToken{l.StartedAt, l.SandboxID}, *lq.after) {
			continue
		}
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b listed) int {
		if lq.before(pageToken{a.StartedAt, a.SandboxID}, pageToken{b.StartedAt, b.SandboxID}) {
			return -1
		}
		return 1
	})
	next := ""
	if len(out) > lq.limit {
		next = pageToken{out[lq.limit].StartedAt, out[lq.limit].SandboxID}.String()
		out = out[:lq.limit]
	}
	return out, next, nil
}

// listV1 is GET /sandboxes: the running sandboxes, newest first.
func (h *Handler) listV1(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return &apiError{http.StatusBadRequest, "the query is not URL-encoded key=value pairs: " + err.Error()}
	}
	lq, e := parseList(q, false)
	if e != nil {
		return e
	}
	lq.limit = math.MaxInt
	out, _, e := h.list(r, key, lq)
	if e != nil {
		return e
	}
	writeJSON(w, http.StatusOK, nonNil(out))
	return nil
}

// listV2 is GET /v2/sandboxes: newest first unless ?order=asc, filtered
// by state, metadata, startedAfter and template, in pages of ?limit=
// (default and most 100) continued by ?nextToken= from the X-Next-Token
// header.
func (h *Handler) listV2(w http.ResponseWriter, r *http.Request, key audit.Key) *apiError {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return &apiError{http.StatusBadRequest, "the query is not URL-encoded key=value pairs: " + err.Error()}
	}
	lq, e := parseList(q, true)
	if e != nil {
		return e
	}
	out, next, e := h.list(r, key, lq)
	if e != nil {
		return e
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
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
	// A paused sandbox is described too (state "paused"), as E2B's is.
	sb, e := h.moatSandbox(r, key, id)
	if e != nil && e2bState(sb.State) == "" {
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

// maxSeconds bounds every timeout in seconds an E2B request gives (E2B's
// API types them int32), so that a time.Duration of it cannot overflow
// into a short or negative one; Moat's --max-ttl refuses far less.
const maxSeconds = math.MaxInt32

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
	if *req.Timeout > maxSeconds {
		return badField("timeout", "%d seconds is more than %d", *req.Timeout, maxSeconds)
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
	if secs <= 0 || secs > maxSeconds {
		return badField("duration", "%d is not a positive number of seconds up to %d", secs, maxSeconds)
	}
	if e := h.extend(r, key, r.PathValue("id"), secs); e != nil {
		return e
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect is POST /v2/sandboxes/{id}/connect: a running sandbox is
// returned (its timeout extended if given), a paused one is resumed.
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
	// memory matters only to a paused sandbox (resumePaused refuses
	// true there): connecting to a running one resumes nothing.
	if e := h.resumePaused(r, key, id, req.Timeout, req.Memory); e != nil {
		return e
	}
	if req.Timeout != nil {
		if *req.Timeout <= 0 || *req.Timeout > maxSeconds {
			return badField("timeout", "%d is not a positive number of seconds up to %d", *req.Timeout, maxSeconds)
		}
		// E2B: connect's timeout only extends a sandbox's life. The SDKs
		// send one on every connect (5 minutes by default), which must
		// not cut short a sandbox created for an hour.
		sb, e := h.moatSandbox(r, key, id)
		if e != nil {
			return e
		}
		if time.Now().Add(time.Duration(*req.Timeout) * time.Second).After(sb.ExpiresAt) {
			if e := h.extend(r, key, id, *req.Timeout); e != nil {
				return e
			}
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
