package pkgguard

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Lockfiles through the guard (issue 20 §2: "lockfile hashes are checked
// by the proxy as well as by pip/npm"). The proxy checks a lockfile's
// hashes when the manifest pins them (the allow syntax is the lockfiles'
// own: "name==1.0 --hash=sha256:HEX", "name@1.0.0 --hash=sha512-B64");
// the client checks them against what the guard served, as it would
// against any index.

func sri512(b []byte) string {
	s := sha512.Sum512(b)
	return "sha512-" + base64.StdEncoding.EncodeToString(s[:])
}

func TestRegistryTarball(t *testing.T) {
	tests := []struct {
		in        string
		name, ver string
		ok        bool
	}{
		{in: "is-number/-/is-number-7.0.0.tgz", name: "is-number", ver: "7.0.0", ok: true},
		{in: "@acme/left-pad/-/left-pad-1.0.0-rc.1.tgz", name: "@acme/left-pad", ver: "1.0.0-rc.1", ok: true},
		{in: "@acme%2fleft-pad/-/left-pad-1.0.0.tgz", name: "@acme/left-pad", ver: "1.0.0", ok: true},
		{in: "is-number/-/other-7.0.0.tgz"},
		{in: "is-number/-/is-number-7.0.0.tar"},
		{in: "is-number/-/is-number-.tgz"},
		{in: "is-number/-/is-number-1/../2.tgz"},
		{in: "../x/-/x-1.0.0.tgz"},
		{in: "is-number"},
		{in: "-/tarball/7.0.0/is-number"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			name, ver, ok := registryTarball(tc.in)
			if ok != tc.ok || name != tc.name || ver != tc.ver {
				t.Errorf("registryTarball(%q) = %q, %q, %v; want %q, %q, %v", tc.in, name, ver, ok, tc.name, tc.ver, tc.ok)
			}
		})
	}
}

// TestNPMLockfile: npm ci with a package-lock.json written against the
// public registry (resolved https://registry.npmjs.org/NAME/-/NAME-V.tgz,
// which npm rewrites to the registry it is given, keeping the path)
// installs through the guard; npm refuses bytes that do not match the
// lock's integrity, and the guard refuses what the manifest does not
// allow, including a release whose digest is not the one the manifest
// pinned from the lockfile.
func TestNPMLockfile(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("needs npm on PATH: the lockfile check runs the real client")
	}
	u := newUpstream(t)
	isNum := u.addTarball(t, "is-number", "7.0.0")
	u.addTarball(t, "is-number", "6.0.0")
	leftPad := u.addTarball(t, "@acme/left-pad", "1.0.0")
	changed := u.addTarball(t, "changed", "1.0.0")
	lockPin := sri512([]byte("the release the lockfile was written against"))
	srv, events := guardFor(t, u, Config{NPM: &Index{URL: u.srv.URL + "/npm", Allow: []Requirement{
		mustReq(t, NPM, "is-number@7.0.0 --hash="+sri512(isNum)),
		mustReq(t, NPM, "@acme/left-pad@1.0.0"),
		mustReq(t, NPM, "changed@1.0.0 --hash="+lockPin),
	}}})
	type dep struct{ name, version, integrity string }
	tests := []struct {
		name       string
		deps       []dep
		wantOK     bool
		wantReason string // the guard's last event
		wantOut    string
	}{
		{name: "lock from the public registry installs", deps: []dep{{"is-number", "7.0.0", sri512(isNum)}, {"@acme/left-pad", "1.0.0", sri512(leftPad)}},
			wantOK: true, wantReason: ReasonAllowed},
		{name: "lock of a version the manifest does not allow", deps: []dep{{"is-number", "6.0.0", ""}},
			wantReason: ReasonNotAllowed},
		{name: "npm checks the lock's integrity against the served bytes", deps: []dep{{"@acme/left-pad", "1.0.0", sri512([]byte("another tarball"))}},
			wantReason: ReasonAllowed, wantOut: "EINTEGRITY"},
		{name: "the guard checks the lock's integrity pinned in the manifest", deps: []dep{{"changed", "1.0.0", lockPin}},
			wantReason: ReasonNotAllowed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var pj, lk []string
			for _, d := range tc.deps {
				integrity := d.integrity
				if integrity == "" {
					integrity = sri512(u.files["/tarballs/"+d.name+"-"+d.version+".tgz"])
				}
				base := d.name[strings.LastIndexByte(d.name, '/')+1:]
				pj = append(pj, fmt.Sprintf("%q: %q", d.name, d.version))
				lk = append(lk, fmt.Sprintf(`"node_modules/%s": {"version": %q, "resolved": "https://registry.npmjs.org/%s/-/%s-%s.tgz", "integrity": %q}`,
					d.name, d.version, d.name, base, d.version, integrity))
			}
			deps := strings.Join(pj, ", ")
			files := map[string]string{
				"package.json":      `{"name": "app", "version": "1.0.0", "dependencies": {` + deps + `}}`,
				"package-lock.json": `{"name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": true, "packages": {"": {"name": "app", "version": "1.0.0", "dependencies": {` + deps + `}}, ` + strings.Join(lk, ", ") + `}}`,
			}
			for n, c := range files {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			n := len(events())
			cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund", "--fetch-retries", "0", "--cache", filepath.Join(dir, ".cache"), "--registry", srv.URL+"/moat-index/npm/")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "npm_config_update_notifier=false", "HOME="+dir)
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.wantOK {
				t.Fatalf("npm ci: err %v, want ok %v\n%s\nevents %+v", err, tc.wantOK, out, events()[n:])
			}
			if tc.wantOut != "" && !strings.Contains(string(out), tc.wantOut) {
				t.Errorf("npm ci output lacks %q:\n%s", tc.wantOut, out)
			}
			ev := events()[n:]
			if len(ev) == 0 || ev[len(ev)-1].Reason != tc.wantReason {
				t.Errorf("events %+v, want the last with reason %s", ev, tc.wantReason)
			}
			if tc.wantOK {
				for _, d := range tc.deps {
					b, err := os.ReadFile(filepath.Join(dir, "node_modules", d.name, "index.js"))
					if err != nil || !strings.Contains(string(b), d.version) {
						t.Errorf("installed %s: %q %v", d.name, b, err)
					}
				}
			}
		})
	}
	if u.hit("/tarballs/changed-1.0.0.tgz") != 0 || len(changed) == 0 {
		t.Errorf("the upstream was asked for a release whose digest is not the manifest's pin")
	}
}

