package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

func TestAuth(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		name   string
		method string
		path   string
		header map[string]string
		want   int
	}{
		{name: "health needs no key", method: "GET", path: "/v1/health", want: 200},
		{name: "no key", method: "GET", path: "/v1/sandboxes", want: 401},
		{name: "unknown key", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "Bearer moat_kx_nope"}, want: 401},
		{name: "wrong scheme", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "Basic " + tokenA}, want: 401},
		{name: "empty bearer", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "Bearer "}, want: 401},
		{name: "bearer", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "Bearer " + tokenA}, want: 200},
		{name: "bearer lower case", method: "GET", path: "/v1/sandboxes", header: map[string]string{"Authorization": "bearer " + tokenA}, want: 200},
		{name: "x-api-key", method: "GET", path: "/v1/sandboxes", header: map[string]string{"X-API-Key": tokenA}, want: 200},
		{name: "metrics needs a key", method: "GET", path: "/metrics", want: 401},
		{name: "metrics with a tenant's key", method: "GET", path: "/metrics", header: map[string]string{"X-API-Key": tokenA}, want: 403},
		{name: "metrics with an admin key", method: "GET", path: "/metrics", header: map[string]string{"X-API-Key": tokenAdmin}, want: 200},
		{name: "run needs a key", method: "POST", path: "/v1/runs", want: 401},
		{name: "unknown path", method: "GET", path: "/v1/nope", want: 404},
		{name: "wrong method", method: "PATCH", path: "/v1/sandboxes", header: map[string]string{"X-API-Key": tokenA}, want: 405},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: tc.method, path: tc.path, header: tc.header})
			if r.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.want, r.body)
			}
			if r.Header.Get("X-Request-Id") == "" {
				t.Error("no X-Request-Id header")
			}
			if tc.want >= 400 {
				d := r.errBody(t)
				want := map[int]string{401: CodeUnauthenticated, 403: CodeForbidden, 404: CodeNotFound, 405: CodeMethodNotAllowed}[tc.want]
				if d.Code != want || d.RequestID != r.Header.Get("X-Request-Id") {
					t.Errorf("error %+v, want code %s and the request id", d, want)
				}
			}
			if tc.want == 405 && r.Header.Get("Allow") == "" {
				t.Error("405 without Allow")
			}
		})
	}
}

