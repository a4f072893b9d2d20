package native_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/manifest"
)

// namedWheel builds a minimal valid wheel of name==version whose module
// prints nothing and holds VERSION.
func namedWheel(t testing.TB, name, version string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	di := name + "-" + version + ".dist-info/"
	for p, c := range map[string]string{
		name + "/__init__.py": fmt.Sprintf("VERSION = %q\n", version),
		di + "METADATA":       "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
		di + "WHEEL":          "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		di + "RECORD":         "",
		di + "top_level.txt":  name + "\n",
	} {
		w, err := zw.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, c)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// pypiIndex is a PEP 503 index on the host's loopback: /simple/<name>/
// lists wheels with their sha256; a file can be served tampered.
type pypiIndex struct {
	mu     sync.Mutex
	listed map[string][]byte // file name -> bytes the listing hashes
	served map[string][]byte // file name -> bytes served
	srv    *counted
}

func newPyPIIndex(t testing.TB, wheels ...[2]string) *pypiIndex {
	ix := &pypiIndex{listed: map[string][]byte{}, served: map[string][]byte{}}
	for _, w := range wheels {
		fn := w[0] + "-" + w[1] + "-py3-none-any.whl"
		b := namedWheel(t, w[0], w[1])
		ix.listed[fn], ix.served[fn] = b, b
	}
	ix.srv = startServer(t.(*testing.T), false, func(w http.ResponseWriter, r *http.Request) {
		ix.mu.Lock()
		defer ix.mu.Unlock()
		if p, ok := strings.CutPrefix(r.URL.Path, "/simple/"); ok {
			name := strings.TrimSuffix(p, "/")
			fmt.Fprintf(w, "<html><body>\n")
			n := 0
			for fn, b := range ix.listed {
				if strings.HasPrefix(fn, name+"-") {
					sum := sha256.Sum256(b)
					fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\">%s</a>\n", fn, hex.EncodeToString(sum[:]), fn)
					n++
				}
			}
			if n == 0 {
				w.WriteHeader(http.StatusNotFound)
			}
			return
		}
		if b, ok := ix.served[strings.TrimPrefix(r.URL.Path, "/files/")]; ok {
			w.Write(b)
			return
		}
		http.NotFound(w, r)
	})
	return ix
}

func (ix *pypiIndex) tamper(fn string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	b := append([]byte{}, ix.served[fn]...)
	b[len(b)/2] ^= 0xff
	ix.served[fn] = b
}

// TestGuardedPipInstall: pip, unchanged (only the environment Moat
// injects), installs an allowed package through the guarded index in a
// real sandbox; a typosquat, an unallowed version and a tampered file are
// refused and logged with their reasons.
func TestGuardedPipInstall(t *testing.T) {
	needRoot(t)
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	ix := newPyPIIndex(t, [2]string{"requests", "2.31.0"}, [2]string{"requests", "2.30.0"}, [2]string{"reqeusts", "1.0"}, [2]string{"tampered", "1.0"})
	ix.tamper("tampered-1.0-py3-none-any.whl")
	tests := []struct {
		name       string
		pkg        string
		wantOK     bool
		wantReason string
		resembles  string
	}{
		{name: "allowed install", pkg: "requests", wantOK: true},
		{name: "typosquat refused", pkg: "reqeusts", wantReason: "typosquat", resembles: "requests"},
		{name: "unallowed version refused", pkg: "requests==2.30.0"},
		{name: "tampered file refused", pkg: "tampered", wantReason: "hash-mismatch"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := manifest.Default()
			m.Network.Mode = "allowlist"
			m.Network.AllowAddresses = []string{"127.0.0.1"}
			m.Resources.Timeout = manifest.Duration(60e9)
			m.Resources.CPUTime = m.Resources.Timeout
			m.Packages.PyPI = manifest.PackageIndex{Index: "http://127.0.0.1:" + port(ix.srv.srv) + "/simple", Allow: []string{"requests==2.31.0", "tampered"}}
			res := runIn(t, e, m, "sh", "-c", "python3 -m pip install --no-deps --no-cache-dir --disable-pip-version-check --target t '"+tc.pkg+"' >pip.log 2>&1; rc=$?; tail -5 pip.log; [ $rc = 0 ] && PYTHONPATH=t python3 -c 'import requests; print(\"imported\", requests.VERSION)'; exit $rc")
			out := res.Stdout.Data + res.Stderr.Data
			if tc.wantOK {
				if res.ExitCode != 0 || !strings.Contains(out, "imported 2.31.0") {
					t.Fatalf("install failed (exit %d): %s\nnetwork %+v", res.ExitCode, out, res.Network)
				}
				return
			}
			if res.ExitCode == 0 {
				t.Fatalf("install of %s succeeded: %s", tc.pkg, out)
			}
			if tc.wantReason == "" {
				return
			}
			found := false
			for _, a := range res.Network {
				found = found || (a.Reason == tc.wantReason && a.Resembles == tc.resembles && !a.Allowed)
			}
			viol := false
			for _, v := range res.Violations {
				viol = viol || v.Kind == "package"
			}
			if !found || !viol {
				t.Fatalf("no %s refusal (resembles %q) with a package violation: network %+v violations %+v\n%s", tc.wantReason, tc.resembles, res.Network, res.Violations, out)
			}
		})
	}
}
