package egress

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestIndexRouting(t *testing.T) {
	tests := []struct {
		name     string
		index    bool   // ServeIndex called
		raw      string // request written on a raw connection
		wantBody string
		wantCode int
	}{
		{name: "origin form served by the index", index: true, raw: "GET /moat-index/pypi/simple/ HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n", wantCode: 200, wantBody: "index saw /moat-index/pypi/simple/"},
		{name: "absolute loopback form served by the index", index: true, raw: "GET http://127.0.0.1:3128/moat-index/npm/x HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n", wantCode: 200, wantBody: "index saw /moat-index/npm/x"},
		{name: "localhost served by the index", index: true, raw: "GET http://localhost:3128/moat-index/npm/x HTTP/1.1\r\nHost: localhost:3128\r\n\r\n", wantCode: 200, wantBody: "index saw /moat-index/npm/x"},
		{name: "other host forwarded, not the index", index: true, raw: "GET http://allowed.test/moat-index/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", wantCode: 200, wantBody: "hello from allowed.test"},
		{name: "other path of origin form refused", index: true, raw: "GET /elsewhere HTTP/1.1\r\nHost: x\r\n\r\n", wantCode: 400},
		{name: "no index: origin form refused", index: false, raw: "GET /moat-index/pypi/simple/ HTTP/1.1\r\nHost: x\r\n\r\n", wantCode: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testPolicy(), Options{})
			if tc.index {
				h.p.ServeIndex(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					fmt.Fprintf(w, "index saw %s", r.URL.Path)
				}))
			}
			c := h.raw()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			io.WriteString(c, tc.raw)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.wantCode || !strings.Contains(string(body), tc.wantBody) {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, body, tc.wantCode, tc.wantBody)
			}
		})
	}
}

func TestUpstreamTransport(t *testing.T) {
	tests := []struct {
		name       string
		url        string
		wantErr    bool
		wantReason string
	}{
		{name: "granted loopback upstream", url: "http://allowed.test/", wantReason: ReasonAllowed},
		{name: "upstream not in network.allow is still reachable by the index", url: "http://other.test/", wantReason: ReasonAllowed},
		{name: "private upstream without allow_addresses", url: "http://private.test/", wantErr: true, wantReason: ReasonPrivateAddress},
		{name: "metadata address", url: "http://meta.bad.test/", wantErr: true, wantReason: ReasonPrivateAddress},
		{name: "unresolvable", url: "http://nowhere.test/", wantErr: true, wantReason: ReasonDNSFailure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, testPolicy(), Options{})
			c := &http.Client{Transport: h.p.UpstreamTransport(), Timeout: 5 * time.Second}
			resp, err := c.Get(tc.url)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				c.CloseIdleConnections()
			}
			atts := h.p.Attempts()
			if len(atts) != 1 || atts[0].Reason != tc.wantReason || atts[0].Method != "INDEX" {
				t.Fatalf("attempts %+v, want one INDEX attempt with reason %s", atts, tc.wantReason)
			}
			if tc.wantReason == ReasonAllowed && (atts[0].BytesIn == 0 || atts[0].BytesOut == 0) {
				t.Errorf("upstream bytes not counted: %+v", atts[0])
			}
		})
	}
}

func TestLogPackage(t *testing.T) {
	h := newHarness(t, testPolicy(), Options{})
	h.p.LogPackage(Attempt{Host: "moat-index/pypi", Reason: ReasonTyposquat, Package: "reqeusts", Resembles: "requests"})
	h.p.LogPackage(Attempt{Host: "moat-index/pypi", Allowed: true, Reason: ReasonAllowed, Package: "requests==2.31.0"})
	atts := h.p.Attempts()
	if len(atts) != 2 || atts[0].Resembles != "requests" || atts[0].Allowed || !atts[1].Allowed {
		t.Fatalf("attempts %+v", atts)
	}
	if s := h.p.Summary(); s.Attempts != 2 || s.Allowed != 1 {
		t.Errorf("summary %+v, want 2 attempts, 1 allowed", s)
	}
}
