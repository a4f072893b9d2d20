package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/workspace"
)

// The error codes of docs/API.md. A client branches on these, never on the
// message.
const (
	CodeBadRequest       = "bad_request"
	CodeInvalidField     = "invalid_field"
	CodeUnauthenticated  = "unauthenticated"
	CodeForbidden        = "forbidden"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeConflict         = "conflict"
	CodeTooLarge         = "too_large"
	CodeQuotaExceeded    = "quota_exceeded"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
)

// Error is what a handler returns when a request fails. Message and Field
// are for the client; Err is the cause, for the log only.
type Error struct {
	Status  int
	Code    string
	Message string
	Field   string
	Err     error
	// RetryAfter, when positive, is sent as Retry-After (seconds).
	RetryAfter int
}

func (e *Error) Error() string {
	s := e.Code + ": " + e.Message
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// ErrorBody is the JSON of an error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code      string `json:"code"`
	Message   string `json:"message"`
	Field     string `json:"field,omitempty"`
	RequestID string `json:"request_id"`
}

func badRequest(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeBadRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}

// invalid says a field's value is refused; the message starts with the
// field, as manifest errors do.
func invalid(field, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: field, Message: msg}
}

func tooLarge(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: field, Message: fmt.Sprintf(format, args...)}
}

func forbidden(format string, args ...any) *Error {
	return &Error{Status: http.StatusForbidden, Code: CodeForbidden, Message: fmt.Sprintf(format, args...)}
}

func notFound(what string) *Error {
	return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: what + " not found"}
}

func conflict(format string, args ...any) *Error {
	return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: fmt.Sprintf(format, args...)}
}

func quotaExceeded(retryAfter int, format string, args ...any) *Error {
	return &Error{Status: http.StatusTooManyRequests, Code: CodeQuotaExceeded, Message: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

func unavailable(format string, args ...any) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: fmt.Sprintf(format, args...), RetryAfter: 5}
}

// internal hides err from the client: the log has it, the client has the
// request id to quote.
func internal(err error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "moat failed to serve this request", Err: err}
}

var shuttingDown = unavailable("the server is shutting down; retry on another instance or after restart")

// backendError classifies an error from the Backend or a Session. what
// names the object for a 404 ("file docs/a.txt"). Field errors are about
// the request's manifest.
func backendError(err error, what string) *Error {
	return classify(err, what, manifestField, "")
}

// requestError classifies an error about the request itself rather than
// its manifest: a command's env and dir (their field names are kept), or
// a file operation's path (usageField).
func requestError(err error, what, usageField string) *Error {
	return classify(err, what, func(f string) string { return f }, usageField)
}

func classify(err error, what string, fieldName func(string) string, usageField string) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	var le *workspace.LimitError
	if errors.As(err, &le) {
		e := tooLarge(manifestField(le.Field), "%s", le.Detail)
		if le.Detail == "" {
			e.Message = le.Error()
		}
		return e
	}
	if errors.Is(err, ErrTooLarge) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT) {
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Message: what + " does not fit in the sandbox's workspace (raise manifest.workspace.size)", Err: err}
	}
	var fe *manifest.FieldError
	if errors.As(err, &fe) {
		field := fieldName(fe.Field)
		f := *fe
		f.Field = field
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: field, Message: f.Error(), Err: err}
	}
	if errors.Is(err, engine.ErrUsage) {
		msg := strings.TrimPrefix(err.Error(), engine.ErrUsage.Error()+": ")
		if usageField != "" {
			msg = usageField + ": " + msg
		}
		return &Error{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: usageField, Message: msg, Err: err}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: what + " not found", Err: err}
	}
	if errors.Is(err, engine.ErrSessionClosed) {
		return &Error{Status: http.StatusConflict, Code: CodeConflict, Message: "the sandbox is closed or being deleted", Err: err}
	}
	if errors.Is(err, ErrUnavailable) {
		e := unavailable("%s", err.Error())
		e.Err = err
		return e
	}
	if errors.Is(err, context.Canceled) {
		// Only the client going away or shutdown cancel a request.
		e := unavailable("the request was cancelled (client gone or server shutting down)")
		e.Err = err
		return e
	}
	return internal(err)
}

// manifestField prefixes a manifest field path as the API names it, inside
// the request's "manifest" object. Internal limit names (DiffLimits.x) are
// left alone.
func manifestField(f string) string {
	if f == "" || strings.Contains(f, "Limits.") {
		return f
	}
	return "manifest." + f
}
