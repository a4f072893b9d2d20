package server

import (
	"bytes"
	"mime/multipart"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The decoders of untrusted request bodies never panic and answer every
// input with either a valid request or a 4xx *Error.

var runSeeds = []string{
	`{"argv":["python3","-c","print(6*7)"]}`,
	`{"manifest":{"resources":{"timeout":"10s","memory":"256MiB"}},"argv":["python3","main.py"],"files":[{"path":"main.py","content":"print('hi')"},{"path":"data.bin","content":"AAEC","encoding":"base64","mode":"0755"}],"stdin":"optional text"}`,
	`{"code":"print(1)","language":"python"}`,
	`{"code":"echo hi","language":"bash","stdin":"aGk=","stdin_encoding":"base64"}`,
	`{"argv":["echo"],"files":[{"path":"../../etc/passwd","content":"x"}]}`,
	`{"argv":["echo"],"files":[{"path":"/abs","content":"x"},{"path":"a\u0000b","content":""}]}`,
	`{"manifest":{"inputs":[{"src":"/etc"}]},"argv":["x"]}`,
	`{"manifest":{"network":{"mode":"allowlist","allow":["pypi.org"]}},"argv":["pip"]}`,
	`{"argv":["a"],"argv":["b"]}`,
	`{"ARGV":["a"]}`,
	`{"manifest":` + strings.Repeat(`[`, 40) + `}`,
	`{"argv":[1,2]}`,
	`[]`,
	``,
	`null`,
	`{"argv":null,"files":null,"manifest":null}`,
}

func checkRefusal(t *testing.T, in []byte, e *Error) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 {
		t.Fatalf("input %q: status %d (%s)", in, e.Status, e)
	}
	if e.Code == "" || e.Message == "" {
		t.Fatalf("input %q: error without code or message: %+v", in, e)
	}
}

func checkFiles(t *testing.T, in []byte, files []upload, maxFiles int) {
	t.Helper()
	if len(files) > maxFiles {
		t.Fatalf("input %q: %d files accepted", in, len(files))
	}
	for _, f := range files {
		if checkPath("x", f.path) != nil || f.mode > 0o777 {
			t.Fatalf("input %q: accepted file %q mode %o", in, f.path, f.mode)
		}
	}
}

func checkManifest(t *testing.T, in []byte, m *manifest.Manifest) {
	t.Helper()
	if m == nil || m.Validate() != nil || len(m.Inputs) > 0 {
		t.Fatalf("input %q: accepted manifest %+v", in, m)
	}
}

func checkArgv(t *testing.T, in []byte, argv []string) {
	t.Helper()
	if len(argv) == 0 || argv[0] == "" {
		t.Fatalf("input %q: accepted argv %q", in, argv)
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			t.Fatalf("input %q: accepted argv %q", in, argv)
		}
	}
}

func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range runSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		spec, e := decodeRun(in, nil, 4)
		if e != nil {
			checkRefusal(t, in, e)
			return
		}
		checkManifest(t, in, spec.manifest)
		// No argv at all (nil, never empty) is a run of the image
		// config's Entrypoint and Cmd, which the service and the engine
		// check against the image; any argv given is checked here.
		if spec.argv != nil {
			checkArgv(t, in, spec.argv)
		}
		checkFiles(t, in, spec.files, 4)
	})
}

func FuzzDecodeSandboxRequest(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"manifest":{"resources":{"timeout":"60s"}},"ttl":"10m","files":[{"path":"main.py","content":"print('hi')"}],"metadata":{"agent":"agent-1"}}`,
		`{"ttl":"25h"}`,
		`{"ttl":"-1s","metadata":{"":"x"}}`,
		`{"files":[{"path":"a//b","content":""}]}`,
		`{"metadata":{"a":"1","a":"2"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		spec, e := decodeSandbox(in, 4, 10*time.Minute, 24*time.Hour)
		if e != nil {
			checkRefusal(t, in, e)
			return
		}
		checkManifest(t, in, spec.manifest)
		checkFiles(t, in, spec.files, 4)
		if spec.ttl <= 0 || spec.ttl > 24*time.Hour || len(spec.metadata) > service.MaxMetadata {
			t.Fatalf("input %q: accepted ttl %s, %d metadata", in, spec.ttl, len(spec.metadata))
		}
	})
}

