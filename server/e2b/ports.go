package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// Ports: the SDKs' getHost(port) is "<port>-<id>.<domain>"; a request to
// that host (or with E2b-Sandbox-Id and E2b-Sandbox-Port) is proxied to a
// program listening on that port inside the sandbox, as E2B's edge proxy
// does. The host connects into the sandbox for each request
// (service.DialPort, the manifest's network.inbound); nothing inside the
// sandbox is ever bound to a host address.
//
// Each request needs the sandbox's traffic access token (the
// trafficAccessToken create returned, in e2b-traffic-access-token), or its
// envd access token, unless its creator set network.allowPublicTraffic:
// true. The token is not the
// envd access token: handing out a URL to a web app in the sandbox must
// not hand out its commands and files.

// TrafficHeader carries a sandbox's traffic access token (E2B's name).
const TrafficHeader = "E2b-Traffic-Access-Token"

// inboundAll is what an E2B sandbox's manifest grants: every port, as E2B
// sandboxes accept connections on any; the traffic token guards them.
const inboundAll = "1-65535"

// inboundJustification is the reason the E2B layer records for the grant
// (manifest justifications), so that a policy requiring justifications
// sees where it came from.
func inboundJustification(public bool) string {
	if public {
		return "E2B API: the creator set network.allowPublicTraffic: true, so any client of this server reaches the sandbox's ports through getHost(port) URLs while it runs"
	}
	return "E2B API: getHost(port) URLs reach the sandbox's ports while it runs, each request only with the sandbox's traffic access token (e2b-traffic-access-token), as E2B's sandboxes"
}

// servePort proxies one request to port of sandbox id.
func (h *Handler) servePort(w http.ResponseWriter, r *http.Request, id, portText string) {
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != portText {
		writeJSON(w, http.StatusBadRequest, apiError{http.StatusBadRequest, fmt.Sprintf("port %q is not a TCP port (1-65535): the host name is <port>-<sandbox id>.<domain>", truncate(portText, 16))})
		return
	}
	h.mu.Lock()
	b := h.boxes[id]
	h.mu.Unlock()
	if b == nil || !h.alive(b.keyID, id) {
		if b != nil {
			h.forget(id)
		}
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "port": port, "code": 502, "message": "The sandbox was not found: it is not running, or it never existed"})
		return
	}
	if !b.public || portText == JupyterPort {
		// The envd access token (X-Access-Token) also lets its holder
		// through: it already runs commands in the sandbox, which reach
		// every port from inside.
		traffic := subtle.ConstantTimeCompare([]byte(r.Header.Get(TrafficHeader)), []byte(b.traffic)) == 1 && b.traffic != ""
		envd := subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(b.token)) == 1
		switch {
		case traffic || envd:
		case b.public:
			// The code interpreter runs code: allowPublicTraffic opens a
			// sandbox's web apps to anyone, never its kernel.
			writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, "the code interpreter (port " + JupyterPort + ") needs the sandbox's envd access token (X-Access-Token) even though the sandbox was created with network.allowPublicTraffic: true: public traffic opens its web apps, not its kernel"})
			return
		default:
			writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, "e2b-traffic-access-token is missing or is not this sandbox's traffic access token (the SDK's sandbox.trafficAccessToken; create with network.allowPublicTraffic: true for URLs anyone may open)"})
			return
		}
	}
	key := b.key
	if h.cfg.Keys != nil {
		k, err := h.cfg.Keys.Key(b.keyID)
		if err != nil || k.Revoked != nil || k.ID != b.keyID {
			writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, "the API key that created this sandbox is revoked or unknown"})
			return
		}
		key = k
	}
	if portText == JupyterPort {
		// The code interpreter is served here, not by the sandbox
		// (jupyter.go).
		h.serveJupyter(w, r, key, b)
		return
	}
	h.proxyPort(w, r, key, id, port)
}

// proxyPort forwards r to port inside sandbox id. What comes back is the
// program's, untrusted: bounded headers, the body streamed as is.
func (h *Handler) proxyPort(w http.ResponseWriter, r *http.Request, key audit.Key, id string, port int) {
	var (
		mu      sync.Mutex
		dialErr error
	)
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			// The program sees the name the client used, as behind
			// E2B's proxy.
			pr.Out.Host = pr.In.Host
			// The sandbox's tokens are for Moat, not for the program.
			for _, hd := range []string{TrafficHeader, "X-Access-Token", "E2b-Sandbox-Id", "E2b-Sandbox-Port"} {
				pr.Out.Header.Del(hd)
			}
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				c, err := h.svc.DialPort(ctx, key, id, port)
				mu.Lock()
				dialErr = err
				mu.Unlock()
				return c, err
			},
			// One connection per request: a kept-alive one would outlive
			// the check that the sandbox runs and the token is right.
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: 1 << 20,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			mu.Lock()
			de := dialErr
			mu.Unlock()
			h.portError(w, id, port, de, err)
		},
	}
	rp.ServeHTTP(w, r)
}

// portError answers a request that did not reach the program, in E2B's
// proxy's form (502 with sandboxId, port, code, message) where E2B has
// one, else Moat's {code, message}.
func (h *Handler) portError(w http.ResponseWriter, id string, port int, dialErr, err error) {
	gateway := func(msg string) {
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "port": port, "code": 502, "message": msg})
	}
	if dialErr == nil {
		// Connected, then the program broke the exchange.
		gateway(fmt.Sprintf("The sandbox is running but the program on port %d did not answer with HTTP: %v", port, err))
		return
	}
	var se *service.Error
	if !errors.As(dialErr, &se) {
		h.log.Error("e2b: connect into sandbox", "sandbox", id, "port", port, "err", dialErr)
		gateway(fmt.Sprintf("The sandbox is running but port %d could not be reached", port))
		return
	}
	switch {
	case errors.Is(dialErr, service.ErrNotListening):
		gateway(fmt.Sprintf("The sandbox is running but port %d is not open: %s", port, se.Message))
	case se.Kind == service.NotFound:
		gateway("The sandbox was not found: it is not running, or it never existed")
	case se.Kind == service.Conflict:
		gateway(se.Message)
	case se.Kind == service.Unavailable:
		writeJSON(w, http.StatusNotImplemented, apiError{http.StatusNotImplemented, "ports are not served for this sandbox: " + se.Message + " (README, What differs from E2B's cloud)"})
	default:
		h.fromService(dialErr).write(w)
	}
}
