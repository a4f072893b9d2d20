package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/client"
)

// step is one answer of the fake API in the retry tests: a refusal with
// its status and Retry-After ("" for none), "ok" for the call's success,
// or "drop" for a connection closed without an answer.
type step struct {
	status     int
	retryAfter string
	drop       bool
}

var stepOK = step{}

// answering returns a handler answering the n-th request with steps[n]
// (the last step repeats).
func answering(t *testing.T, f **fakeAPI, steps ...step) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := len((*f).requests()) - 1
		s := steps[min(n, len(steps)-1)]
		switch {
		case s.drop:
			hj, ok := w.(http.Hijacker)
			if !ok {
				t.Error("the test server cannot hijack")
				return
			}
			conn, _, err := hj.Hijack()
			if err == nil {
				conn.Close()
			}
		case s.status != 0:
			if s.retryAfter != "" {
				w.Header().Set("Retry-After", s.retryAfter)
			}
			code := map[int]string{429: "quota_exceeded", 503: "unavailable"}[s.status]
			apiError(w, s.status, code, "try later", "")
		case r.URL.Path == "/v1/runs":
			reply(w, 200, `{"id":"r-1","pooled":false,"result":{"termination":"exited","exit_code":0}}`)
		case r.Method == http.MethodPut:
			reply(w, 201, `{"path":"a"}`)
		default:
			reply(w, 200, `{"id":"sb-1","state":"running"}`)
		}
	}
}

func TestRetry(t *testing.T) {
	fast := client.Retry{Attempts: 4, Backoff: 10 * time.Millisecond, MaxDelay: 5 * time.Second, MaxWait: 10 * time.Second}
	run := func(ctx context.Context, c *client.Client) error {
		_, err := c.Run(ctx, &client.RunRequest{Argv: []string{"true"}})
		return err
	}
	get := func(ctx context.Context, c *client.Client) error {
		_, err := c.GetSandbox(ctx, "sb-1")
		return err
	}
	upload := func(r func() io.Reader) func(ctx context.Context, c *client.Client) error {
		return func(ctx context.Context, c *client.Client) error {
			return c.Sandbox("sb-1").Upload(ctx, "a", r(), 0)
		}
	}
	ra0 := "0"
	tests := []struct {
		name       string
		steps      []step
		call       func(context.Context, *client.Client) error
		retry      client.Retry
		wantReqs   int
		wantStatus int  // the *Error's status; 0: the call succeeds
		wantErr    bool // a transport error
	}{
		{name: "POST 429 with Retry-After is retried", steps: []step{{status: 429, retryAfter: ra0}, stepOK}, call: run, retry: fast, wantReqs: 2},
		{name: "POST 503 with Retry-After is retried", steps: []step{{status: 503, retryAfter: ra0}, {status: 503, retryAfter: ra0}, stepOK}, call: run, retry: fast, wantReqs: 3},
		{name: "POST 429 without Retry-After is not", steps: []step{{status: 429}, stepOK}, call: run, retry: fast, wantReqs: 1, wantStatus: 429},
		{name: "GET 503 without Retry-After is retried", steps: []step{{status: 503}, stepOK}, call: get, retry: fast, wantReqs: 2},
		{name: "GET gives up after Attempts", steps: []step{{status: 429, retryAfter: ra0}}, call: get, retry: fast, wantReqs: 4, wantStatus: 429},
		{name: "500 is not retried", steps: []step{{status: 500, retryAfter: ra0}, stepOK}, call: get, retry: fast, wantReqs: 1, wantStatus: 500},
		{name: "retrying disabled", steps: []step{{status: 429, retryAfter: ra0}, stepOK}, call: run, retry: client.Retry{Attempts: 1}, wantReqs: 1, wantStatus: 429},
		{name: "an HTTP-date Retry-After", steps: []step{{status: 429, retryAfter: time.Now().UTC().Format(http.TimeFormat)}, stepOK}, call: run, retry: fast, wantReqs: 2},
		{name: "a Retry-After longer than MaxDelay is not waited for", steps: []step{{status: 429, retryAfter: "3600"}, stepOK}, call: run, retry: fast, wantReqs: 1, wantStatus: 429},
		{name: "a dropped POST is not sent again", steps: []step{{drop: true}, stepOK}, call: run, retry: fast, wantReqs: 1, wantErr: true},
		{name: "a dropped GET is", steps: []step{{drop: true}, stepOK}, call: get, retry: fast, wantReqs: 2},
		{name: "an upload from a bytes.Reader is retried", steps: []step{{status: 503, retryAfter: ra0}, stepOK},
			call: upload(func() io.Reader { return bytes.NewReader([]byte("x")) }), retry: fast, wantReqs: 2},
		{name: "an upload from another reader is not", steps: []step{{status: 503, retryAfter: ra0}, stepOK},
			call: upload(func() io.Reader { return io.MultiReader(strings.NewReader("x")) }), retry: fast, wantReqs: 1, wantStatus: 503},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f *fakeAPI
			f = newFakeAPI(t, answering(t, &f, tc.steps...))
			err := tc.call(context.Background(), f.client(t, client.WithRetry(tc.retry)))
			var apiErr *client.Error
			switch {
			case tc.wantStatus != 0:
				if !errors.As(err, &apiErr) || apiErr.Status != tc.wantStatus {
					t.Fatalf("error = %v, want a %d", err, tc.wantStatus)
				}
			case tc.wantErr:
				if err == nil || errors.As(err, &apiErr) {
					t.Fatalf("error = %v, want a transport error", err)
				}
			case err != nil:
				t.Fatalf("error = %v, want none", err)
			}
			reqs := f.requests()
			if len(reqs) != tc.wantReqs {
				t.Fatalf("the server got %d requests, want %d", len(reqs), tc.wantReqs)
			}
			for i, r := range reqs {
				if !bytes.Equal(r.Body, reqs[0].Body) {
					t.Errorf("try %d sent body %q, the first %q", i+1, r.Body, reqs[0].Body)
				}
			}
		})
	}
}

