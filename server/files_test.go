package server

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/engine"
)

func TestFiles(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxBodyBytes = 1 << 10 })
	sb := e.createSandbox(tokenA, nil)
	dir := e.be.Sessions()[0].Dir()
	base := "/v1/sandboxes/" + sb.ID + "/files"

	var fi engine.FileInfo
	e.must(201, req{method: "PUT", path: base + "?path=src/run.sh&mode=0755", token: tokenA, body: "echo hi\n"}).decode(t, &fi)
	if fi.Type != "file" || fi.Size != 8 || fi.Mode != "0755" || fi.Path != "src/run.sh" {
		t.Errorf("put answered %+v", fi)
	}
	if st, err := os.Stat(filepath.Join(dir, "src/run.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("written file: %v %v", st, err)
	}

	r := e.must(200, req{method: "GET", path: base + "?path=src/run.sh", token: tokenA})
	if string(r.body) != "echo hi\n" || r.Header.Get("Content-Type") != "application/octet-stream" || r.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(r.Header.Get("Content-Disposition"), "attachment") {
		t.Errorf("download %q, headers %v", r.body, r.Header)
	}
	// HTML written by the sandbox is never served as HTML.
	e.must(201, req{method: "PUT", path: base + "?path=x.html", token: tokenA, body: "<script>alert(1)</script>"})
	if ct := e.must(200, req{method: "GET", path: base + "?path=x.html", token: tokenA}).Header.Get("Content-Type"); ct != "application/octet-stream" {
		t.Errorf("html served as %s", ct)
	}

	var ls DirListing
	e.must(200, req{method: "GET", path: base + "?path=src", token: tokenA}).decode(t, &ls)
	if ls.Path != "src" || len(ls.Entries) != 1 || ls.Entries[0].Name != "run.sh" {
		t.Errorf("listing %+v", ls)
	}
	e.must(200, req{method: "GET", path: base, token: tokenA}).decode(t, &ls)
	if ls.Path != "." || len(ls.Entries) != 2 {
		t.Errorf("root listing %+v", ls)
	}

	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if d := e.must(400, req{method: "GET", path: base + "?path=link", token: tokenA}).errBody(t); d.Field != "path" || !strings.Contains(d.Message, "never followed") {
		t.Errorf("symlink download: %+v", d)
	}

	e.must(413, req{method: "PUT", path: base + "?path=big", token: tokenA, body: strings.Repeat("x", 2<<10)})
	e.must(204, req{method: "DELETE", path: base + "?path=src", token: tokenA})
	e.must(404, req{method: "GET", path: base + "?path=src/run.sh", token: tokenA})
	e.must(404, req{method: "DELETE", path: base + "?path=src", token: tokenA})

	// Refused paths create nothing.
	before := listTree(t, dir)
	tests := []struct {
		name, query string
	}{
		{"dot-dot", "?path=../../etc/passwd"},
		{"escaped dot-dot", "?path=a%2F..%2F..%2Fx"},
		{"absolute", "?path=/etc/passwd"},
		{"NUL", "?path=a%00b"},
		{"empty component", "?path=a//b"},
		{"dot", "?path=./a"},
		{"missing", ""},
		{"bad mode", "?path=a&mode=999"},
		{"setuid mode", "?path=a&mode=4755"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, method := range []string{"PUT", "GET", "DELETE"} {
				if method != "PUT" && (tc.name == "missing" || strings.Contains(tc.name, "mode")) {
					continue
				}
				r := e.do(req{method: method, path: base + tc.query, token: tokenA, body: "x"})
				if r.StatusCode != 400 {
					t.Errorf("%s %s: %d %s", method, tc.query, r.StatusCode, r.body)
					continue
				}
				if d := r.errBody(t); d.Code != CodeInvalidField {
					t.Errorf("%s %s: %+v", method, tc.query, d)
				}
			}
		})
	}
	if after := listTree(t, dir); after != before {
		t.Errorf("refused requests changed the workspace:\n%s\nto\n%s", before, after)
	}
}

func listTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		b.WriteString(p + "\n")
		return nil
	})
	return b.String()
}
