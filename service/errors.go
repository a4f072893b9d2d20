package service

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/workspace"
)

// Kind is what a caller can do about an error: the closed set every front
// door maps onto its protocol (HTTP status and code, E2B's {code,message},
// a Connect code, an exit status).
type Kind int

const (
	// Internal is Moat failing; the message hides the cause.
	Internal Kind = iota
	// BadRequest is a request that cannot be understood (malformed JSON,
	// a wrong content type).
	BadRequest
	// Invalid is a request whose field (Field) has a value that is
	// refused.
	Invalid
	// Unauthenticated is a missing or unknown API key.
	Unauthenticated
	// Forbidden is a key that may not do this.
	Forbidden
	// NotFound is an unknown object, or another key's.
	NotFound
	// Conflict is an object in a state that refuses the request (a
	// sandbox being deleted, a command that has ended).
	Conflict
	// TooLarge is a request or a file that does not fit.
	TooLarge
	// Quota is a key's or the server's limit reached (RetryAfter says
	// when to try again).
	Quota
	// Unavailable is what this host cannot serve now (shutting down, a
	// tier it lacks).
	Unavailable
)

var kindNames = [...]string{"internal", "bad_request", "invalid_field", "unauthenticated", "forbidden", "not_found", "conflict", "too_large", "quota_exceeded", "unavailable"}

// String is the kind's name, the API's error code (docs/API.md).
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return "kind(" + strconv.Itoa(int(k)) + ")"
	}
	return kindNames[k]
}

// Error is what a method returns when a request fails. Message and Field
// are for the caller; Err is the cause, for the log only.
type Error struct {
	Kind    Kind
	Field   string
	Message string
	Err     error
	// RetryAfter, when positive, is the seconds after which a retry may
	// succeed (Quota, Unavailable).
	RetryAfter int
	// Held, when set, says the request was not refused but held for a
	// person's approval (Kind Forbidden, for front doors that know no
	// pending state): the HTTP API answers 202 with it.
	Held *Approval
}

func (e *Error) Error() string {
	s := e.Kind.String() + ": " + e.Message
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// KindOf is err's Kind: Internal unless it is (or wraps) a *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return Internal
}

// Errorf returns an error of kind k about field.
func Errorf(k Kind, field, format string, args ...any) *Error {
	return &Error{Kind: k, Field: field, Message: fmt.Sprintf(format, args...)}
}

// InvalidField says a field's value is refused; the message starts with
// the field, as manifest errors do.
func InvalidField(field, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if field != "" {
		msg = field + ": " + msg
	}
	return &Error{Kind: Invalid, Field: field, Message: msg}
}

func notFound(what string) *Error {
	return &Error{Kind: NotFound, Message: what + " not found"}
}

func conflict(format string, args ...any) *Error {
	return &Error{Kind: Conflict, Message: fmt.Sprintf(format, args...)}
}

func quotaExceeded(retryAfter int, format string, args ...any) *Error {
	return &Error{Kind: Quota, Message: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

func unavailable(format string, args ...any) *Error {
	return &Error{Kind: Unavailable, Message: fmt.Sprintf(format, args...), RetryAfter: 5}
}

// InternalError hides err from the caller: the log has it.
func InternalError(err error) *Error {
	return &Error{Kind: Internal, Message: "moat failed to serve this request", Err: err}
}

var shuttingDown = unavailable("the server is shutting down; retry on another instance or after restart")

// ErrUnavailable, wrapped in a Backend's error, means this host cannot serve
// the request now (the tier is not available here): Unavailable.
// tier.ErrUnavailable counts as the same.
var ErrUnavailable = errors.New("unavailable on this host")

// ErrTooLarge, wrapped in a Backend's error, means an upload does not fit
// (the workspace is full): TooLarge. ENOSPC, EFBIG and EDQUOT count as the
// same.
var ErrTooLarge = errors.New("does not fit in the workspace")

// Classify turns an error from the engine, a Backend, a Session, the
// manifest, the workspace or the file system into a *Error: the one
// classification of Moat's errors, used by every front door (and by `moat
// run` for its exit status). what names the object for NotFound ("file
// \"docs/a.txt\""). A manifest field error keeps the field as the manifest
// names it.
func Classify(err error, what string) *Error {
	return classify(err, what, func(f string) string { return f }, "")
}

// backendError classifies an error from the Backend or a Session. Field
// errors are about the request's manifest.
func backendError(err error, what string) *Error {
	return classify(err, what, ManifestField, "")
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
		e := &Error{Kind: TooLarge, Field: ManifestField(le.Field), Message: le.Detail}
		if le.Detail == "" {
			e.Message = le.Error()
		}
		return e
	}
	if errors.Is(err, ErrTooLarge) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EFBIG) || errors.Is(err, syscall.EDQUOT) {
		return &Error{Kind: TooLarge, Message: what + " does not fit in the sandbox's workspace (raise manifest.workspace.size)", Err: err}
	}
	var fe *manifest.FieldError
	if errors.As(err, &fe) {
		field := fieldName(fe.Field)
		f := *fe
		f.Field = field
		return &Error{Kind: Invalid, Field: field, Message: f.Error(), Err: err}
	}
	if errors.Is(err, engine.ErrUsage) {
		msg := strings.TrimPrefix(err.Error(), engine.ErrUsage.Error()+": ")
		if usageField != "" {
			msg = usageField + ": " + msg
		}
		return &Error{Kind: Invalid, Field: usageField, Message: msg, Err: err}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return &Error{Kind: NotFound, Message: what + " not found", Err: err}
	}
	if errors.Is(err, engine.ErrSessionClosed) {
		return &Error{Kind: Conflict, Message: "the sandbox is closed or being deleted", Err: err}
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, tier.ErrUnavailable) {
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
	return InternalError(err)
}

// ManifestField prefixes a manifest field path as the API names it, inside
// the request's "manifest" object. Internal limit names (DiffLimits.x) are
// left alone.
func ManifestField(f string) string {
	if f == "" || strings.Contains(f, "Limits.") {
		return f
	}
	return "manifest." + f
}

// quote shows a caller's value in a message: quoted, escaped, short.
func Quote(s string) string {
	if len(s) > 80 {
		s = strings.ToValidUTF8(s[:80], "") + "..."
	}
	return strconv.Quote(s)
}
