package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/service"
)

// FuzzToolArguments feeds every tool arguments a model could send: no
// input may panic, and every refusal is a *service.Error with a message
// (what errorResult turns into an IsError result naming the field).
func FuzzToolArguments(f *testing.F) {
	seeds := []string{
		`{}`, `null`, `[]`, `"x"`, `{"language":"python","code":"print(1)"}`,
		`{"language":"python","code":"1","files":[{"path":"a/b.txt","content":"aGk=","encoding":"base64","mode":"0755"}]}`,
		`{"language":"python","code":"1","files":[{"path":"a","content":""},{"path":"a/b","content":""}]}`,
		`{"language":"sh","code":"x","manifest":{"resources":{"memory":"1GiB","timeout":"1m"},"network":{"mode":"none"}}}`,
		`{"manifest":{"inputs":[{"host":"/etc","path":"etc"}]}}`,
		`{"ttl":"5m","metadata":{"a":"b"}}`, `{"ttl":"-1s"}`,
		`{"sandbox_id":"sb","argv":["ls","-l"],"env":{"A":"1"},"dir":"/tmp","timeout":"1s","stdin":"x"}`,
		`{"sandbox_id":"sb","path":"../../etc/passwd","content":"x","mode":"4755"}`,
		`{"sandbox_id":"sb","path":"."}`, `{"approval_id":"ap-1"}`,
		`{"code":1e400}`, `{"a":{"b":{"c":{"d":{"e":{"f":{"g":{}}}}}}}}`, `{"path":"\u0000"}`,
	}
	for _, s := range seeds {
		for i := range tools {
			f.Add(uint8(i), []byte(s))
		}
	}
	h := newHarness(f)
	sb, err := h.svc.CreateSandbox(context.Background(), keyA, service.SandboxArgs{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		tl := tools[int(which)%len(tools)]
		// Calls name the one sandbox the key has, so that the fuzzer
		// reaches past the lookup; those it creates are destroyed.
		var m map[string]any
		if json.Unmarshal(raw, &m) == nil && m != nil {
			if _, ok := m["sandbox_id"]; ok {
				m["sandbox_id"] = sb.ID
				raw, _ = json.Marshal(m)
			}
		}
		c := &conn{key: nil, owned: map[string]bool{}}
		_, err := tl.call(context.Background(), h.srv, c, keyA, raw)
		if err != nil {
			var e *service.Error
			if !errors.As(err, &e) || e.Message == "" {
				t.Fatalf("%s(%q): %T %v is not a service error with a message", tl.def.Name, raw, err, err)
			}
		}
		h.srv.destroyAll(keyA, c.drain())
	})
}

// FuzzFileURI: a resource URI from a client never panics the parser, and
// every file a sandbox can hold (a path CheckPath accepts) round-trips.
func FuzzFileURI(f *testing.F) {
	for _, s := range []string{"0123abcd", "out/chart.png", "a b/ü?#%.txt", "moat://sandboxes/s/files/a", "moat://sandboxes/s/files/../x", "%", ""} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, id, p string) {
		parseFileURI(id)
		parseFileURI(p)
		if id == "" || strings.Contains(id, "/") || service.CheckPath("path", p) != nil {
			return
		}
		gotID, gotP, ok := parseFileURI(fileURI(id, p))
		if !ok || gotID != id || gotP != p {
			t.Fatalf("fileURI(%q, %q) = %q parses as %q, %q, %v", id, p, fileURI(id, p), gotID, gotP, ok)
		}
	})
}
