package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/moat-sandbox/moat/service"
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

// Error is what a handler returns when a request fails at the HTTP layer
// (a service method returns a *service.Error; httpError maps it). Message and Field
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

// internal hides err from the client: the log has it, the client has the
// request id to quote.
func internal(err error) *Error {
	return &Error{Status: http.StatusInternalServerError, Code: CodeInternal, Message: "moat failed to serve this request", Err: err}
}

// kinds maps each service error Kind onto its HTTP status and code: the
// one place where the API decides how the service's errors look.
var kinds = map[service.Kind]struct {
	status int
	code   string
}{
	service.Internal:        {http.StatusInternalServerError, CodeInternal},
	service.BadRequest:      {http.StatusBadRequest, CodeBadRequest},
	service.Invalid:         {http.StatusBadRequest, CodeInvalidField},
	service.Unauthenticated: {http.StatusUnauthorized, CodeUnauthenticated},
	service.Forbidden:       {http.StatusForbidden, CodeForbidden},
	service.NotFound:        {http.StatusNotFound, CodeNotFound},
	service.Conflict:        {http.StatusConflict, CodeConflict},
	service.TooLarge:        {http.StatusRequestEntityTooLarge, CodeTooLarge},
	service.Quota:           {http.StatusTooManyRequests, CodeQuotaExceeded},
	service.Unavailable:     {http.StatusServiceUnavailable, CodeUnavailable},
}

// httpError is err as the API answers it: an *Error as it is, a
// *service.Error by its Kind (kinds), anything else internal.
func httpError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var se *service.Error
	if !errors.As(err, &se) {
		return internal(err)
	}
	k, ok := kinds[se.Kind]
	if !ok {
		k = kinds[service.Internal]
	}
	return &Error{Status: k.status, Code: k.code, Message: se.Message, Field: se.Field, Err: se.Err, RetryAfter: se.RetryAfter}
}

// KindOfStatus is the service error Kind an API answer's status stands
// for (the reverse of kinds): what a client of the API, such as `moat run
// --server`, classifies a refusal by. 400 is Invalid (bad_request and
// invalid_field alike); an unknown status is Internal.
func KindOfStatus(status int) service.Kind {
	if status == http.StatusBadRequest {
		return service.Invalid
	}
	for k, v := range kinds {
		if v.status == status {
			return k
		}
	}
	return service.Internal
}
