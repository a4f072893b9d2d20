// Package client is the Go SDK for the HTTP API of `moat serve`
// (docs/API.md): one-shot runs, long-lived sandboxes and their commands,
// live output as a resumable event stream, and workspace files.
//
// A Client holds only the server's address, an API key and an
// *http.Client; it is safe for concurrent use. Every call takes a
// context.Context first: its deadline and cancellation are how calls time
// out and how a stream is stopped.
//
// A program that failed (non-zero exit, timeout, OOM kill) is not an error
// here, as it is not one for the server: it is a result.Result with its
// Termination. An error is either an *Error (the server refused the call,
// decoded from its error JSON; use errors.As) or a transport failure,
// wrapped with the method and path of the call. A 429 or 503 is retried
// after its Retry-After, and idempotent calls after a dropped connection,
// as the Client's Retry says (WithRetry).
//
// This package must never run anything locally or touch the host's files
// beyond the readers and writers its caller hands it: it only speaks HTTP.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/manifest"
)

// Client calls one Moat server with one API key. Create it with New.
type Client struct {
	base      *url.URL
	key       string
	hc        *http.Client
	userAgent string
	// retries and retryDelay govern EventStream reconnection.
	retries    int
	retryDelay time.Duration
	// retry governs sending a refused or failed call again (retry.go).
	retry Retry
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient makes the Client send its requests through hc (for
// proxies, custom TLS roots or a test server's client). The default is a
// client without a timeout: bound calls with their context instead, as a
// waiting exec or an event stream legitimately lasts long. nil keeps the
// default.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header of every request (default
// "moat-go-client").
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// WithReconnect sets how an EventStream resumes after its connection
// drops: up to attempts reconnections in a row without receiving an event
// (0 disables resuming), the first after delay, each later one after twice
// the previous delay, at most 10s. The default is 5 attempts from 250ms. A
// server's SSE "retry:" field replaces the starting delay.
func WithReconnect(attempts int, delay time.Duration) Option {
	return func(c *Client) {
		c.retries = max(attempts, 0)
		if delay > 0 {
			c.retryDelay = delay
		}
	}
}

// Defaults of New.
const (
	defaultRetries    = 5
	defaultRetryDelay = 250 * time.Millisecond
	maxRetryDelay     = 10 * time.Second
)

// New returns a Client for the server at baseURL (e.g.
// "http://127.0.0.1:7070"; a path prefix such as "https://host/moat" is
// kept) that authenticates with apiKey, sent as "Authorization: Bearer
// KEY". An empty apiKey sends no credentials, which only Health accepts.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("moat client: server URL %q: want http://HOST[:PORT] or https://HOST[:PORT]", baseURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("moat client: server URL %q: must not carry a query, fragment or user info (pass the API key separately)", baseURL)
	}
	if strings.ContainsAny(apiKey, "\r\n") {
		return nil, errors.New("moat client: the API key contains a line break")
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	c := &Client{
		base:       u,
		key:        apiKey,
		hc:         &http.Client{},
		userAgent:  "moat-go-client",
		retries:    defaultRetries,
		retryDelay: defaultRetryDelay,
		retry:      DefaultRetry,
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// Health is the answer of GET /v1/health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version"`
}

// Health asks whether the server is up. It needs no API key.
func (c *Client) Health(ctx context.Context) (*Health, error) {
	var h Health
	if err := c.doJSON(ctx, http.MethodGet, "/v1/health", nil, nil, &h); err != nil {
		return nil, err
	}
	return &h, nil
}

// Run sends a one-shot run (POST /v1/runs) and waits for its result. The
// program's own failure is in the returned Result, not in the error.
func (c *Client) Run(ctx context.Context, req *RunRequest) (*RunResponse, error) {
	if req == nil {
		return nil, errors.New("moat client: Run: nil request")
	}
	body, err := req.wire()
	if err != nil {
		return nil, fmt.Errorf("moat client: POST /v1/runs: %w", err)
	}
	var resp RunResponse
	if err := c.doJSON(ctx, http.MethodPost, "/v1/runs", nil, body, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// ListApprovals returns the key's runs and commands held for a person's
// approval (GET /v1/approvals).
func (c *Client) ListApprovals(ctx context.Context) ([]*Approval, error) {
	var resp struct {
		Approvals []*Approval `json:"approvals"`
	}
	if err := c.doJSON(ctx, http.MethodGet, "/v1/approvals", nil, nil, &resp); err != nil {
		return nil, err
	}
	return resp.Approvals, nil
}

// DecideApproval approves or denies a held run or command (POST
// /v1/approvals/{id}); reason goes to the audit log. An approved run
// runs before this returns (Outcome.Run has its result); an approved
// command is started and returned running (Outcome.Exec).
func (c *Client) DecideApproval(ctx context.Context, id string, approve bool, reason string) (*ApprovalOutcome, error) {
	if id == "" {
		return nil, errors.New("moat client: DecideApproval: empty approval id")
	}
	body, err := json.Marshal(struct {
		Approve bool   `json:"approve"`
		Reason  string `json:"reason,omitempty"`
	}{approve, reason})
	if err != nil {
		return nil, err
	}
	var out ApprovalOutcome
	if err := c.doJSON(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(id), nil, body, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetRun returns a finished run again (GET /v1/runs/{id}), as long as the
// server still keeps it.
func (c *Client) GetRun(ctx context.Context, id string) (*RunResponse, error) {
	var resp RunResponse
	if err := c.doJSON(ctx, http.MethodGet, "/v1/runs/"+url.PathEscape(id), nil, nil, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// CreateSandbox creates a sandbox that lives across many commands (POST
// /v1/sandboxes) and returns a handle to it. Delete it when done; the
// server also destroys it when its TTL passes.
func (c *Client) CreateSandbox(ctx context.Context, req *SandboxRequest) (*Sandbox, error) {
	if req == nil {
		req = &SandboxRequest{}
	}
	body, err := req.wire()
	if err != nil {
		return nil, fmt.Errorf("moat client: POST /v1/sandboxes: %w", err)
	}
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodPost, "/v1/sandboxes", nil, body, &sb); err != nil {
		return nil, err
	}
	sb.c = c
	return &sb, nil
}

// ListSandboxes returns the caller's sandboxes (GET /v1/sandboxes).
func (c *Client) ListSandboxes(ctx context.Context) ([]*Sandbox, error) {
	var list []*Sandbox
	if err := c.doJSON(ctx, http.MethodGet, "/v1/sandboxes", nil, nil, listOf(&list, "sandboxes", "items")); err != nil {
		return nil, err
	}
	for _, sb := range list {
		sb.c = c
	}
	return list, nil
}

// GetSandbox returns the sandbox id (GET /v1/sandboxes/{id}). Another
// key's sandbox is an *Error with Status 404, as if it did not exist.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodGet, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	sb.c = c
	return &sb, nil
}

// Sandbox returns a handle to the sandbox id without asking the server;
// only its ID is set. Use it to act on a sandbox created elsewhere.
func (c *Client) Sandbox(id string) *Sandbox {
	return &Sandbox{ID: id, c: c}
}

// DeleteSandbox destroys the sandbox id now (DELETE /v1/sandboxes/{id})
// and returns its final state ("deleted").
func (c *Client) DeleteSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.doJSON(ctx, http.MethodDelete, sandboxPath(id), nil, nil, &sb); err != nil {
		return nil, err
	}
	sb.c = c
	return &sb, nil
}

// SetTimeout makes the sandbox id expire ttl from now (POST
// /v1/sandboxes/{id}/timeout) and returns the sandbox with its new
// ExpiresAt. If the server answers without a body, the sandbox is read
// back with GetSandbox.
func (c *Client) SetTimeout(ctx context.Context, id string, ttl time.Duration) (*Sandbox, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("moat client: SetTimeout: ttl %v: want a positive duration", ttl)
	}
	body, _ := json.Marshal(map[string]string{"ttl": durationString(ttl)})
	sb := Sandbox{}
	if err := c.doJSON(ctx, http.MethodPost, sandboxPath(id)+"/timeout", nil, body, &sb); err != nil {
		return nil, err
	}
	if sb.ID == "" {
		return c.GetSandbox(ctx, id)
	}
	sb.c = c
	return &sb, nil
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }

// request is one call's description for do.
type request struct {
	method, path string
	query        url.Values
	body         io.Reader
	contentType  string
	header       http.Header
}

// newRequest builds the HTTP request of r, with the credentials.
func (c *Client) newRequest(ctx context.Context, r request) (*http.Request, error) {
	// r.path is already escaped (IDs go through url.PathEscape), so an ID
	// holding "/" or "?" stays one path segment.
	u := *c.base
	u.RawPath = c.base.EscapedPath() + r.path
	var err error
	if u.Path, err = url.PathUnescape(u.RawPath); err != nil {
		return nil, err
	}
	if len(r.query) > 0 {
		u.RawQuery = r.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u.String(), r.body)
	if err != nil {
		return nil, err
	}
	for k, vs := range r.header {
		req.Header[k] = vs
	}
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	if r.body != nil && (req.ContentLength > expectContinueBytes || req.ContentLength <= 0 && req.Body != http.NoBody) {
		// Ask before sending a large body: a request the server refuses
		// (over --max-body, a bad key) is answered before the body is
		// sent, instead of the server reading and discarding it or the
		// connection being reset under a body it stopped reading.
		// Go's default Transport waits up to its ExpectContinueTimeout
		// (1s) for the server's "100 Continue".
		req.Header.Set("Expect", "100-continue")
	}
	return req, nil
}

// expectContinueBytes is the body size above which a request asks
// "Expect: 100-continue" (bodies of unknown size always do): below it,
// the round trip costs more than sending the body for nothing would.
const expectContinueBytes = 64 << 10

// do sends r and returns the response when its status is 2xx, trying it
// again as c.retry allows (retry.go). Any other status is decoded into an
// *Error; a transport failure is wrapped with the method and path.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	req, err := c.newRequest(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("moat client: %s %s: %w", r.method, r.path, err)
	}
	// http.NewRequest sets GetBody for the bodies it can read again
	// (*bytes.Reader, *bytes.Buffer, *strings.Reader); any other reader
	// is consumed by the first try.
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	var waited time.Duration
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			req = req.Clone(ctx)
			if req.GetBody != nil {
				if req.Body, err = req.GetBody(); err != nil {
					return nil, fmt.Errorf("moat client: %s %s: %w", r.method, r.path, err)
				}
			}
		}
		var last error
		var f failure
		resp, err := c.hc.Do(req)
		switch {
		case err != nil:
			last = fmt.Errorf("moat client: %s %s: %w", r.method, r.path, err)
			var final bool
			if f, final = transportFailure(ctx, err); final {
				return nil, last
			}
		case resp.StatusCode < 200 || resp.StatusCode > 299:
			last = decodeError(r.method, r.path, resp)
			resp.Body.Close()
			f.status = resp.StatusCode
			f.retryAfter, f.hasRetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
		default:
			return resp, nil
		}
		d, ok := c.retry.delay(attempt, waited, r.method, replayable, f)
		if !ok {
			return nil, last
		}
		if err := wait(ctx, d); err != nil {
			return nil, gaveUp(last, err)
		}
		waited += d
	}
}

