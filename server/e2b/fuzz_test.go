package e2b

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzWorkspacePath: whatever an SDK sends as a path maps to a workspace
// path that stays inside (no "..", not absolute, no NUL) or is refused.
func FuzzWorkspacePath(f *testing.F) {
	for _, s := range []string{"/home/user/a.txt", "a/../b", "/home/user/../../etc/passwd", "/workspace", "//home/user//x", "/home/user/.", "..", "a\x00b", "/home/user/a/../../user/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, e := workspacePath("path", p)
		if e != nil {
			if got != "" {
				t.Fatalf("refused %q but returned %q", p, got)
			}
			return
		}
		if got == "" || strings.HasPrefix(got, "/") || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("%q mapped to %q", p, got)
		}
		if got == "." {
			return
		}
		for _, c := range strings.Split(got, "/") {
			if c == "" || c == "." || c == ".." {
				t.Fatalf("%q mapped to %q, which has component %q", p, got, c)
			}
		}
	})
}

// FuzzSandboxManifest: a create body is decoded strictly and either
// refused with E2B's error or turned into a manifest document that is
// valid JSON with the image set.
func FuzzSandboxManifest(f *testing.F) {
	for _, s := range []string{`{"templateID":"base"}`, `{"templateID":"base","timeout":5,"envVars":{"A":"b"},"metadata":{"k":"v"}}`,
		`{"network":{"allowOut":["example.com","10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}}`, `{"autoPause":true}`, `{"network":{"rules":{"api.openai.com":[{"transform":{"headers":{"Authorization":"Bearer {{secrets.K}}"}}}]}}}`, `{"timeout":-1}`, `{"x":1}`, `[]`, `{"mcp":null}`,
		// e2b JS before 2.51 and the Python SDK (issue 22).
		`{"templateID":"base","autoPause":false,"metadata":{},"timeout":300,"envVars":{},"secure":true,"allow_internet_access":true}`,
		`{"allow_internet_access":true,"network":{"allowOut":["pypi.org"]}}`, `{"timeout":18446744074}`,
		// lifecycle.onTimeout as e2b 2.51 sends it (issue 22 §2).
		`{"templateID":"base","timeout":3,"autoPause":true}`, `{"autoPause":true,"autoPauseMemory":false}`,
		`{"autoPause":true,"autoPauseMemory":true}`, `{"autoPauseMemory":false}`, `{"autoPause":true,"autoResume":{"enabled":true}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(body))
		var req newSandbox
		if e := decodeStrict(r, &req); e != nil {
			if e.Code != 400 || e.Message == "" {
				t.Fatalf("decode error %+v", e)
			}
			return
		}
		m, template, ttl, e := sandboxManifest(&req)
		if e != nil {
			if e.Code != 400 && e.Code != 404 || e.Message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		// A template names a Moat image (issue 19): the manifest's image
		// is set, to a non-empty name; whether the host has it is the
		// engine's to say.
		data, err := json.Marshal(m)
		image, _ := m["image"].(string)
		if err != nil || image == "" || !bytes.Contains(data, []byte(`"image":`)) || template == "" || ttl <= 0 {
			t.Fatalf("manifest %s %v template %q ttl %v", data, err, template, ttl)
		}
		// autoPause is honoured exactly as asked, and never with memory
		// or auto-resume (a filesystem-only pause keeps neither).
		p, _ := translate(&req, false, Internet{})
		if p.autoPause != (req.AutoPause != nil && *req.AutoPause) ||
			req.AutoPauseMemory != nil && *req.AutoPauseMemory || req.AutoResume != nil && req.AutoResume.Enabled {
			t.Fatalf("autoPause %v accepted for %s", p.autoPause, body)
		}
	})
}
