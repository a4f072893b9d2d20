package client

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// Error is a call the server refused: its HTTP status and the error
// document of docs/API.md ({"error": {"code", "message", "field",
// "request_id"}}). Branch on Code (or Status) with errors.As:
//
//	var apiErr *client.Error
//	if errors.As(err, &apiErr) && apiErr.Code == client.CodeNotFound { ... }
type Error struct {
	// Status is the HTTP status code, e.g. 400.
	Status int
	// Code is the API's stable error code, one of the Code constants; it
	// is empty when the answer was not Moat's error JSON (a proxy's error
	// page, for instance).
	Code string
	// Message says what is wrong, for a person.
	Message string
	// Field names the refused request field, e.g.
	// "manifest.resources.memory"; empty when no one field is at fault.
	Field string
	// RequestID identifies the call in the server's log.
	RequestID string
	// Method and Path are the call's, e.g. "POST" and "/v1/runs".
	Method, Path string
	// RetryAfter is when the server said to try again (its Retry-After
	// header, on a 429 or 503), 0 when it did not say; set on a refusal
	// the Client's Retry did not wait out (WithRetry).
	RetryAfter time.Duration
}

// The error codes of docs/API.md.
const (
	CodeBadRequest       = "bad_request"        // 400: malformed JSON, unknown field, wrong content type
	CodeInvalidField     = "invalid_field"      // 400: a field's value is refused; Field names it
	CodeUnauthenticated  = "unauthenticated"    // 401: missing, unknown or revoked key
	CodeForbidden        = "forbidden"          // 403: the key may not read this (GET /metrics needs an admin key)
	CodeNotFound         = "not_found"          // 404: no such run, sandbox, process or file for this key
	CodeMethodNotAllowed = "method_not_allowed" // 405
	CodeConflict         = "conflict"           // 409: the sandbox is being deleted, the process already ended
	CodeTooLarge         = "too_large"          // 413: body, file count or file size over a limit
	CodeQuotaExceeded    = "quota_exceeded"     // 429: a per-key or server-wide quota
	CodeInternal         = "internal"           // 500: Moat failed
	CodeUnavailable      = "unavailable"        // 503: shutting down, tier unavailable
)

// Error renders e on one line: the call, the status and code, the message,
// the field and the request id, e.g. `moat server: POST /v1/runs: 400
// invalid_field: resources.memory: ... (field: manifest.resources.memory)
// [request r-5c1e]`.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("moat server: ")
	if e.Method != "" {
		fmt.Fprintf(&b, "%s %s: ", e.Method, e.Path)
	}
	fmt.Fprintf(&b, "%d", e.Status)
	if e.Code != "" {
		b.WriteString(" " + e.Code)
	}
	b.WriteString(": " + e.Message)
	if e.Field != "" {
		b.WriteString(" (field: " + e.Field + ")")
	}
	if e.RequestID != "" {
		b.WriteString(" [request " + e.RequestID + "]")
	}
	return b.String()
}

// maxErrorBody bounds how much of an error answer is read: Moat's error
// documents are a few hundred bytes, and anything else is only quoted.
const maxErrorBody = 64 << 10

// decodeError turns a non-2xx answer into an *Error.
func decodeError(method, path string, resp *http.Response) *Error {
	e := &Error{Status: resp.StatusCode, Method: method, Path: path, RequestID: resp.Header.Get("X-Request-ID")}
	e.RetryAfter, _ = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	data, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var doc struct {
		Error *struct {
			Code      string `json:"code"`
			Message   string `json:"message"`
			Field     string `json:"field"`
			RequestID string `json:"request_id"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &doc) == nil && doc.Error != nil {
		e.Code, e.Message, e.Field = doc.Error.Code, doc.Error.Message, doc.Error.Field
		if doc.Error.RequestID != "" {
			e.RequestID = doc.Error.RequestID
		}
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
		if s := quoteBody(data); s != "" {
			e.Message += ": " + s
		}
	}
	return e
}

// quoteBody renders the start of a non-Moat error body on one line.
func quoteBody(data []byte) string {
	const n = 200
	s := strings.ToValidUTF8(strings.TrimSpace(string(data)), "\uFFFD")
	if len(s) > n {
		i := n
		for i > 0 && !utf8.RuneStart(s[i]) {
			i--
		}
		s = s[:i] + "..."
	}
	if s == "" {
		return ""
	}
	return fmt.Sprintf("%q", s)
}

// HeldError is a command the server's effects policy held for a person's
// approval (202 with {"approval": ...}): it has not started. Approve it
// with Client.DecideApproval (or from the dashboard), then follow the
// returned Exec. Sandbox.Exec and Sandbox.Start return it; a held
// one-shot Run is not an error but a RunResponse with Approval set.
type HeldError struct {
	Approval *Approval
}

func (e *HeldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "moat server: held for approval %s until %s", e.Approval.ID, e.Approval.ExpiresAt.Format(time.RFC3339))
	for i, ef := range e.Approval.Effects {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(ef.Detail)
	}
	return b.String()
}