// doJSON sends body (JSON, or nothing when nil) and decodes the answer
// into out, unless the answer has no body.
func (c *Client) doJSON(ctx context.Context, method, path string, query url.Values, body []byte, out any) error {
	r := request{method: method, path: path, query: query, header: http.Header{"Accept": {"application/json"}}}
	if body != nil {
		r.body = bytes.NewReader(body)
		r.contentType = "application/json"
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return decodeBody(method, path, resp.Body, out)
}

// decodeBody decodes one JSON value from body into out; an empty body
// leaves out as it is.
func decodeBody(method, path string, body io.Reader, out any) error {
	if out == nil {
		_, err := io.Copy(io.Discard, body)
		return wrapRead(method, path, err)
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return wrapRead(method, path, err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("moat client: %s %s: decode the answer: %w", method, path, err)
	}
	return nil
}

func wrapRead(method, path string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("moat client: %s %s: read the answer: %w", method, path, err)
}

// listOf decodes a list answer that is either a JSON array or an object
// holding the array under one of keys: docs/API.md does not fix which.
func listOf[T any](out *[]T, keys ...string) json.Unmarshaler {
	return &listDecoder[T]{keys: keys, out: out}
}

type listDecoder[T any] struct {
	keys []string
	out  *[]T
}

func (d *listDecoder[T]) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return json.Unmarshal(b, d.out)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(b, &obj); err != nil {
		return err
	}
	for _, k := range d.keys {
		if raw, ok := obj[k]; ok {
			return json.Unmarshal(raw, d.out)
		}
	}
	return fmt.Errorf("the answer is an object without a %q list", d.keys[0])
}

// durationString renders d as the API writes durations ("10m", "1h30m",
// "500ms"), the manifest's form.
func durationString(d time.Duration) string { return manifest.Duration(d).String() }
