package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Signed URLs: the SDKs' downloadUrl and uploadUrl (e2b JS
// src/sandbox/signature.ts) let a plain HTTP client, which holds no access
// token, read or write one file of a sandbox. The URL carries
//
//	signature = "v1_" + base64(sha256(path:operation:user:token[:expiration])), unpadded
//	signature_expiration = the Unix second it stops being valid (optional)
//
// beside ?path= and ?username=, operation being "read" for GET /files and
// "write" for POST /files. Only the holder of the sandbox's access token
// can make one, and one is good for its path, operation and user only.
// Every Moat sandbox is what E2B calls secure (it always has an access
// token), so every /files request needs the token or a signature.

const (
	sigParam    = "signature"
	sigExpParam = "signature_expiration"
)

// fileSignature is the signature the SDKs compute for path, operation
// ("read" or "write") and user with token; exp is "" for one that does not
// expire, else the decimal Unix second as it appears in the URL.
func fileSignature(path, operation, user, token, exp string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedOperation is the operation a signature must name for a /files
// request's method, or "" for a method no signature covers.
func signedOperation(method string) string {
	switch method {
	case http.MethodGet:
		return "read"
	case http.MethodPost:
		return "write"
	}
	return ""
}

// hasSignature reports whether a request carries a signed URL's query.
func hasSignature(r *http.Request) bool {
	return r.URL.Path == "/files" && r.URL.Query().Has(sigParam)
}

// checkSignature says why the signed /files request r is not one token
// signed, or "" when it is and has not expired at now. The signature is
// compared in constant time, before the expiration is looked at, so that
// an answer tells nothing about a guess.
func checkSignature(r *http.Request, token string, now time.Time) string {
	q := r.URL.Query()
	if r.URL.Path != "/files" {
		return "a signature is accepted only on /files"
	}
	op := signedOperation(r.Method)
	if op == "" {
		return "a signature is accepted only on GET /files (read) and POST /files (write)"
	}
	got := q.Get(sigParam)
	if got == "" {
		return "the signature query parameter is empty: get a signed URL from the SDK's downloadUrl or uploadUrl"
	}
	exp := q.Get(sigExpParam)
	var expAt int64
	if q.Has(sigExpParam) {
		n, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || n <= 0 || strings.HasPrefix(exp, "+") {
			return "signature_expiration " + strconv.Quote(truncate(exp, 32)) + " is not a Unix time in seconds"
		}
		expAt = n
	}
	want := fileSignature(q.Get("path"), op, q.Get("username"), token, exp)
	if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
		return "the signature does not match this sandbox, path, operation (" + op + ") and user: sign the URL with the sandbox's downloadUrl/uploadUrl for this very path"
	}
	if q.Has(sigExpParam) && now.Unix() > expAt {
		return "the signed URL expired at " + time.Unix(expAt, 0).UTC().Format(time.RFC3339) + ": ask the SDK for a new one"
	}
	return ""
}

// boxBySignature finds the live sandbox whose access token signed r: in
// path mode (E2B_SANDBOX_URL) a signed URL names no sandbox, but only one
// token can have signed it.
func (h *Handler) boxBySignature(r *http.Request) *box {
	h.mu.Lock()
	all := make([]*box, 0, len(h.boxes))
	for _, b := range h.boxes {
		all = append(all, b)
	}
	h.mu.Unlock()
	q := r.URL.Query()
	op := signedOperation(r.Method)
	if op == "" {
		return nil
	}
	for _, b := range all {
		want := fileSignature(q.Get("path"), op, q.Get("username"), b.token, q.Get(sigExpParam))
		if subtle.ConstantTimeCompare([]byte(q.Get(sigParam)), []byte(want)) == 1 {
			return b
		}
	}
	return nil
}

// serveSignedPathMode serves a /files request that names no sandbox
// (E2B_SANDBOX_URL addressing, no E2b-Sandbox-Id): the sandbox is the one
// whose token signed it; no signature, or one no sandbox's token made, is
// 401.
func (h *Handler) serveSignedPathMode(w http.ResponseWriter, r *http.Request) {
	var b *box
	if hasSignature(r) {
		b = h.boxBySignature(r)
	}
	if b == nil {
		writeJSON(w, http.StatusUnauthorized, apiError{http.StatusUnauthorized, "the signature is not valid for any running sandbox: sign the URL with the SDK's downloadUrl/uploadUrl, or send E2b-Sandbox-Id and X-Access-Token"})
		return
	}
	h.serveEnvd(w, r, b.id, EnvdPort)
}