// TestRetryAfterWaits: the wait is the server's Retry-After; a refusal
// not waited for says in RetryAfter how long the server asked for; a
// context that ends during the wait ends the call with both errors.
func TestRetryAfterWaits(t *testing.T) {
	var f *fakeAPI
	f = newFakeAPI(t, answering(t, &f, step{status: 429, retryAfter: "1"}, stepOK))
	start := time.Now()
	if _, err := f.client(t, client.WithRetry(client.Retry{Attempts: 2, MaxDelay: 5 * time.Second, MaxWait: 5 * time.Second})).
		Run(context.Background(), &client.RunRequest{Argv: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 950*time.Millisecond {
		t.Errorf("retried after %v, before the server's Retry-After: 1", el)
	}

	f = newFakeAPI(t, answering(t, &f, step{status: 503, retryAfter: "120"}))
	_, err := f.client(t).Run(context.Background(), &client.RunRequest{Argv: []string{"true"}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.RetryAfter != 120*time.Second {
		t.Errorf("error = %#v, want a 503 with RetryAfter 2m0s", err)
	}

	f = newFakeAPI(t, answering(t, &f, step{status: 429, retryAfter: "5"}))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = f.client(t).Run(ctx, &client.RunRequest{Argv: []string{"true"}})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &apiErr) || apiErr.Status != 429 {
		t.Errorf("error = %v, want the 429 and the context's deadline", err)
	}
	if n := len(f.requests()); n != 1 {
		t.Errorf("the server got %d requests, want 1", n)
	}
}

// TestRetryNotAfterTimeout: the caller's timeout bounds the call, so a
// GET that timed out is not sent again.
func TestRetryNotAfterTimeout(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(600 * time.Millisecond)
		reply(w, 200, `{"id":"sb-1","state":"running"}`)
	})
	c := f.client(t, client.WithHTTPClient(&http.Client{Timeout: 200 * time.Millisecond}), client.WithRetry(client.Retry{Attempts: 4, MaxDelay: time.Second, MaxWait: time.Second}))
	if _, err := c.GetSandbox(context.Background(), "sb-1"); err == nil {
		t.Fatal("no error, want the client's timeout")
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(f.requests()); n != 1 {
		t.Errorf("the server got %d requests, want 1", n)
	}
}

// TestRetryRefusedConnection: nothing was sent, so even a POST is tried
// again.
func TestRetryRefusedConnection(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	c, err := client.New("http://"+addr, testKey, client.WithRetry(client.Retry{Attempts: 3, Backoff: 100 * time.Millisecond, MaxDelay: time.Second, MaxWait: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Run(context.Background(), &client.RunRequest{Argv: []string{"true"}})
	if err == nil || !strings.Contains(err.Error(), "POST /v1/runs") {
		t.Fatalf("error = %v, want the refused connection, naming the call", err)
	}
	if el := time.Since(start); el < 280*time.Millisecond {
		t.Errorf("gave up after %v, before two backoffs (100ms + 200ms)", el)
	}
}
