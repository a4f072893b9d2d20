package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/moat-sandbox/moat/client"
)

// TestRefusedBodyNotSent: a server that refuses a large request before
// reading its body (over --max-body, a bad key) answers with its error,
// and the client asked first (Expect: 100-continue), so the body was
// never sent and the caller gets the API error, not a reset connection.
func TestRefusedBodyNotSent(t *testing.T) {
	var read atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > 1<<20 || r.ContentLength < 0 {
			// Answer and close without reading, as a server that
			// does not discard does.
			w.Header().Set("Connection", "close")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			io.WriteString(w, `{"error":{"code":"too_large","message":"the request body is over the limit","request_id":"r-1"}}`)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		read.Add(n)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	c, err := client.New(srv.URL, testKey)
	if err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 32<<20)
	tests := []struct {
		name string
		body func() (io.Reader, func() int) // the body, and how much of it was read
	}{
		{"known length", func() (io.Reader, func() int) {
			br := bytes.NewReader(big) // net/http learns its length
			return br, func() int { return len(big) - br.Len() }
		}},
		{"unknown length", func() (io.Reader, func() int) {
			cr := &countingReader{r: bytes.NewReader(big)}
			return cr, func() int { return int(cr.n.Load()) }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body, sent := tc.body()
			err := c.Sandbox("sb-1").Upload(context.Background(), "big.bin", body, 0o644)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Status != http.StatusRequestEntityTooLarge || ce.Code != "too_large" {
				t.Fatalf("err = %v, want the server's 413", err)
			}
			if n := sent(); n > 1<<20 {
				t.Errorf("the client sent %d bytes of a body the server refused before reading", n)
			}
		})
	}
	if err := c.Sandbox("sb-1").Upload(context.Background(), "small.txt", strings.NewReader("hello"), 0o644); err != nil {
		t.Fatalf("small upload: %v", err)
	}
	if n := read.Load(); n != 5 {
		t.Errorf("server read %d body bytes, want only the small upload's 5", n)
	}
}

type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}