func FuzzDecodeExecRequest(f *testing.F) {
	for _, s := range []string{
		`{"argv":["python3","main.py"],"env":{"DEBUG":"1"},"dir":"/workspace","timeout":"20s","wait":false}`,
		`{"code":"import sys","language":"python","stdin":"x"}`,
		`{"argv":["cat"],"stdin_open":true}`,
		`{"argv":["cat"],"stdin_open":true,"stdin":"x"}`,
		`{"argv":["x"],"timeout":"1h"}`,
		`{"argv":["x"],"env":{"1":"a"},"dir":"rel"}`,
		`{"argv":["x"],"wait":"yes"}`,
	} {
		f.Add([]byte(s))
	}
	m := manifest.Default()
	f.Fuzz(func(t *testing.T, in []byte) {
		spec, e := decodeExec(in, m)
		if e != nil {
			checkRefusal(t, in, e)
			return
		}
		checkArgv(t, in, spec.argv)
		if spec.timeout < 0 || spec.timeout > m.Resources.Timeout.D() || spec.dir != "" && !strings.HasPrefix(spec.dir, "/") {
			t.Fatalf("input %q: accepted %+v", in, spec)
		}
		for k, v := range spec.env {
			if !service.ValidEnvName(k) || strings.IndexByte(v, 0) >= 0 {
				t.Fatalf("input %q: accepted env %q=%q", in, k, v)
			}
		}
		if spec.stdinOpen && len(spec.stdin) > 0 {
			t.Fatalf("input %q: stdin with stdin_open", in)
		}
	})
}

func FuzzDecodeMultipartRun(f *testing.F) {
	seed := func(parts ...[3]string) []byte {
		var b bytes.Buffer
		for _, p := range parts {
			b.WriteString("--B\r\nContent-Disposition: form-data; name=\"" + p[0] + "\"")
			if p[1] != "" {
				b.WriteString("; filename=\"" + p[1] + "\"")
			}
			b.WriteString("\r\n\r\n" + p[2] + "\r\n")
		}
		b.WriteString("--B--\r\n")
		return b.Bytes()
	}
	f.Add(seed([3]string{"request", "", `{"argv":["echo"]}`}, [3]string{"file", "src/a.py", "print(1)"}))
	f.Add(seed([3]string{"file", "../../etc/passwd", "x"}))
	f.Add(seed([3]string{"other", "", "x"}))
	f.Add([]byte("--B\r\nContent-Disposition: form-data; name=\"file\"; filename*=UTF-8''a%00b\r\n\r\nx\r\n--B--\r\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		spec, e := decodeMultipartRun(multipart.NewReader(bytes.NewReader(in), "B"), 1<<20, 4)
		if e != nil {
			checkRefusal(t, in, e)
			return
		}
		checkManifest(t, in, spec.manifest)
		// As for a JSON request: no argv (nil) runs the image's
		// Entrypoint and Cmd; any argv given is checked.
		if spec.argv != nil {
			checkArgv(t, in, spec.argv)
		}
		checkFiles(t, in, spec.files, 4)
	})
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want int
	}{
		{`"SIGTERM"`, 15}, {`"TERM"`, 15}, {`"term"`, 15}, {`" SIGINT "`, 2}, {`9`, 9}, {`"9"`, 9}, {`64`, 64},
		{`"SIGFOO"`, 0}, {`0`, 0}, {`32`, 0}, {`65`, 0}, {`-1`, 0}, {`1.5`, 0}, {`true`, 0}, {`null`, 0}, {`""`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			sig, e := parseSignal([]byte(tc.in))
			if tc.want == 0 {
				if e == nil {
					t.Errorf("accepted as %d", sig)
				}
				return
			}
			if e != nil || int(sig) != tc.want {
				t.Errorf("got %d, %v; want %d", sig, e, tc.want)
			}
		})
	}
}

func TestCheckPath(t *testing.T) {
	ok := []string{"a", "a/b/c.txt", "with space", "ünïcode/ok", ".hidden", "a..b", "...", strings.Repeat("a", 255)}
	bad := []string{"", "/a", "..", "../a", "a/..", "a/../b", ".", "./a", "a/.", "a//b", "a/", "a\x00", "a\nb", "a\x7f", "\xff", strings.Repeat("a", 256), strings.Repeat("a/", 600) + "a"}
	for _, p := range ok {
		if e := checkPath("p", p); e != nil {
			t.Errorf("%q refused: %s", p, e.Message)
		}
	}
	for _, p := range bad {
		if e := checkPath("p", p); e == nil {
			t.Errorf("%q accepted", p)
		} else if e.Field != "p" || e.Status != 400 {
			t.Errorf("%q: %+v", p, e)
		}
	}
}