// TestPipHashCheckingMode: pip install --require-hashes -r with a hashed
// requirements file installs through the guard; pip refuses a file whose
// hash is not the lockfile's, and the guard does not list a file whose
// hash is not the one the manifest pinned from the lockfile.
func TestPipHashCheckingMode(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-m", "pip", "--version").Run() != nil {
		t.Skip("needs python3 with pip on the host: the check runs the real client")
	}
	u := newUpstream(t)
	good := u.addWheel(t, "good", "1.0")
	u.addWheel(t, "changed", "1.0")
	hexsum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	lockPin := hexsum([]byte("the release the lockfile was written against"))
	srv, events := guardFor(t, u, Config{PyPI: &Index{URL: u.srv.URL + "/simple", Allow: []Requirement{
		mustReq(t, PyPI, "good==1.0"),
		mustReq(t, PyPI, "changed==1.0 --hash=sha256:"+lockPin),
	}}})
	tests := []struct {
		name    string
		req     string
		wantOK  bool
		wantOut string
	}{
		{name: "hashed requirements install", req: "good==1.0 --hash=sha256:" + hexsum(good), wantOK: true},
		{name: "pip checks the lockfile's hash against the served file", req: "good==1.0 --hash=sha256:" + lockPin, wantOut: "DO NOT MATCH THE HASHES"},
		{name: "the guard checks the hash the manifest pinned from the lockfile", req: "changed==1.0 --hash=sha256:" + lockPin, wantOut: "No matching distribution"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			req := filepath.Join(dir, "requirements.txt")
			if err := os.WriteFile(req, []byte(tc.req+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(py, "-m", "pip", "install", "--isolated", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-compile",
				"--require-hashes", "-r", req, "--target", filepath.Join(dir, "t"), "--index-url", srv.URL+"/moat-index/pypi/simple/", "--trusted-host", "127.0.0.1")
			out, err := cmd.CombinedOutput()
			if (err == nil) != tc.wantOK {
				t.Fatalf("pip install: err %v, want ok %v\n%s\nevents %+v", err, tc.wantOK, out, events())
			}
			if tc.wantOut != "" && !strings.Contains(string(out), tc.wantOut) {
				t.Errorf("pip output lacks %q:\n%s", tc.wantOut, out)
			}
		})
	}
	if u.hit("/files/changed-1.0-py3-none-any.whl") != 0 {
		t.Errorf("the upstream was asked for a file whose digest is not the manifest's pin")
	}
}