func TestRun(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		name      string
		body      any
		header    map[string]string
		wantArgv  []string
		wantOut   string
		wantExit  int
		wantFiles map[string]string
	}{
		{name: "argv", body: `{"argv":["echo","hi"]}`, wantArgv: []string{"echo", "hi"}, wantOut: "echo hi\n"},
		{name: "python code", body: `{"code":"print(6*7)","language":"python"}`, wantArgv: []string{"python3", "-c", "print(6*7)"}, wantOut: "python3 -c print(6*7)\n"},
		{name: "bash code", body: `{"code":"echo $((6*7))","language":"bash"}`, wantArgv: []string{"bash", "-c", "echo $((6*7))"}},
		{name: "sh code", body: `{"code":"true","language":"sh"}`, wantArgv: []string{"sh", "-c", "true"}},
		{name: "exit code is a result, not an error", body: `{"argv":["fake","out:x","exit:3"]}`, wantOut: "x\n", wantExit: 3},
		{name: "stdin", body: `{"argv":["fake","cat"],"stdin":"hello"}`, wantOut: "hello"},
		{name: "base64 stdin", body: `{"argv":["fake","cat"],"stdin":"aGk=","stdin_encoding":"base64"}`, wantOut: "hi"},
		{name: "content type with charset", body: `{"argv":["echo"]}`, header: map[string]string{"Content-Type": "application/json; charset=utf-8"}, wantOut: "echo\n"},
		{name: "files", body: `{"argv":["echo"],"files":[{"path":"main.py","content":"print('hi')"},{"path":"data/x.bin","content":"AAEC","encoding":"base64","mode":"0755"}]}`,
			wantFiles: map[string]string{"main.py": "print('hi')", "data/x.bin": "\x00\x01\x02"}},
		{name: "manifest", body: `{"manifest":{"resources":{"timeout":"10s","memory":"256MiB"}},"argv":["echo"]}`},
		{name: "canonical manifest with empty inputs", body: `{"manifest":{"image":"python","inputs":[],"env":{}},"argv":["echo"]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: tc.body, header: tc.header})
			var rr RunResponse
			r.decode(t, &rr)
			if rr.ID == "" || rr.Result == nil {
				t.Fatalf("response %s", r.body)
			}
			if tc.wantArgv != nil && strings.Join(rr.Result.Command, "\x00") != strings.Join(tc.wantArgv, "\x00") {
				t.Errorf("argv %q, want %q", rr.Result.Command, tc.wantArgv)
			}
			if tc.wantOut != "" && rr.Result.Stdout.Data != tc.wantOut {
				t.Errorf("stdout %q, want %q", rr.Result.Stdout.Data, tc.wantOut)
			}
			if rr.Result.ExitCode != tc.wantExit {
				t.Errorf("exit code %d, want %d", rr.Result.ExitCode, tc.wantExit)
			}
			if tc.wantFiles != nil {
				got, modes, _ := e.be.LastRun()
				for p, want := range tc.wantFiles {
					if got[p] != want {
						t.Errorf("file %s = %q, want %q", p, got[p], want)
					}
				}
				if modes["data/x.bin"] != 0o755 || modes["main.py"] != 0o644 {
					t.Errorf("modes %v", modes)
				}
			}
			rec, ok := e.au.Record(rr.ID)
			if !ok || rec.Kind != audit.KindRun || rec.KeyID != "ka" || rec.Status != audit.Done || rec.Manifest == "" {
				t.Errorf("audit record %+v", rec)
			}
		})
	}
}

func TestRunRefused(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 4096; c.MaxFiles = 3 })
	files := func(paths ...string) string {
		var parts []string
		for _, p := range paths {
			parts = append(parts, fmt.Sprintf(`{"path":%q,"content":"x"}`, p))
		}
		return `{"argv":["echo"],"files":[` + strings.Join(parts, ",") + `]}`
	}
	tests := []struct {
		name      string
		body      string
		header    map[string]string
		status    int
		code      string
		field     string
		inMessage string
	}{
		{name: "malformed JSON", body: `{"argv":`, status: 400, code: CodeBadRequest},
		{name: "not an object", body: `["echo"]`, status: 400, code: CodeInvalidField},
		{name: "trailing data", body: `{"argv":["echo"]} {}`, status: 400, code: CodeBadRequest},
		{name: "empty body", body: ``, status: 400, code: CodeBadRequest},
		{name: "unknown field", body: `{"argv":["echo"],"bogus":1}`, status: 400, code: CodeBadRequest, field: "bogus"},
		{name: "case-folded field", body: `{"ARGV":["echo"]}`, status: 400, code: CodeBadRequest, field: "ARGV"},
		{name: "unknown nested field", body: `{"argv":["echo"],"files":[{"path":"a","content":"x","owner":"root"}]}`, status: 400, code: CodeBadRequest, field: "files[0].owner"},
		{name: "duplicate key", body: `{"argv":["echo"],"argv":["rm"]}`, status: 400, code: CodeBadRequest, field: "argv"},
		{name: "wrong type", body: `{"argv":"echo hi"}`, status: 400, code: CodeInvalidField, field: "argv"},
		{name: "wrong element type", body: `{"argv":["echo",1]}`, status: 400, code: CodeInvalidField, field: "argv[1]"},
		{name: "no command", body: `{}`, status: 400, code: CodeInvalidField, field: "argv"},
		{name: "argv and code", body: `{"argv":["echo"],"code":"x","language":"python"}`, status: 400, code: CodeInvalidField, field: "code"},
		{name: "code without language", body: `{"code":"x"}`, status: 400, code: CodeInvalidField, field: "language"},
		{name: "unknown language", body: `{"code":"x","language":"cobol"}`, status: 400, code: CodeInvalidField, field: "language"},
		{name: "empty program", body: `{"argv":[""]}`, status: 400, code: CodeInvalidField, field: "argv[0]"},
		{name: "NUL in argv", body: `{"argv":["echo","a\u0000b"]}`, status: 400, code: CodeInvalidField, field: "argv[1]"},
		{name: "manifest field", body: `{"manifest":{"resources":{"memory":"99TiB"}},"argv":["echo"]}`, status: 400, code: CodeInvalidField, field: "manifest.resources.memory"},
		{name: "manifest unknown key", body: `{"manifest":{"resourcez":{}},"argv":["echo"]}`, status: 400, code: CodeInvalidField, field: "manifest.resourcez", inMessage: "did you mean"},
		{name: "manifest duplicate key", body: `{"manifest":{"image":"python","image":"node"},"argv":["echo"]}`, status: 400, code: CodeInvalidField, field: "manifest.image"},
		{name: "manifest not an object", body: `{"manifest":"python","argv":["echo"]}`, status: 400, code: CodeInvalidField, field: "manifest"},
		{name: "manifest inputs", body: `{"manifest":{"inputs":[{"src":"/etc","dst":"etc"}]},"argv":["echo"]}`, status: 400, code: CodeInvalidField, field: "manifest.inputs"},
		{name: "dot-dot path", body: files("../../etc/passwd"), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "inner dot-dot", body: files("a", "src/../../x"), status: 400, code: CodeInvalidField, field: "files[1].path"},
		{name: "absolute path", body: files("ok", "ok2", "/etc/passwd"), status: 400, code: CodeInvalidField, field: "files[2].path"},
		{name: "NUL in path", body: `{"argv":["echo"],"files":[{"path":"a\u0000b","content":""}]}`, status: 400, code: CodeInvalidField, field: "files[0].path", inMessage: "NUL"},
		{name: "empty path", body: files(""), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "doubled slash", body: files("a//b"), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "trailing slash", body: files("a/"), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "dot component", body: files("./a"), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "control character", body: `{"argv":["echo"],"files":[{"path":"a\nb","content":""}]}`, status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "long component", body: files(strings.Repeat("a", 256)), status: 400, code: CodeInvalidField, field: "files[0].path"},
		{name: "duplicate path", body: files("a", "a"), status: 400, code: CodeInvalidField, field: "files[1].path"},
		{name: "file below a file", body: files("a", "a/b"), status: 400, code: CodeInvalidField, field: "files[1].path"},
		{name: "bad mode", body: `{"argv":["echo"],"files":[{"path":"a","content":"","mode":"rwx"}]}`, status: 400, code: CodeInvalidField, field: "files[0].mode"},
		{name: "setuid mode", body: `{"argv":["echo"],"files":[{"path":"a","content":"","mode":"4755"}]}`, status: 400, code: CodeInvalidField, field: "files[0].mode"},
		{name: "bad base64", body: `{"argv":["echo"],"files":[{"path":"a","content":"!!","encoding":"base64"}]}`, status: 400, code: CodeInvalidField, field: "files[0].content"},
		{name: "bad encoding", body: `{"argv":["echo"],"files":[{"path":"a","content":"","encoding":"latin1"}]}`, status: 400, code: CodeInvalidField, field: "files[0].encoding"},
		{name: "bad stdin encoding", body: `{"argv":["echo"],"stdin":"x","stdin_encoding":"rot13"}`, status: 400, code: CodeInvalidField, field: "stdin_encoding"},
		{name: "too many files", body: files("a", "b", "c", "d"), status: 413, code: CodeTooLarge, field: "files"},
		{name: "huge body", body: `{"argv":["echo"],"stdin":"` + strings.Repeat("x", 5000) + `"}`, status: 413, code: CodeTooLarge},
		{name: "wrong content type", body: `{"argv":["echo"]}`, header: map[string]string{"Content-Type": "text/plain"}, status: 400, code: CodeBadRequest},
		{name: "deeply nested", body: `{"manifest":` + strings.Repeat(`{"a":`, 40) + `1` + strings.Repeat(`}`, 40) + `,"argv":["echo"]}`, status: 400, code: CodeBadRequest, field: "manifest"},
		{name: "backend usage error", body: `{"argv":["fail-usage"]}`, status: 400, code: CodeInvalidField, inMessage: "no command given"},
		{name: "backend field error", body: `{"argv":["fail-field"]}`, status: 400, code: CodeInvalidField, field: "manifest.tier"},
		{name: "backend unavailable", body: `{"argv":["fail-unavailable"]}`, status: 503, code: CodeUnavailable},
		{name: "backend failure hides the detail", body: `{"argv":["fail-internal"]}`, status: 500, code: CodeInternal, inMessage: "request id"},
		{name: "backend panic", body: `{"argv":["panic"]}`, status: 500, code: CodeInternal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, before, _ := e.be.Counts()
			r := e.do(req{method: "POST", path: "/v1/runs", token: tokenA, body: tc.body, header: tc.header})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			d := r.errBody(t)
			if d.Code != tc.code || d.Field != tc.field {
				t.Errorf("error %+v, want code %q field %q", d, tc.code, tc.field)
			}
			if !strings.Contains(d.Message, tc.inMessage) {
				t.Errorf("message %q does not say %q", d.Message, tc.inMessage)
			}
			if strings.Contains(d.Message, "/var/lib") {
				t.Errorf("message %q leaks the cause", d.Message)
			}
			if _, _, after, _ := e.be.Counts(); after != before {
				t.Errorf("a refused request reached the program")
			}
		})
	}
}

func TestRunWorkspaceTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	big := strings.Repeat("A", (4<<20)/3*4+4) // just over 4 MiB once decoded
	body := `{"manifest":{"workspace":{"size":"4MiB"}},"argv":["echo"],"files":[{"path":"a","content":"` + big + `","encoding":"base64"}]}`
	r := e.must(413, req{method: "POST", path: "/v1/runs", token: tokenA, body: body})
	if d := r.errBody(t); d.Code != CodeTooLarge || d.Field != "files" {
		t.Errorf("error %+v", d)
	}
}

// multipartBody builds a multipart request: the JSON part (if any), then
// one part per file with its raw filename.
func multipartBody(t *testing.T, reqJSON string, files [][2]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	if reqJSON != "" {
		w, err := mw.CreateFormField("request")
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(reqJSON))
	}
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, f[0]))
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f[1]))
	}
	mw.Close()
	return mw.FormDataContentType(), buf.Bytes()
}

func TestRunMultipart(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxFiles = 2 })
	ct, body := multipartBody(t, `{"argv":["echo","mp"]}`, [][2]string{{"src/main.py", "print(1)"}, {"data.bin", "\x00\xff"}})
	r := e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: body, header: map[string]string{"Content-Type": ct}})
	var rr RunResponse
	r.decode(t, &rr)
	got, _, _ := e.be.LastRun()
	if got["src/main.py"] != "print(1)" || got["data.bin"] != "\x00\xff" || rr.Result.Stdout.Data != "echo mp\n" {
		t.Errorf("files %q, stdout %q", got, rr.Result.Stdout.Data)
	}

	tests := []struct {
		name  string
		json  string
		files [][2]string
		raw   string // a whole body instead
		code  int
		field string
	}{
		{name: "dot-dot filename", json: `{"argv":["echo"]}`, files: [][2]string{{"ok", "x"}, {"../../etc/passwd", "x"}}, code: 400, field: "parts[2].filename"},
		{name: "absolute filename", json: `{"argv":["echo"]}`, files: [][2]string{{"/etc/passwd", "x"}}, code: 400, field: "parts[1].filename"},
		{name: "empty filename", json: `{"argv":["echo"]}`, files: [][2]string{{"", "x"}}, code: 400, field: "parts[1].filename"},
		{name: "too many files", json: `{"argv":["echo"]}`, files: [][2]string{{"a", ""}, {"b", ""}, {"c", ""}}, code: 413, field: "files"},
		{name: "duplicate with JSON file", json: `{"argv":["echo"],"files":[{"path":"a","content":""}]}`, files: [][2]string{{"a", ""}}, code: 400, field: "parts[1].filename"},
		{name: "no request part", files: [][2]string{{"a", ""}}, code: 400, field: "argv"},
		{name: "bad request part", json: `{"argv":["echo"],"x":1}`, code: 400, field: "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ct, body := multipartBody(t, tc.json, tc.files)
			r := e.do(req{method: "POST", path: "/v1/runs", token: tokenA, body: body, header: map[string]string{"Content-Type": ct}})
			if r.StatusCode != tc.code {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.code, r.body)
			}
			if d := r.errBody(t); d.Field != tc.field {
				t.Errorf("field %q, want %q (%s)", d.Field, tc.field, d.Message)
			}
		})
	}
	t.Run("unexpected part", func(t *testing.T) {
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		w, _ := mw.CreateFormField("other")
		w.Write([]byte("x"))
		mw.Close()
		r := e.must(400, req{method: "POST", path: "/v1/runs", token: tokenA, body: buf.Bytes(), header: map[string]string{"Content-Type": mw.FormDataContentType()}})
		if d := r.errBody(t); d.Field != "parts[0]" {
			t.Errorf("error %+v", d)
		}
	})
}

func TestGetRun(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.KeepRuns = 2 })
	var ids []string
	for i := range 3 {
		var rr RunResponse
		e.must(200, req{method: "POST", path: "/v1/runs", token: tokenA, body: fmt.Sprintf(`{"argv":["echo","%d"]}`, i)}).decode(t, &rr)
		ids = append(ids, rr.ID)
	}
	var got RunResponse
	e.must(200, req{method: "GET", path: "/v1/runs/" + ids[2], token: tokenA}).decode(t, &got)
	if got.ID != ids[2] || got.Result.Stdout.Data != "echo 2\n" || got.Result.Termination != result.Exited {
		t.Errorf("got %+v", got)
	}
	e.must(404, req{method: "GET", path: "/v1/runs/" + ids[2], token: tokenB})
	e.must(404, req{method: "GET", path: "/v1/runs/" + ids[0], token: tokenA}) // evicted by KeepRuns
	e.must(200, req{method: "GET", path: "/v1/runs/" + ids[1], token: tokenA})
	e.must(404, req{method: "GET", path: "/v1/runs/nope", token: tokenA})
}

func TestRunAuditFailsClosed(t *testing.T) {
	e := newEnv(t, nil)
	e.au.FailNextBegin(fmt.Errorf("disk full"))
	e.must(http.StatusInternalServerError, req{method: "POST", path: "/v1/runs", token: tokenA, body: `{"argv":["echo"]}`})
	if _, _, runs, _ := e.be.Counts(); runs != 0 {
		t.Error("a run started without its audit record")
	}
}

// TestManifestRoundTrip: a manifest as encoding/json writes it (what the Go
// client sends) is accepted and keeps its digest.
func TestManifestRoundTrip(t *testing.T) {
	m := manifest.Default()
	m.Network.Mode, m.Network.Allow = "allowlist", []string{"pypi.org"}
	m.Env = map[string]string{"A": "1"}
	m.Security.AllowMissing = []string{"landlock"}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	got, e := decodeManifest(b)
	if e != nil {
		t.Fatalf("%s: %s", b, e.Message)
	}
	if got.Digest() != m.Digest() {
		t.Errorf("digest %s, want %s", got.Digest(), m.Digest())
	}
}

// TestRunImageCommand: POST /v1/runs with neither argv nor code runs the
// image config's Entrypoint and Cmd, as `moat run IMAGE` with no command
// does; on an image without them it is refused naming argv, and argv
// given replaces them.
func TestRunImageCommand(t *testing.T) {
	e := newEnv(t, nil)
	e.be.Commands = map[string][]string{"app": {"fake", "out:from the image"}}
	tests := []struct {
		name     string
		body     string
		status   int
		wantArgv []string
		wantOut  string
		field    string // of a refusal
		inMsg    string
	}{
		{name: "no argv: the image's command", body: `{"manifest":{"image":"app"}}`, status: 200,
			wantArgv: []string{"fake", "out:from the image"}, wantOut: "from the image\n"},
		{name: "argv replaces it", body: `{"manifest":{"image":"app"},"argv":["echo","hi"]}`, status: 200,
			wantArgv: []string{"echo", "hi"}, wantOut: "echo hi\n"},
		{name: "no argv on an image without a command", body: `{"manifest":{"image":"python"}}`, status: 400,
			field: "argv", inMsg: `image "python" has no Entrypoint or Cmd`},
		{name: "empty argv is not no argv", body: `{"manifest":{"image":"app"},"argv":[]}`, status: 400, field: "argv"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(req{method: "POST", path: "/v1/runs", token: tokenA, body: tc.body})
			if r.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", r.StatusCode, tc.status, r.body)
			}
			if tc.status != 200 {
				eb := r.errBody(t)
				if eb.Field != tc.field || !strings.Contains(eb.Message, tc.inMsg) {
					t.Errorf("error %+v, want field %q and a message containing %q", eb, tc.field, tc.inMsg)
				}
				return
			}
			var rr RunResponse
			r.decode(t, &rr)
			if rr.Result == nil || !slices.Equal(rr.Result.Command, tc.wantArgv) || rr.Result.Stdout.Data != tc.wantOut {
				t.Errorf("result %+v, want command %q and stdout %q", rr.Result, tc.wantArgv, tc.wantOut)
			}
		})
	}
}
