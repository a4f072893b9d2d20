package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Retry says which refused or failed calls a Client sends again, and
// after how long (the Python client's RetryPolicy follows the same rules;
// docs/API.md "Retries"):
//
//   - 429 and 503 with Retry-After (seconds or an HTTP date): the server
//     refused the call before acting on it (a quota, a full server,
//     shutting down) and said when to come back, so any call is retried,
//     POSTs included, after that long.
//   - 429 and 503 without Retry-After, and a connection that failed or
//     dropped: only idempotent calls (GET, HEAD, PUT, DELETE) are retried,
//     after a doubling backoff; a POST may have been acted on (a sandbox
//     created, a command started) and is never sent twice.
//   - A refused connection (nothing was sent) is retried for every method.
//   - A body that cannot be sent again (an upload from an io.Reader other
//     than *bytes.Reader, *bytes.Buffer or *strings.Reader) is never
//     retried, nor a call whose context ended or timed out.
//
// A Retry-After longer than MaxDelay, or one that would take the call's
// waits past MaxWait, is not waited for: the *Error is returned at once,
// its RetryAfter saying when the server expects the caller back.
type Retry struct {
	// Attempts is the number of tries in all, the first included; 1 (or
	// less) disables retrying.
	Attempts int
	// Backoff is the first wait when the server gave no Retry-After,
	// doubled for each later one.
	Backoff time.Duration
	// MaxDelay bounds one wait; MaxWait the sum of one call's waits.
	MaxDelay, MaxWait time.Duration
}

// DefaultRetry is the Retry of a Client made without WithRetry.
var DefaultRetry = Retry{Attempts: 4, Backoff: 250 * time.Millisecond, MaxDelay: 10 * time.Second, MaxWait: 30 * time.Second}

// WithRetry sets which failed calls the Client sends again (see Retry);
// Retry{Attempts: 1} disables retrying.
func WithRetry(r Retry) Option {
	return func(c *Client) { c.retry = r }
}

// failure is what one try of a call ended with, as Retry.delay reads it.
type failure struct {
	status        int           // the refusal's HTTP status; 0 for a transport failure
	retryAfter    time.Duration // the refusal's Retry-After
	hasRetryAfter bool
	refused       bool // the connection was refused: nothing was sent
}

// delay returns how long to wait before trying a call again, and false
// when it must not be retried. attempt counts the tries made (1 after the
// first), waited the time this call already spent waiting.
func (r Retry) delay(attempt int, waited time.Duration, method string, replayable bool, f failure) (time.Duration, bool) {
	if attempt >= r.Attempts || !replayable {
		return 0, false
	}
	idempotent := idempotentMethod(method)
	if f.status != 0 {
		if f.status != http.StatusTooManyRequests && f.status != http.StatusServiceUnavailable {
			return 0, false
		}
		if f.hasRetryAfter {
			if f.retryAfter > r.MaxDelay || waited+f.retryAfter > r.MaxWait {
				return 0, false // the server wants longer than the caller allows
			}
			return f.retryAfter, true
		}
		if !idempotent {
			return 0, false
		}
	} else if !idempotent && !f.refused {
		return 0, false
	}
	d := r.Backoff
	for i := 1; i < attempt && d < r.MaxDelay; i++ {
		d *= 2
	}
	d = min(d, r.MaxDelay)
	if waited+d > r.MaxWait {
		return 0, false
	}
	return d, true
}

// idempotentMethod reports whether a second identical request has the
// effect of one (RFC 9110 section 9.2.2).
func idempotentMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions:
		return true
	}
	return false
}

// parseRetryAfter reads a Retry-After value (RFC 9110 section 10.2.3): a
// whole number of seconds, or an HTTP date in any of its three forms (a
// date in the past is 0). ok is false when v is empty or malformed.
func parseRetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, false
		}
		return time.Duration(n) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// transportFailure classifies a transport error of one try: whether the call's
// own end (context, timeout) forbids retrying, and whether the connection
// was refused.
func transportFailure(ctx context.Context, err error) (f failure, final bool) {
	if ctx.Err() != nil {
		return f, true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return f, true // the caller's timeout bounds the call
	}
	f.refused = errors.Is(err, syscall.ECONNREFUSED)
	return f, false
}

// wait sleeps d unless ctx ends first.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// gaveUp is the error of a call whose context ended while it waited to
// retry: the last try's error and the context's, both visible to
// errors.As and errors.Is.
func gaveUp(last, ctxErr error) error {
	return fmt.Errorf("%w (stopped waiting to retry: %w)", last, ctxErr)
}
