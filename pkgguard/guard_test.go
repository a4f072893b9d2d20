package pkgguard

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// wheel builds a minimal valid wheel of name==version.
func wheel(t testing.TB, name, version string) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	di := strings.ReplaceAll(name, "-", "_") + "-" + version + ".dist-info/"
	files := map[string]string{
		strings.ReplaceAll(name, "-", "_") + "/__init__.py": "VERSION = " + fmt.Sprintf("%q", version) + "\n",
		di + "METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
		di + "WHEEL":    "Wheel-Version: 1.0\nGenerator: moat-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	var record strings.Builder
	for p, c := range files {
		w, _ := z.Create(p)
		io.WriteString(w, c)
		sum := sha256.Sum256([]byte(c))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", p, base64.RawURLEncoding.EncodeToString(sum[:]), len(c))
	}
	record.WriteString(di + "RECORD,,\n")
	w, _ := z.Create(di + "RECORD")
	io.WriteString(w, record.String())
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarball builds a minimal npm package tarball.
func tarball(t testing.TB, name, version string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for p, c := range map[string]string{
		"package/package.json": fmt.Sprintf(`{"name":%q,"version":%q,"main":"index.js"}`, name, version),
		"package/index.js":     "module.exports = " + fmt.Sprintf("%q", version) + ";\n",
	} {
		tw.WriteHeader(&tar.Header{Name: p, Mode: 0o644, Size: int64(len(c)), Typeflag: tar.TypeReg})
		io.WriteString(tw, c)
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// upstream is a local index: a PyPI simple index (HTML, or JSON when
// asked) and an npm registry, with files that can be tampered with.
type upstream struct {
	srv   *httptest.Server
	mu    sync.Mutex
	files map[string][]byte // path -> bytes served
	sums  map[string][]byte // path -> bytes the listing's digest is of
	pypi  map[string][]string
	npm   map[string][]string
	json  bool
	hits  map[string]int
	// meta: a PyPI file's (by file name) or an npm version's (by
	// name@version) yanked state and upload time, when set.
	meta map[string]fileMeta
}

// fileMeta is what an upstream says about a file or version besides its
// bytes: yanked (with a reason, which may be empty) and when uploaded.
type fileMeta struct {
	yanked   bool
	reason   string
	uploaded time.Time
}

func newUpstream(t testing.TB) *upstream {
	u := &upstream{files: map[string][]byte{}, sums: map[string][]byte{}, pypi: map[string][]string{}, npm: map[string][]string{}, hits: map[string]int{}, meta: map[string]fileMeta{}}
	u.srv = httptest.NewServer(u)
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addWheel(t testing.TB, name, version string) []byte {
	b := wheel(t, name, version)
	fn := strings.ReplaceAll(name, "-", "_") + "-" + version + "-py3-none-any.whl"
	u.mu.Lock()
	defer u.mu.Unlock()
	u.files["/files/"+fn], u.sums["/files/"+fn] = b, b
	u.pypi[name] = append(u.pypi[name], fn)
	return b
}

func (u *upstream) addTarball(t testing.TB, name, version string) []byte {
	b := tarball(t, name, version)
	p := "/tarballs/" + name + "-" + version + ".tgz"
	u.mu.Lock()
	defer u.mu.Unlock()
	u.files[p], u.sums[p] = b, b
	u.npm[name] = append(u.npm[name], version)
	return b
}

// hit is how often the upstream was asked for path.
func (u *upstream) hit(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

func (u *upstream) tamper(path string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	b := append([]byte{}, u.files[path]...)
	b[len(b)/2] ^= 0xff
	u.files[path] = b
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.hits[r.URL.Path]++
	if b, ok := u.files[r.URL.Path]; ok {
		w.Write(b)
		return
	}
	if p, ok := strings.CutPrefix(r.URL.Path, "/simple/"); ok {
		name := strings.TrimSuffix(p, "/")
		fns, ok := u.pypi[name]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if u.json {
			w.Header().Set("Content-Type", simpleJSON)
			var files []string
			for _, fn := range fns {
				sum := sha256.Sum256(u.sums["/files/"+fn])
				extra := ""
				if m, ok := u.meta[fn]; ok {
					if m.yanked {
						extra += fmt.Sprintf(`,"yanked":%q`, m.reason)
					}
					if !m.uploaded.IsZero() {
						extra += fmt.Sprintf(`,"upload-time":%q`, m.uploaded.UTC().Format(time.RFC3339))
					}
				}
				files = append(files, fmt.Sprintf(`{"filename":%q,"url":"../../files/%s","hashes":{"sha256":%q}%s}`, fn, fn, hex.EncodeToString(sum[:]), extra))
			}
			fmt.Fprintf(w, `{"meta":{"api-version":"1.0"},"name":%q,"files":[%s]}`, name, strings.Join(files, ","))
			return
		}
		fmt.Fprintf(w, "<html><body>\n")
		for _, fn := range fns {
			sum := sha256.Sum256(u.sums["/files/"+fn])
			attrs := ""
			if m := u.meta[fn]; m.yanked {
				attrs = fmt.Sprintf(" data-yanked=%q", m.reason)
			}
			fmt.Fprintf(w, "<a href=\"/files/%s#sha256=%s\"%s>%s</a>\n", fn, hex.EncodeToString(sum[:]), attrs, fn)
		}
		fmt.Fprintf(w, "</body></html>\n")
		return
	}
	if p, ok := strings.CutPrefix(r.URL.Path, "/npm/"); ok {
		vs, ok := u.npm[p]
		if !ok {
			http.NotFound(w, r)
			return
		}
		versions := map[string]any{}
		times := map[string]string{}
		for _, v := range vs {
			if m := u.meta[p+"@"+v]; !m.uploaded.IsZero() {
				times[v] = m.uploaded.UTC().Format(time.RFC3339)
			}
			b := u.sums["/tarballs/"+p+"-"+v+".tgz"]
			s512 := sha512.Sum512(b)
			s1 := sha1.Sum(b)
			versions[v] = map[string]any{"name": p, "version": v, "dist": map[string]any{
				"tarball":   u.srv.URL + "/tarballs/" + p + "-" + v + ".tgz",
				"integrity": "sha512-" + base64.StdEncoding.EncodeToString(s512[:]),
				"shasum":    hex.EncodeToString(s1[:]),
			}}
		}
		json.NewEncoder(w).Encode(map[string]any{"name": p, "versions": versions, "time": times, "dist-tags": map[string]string{"latest": vs[len(vs)-1]}})
		return
	}
	http.NotFound(w, r)
}

func mustReq(t testing.TB, eco Ecosystem, s string) Requirement {
	t.Helper()
	r, err := ParseRequirement(eco, s)
	if err != nil {
		t.Fatalf("ParseRequirement(%s, %q): %v", eco, s, err)
	}
	return r
}

// guardFor serves a guard over u on a test server and records its events;
// now, when given, is the guard's clock.
func guardFor(t testing.TB, u *upstream, cfg Config, now ...func() time.Time) (*httptest.Server, func() []Event) {
	t.Helper()
	var mu sync.Mutex
	var events []Event
	srv := httptest.NewUnstartedServer(nil)
	opts := Options{Transport: http.DefaultTransport, BaseURL: "http://" + srv.Listener.Addr().String() + "/moat-index",
		Report: func(e Event) { mu.Lock(); events = append(events, e); mu.Unlock() }, SpoolDir: t.TempDir()}
	if len(now) > 0 {
		opts.Now = now[0]
	}
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	srv.Config.Handler = g
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, func() []Event { mu.Lock(); defer mu.Unlock(); return append([]Event{}, events...) }
}

func get(t testing.TB, url, accept string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func TestPyPIGuard(t *testing.T) {
	for _, upJSON := range []bool{false, true} {
		u := newUpstream(t)
		u.json = upJSON
		w1 := u.addWheel(t, "requests", "2.31.0")
		u.addWheel(t, "requests", "2.30.0")
		u.addWheel(t, "idna", "3.6")
		u.addWheel(t, "reqeusts", "1.0")
		u.addWheel(t, "leftpadx", "1.0")
		u.addWheel(t, "tampered", "1.0")
		u.tamper("/files/tampered-1.0-py3-none-any.whl")
		sum := sha256.Sum256(w1)
		cfg := Config{PyPI: &Index{URL: u.srv.URL + "/simple", Allow: []Requirement{
			mustReq(t, PyPI, "requests==2.31.0 --hash=sha256:"+hex.EncodeToString(sum[:])),
			mustReq(t, PyPI, "IDNA"),
			mustReq(t, PyPI, "tampered"),
		}}}
		srv, events := guardFor(t, u, cfg)
		base := srv.URL + "/moat-index/pypi/"
		tests := []struct {
			name       string
			path       string
			accept     string
			wantStatus int
			wantIn     []string
			wantNotIn  []string
			wantReason string
			resembles  string
		}{
			{name: "allowed page lists only the allowed version", path: "simple/requests/", wantStatus: 200,
				wantIn: []string{"requests-2.31.0-py3-none-any.whl", "/moat-index/pypi/files/requests/"}, wantNotIn: []string{"2.30.0", u.srv.URL}},
			{name: "allowed page as JSON", path: "simple/requests/", accept: simpleJSON, wantStatus: 200,
				wantIn: []string{`"api-version":"1.1"`, "requests-2.31.0-py3-none-any.whl"}, wantNotIn: []string{"2.30.0"}},
			{name: "name normalised", path: "simple/Requests/", wantStatus: 200, wantIn: []string{"2.31.0"}},
			{name: "allowed file served", path: "files/requests/requests-2.31.0-py3-none-any.whl", wantStatus: 200, wantReason: ReasonAllowed},
			{name: "typosquat of an allowed name", path: "simple/reqeusts/", wantStatus: 403, wantReason: ReasonTyposquat, resembles: "requests"},
			{name: "typosquat of a popular name", path: "simple/numpyy/", wantStatus: 403, wantReason: ReasonTyposquat, resembles: "numpy"},
			{name: "unrelated name not allowed", path: "simple/leftpadx/", wantStatus: 403, wantReason: ReasonNotAllowed},
			{name: "unallowed version refused", path: "files/requests/requests-2.30.0-py3-none-any.whl", wantStatus: 403, wantReason: ReasonNotAllowed},
			{name: "tampered file refused", path: "files/tampered/tampered-1.0-py3-none-any.whl", wantStatus: 403, wantReason: ReasonHashMismatch},
			{name: "root lists allowed only", path: "simple/", wantStatus: 200, wantIn: []string{"requests", "idna"}, wantNotIn: []string{"reqeusts", "leftpadx"}},
		}
		for _, tc := range tests {
			t.Run(fmt.Sprintf("json=%v/%s", upJSON, tc.name), func(t *testing.T) {
				n := len(events())
				status, body, hdr := get(t, base+tc.path, tc.accept)
				if status != tc.wantStatus {
					t.Fatalf("status %d, want %d; body %s", status, tc.wantStatus, body)
				}
				for _, s := range tc.wantIn {
					if !strings.Contains(body, s) {
						t.Errorf("body lacks %q:\n%s", s, body)
					}
				}
				for _, s := range tc.wantNotIn {
					if strings.Contains(body, s) {
						t.Errorf("body has %q:\n%s", s, body)
					}
				}
				if tc.wantReason == "" {
					return
				}
				ev := events()[n:]
				if len(ev) == 0 {
					t.Fatalf("no event, want reason %s", tc.wantReason)
				}
				e := ev[len(ev)-1]
				if e.Reason != tc.wantReason || e.Resembles != tc.resembles || e.Allowed != (tc.wantReason == ReasonAllowed) {
					t.Errorf("event %+v, want reason %s resembles %q", e, tc.wantReason, tc.resembles)
				}
				if tc.wantStatus != 200 && hdr.Get("X-Moat-Egress") != tc.wantReason {
					t.Errorf("X-Moat-Egress %q, want %q", hdr.Get("X-Moat-Egress"), tc.wantReason)
				}
				if tc.wantStatus == 200 && strings.HasPrefix(tc.path, "files/") && body != string(w1) {
					t.Errorf("served %d bytes, not the upstream's wheel", len(body))
				}
			})
		}
	}
}

func TestNPMGuard(t *testing.T) {
	u := newUpstream(t)
	t7 := u.addTarball(t, "is-number", "7.0.0")
	u.addTarball(t, "is-number", "6.0.0")
	u.addTarball(t, "evil", "1.0.0")
	u.tamper("/tarballs/evil-1.0.0.tgz")
	s := sha512.Sum512(t7)
	pin := "sha512-" + base64.StdEncoding.EncodeToString(s[:])
	cfg := Config{NPM: &Index{URL: u.srv.URL + "/npm", Allow: []Requirement{
		mustReq(t, NPM, "is-number@7.0.0 --hash="+pin), mustReq(t, NPM, "evil"),
	}}}
	srv, events := guardFor(t, u, cfg)
	base := srv.URL + "/moat-index/npm/"
	status, body, _ := get(t, base+"is-number", "")
	if status != 200 {
		t.Fatalf("packument: %d %s", status, body)
	}
	var doc struct {
		Versions map[string]struct {
			Dist struct{ Tarball, Integrity string }
		}
		DistTags map[string]string `json:"dist-tags"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Versions) != 1 || doc.DistTags["latest"] != "7.0.0" {
		t.Fatalf("packument not filtered to 7.0.0: %s", body)
	}
	tb := doc.Versions["7.0.0"].Dist.Tarball
	if !strings.HasPrefix(tb, srv.URL+"/moat-index/npm/-/tarball/") {
		t.Fatalf("tarball URL %q not rewritten to the guard", tb)
	}
	tests := []struct {
		name       string
		url        string
		wantStatus int
		wantReason string
		resembles  string
	}{
		{"allowed tarball", tb, 200, ReasonAllowed, ""},
		{"unallowed version", base + "-/tarball/6.0.0/is-number", 403, ReasonNotAllowed, ""},
		{"typosquat", base + "is-numbr", 403, ReasonTyposquat, "is-number"},
		{"not allowed", base + "left-pad", 403, ReasonNotAllowed, ""},
		{"tampered tarball", base + "-/tarball/1.0.0/evil", 403, ReasonHashMismatch, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := len(events())
			status, body, _ := get(t, tc.url, "")
			if status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", status, tc.wantStatus, body)
			}
			ev := events()[n:]
			if len(ev) == 0 || ev[len(ev)-1].Reason != tc.wantReason || ev[len(ev)-1].Resembles != tc.resembles {
				t.Fatalf("events %+v, want reason %s resembles %q", ev, tc.wantReason, tc.resembles)
			}
			if status == 200 && body != string(t7) {
				t.Errorf("tarball bytes differ from upstream's")
			}
		})
	}
}

func TestParseRequirement(t *testing.T) {
	h := strings.Repeat("ab", 32)
	tests := []struct {
		eco     Ecosystem
		in      string
		name    string
		match   []string
		nomatch []string
		err     string
	}{
		{PyPI, "requests==2.31.0", "requests", []string{"2.31.0", "2.31"}, []string{"2.31.1", "2.31.0rc1"}, ""},
		{PyPI, "Zope.Interface>=5,<6", "zope-interface", []string{"5.0", "5.9.1"}, []string{"6.0", "4.9"}, ""},
		{PyPI, "idna", "idna", []string{"1", "3.6"}, nil, ""},
		{PyPI, "requests==2.31.0 --hash=sha256:" + h, "requests", []string{"2.31.0"}, nil, ""},
		{PyPI, "requests>=2 --hash=sha256:" + h, "", nil, nil, "exact version"},
		{PyPI, "requests==2 --hash=md5:00", "", nil, nil, "sha256:"},
		{PyPI, "requests~=2.1", "", nil, nil, "not supported"},
		{PyPI, "requests[socks]", "", nil, nil, "extras"},
		{PyPI, "", "", nil, nil, "empty"},
		{NPM, "is-number@7.0.0", "is-number", []string{"7.0.0"}, []string{"7.0.1"}, ""},
		{NPM, "@types/node@>=20", "@types/node", []string{"20.1.0"}, []string{"18.0.0"}, ""},
		{NPM, "lodash", "lodash", []string{"4.17.21"}, nil, ""},
		{NPM, "is-number@^7", "", nil, nil, "not supported"},
		{NPM, "Bad Name", "", nil, nil, "after the name"},
	}
	for _, tc := range tests {
		t.Run(string(tc.eco)+"/"+tc.in, func(t *testing.T) {
			r, err := ParseRequirement(tc.eco, tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one mentioning %q", err, tc.err)
				}
				return
			}
			if err != nil || r.Name != tc.name {
				t.Fatalf("got %+v, %v; want name %s", r, err, tc.name)
			}
			for _, v := range tc.match {
				if !r.Allows(v, "") {
					t.Errorf("%s does not allow %s", tc.in, v)
				}
			}
			for _, v := range tc.nomatch {
				if r.Allows(v, "") {
					t.Errorf("%s allows %s", tc.in, v)
				}
			}
		})
	}
}

func TestResembles(t *testing.T) {
	tests := []struct {
		name, want string
		ok         bool
	}{
		{"reqeusts", "requests", true},
		{"requestss", "requests", true},
		{"numpyy", "numpy", true},
		{"djnago", "django", true},
		{"requests", "", false}, // itself
		{"sip", "six", true},    // one edit on a short name
		{"abc", "", false},      // two edits from "attrs"? no: far
		{"totally-unrelated-name", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Resembles(tc.name, popular[PyPI])
			if ok != tc.ok || (tc.ok && got != tc.want) {
				t.Errorf("Resembles(%q) = %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestFileVersion(t *testing.T) {
	tests := []struct{ project, file, want string }{
		{"requests", "requests-2.31.0-py3-none-any.whl", "2.31.0"},
		{"zope-interface", "zope.interface-6.0.tar.gz", "6.0"},
		{"charset-normalizer", "charset_normalizer-3.3.2-cp311-cp311-manylinux_2_17_x86_64.whl", "3.3.2"},
		{"requests", "requests-toolbelt-1.0.tar.gz", ""},
		{"requests", "../requests-1.0.tar.gz", ""},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			got, _ := FileVersion(tc.project, tc.file)
			if got != tc.want {
				t.Errorf("FileVersion(%q, %q) = %q, want %q", tc.project, tc.file, got, tc.want)
			}
		})
	}
}

// TestNPMClient: the real npm client, pointed at the guard as its
// registry (as the engine does with npm_config_registry), installs an
// allowed package, and fails on a typosquat. It runs on the host against
// the handler; the sandbox images need not have npm.
func TestNPMClient(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("needs npm on PATH: the protocol check runs the real client")
	}
	u := newUpstream(t)
	u.addTarball(t, "is-number", "7.0.0")
	u.addTarball(t, "is-number", "6.0.0")
	srv, events := guardFor(t, u, Config{NPM: &Index{URL: u.srv.URL + "/npm", Allow: []Requirement{mustReq(t, NPM, "is-number@7.0.0")}}})
	tests := []struct {
		name       string
		pkg        string
		wantOK     bool
		wantReason string
	}{
		{"allowed install", "is-number", true, ReasonAllowed},
		{"unallowed version", "is-number@6.0.0", false, ""},
		{"typosquat", "is-numbr", false, ReasonTyposquat},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(npm, "install", "--no-audit", "--no-fund", "--no-package-lock", "--cache", filepath.Join(dir, ".cache"), "--registry", srv.URL+"/moat-index/npm/", tc.pkg)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "HOME="+dir)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.wantOK {
				t.Fatalf("npm install %s: err %v, want ok %v\n%s", tc.pkg, err, tc.wantOK, out)
			}
			if tc.wantOK {
				b, err := os.ReadFile(filepath.Join(dir, "node_modules/is-number/index.js"))
				if err != nil || !strings.Contains(string(b), "7.0.0") {
					t.Fatalf("installed module: %q %v", b, err)
				}
			}
			if tc.wantReason != "" {
				found := false
				for _, e := range events() {
					found = found || e.Reason == tc.wantReason
				}
				if !found {
					t.Errorf("no %s event: %+v", tc.wantReason, events())
				}
			}
		})
	}
}
