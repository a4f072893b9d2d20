package e2b

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

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
	// signedPath, when set, is the path a signed URL authorised instead
	// of the access token: the only file the request may touch ("" in an
	// upload URL signed without a path: the parts' own names, as E2B).
	signedPath *string
}

func (h *Handler) serveEnvd(w http.ResponseWriter, r *http.Request, id, port string) {
	if port != "" && port != EnvdPort {
		h.servePort(w, r, id, port)
		return
	}
	token := r.Header.Get("X-Access-Token")
	b, ok := h.boxByToken(id, token)
	why := "X-Access-Token is missing or is not this sandbox's access token"
	var signedPath *string
	if b != nil && !ok && token == "" && hasSignature(r) {
		// A signed URL (downloadUrl/uploadUrl) stands in for the token,
		// for its one path and operation (signed.go).
		if why = checkSignature(r, b.token, time.Now()); why == "" {
			if h.alive(b.keyID, id) {
				ok = true
				p := r.URL.Query().Get("path")
				signedPath = &p
			} else {
				h.forget(id)
				b = nil
			}
		}
	}
	if b == nil {
		// What E2B's proxy answers for a sandbox that is not running; the
		// SDKs' isRunning reads it as false.
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "code": 502, "message": "The sandbox was not found"})
		return
	}
	if !ok {
		e := rpcErr(connect.CodeUnauthenticated, "%s", why)
		if strings.HasPrefix(r.URL.Path, "/files") || r.URL.Path == "/health" {
			writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, e.Message()})
		} else {
			writeRPCError(w, http.StatusUnauthorized, e)
		}
		return
	}
	if sb, err := h.svc.GetSandbox(r.Context(), b.key, id); err == nil && sb.State == service.StatePaused {
		// E2B's proxy answers 502 for a paused sandbox too: the SDKs'
		// isRunning reads it as false, other calls raise TimeoutError.
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "code": 502,
			"message": "sandbox " + id + " is paused: Sandbox.connect resumes it (with its files; its processes were not kept)"})
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
	// RPCs are checked by userInterceptor, so that a streaming call gets
	// its refusal in Connect's streaming form.
	if msg := refusedUser(r.Header, r.URL.Query()); msg != "" && r.URL.Path == "/files" {
		writeJSON(w, http.StatusBadRequest, apiError{http.StatusBadRequest, msg})
		return
	}
	c := &envdCall{h: h, svc: h.svc, b: b, key: key, signedPath: signedPath}
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
		// 501, not 404: the SDKs read a 404 from envd as a missing file
		// or sandbox.
		writeJSON(w, http.StatusNotImplemented, apiError{http.StatusNotImplemented, "envd on Moat does not implement " + r.URL.Path + " (README, What differs from E2B's cloud)"})
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

// defaultUser is the user E2B's sandboxes run commands as, and the only
// one Moat's do.
const defaultUser = "user"

// userInterceptor refuses an RPC whose user refusedUser refuses, with
// invalid_argument (the SDKs' InvalidArgumentError).
type userInterceptor struct{}

func (userInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if msg := refusedUser(req.Header(), nil); msg != "" {
			return nil, rpcErr(connect.CodeInvalidArgument, "%s", msg)
		}
		return next(ctx, req)
	}
}

func (userInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (userInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if msg := refusedUser(conn.RequestHeader(), nil); msg != "" {
			return rpcErr(connect.CodeInvalidArgument, "%s", msg)
		}
		return next(ctx, conn)
	}
}

// refusedUser says why the user a request asks to act as (the SDKs'
// `user` option: "Authorization: Basic base64(<user>:)" on RPCs,
// ?username= on /files) is refused, or "" for none or E2B's default user.
// Moat runs every command as the sandbox's unprivileged user, with no
// capabilities; it refuses root rather than ignore it, since a program
// that asked for root and silently got less would fail later in a way
// that hides the cause.
func refusedUser(h http.Header, q url.Values) string {
	users := q["username"]
	if a := h.Get("Authorization"); a != "" {
		scheme, cred, _ := strings.Cut(a, " ")
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
		if !strings.EqualFold(scheme, "Basic") || err != nil {
			return "Authorization: envd takes only Basic <base64 of user:> (the SDK's user option); the sandbox's access token goes in X-Access-Token"
		}
		u, _, _ := strings.Cut(string(raw), ":")
		users = append(users, u)
	}
	for _, u := range users {
		if u != "" && u != defaultUser {
			return fmt.Sprintf("user %q is not supported: Moat runs every command and file operation as the sandbox's unprivileged user %q, without capabilities; it never runs them as root or another user (leave the user option unset or %q)", truncate(u, 64), defaultUser, defaultUser)
		}
	}
	return ""
}

// truncate bounds s, a client's string, for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
