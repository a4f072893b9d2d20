package mcp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/server"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// BenchmarkRunCode is issue 23 §3's figure on the fake backend (so that
// only the front doors differ): a warm run_code through MCP, over
// Streamable HTTP and over stdio's framing (in memory), against the same
// code through POST /v1/runs, all on one service in the same run. The
// MCP layer's cost is mcp-http's ns/op minus v1's.
func BenchmarkRunCode(b *testing.B) {
	be := &servicetest.Backend{Dir: b.TempDir()}
	au := servicetest.NewAuditor()
	au.AddKey(tokenA, keyA)
	api, err := server.New(server.Config{Backend: be, Auditor: au, Logger: logger(), KeepRuns: 10})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { api.Shutdown(context.Background()) })
	ms, err := New(Config{Service: api.Service(), Keys: au, Logger: logger()})
	if err != nil {
		b.Fatal(err)
	}
	mh, err := ms.Handler()
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mh)
	mux.Handle("/", api.Handler())
	hs := httptest.NewServer(mux)
	b.Cleanup(hs.Close)

	args := map[string]any{"language": "python", "code": "print(1+1)"}
	b.Run("v1", func(b *testing.B) {
		body := []byte(`{"language":"python","code":"print(1+1)"}`)
		for b.Loop() {
			rq, _ := http.NewRequest("POST", hs.URL+"/v1/runs", bytes.NewReader(body))
			rq.Header.Set("Authorization", "Bearer "+tokenA)
			rq.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(rq)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
	connect := func(b *testing.B, t mcp.Transport) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(context.Background(), t, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cs.Close() })
		return cs
	}
	loop := func(b *testing.B, cs *mcp.ClientSession) {
		for b.Loop() {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: args})
			if err != nil || res.IsError {
				b.Fatalf("run_code: %v %v", err, res)
			}
		}
	}
	b.Run("mcp-http", func(b *testing.B) {
		loop(b, connect(b, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp", HTTPClient: &http.Client{Transport: bearer{tokenA, http.DefaultTransport}}}))
	})
	b.Run("mcp-stdio", func(b *testing.B) {
		ct, st := mcp.NewInMemoryTransports()
		done := make(chan struct{})
		go func() { defer close(done); ms.Serve(context.Background(), st, audit.Key(keyA)) }()
		b.Cleanup(func() { <-done })
		loop(b, connect(b, ct))
	})
}
