package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/client"
)

const eventsPath = "/v1/sandboxes/sb-1/execs/e-1/events"

// sseHeader starts an event stream answer.
func sseHeader(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
}

// got is what a test read from a stream.
type got struct {
	ID   int64
	Type string
	Data string
	Exit int // exit code of the exit event's Exec, -1 otherwise
}

func collect(t *testing.T, st *client.EventStream) []got {
	t.Helper()
	var out []got
	for st.Next() {
		ev := st.Event()
		g := got{ID: ev.ID, Type: ev.Type, Data: string(ev.Data), Exit: -1}
		if ev.Exec != nil && ev.Exec.Result != nil {
			g.Exit = ev.Exec.Result.ExitCode
		}
		if ev.Type != client.EventStdout && ev.Type != client.EventStderr && ev.Type != client.EventExit {
			g.Data = string(ev.Raw)
		}
		out = append(out, g)
	}
	return out
}

// TestEventParsing feeds raw text/event-stream bodies to Events and
// checks the events that come out.
func TestEventParsing(t *testing.T) {
	const exit = "id: 9\nevent: exit\ndata: {\"id\": \"e-1\", \"state\": \"exited\", \"result\": {\"exit_code\": 3}}\n\n"
	tests := []struct {
		name string
		body string
		want []got
	}{
		{
			name: "stdout then exit",
			body: "id: 1\nevent: stdout\ndata: {\"data\":\"hello\\n\",\"encoding\":\"utf-8\"}\n\n" + exit,
			want: []got{{1, "stdout", "hello\n", -1}, {9, "exit", "", 3}},
		},
		{
			name: "multi-line data is joined with newlines",
			body: "id: 1\nevent: stdout\ndata: {\"data\":\ndata: \"a\\nb\",\ndata:  \"encoding\": \"utf-8\"}\n\n" +
				"id: 2\nevent: exit\ndata: {\"id\": \"e-1\",\ndata:  \"state\": \"exited\",\ndata:  \"result\": {\"exit_code\": 0}}\n\n",
			want: []got{{1, "stdout", "a\nb", -1}, {2, "exit", "", 0}},
		},
		{
			name: "CRLF line endings",
			body: strings.ReplaceAll("id: 1\nevent: stderr\ndata: {\"data\":\"oops\",\"encoding\":\"utf-8\"}\n\n"+exit, "\n", "\r\n"),
			want: []got{{1, "stderr", "oops", -1}, {9, "exit", "", 3}},
		},
		{
			name: "CR line endings",
			body: strings.ReplaceAll("id: 1\nevent: stdout\ndata: {\"data\":\"x\"}\n\n"+exit, "\n", "\r"),
			want: []got{{1, "stdout", "x", -1}, {9, "exit", "", 3}},
		},
		{
			name: "comments, a BOM, no space after the colon, unknown fields",
			body: "\xef\xbb\xbf: keep-alive\n\nid:1\nevent:stdout\nfoo: bar\ndata:{\"data\":\"y\"}\n\n: ping\n\n" + exit,
			want: []got{{1, "stdout", "y", -1}, {9, "exit", "", 3}},
		},
		{
			name: "base64 output",
			body: "id: 1\nevent: stdout\ndata: {\"data\":\"AP8K\",\"encoding\":\"base64\"}\n\n" + exit,
			want: []got{{1, "stdout", "\x00\xff\n", -1}, {9, "exit", "", 3}},
		},
		{
			name: "an event type the client does not know is passed on raw",
			body: "id: 1\nevent: progress\ndata: {\"pct\": 50}\n\n" + exit,
			want: []got{{1, "progress", `{"pct": 50}`, -1}, {9, "exit", "", 3}},
		},
		{
			name: "blocks without data and a retry field dispatch nothing",
			body: "retry: 10\n\nid: 1\n\nevent: stdout\n\nid: 2\nevent: stdout\ndata: {\"data\":\"z\"}\n\n" + exit,
			want: []got{{2, "stdout", "z", -1}, {9, "exit", "", 3}},
		},
		{
			name: "nothing is read after the exit event",
			body: exit + "id: 10\nevent: stdout\ndata: {\"data\":\"late\"}\n\n",
			want: []got{{9, "exit", "", 3}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				sseHeader(w)
				io.WriteString(w, tc.body)
			})
			st, err := f.client(t, client.WithReconnect(0, 0)).Sandbox("sb-1").Events(context.Background(), "e-1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if evs := collect(t, st); !reflect.DeepEqual(evs, tc.want) {
				t.Errorf("events %+v\nwant   %+v", evs, tc.want)
			}
			if err := st.Err(); err != nil {
				t.Errorf("Err = %v", err)
			}
			req := f.last(t)
			if req.Path != eventsPath || req.Header.Get("Accept") != "text/event-stream" || req.Header.Get("Authorization") != "Bearer "+testKey {
				t.Errorf("request %s %v", req.Path, req.Header)
			}
		})
	}
}

