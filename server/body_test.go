package server

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestOversizedBodyAnswered: a client that sends its whole body before it
// reads the answer, as Python's http.client does, gets the documented
// error (413, 401), not a reset connection; one that asks "Expect:
// 100-continue" gets the 413 without sending the body.
func TestOversizedBodyAnswered(t *testing.T) {
	const limit = 64 << 10
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = limit })
	addr := strings.TrimPrefix(e.hs.URL, "http://")
	big := bytes.Repeat([]byte("x"), 32<<20) // far over the limit and any socket buffer
	tests := []struct {
		name    string
		method  string
		path    string
		token   string
		chunked bool // no Content-Length: the limit is found while reading
		want    int
	}{
		{"run, Content-Length", "POST", "/v1/runs", tokenA, false, http.StatusRequestEntityTooLarge},
		{"run, chunked", "POST", "/v1/runs", tokenA, true, http.StatusRequestEntityTooLarge},
		{"sandbox, Content-Length", "POST", "/v1/sandboxes", tokenA, false, http.StatusRequestEntityTooLarge},
		{"no key", "POST", "/v1/runs", "", false, http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(60 * time.Second))
			var hdr bytes.Buffer
			fmt.Fprintf(&hdr, "%s %s HTTP/1.1\r\nHost: moat\r\nContent-Type: application/json\r\n", tc.method, tc.path)
			if tc.token != "" {
				fmt.Fprintf(&hdr, "Authorization: Bearer %s\r\n", tc.token)
			}
			if tc.chunked {
				hdr.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			} else {
				fmt.Fprintf(&hdr, "Content-Length: %d\r\n\r\n", len(big))
			}
			// The whole request first, as http.client does.
			if _, err := conn.Write(hdr.Bytes()); err != nil {
				t.Fatal(err)
			}
			body := big
			if tc.chunked {
				var b bytes.Buffer
				for off := 0; off < len(big); off += 1 << 20 {
					fmt.Fprintf(&b, "%x\r\n", 1<<20)
					b.Write(big[off : off+1<<20])
					b.WriteString("\r\n")
				}
				b.WriteString("0\r\n\r\n")
				body = b.Bytes()
			}
			if _, err := conn.Write(body); err != nil {
				t.Fatalf("sending the body: %v (the server closed the connection before reading it)", err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}

	t.Run("Expect: 100-continue", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "POST /v1/runs HTTP/1.1\r\nHost: moat\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", tokenA, len(big))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("reading the answer without sending the body: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d, want 413 before the body (not 100 Continue)", resp.StatusCode)
		}
	})
}
