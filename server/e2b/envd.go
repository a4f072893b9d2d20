package e2b

import (
	"context"
	"net/http"
	"path"
	"strings"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/service"
)

// envd, the data plane, served on the host side. A request reaches a
// sandbox only with that sandbox's access token (X-Access-Token), issued
// at creation and known only to the creator.

// home is the user's home in E2B's sandboxes; Moat's workspace stands in
// for it (and for /workspace).
const home = "/home/user"

// envdCall is one data-plane request for a sandbox whose token checked.
type envdCall struct {
	h   *Handler
	svc *service.Service
	b   *box
	key audit.Key
}

func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id, port string) {
	if port != "" && port != EnvdPort {
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "port": port, "code": 502,
			"message": "The sandbox is running but port " + port + " is not open: Moat serves only envd (" + EnvdPort + ")"})
		return
	}
	b, ok := h.boxByToken(id, r.Header.Get("X-Access-Token"))
	if b == nil {
		// What E2B's proxy answers for a sandbox that is not running; the
		// SDKs' isRunning reads it as false.
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "code": 502, "message": "The sandbox was not found"})
		return
	}
	if !ok {
		e := rpcErr(connect.CodeUnauthenticated, "X-Access-Token is missing or is not this sandbox's access token")
		if strings.HasPrefix(r.URL.Path, "/files") || r.URL.Path == "/health" {
			writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, e.Message()})
		} else {
			writeRPCError(w, http.StatusUnauthorized, e)
		}
		return
	}
	// The service reads the quota from the key it is given: the box keeps
	// the key as authenticated at creation.
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
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
	c := &envdCall{h: h, svc: h.svc, b: b, key: key}
	switch {
	case r.URL.Path == "/files":
		switch r.Method {
		case http.MethodGet:
			c.download(w, r)
		case http.MethodPost:
			c.upload(w, r)
		default:
			w.Header().Set("Allow", "GET, POST")
			writeJSON(w, http.StatusMethodNotAllowed, apiError{http.StatusMethodNotAllowed, r.Method + " is not allowed on /files"})
		}
	case strings.HasPrefix(r.URL.Path, "/process.Process/"), strings.HasPrefix(r.URL.Path, "/filesystem.Filesystem/"):
		h.rpc.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
	default:
		writeJSON(w, http.StatusNotFound, apiError{http.StatusNotFound, "envd on Moat has no " + r.URL.Path})
	}
}

// workspacePath maps an E2B path (absolute, or relative to the home) onto
// the workspace; "." is the workspace itself. Anything outside /home/user
// and /workspace is refused: a Moat sandbox exposes only its workspace.
func workspacePath(field, p string) (string, *connect.Error) {
	if p == "" {
		return "", rpcErr(connect.CodeInvalidArgument, "%s is empty: give a path under %s", field, home)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", rpcErr(connect.CodeInvalidArgument, "%s contains a NUL byte", field)
	}
	if !strings.HasPrefix(p, "/") {
		p = home + "/" + p
	}
	clean := path.Clean(p)
	for _, root := range []string{home, "/workspace"} {
		if clean == root {
			return ".", nil
		}
		if rest, ok := strings.CutPrefix(clean, root+"/"); ok {
			return rest, nil
		}
	}
	return "", rpcErr(connect.CodePermissionDenied, "%s %q is outside the sandbox's workspace: Moat exposes only %s (the same directory as /workspace)", field, p, home)
}

// e2bPath is the E2B path of a workspace path.
func e2bPath(rel string) string {
	if rel == "." || rel == "" {
		return home
	}
	return home + "/" + rel
}