// TestEventParsingErrors checks streams the client must refuse.
func TestEventParsingErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
		want string
	}{
		{"output data that is not JSON", "id: 1\nevent: stdout\ndata: hello\n\n", "decode stdout data"},
		{"bad base64", "id: 1\nevent: stderr\ndata: {\"data\":\"!!\",\"encoding\":\"base64\"}\n\n", "decode stderr data"},
		{"unknown encoding", "id: 1\nevent: stdout\ndata: {\"data\":\"x\",\"encoding\":\"utf-16\"}\n\n", "unknown encoding"},
		{"exit that is not an Exec", "id: 1\nevent: exit\ndata: [1]\n\n", "decode the exit event"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				sseHeader(w)
				io.WriteString(w, tc.body)
			})
			st, err := f.client(t).Sandbox("sb-1").Events(context.Background(), "e-1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if st.Next() {
				t.Fatalf("Next delivered %+v", st.Event())
			}
			if err := st.Err(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// stream is the fake API's side of one exec's events: n output events
// then the exit, numbered from 1, and a plan of how each connection is
// cut short.
type stream struct {
	n int
	// cuts[i] tells connection i where to stop: after that many events of
	// this connection, then cutMode. A connection beyond cuts sends all.
	cuts []int
	// mode is how a connection ends early: "abort" (the TCP connection
	// breaks), "eof" (the answer ends cleanly), "mid-event" (half an
	// event, then abort), "mid-line" (half a line, then abort).
	mode string
	// ignoreResume makes the server replay from the first event, to
	// check that the client drops what it already delivered.
	ignoreResume bool

	mu      sync.Mutex
	resumes []string // the Last-Event-ID of each connection ("" when absent)
	afters  []string // the ?after= of each connection
}

func (s *stream) event(id int) string {
	if id > s.n {
		return fmt.Sprintf("id: %d\nevent: exit\ndata: {\"id\":\"e-1\",\"sandbox_id\":\"sb-1\",\"state\":\"exited\",\"result\":{\"exit_code\":7}}\n\n", id)
	}
	typ := "stdout"
	if id%3 == 0 {
		typ = "stderr"
	}
	// Each event is two data lines, so a cut can fall inside one.
	return fmt.Sprintf("id: %d\nevent: %s\ndata: {\"data\": \"line %d\\n\",\ndata:  \"encoding\": \"utf-8\"}\n\n", id, typ, id)
}

func (s *stream) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	conn := len(s.resumes)
	s.resumes = append(s.resumes, r.Header.Get("Last-Event-ID"))
	s.afters = append(s.afters, r.URL.Query().Get("after"))
	s.mu.Unlock()
	after := 0
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		after, _ = strconv.Atoi(v)
	} else if v := r.URL.Query().Get("after"); v != "" {
		after, _ = strconv.Atoi(v)
	}
	if s.ignoreResume {
		after = 0
	}
	limit := -1
	if conn < len(s.cuts) {
		limit = s.cuts[conn]
	}
	sseHeader(w)
	fl := w.(http.Flusher)
	sent := 0
	for id := after + 1; id <= s.n+1; id++ {
		if sent == limit {
			switch s.mode {
			case "mid-event":
				ev := s.event(id)
				io.WriteString(w, ev[:strings.Index(ev, "data:")+20])
			case "mid-line":
				io.WriteString(w, s.event(id)[:5])
			}
			fl.Flush()
			if s.mode == "eof" {
				return
			}
			// Breaks the connection without ending the chunked body.
			panic(http.ErrAbortHandler)
		}
		io.WriteString(w, s.event(id))
		fl.Flush()
		sent++
	}
}

func (s *stream) wantEvents(from int) []got {
	var out []got
	for id := from + 1; id <= s.n+1; id++ {
		switch {
		case id > s.n:
			out = append(out, got{int64(id), "exit", "", 7})
		case id%3 == 0:
			out = append(out, got{int64(id), "stderr", fmt.Sprintf("line %d\n", id), -1})
		default:
			out = append(out, got{int64(id), "stdout", fmt.Sprintf("line %d\n", id), -1})
		}
	}
	return out
}

