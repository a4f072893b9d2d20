package client

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		v      string
		want   time.Duration
		wantOK bool
	}{
		{name: "absent", v: ""},
		{name: "seconds", v: "3", want: 3 * time.Second, wantOK: true},
		{name: "zero", v: "0", wantOK: true},
		{name: "spaces around", v: " 7 ", want: 7 * time.Second, wantOK: true},
		{name: "negative", v: "-1"},
		{name: "a fraction is not delta-seconds", v: "1.5"},
		{name: "garbage", v: "soon"},
		{name: "too large", v: "99999999999999999999"},
		{name: "HTTP date ahead", v: now.Add(10 * time.Second).Format(http.TimeFormat), want: 10 * time.Second, wantOK: true},
		{name: "HTTP date past", v: now.Add(-time.Minute).Format(http.TimeFormat), wantOK: true},
		{name: "RFC 850 date", v: "Sunday, 06-Nov-94 08:49:37 GMT", wantOK: true},
		{name: "asctime date", v: "Sun Nov  6 08:49:37 1994", wantOK: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := parseRetryAfter(tc.v, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", tc.v, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	r := Retry{Attempts: 4, Backoff: 500 * time.Millisecond, MaxDelay: 10 * time.Second, MaxWait: 12 * time.Second}
	ra := func(status int, d time.Duration) failure {
		return failure{status: status, retryAfter: d, hasRetryAfter: true}
	}
	tests := []struct {
		name      string
		method    string
		f         failure
		attempt   int
		waited    time.Duration
		unreplay  bool
		want      time.Duration
		wantRetry bool
	}{
		{name: "POST 429 with Retry-After", method: "POST", f: ra(429, 2*time.Second), want: 2 * time.Second, wantRetry: true},
		{name: "POST 503 with Retry-After 0", method: "POST", f: ra(503, 0), wantRetry: true},
		{name: "POST 429 without Retry-After", method: "POST", f: failure{status: 429}},
		{name: "GET 503 without Retry-After backs off", method: "GET", f: failure{status: 503}, want: 500 * time.Millisecond, wantRetry: true},
		{name: "GET backs off doubling", method: "GET", f: failure{status: 503}, attempt: 3, want: 2 * time.Second, wantRetry: true},
		{name: "DELETE after a dropped connection", method: "DELETE", want: 500 * time.Millisecond, wantRetry: true},
		{name: "POST after a dropped connection", method: "POST"},
		{name: "POST after a refused connection", method: "POST", f: failure{refused: true}, want: 500 * time.Millisecond, wantRetry: true},
		{name: "500 is not retried", method: "GET", f: ra(500, time.Second)},
		{name: "Retry-After over MaxDelay", method: "GET", f: ra(429, 11*time.Second)},
		{name: "Retry-After over the total", method: "GET", f: ra(429, 5*time.Second), waited: 8 * time.Second},
		{name: "backoff over the total", method: "GET", f: failure{status: 503}, waited: 11800 * time.Millisecond},
		{name: "attempts spent", method: "GET", f: ra(429, 0), attempt: 4},
		{name: "a body that cannot be sent again", method: "PUT", f: ra(429, 0), unreplay: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			attempt := max(tc.attempt, 1)
			got, ok := r.delay(attempt, tc.waited, tc.method, !tc.unreplay, tc.f)
			if got != tc.want || ok != tc.wantRetry {
				t.Errorf("delay = %v, %v; want %v, %v", got, ok, tc.want, tc.wantRetry)
			}
		})
	}
}

// FuzzParseRetryAfter: the header comes from the server (or a proxy in
// front of it): never a panic, never a negative wait, and whole seconds
// read as themselves.
func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"0", "120", " 7 ", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT",
		"Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994", "99999999999999999999", ""} {
		f.Add(s)
	}
	now := time.Date(2027, 1, 15, 8, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := parseRetryAfter(v, now)
		if d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v, negative", v, d)
		}
		if !ok && d != 0 {
			t.Fatalf("parseRetryAfter(%q) = %v without ok", v, d)
		}
	})
}