// TestEventsResume cuts the stream in various ways and checks that every
// event arrives exactly once, in order, and that each reconnection asks
// for the events after the last one delivered.
func TestEventsResume(t *testing.T) {
	tests := []struct {
		name        string
		s           *stream
		after       int64
		wantResumes []string
	}{
		{"uncut", &stream{n: 5}, 0, []string{""}},
		{"cut between events", &stream{n: 5, cuts: []int{2}, mode: "abort"}, 0, []string{"", "2"}},
		{"cut inside an event", &stream{n: 5, cuts: []int{2}, mode: "mid-event"}, 0, []string{"", "2"}},
		{"cut inside a line", &stream{n: 5, cuts: []int{3}, mode: "mid-line"}, 0, []string{"", "3"}},
		{"answer ends before the exit", &stream{n: 5, cuts: []int{4}, mode: "eof"}, 0, []string{"", "4"}},
		{"cut before the first event", &stream{n: 3, cuts: []int{0}, mode: "abort"}, 0, []string{"", ""}},
		{"cut before the exit event", &stream{n: 3, cuts: []int{3}, mode: "mid-event"}, 0, []string{"", "3"}},
		{"cut every two events", &stream{n: 7, cuts: []int{2, 2, 2, 2}, mode: "mid-event"}, 0, []string{"", "2", "4", "6"}},
		{"a reconnection without progress", &stream{n: 4, cuts: []int{2, 0, 1}, mode: "abort"}, 0, []string{"", "2", "2", "3"}},
		{"a server that replays from the start", &stream{n: 5, cuts: []int{3}, mode: "abort", ignoreResume: true}, 0, []string{"", "3"}},
		{"start after an event", &stream{n: 5, cuts: []int{1}, mode: "abort"}, 2, []string{"2", "3"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAPI(t, tc.s.serve)
			c := f.client(t, client.WithReconnect(3, time.Millisecond))
			st, err := c.Sandbox("sb-1").Events(context.Background(), "e-1", tc.after)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			evs := collect(t, st)
			if err := st.Err(); err != nil {
				t.Fatalf("Err = %v", err)
			}
			if want := tc.s.wantEvents(int(tc.after)); !reflect.DeepEqual(evs, want) {
				t.Errorf("events %+v\nwant   %+v", evs, want)
			}
			if got, want := st.LastID(), int64(tc.s.n+1); got != want {
				t.Errorf("LastID = %d, want %d", got, want)
			}
			tc.s.mu.Lock()
			defer tc.s.mu.Unlock()
			if !reflect.DeepEqual(tc.s.resumes, tc.wantResumes) {
				t.Errorf("Last-Event-ID of each connection %q, want %q", tc.s.resumes, tc.wantResumes)
			}
			// ?after= always says the same as Last-Event-ID.
			if !reflect.DeepEqual(tc.s.afters, tc.s.resumes) {
				t.Errorf("?after= of each connection %q, Last-Event-ID %q", tc.s.afters, tc.s.resumes)
			}
		})
	}
}

// TestEventsGiveUp checks that reconnection stops after the configured
// attempts when no event comes, and at once on a refusal.
func TestEventsGiveUp(t *testing.T) {
	tests := []struct {
		name      string
		retries   int
		handle    func(conn int, w http.ResponseWriter, r *http.Request)
		wantConns int
		wantEvs   int
		wantErr   string
		wantAPI   int // status of the *client.Error, 0 for none
	}{
		{
			name:    "always cut",
			retries: 3,
			handle: func(conn int, w http.ResponseWriter, r *http.Request) {
				sseHeader(w)
				if conn == 0 {
					io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"a\"}\n\n")
				}
				w.(http.Flusher).Flush()
				panic(http.ErrAbortHandler)
			},
			wantConns: 4, wantEvs: 1, wantErr: "3 reconnection(s) failed",
		},
		{
			name:    "resuming disabled",
			retries: 0,
			handle: func(conn int, w http.ResponseWriter, r *http.Request) {
				sseHeader(w)
				io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"a\"}\n\n")
			},
			wantConns: 1, wantEvs: 1, wantErr: "reconnecting is disabled",
		},
		{
			name:    "the exec is gone",
			retries: 3,
			handle: func(conn int, w http.ResponseWriter, r *http.Request) {
				if conn > 0 {
					apiError(w, 404, "not_found", "no exec e-1", "")
					return
				}
				sseHeader(w)
				io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"a\"}\n\n")
			},
			wantConns: 2, wantEvs: 1, wantAPI: 404,
		},
		{
			name:    "a passing 503 is retried",
			retries: 3,
			handle: func(conn int, w http.ResponseWriter, r *http.Request) {
				switch conn {
				case 0:
					sseHeader(w)
					io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"a\"}\n\n")
				case 1:
					apiError(w, 503, "unavailable", "restarting", "")
				default:
					sseHeader(w)
					io.WriteString(w, "id: 2\nevent: exit\ndata: {\"id\":\"e-1\",\"state\":\"exited\",\"result\":{\"exit_code\":0}}\n\n")
				}
			},
			wantConns: 3, wantEvs: 2,
		},
		{
			name:    "an answer that is not an event stream",
			retries: 3,
			handle: func(conn int, w http.ResponseWriter, r *http.Request) {
				if conn > 0 {
					reply(w, 200, `{"id": "e-1"}`)
					return
				}
				sseHeader(w)
				io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"a\"}\n\n")
			},
			wantConns: 2, wantEvs: 1, wantErr: "not an event stream", wantAPI: 200,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			conns := 0
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				n := conns
				conns++
				mu.Unlock()
				tc.handle(n, w, r)
			})
			st, err := f.client(t, client.WithReconnect(tc.retries, time.Millisecond)).Sandbox("sb-1").Events(context.Background(), "e-1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			evs := collect(t, st)
			if len(evs) != tc.wantEvs {
				t.Errorf("%d events, want %d: %+v", len(evs), tc.wantEvs, evs)
			}
			err = st.Err()
			if tc.wantErr == "" && tc.wantAPI == 0 {
				if err != nil {
					t.Errorf("Err = %v", err)
				}
			} else if err == nil {
				t.Fatal("Err = nil, want an error")
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Err = %v, want it to mention %q", err, tc.wantErr)
			}
			var apiErr *client.Error
			if tc.wantAPI != 0 && (!errors.As(err, &apiErr) || apiErr.Status != tc.wantAPI) {
				t.Errorf("Err = %v, want a *client.Error with status %d", err, tc.wantAPI)
			}
			mu.Lock()
			defer mu.Unlock()
			if conns != tc.wantConns {
				t.Errorf("%d connections, want %d", conns, tc.wantConns)
			}
		})
	}
}

// TestEventsRefused checks that opening a stream reports the API's error.
func TestEventsRefused(t *testing.T) {
	f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) { apiError(w, 404, "not_found", "no exec e-1", "") })
	_, err := f.client(t).Sandbox("sb-1").Events(context.Background(), "e-1", 0)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != client.CodeNotFound || apiErr.Path != eventsPath {
		t.Errorf("err = %v", err)
	}
}

// TestEventsStop checks the two ways to stop a stream that waits for the
// next event: cancelling its context (an error) and Close (not one).
func TestEventsStop(t *testing.T) {
	tests := []struct {
		name    string
		stop    func(cancel context.CancelFunc, st *client.EventStream)
		wantErr error
	}{
		{"context cancelled", func(cancel context.CancelFunc, st *client.EventStream) { cancel() }, context.Canceled},
		{"closed from another goroutine", func(cancel context.CancelFunc, st *client.EventStream) { st.Close() }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			t.Cleanup(func() { close(release) })
			f := newFakeAPI(t, func(w http.ResponseWriter, r *http.Request) {
				sseHeader(w)
				io.WriteString(w, "id: 1\nevent: stdout\ndata: {\"data\":\"first\"}\n\n")
				w.(http.Flusher).Flush()
				select { // a command that prints nothing more for now
				case <-r.Context().Done():
				case <-release:
				}
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := f.client(t, client.WithReconnect(3, time.Millisecond)).Sandbox("sb-1").Events(ctx, "e-1", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if !st.Next() || string(st.Event().Data) != "first" {
				t.Fatalf("first event: %+v, %v", st.Event(), st.Err())
			}
			time.AfterFunc(50*time.Millisecond, func() { tc.stop(cancel, st) })
			done := make(chan bool)
			go func() { done <- st.Next() }()
			select {
			case more := <-done:
				if more {
					t.Errorf("Next delivered %+v after the stop", st.Event())
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Next did not return after the stop")
			}
			if err := st.Err(); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Errorf("Err = %v, want %v", err, tc.wantErr)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d connections, want 1 (no reconnection after a stop)", n)
			}
		})
	}
}

// TestStream checks Sandbox.Stream: output to the writers, through a cut,
// and the finished Exec.
func TestStream(t *testing.T) {
	s := &stream{n: 6, cuts: []int{2, 3}, mode: "mid-event"}
	f := newFakeAPI(t, s.serve)
	var stdout, stderr bytes.Buffer
	e, err := f.client(t, client.WithReconnect(3, time.Millisecond)).Sandbox("sb-1").Stream(context.Background(), "e-1", &stdout, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != "e-1" || e.Result == nil || e.Result.ExitCode != 7 {
		t.Errorf("exec = %+v", e)
	}
	if want := "line 1\nline 2\nline 4\nline 5\n"; stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
	if want := "line 3\nline 6\n"; stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}
