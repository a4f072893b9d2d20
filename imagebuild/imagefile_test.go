package imagebuild

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The fixtures' pins: a hand-made wheel (testdata/pip) and is-number 7.0.0
// from registry.npmjs.org (testdata/npm, written by npm install
// --package-lock-only).
const (
	wheelHash   = "sha256:1b0910cd3f6d6d064ae0913003e5df810cfd6a12bd01703f21a185d6e3eece49"
	isNumberSRI = "sha512-41Cifkg6e8TylSpdtTpeLVMqvSBEVzTttHvERD741+pnZ8ANv0004MRL43QKPDlK9cGvNp6NZWZUBlbGXYxxng=="
	testHash    = "sha256:0000000000000000000000000000000000000000000000000000000000000000"
)

// buildDirWith writes files (relative name -> content; "" content ending
// in / makes a directory) and image.yaml into a fresh directory and returns
// the image file's path.
func buildDirWith(t *testing.T, yaml string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "image.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func pipInstall(extra ...string) []string {
	return append([]string{"python3", "-m", "pip", "install", "--require-hashes", "--only-binary", ":all:",
		"--no-cache-dir", "--no-input", "--disable-pip-version-check", "--break-system-packages"}, extra...)
}

var cleanupStep = func(line int) Step {
	return Step{Op: OpRun, Line: line, Text: "remove /opt/moat-build", Argv: []string{"rm", "-rf", "/opt/moat-build"}}
}

func TestReadImageFile(t *testing.T) {
	npmFiles := map[string]string{
		"app/package.json":      fixture(t, "npm/package.json"),
		"app/package-lock.json": fixture(t, "npm/package-lock.json"),
	}
	pipFiles := map[string]string{
		"requirements.txt":                       fixture(t, "pip/requirements.txt"),
		"wheels/moat_hello-1.0-py3-none-any.whl": fixture(t, "pip/wheels/moat_hello-1.0-py3-none-any.whl"),
	}
	aptScript := "set -e; apt-get -o APT::Sandbox::User=root update; DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root install -y --no-install-recommends curl git; rm -rf /var/lib/apt/lists/*"
	tests := []struct {
		name  string
		yaml  string
		files map[string]string
		// want's File and Context are filled in by the test.
		want Plan
	}{
		{
			name: "debian base only",
			yaml: "version: 1\nbase: {debian: bookworm}\n",
			want: Plan{Base: Base{Debian: "bookworm"}},
		},
		{
			name: "apt on a debian base: downloaded by the bootstrap, installed offline in a sandboxed step",
			yaml: "version: 1\nbase: {debian: trixie}\napt: [curl, git]\n",
			want: Plan{Base: Base{Debian: "trixie", Download: []string{"curl", "git"}}, Steps: []Step{
				{Op: OpRun, Line: 3, Needs: []string{"apt-get"}, NeedsFix: aptDebianNeedsFix, Text: "apt: curl git",
					Argv: []string{"/bin/sh", "-c", "set -e; DEBIAN_FRONTEND=noninteractive apt-get -o APT::Sandbox::User=root install -y --no-install-recommends --no-download curl git; rm -rf /var/lib/apt/lists/*"}},
			}},
		},
		{
			name: "apt on an image base is a sandboxed step reaching only Debian's archive",
			yaml: "version: 1\nbase: {image: python}\napt:\n  - curl\n  - git\n",
			want: Plan{Base: Base{Image: "python", Line: 2, Text: "base.image: python"}, Steps: []Step{
				{Op: OpRun, Line: 4, Needs: []string{"apt-get"}, NeedsFix: aptNeedsFix, Text: "apt: curl git", Argv: []string{"/bin/sh", "-c", aptScript},
					Hosts: []string{"deb.debian.org", "security.debian.org"}},
			}},
		},
		{
			name:  "pip from find_links only: no index, no network",
			yaml:  "version: 1\nbase: {image: python}\npip:\n  requirements: requirements.txt\n  find_links: wheels\n",
			files: pipFiles,
			want: Plan{Base: Base{Image: "python", Line: 2, Text: "base.image: python"}, Steps: []Step{
				{Op: OpCopy, Line: 4, Text: "pip: copy requirements.txt", Sources: []string{"requirements.txt"}, Dest: "/opt/moat-build/pip/requirements.txt"},
				{Op: OpCopy, Line: 5, Text: "pip: copy wheels", Sources: []string{"wheels"}, Dest: "/opt/moat-build/pip/wheels/"},
				{Op: OpRun, Line: 4, Needs: []string{"python3"}, NeedsFix: pipNeedsFix, Text: "pip: install requirements.txt",
					Argv: pipInstall("--no-index", "--find-links", "/opt/moat-build/pip/wheels/", "-r", "/opt/moat-build/pip/requirements.txt")},
				cleanupStep(1),
			}, Pins: []Pin{{Manager: "pip", Name: "moat-hello", Version: "1.0", Hash: wheelHash}}},
		},
		{
			name:  "pip defaults to PyPI and may reach its file host",
			yaml:  "version: 1\nbase: {debian: bookworm}\npip: {requirements: req/r.txt}\n",
			files: map[string]string{"req/r.txt": "a==1 --hash=" + testHash + "\nB_c[x,y]==2.0.post1 ; python_version >= \"3\" \\\n --hash " + testHash + "\n"},
			want: Plan{Base: Base{Debian: "bookworm"}, Steps: []Step{
				{Op: OpCopy, Line: 3, Text: "pip: copy req/r.txt", Sources: []string{"req/r.txt"}, Dest: "/opt/moat-build/pip/requirements.txt"},
				{Op: OpRun, Line: 3, Needs: []string{"python3"}, NeedsFix: pipNeedsFix, Text: "pip: install req/r.txt",
					Argv:  pipInstall("--index-url", "https://pypi.org/simple", "-r", "/opt/moat-build/pip/requirements.txt"),
					Hosts: []string{"pypi.org", "files.pythonhosted.org"}},
				cleanupStep(1),
			}, Pins: []Pin{{Manager: "pip", Name: "a", Version: "1", Hash: testHash}, {Manager: "pip", Name: "B_c", Version: "2.0.post1", Hash: testHash}}},
		},
		{
			name:  "pip from a private index with a port",
			yaml:  "version: 1\nbase: {image: python}\npip: {requirements: r.txt, index: \"https://pypi.example.com:8443/simple/\"}\n",
			files: map[string]string{"r.txt": "a==1 --hash=" + testHash},
			want: Plan{Base: Base{Image: "python", Line: 2, Text: "base.image: python"}, Steps: []Step{
				{Op: OpCopy, Line: 3, Text: "pip: copy r.txt", Sources: []string{"r.txt"}, Dest: "/opt/moat-build/pip/requirements.txt"},
				{Op: OpRun, Line: 3, Needs: []string{"python3"}, NeedsFix: pipNeedsFix, Text: "pip: install r.txt",
					Argv:  pipInstall("--index-url", "https://pypi.example.com:8443/simple/", "-r", "/opt/moat-build/pip/requirements.txt"),
					Hosts: []string{"pypi.example.com:8443"}},
				cleanupStep(1),
			}, Pins: []Pin{{Manager: "pip", Name: "a", Version: "1", Hash: testHash}}},
		},
		{
			name:  "npm ci from the lockfile, without dev packages or install scripts",
			yaml:  "version: 1\nbase: {image: node}\nnpm:\n  lockfile: app/package-lock.json\n  dir: /opt/app\n",
			files: npmFiles,
			want: Plan{Base: Base{Image: "node", Line: 2, Text: "base.image: node"}, Steps: []Step{
				{Op: OpCopy, Line: 4, Text: "npm: copy app/package-lock.json", Sources: []string{"app/package.json", "app/package-lock.json"}, Dest: "/opt/app/"},
				{Op: OpRun, Line: 4, Needs: []string{"npm"}, NeedsFix: npmNeedsFix, Text: "npm: ci in /opt/app", Argv: []string{"npm", "ci", "--prefix", "/opt/app",
					"--registry", "https://registry.npmjs.org/", "--cache", "/opt/moat-build/npm-cache", "--no-audit", "--no-fund",
					"--no-update-notifier", "--omit=dev", "--ignore-scripts"}, Hosts: []string{"registry.npmjs.org"}},
				cleanupStep(1),
			}, Pins: []Pin{{Manager: "npm", Name: "is-number", Version: "7.0.0", Hash: isNumberSRI}}},
		},
		{
			name: "npm with dev packages, install scripts and a private registry",
			yaml: "version: 1\nbase: {image: node}\nnpm: {lockfile: package-lock.json, dir: /srv/x/, registry: \"https://npm.example.com/\", dev: true, scripts: true}\n",
			files: map[string]string{"package.json": "{}", "package-lock.json": `{"lockfileVersion": 2, "packages": {"": {},
				"node_modules/a": {"version": "1.0.0", "integrity": "sha512-AAAA"},
				"node_modules/a/node_modules/b": {"version": "2.0.0", "integrity": "sha512-BBBB", "dev": true}}}`},
			want: Plan{Base: Base{Image: "node", Line: 2, Text: "base.image: node"}, Steps: []Step{
				{Op: OpCopy, Line: 3, Text: "npm: copy package-lock.json", Sources: []string{"package.json", "package-lock.json"}, Dest: "/srv/x/"},
				{Op: OpRun, Line: 3, Needs: []string{"npm"}, NeedsFix: npmNeedsFix, Text: "npm: ci in /srv/x", Argv: []string{"npm", "ci", "--prefix", "/srv/x",
					"--registry", "https://npm.example.com/", "--cache", "/opt/moat-build/npm-cache", "--no-audit", "--no-fund",
					"--no-update-notifier"}, Hosts: []string{"npm.example.com"}},
				cleanupStep(1),
			}, Pins: []Pin{{Manager: "npm", Name: "a", Version: "1.0.0", Hash: "sha512-AAAA"}, {Manager: "npm", Name: "b", Version: "2.0.0", Hash: "sha512-BBBB"}}},
		},
		{
			name: "files, env sorted by name, workdir, run, entrypoint and cmd, in schema order",
			yaml: `version: 1
base: {image: python}
cmd: [python3, main.py]
entrypoint: ["/usr/bin/env"]
run: ["python3 -m compileall -q /opt/app"]
workdir: /opt/app
env:
  ZED: "1"
  APP_MODE: production
  EMPTY: ""
files:
  - {src: app/, dest: /opt/app/}
  - src: config.toml
    dest: /etc/app/config.toml
    owner: sandbox
`,
			files: map[string]string{"app/main.py": "print(1)\n", "config.toml": "x=1\n"},
			want: Plan{Base: Base{Image: "python", Line: 2, Text: "base.image: python"}, Steps: []Step{
				{Op: OpCopy, Line: 12, Text: "files: app/ -> /opt/app/", Sources: []string{"app"}, Dest: "/opt/app/", Chown: "root"},
				{Op: OpCopy, Line: 13, Text: "files: config.toml -> /etc/app/config.toml", Sources: []string{"config.toml"}, Dest: "/etc/app/config.toml", Chown: "sandbox"},
				{Op: OpEnv, Line: 9, Text: "env: APP_MODE=production", Key: "APP_MODE", Value: "production"},
				{Op: OpEnv, Line: 10, Text: "env: EMPTY=", Key: "EMPTY"},
				{Op: OpEnv, Line: 8, Text: "env: ZED=1", Key: "ZED", Value: "1"},
				{Op: OpWorkdir, Line: 6, Text: "workdir: /opt/app", Dir: "/opt/app"},
				{Op: OpRun, Line: 5, Text: "run: python3 -m compileall -q /opt/app", Argv: []string{"/bin/sh", "-c", "python3 -m compileall -q /opt/app"}},
				{Op: OpEntrypoint, Line: 4, Text: "entrypoint: /usr/bin/env", Argv: []string{"/usr/bin/env"}},
				{Op: OpCmd, Line: 3, Text: "cmd: python3 main.py", Argv: []string{"python3", "main.py"}},
			}},
		},
		{
			name: "workdir in the workspace is allowed",
			yaml: "version: 1\nbase: {image: python}\nworkdir: /workspace\n",
			want: Plan{Base: Base{Image: "python", Line: 2, Text: "base.image: python"}, Steps: []Step{{Op: OpWorkdir, Line: 3, Text: "workdir: /workspace", Dir: "/workspace"}}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := buildDirWith(t, tc.yaml, tc.files)
			got, err := ReadImageFile(path, nil)
			if err != nil {
				t.Fatalf("ReadImageFile: %v", err)
			}
			want := tc.want
			want.File, want.Context = path, filepath.Dir(path)
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("plan:\n got %#v\nwant %#v", *got, want)
				for i := 0; i < len(got.Steps) && i < len(want.Steps); i++ {
					if !reflect.DeepEqual(got.Steps[i], want.Steps[i]) {
						t.Errorf("step %d:\n got %#v\nwant %#v", i, got.Steps[i], want.Steps[i])
					}
				}
			}
		})
	}
}

func TestReadImageFileRefusals(t *testing.T) {
	const head = "version: 1\nbase: {image: python}\n"
	reqOK := map[string]string{"r.txt": "a==1 --hash=" + testHash + "\n"}
	npmOK := map[string]string{"package.json": "{}", "package-lock.json": `{"lockfileVersion": 3, "packages": {}}`}
	tests := []struct {
		name  string
		yaml  string
		files map[string]string
		args  map[string]string
		// want are substrings of the error, after "FILE" is replaced by
		// the image file's path.
		want []string
	}{
		{name: "build args", yaml: head, args: map[string]string{"V": "1"}, want: []string{"FILE: --build-arg V: a declarative image file has no variables"}},
		{name: "empty file", yaml: "", want: []string{"FILE: is empty"}},
		{name: "not a mapping", yaml: "- a\n", want: []string{"FILE: is not a mapping"}},
		{name: "two documents", yaml: head + "---\nversion: 1\n", want: []string{"more than one YAML document"}},
		{name: "syntax error", yaml: "version: [1\n", want: []string{"FILE: yaml:"}},
		{name: "unknown key with suggestion", yaml: head + "\nworkdri: /x\n", want: []string{`FILE:4: workdri: is not a known key (did you mean "workdir"?); accepted at the top level: apt, base, cmd`}},
		{name: "unknown nested key", yaml: "version: 1\nbase: {image: python, suite: x}\n", want: []string{`FILE:2: base.suite: is not a known key`, "accepted under base: debian, image"}},
		{name: "duplicate key", yaml: head + "workdir: /a\nworkdir: /b\n", want: []string{"FILE:4: workdir: is given twice (lines 3 and 4)"}},
		{name: "anchor", yaml: head + "entrypoint: &a [x]\ncmd: *a\n", want: []string{"FILE:3: entrypoint: uses a YAML anchor"}},
		{name: "merge key", yaml: "version: 1\nbase: {<<: {image: python}}\n", want: []string{"FILE:2: base: uses a YAML merge key"}},
		{name: "missing version", yaml: "base: {image: python}\n", want: []string{"FILE:1: version: is missing; write version: 1"}},
		{name: "wrong version", yaml: "version: 2\nbase: {image: python}\n", want: []string{`FILE:1: version: "2" is not a version this Moat reads`}},
		{name: "quoted version", yaml: "version: \"1\"\nbase: {image: python}\n", want: []string{`FILE:1: version: "1" is not a version`}},
		{name: "missing base", yaml: "version: 1\n", want: []string{"FILE:1: base: is missing"}},
		{name: "both bases", yaml: "version: 1\nbase: {image: python, debian: bookworm}\n", want: []string{"FILE:2: base: names both debian and image"}},
		{name: "neither base", yaml: "version: 1\nbase: {}\n", want: []string{"FILE:2: base: names neither debian nor image"}},
		{name: "unknown suite", yaml: "version: 1\nbase: {debian: wheezy}\n", want: []string{`FILE:2: base.debian: "wheezy" is not a Debian suite Moat can bootstrap; accepted: bullseye, bookworm`}},
		{name: "bad image name", yaml: "version: 1\nbase: {image: ../etc}\n", want: []string{`FILE:2: base.image: "../etc" is not an image name`}},
		{name: "base image not a string", yaml: "version: 1\nbase: {image: 3}\n", want: []string{`FILE:2: base.image: "3" is an integer; expected a string (put it in quotes)`}},
		{name: "apt empty", yaml: head + "apt: []\n", want: []string{"FILE:3: apt: is an empty list"}},
		{name: "apt not a list", yaml: head + "apt: curl\n", want: []string{`FILE:3: apt: "curl" is a string; expected a list of strings`}},
		{name: "apt version", yaml: head + "apt: [curl=7.88]\n", want: []string{`FILE:3: apt[0]: "curl=7.88" names a version`}},
		{name: "apt bad name", yaml: head + "apt: [\"curl; rm -rf /\"]\n", want: []string{`FILE:3: apt[0]: "curl; rm -rf /" is not a Debian package name`}},
		{name: "apt twice", yaml: head + "apt: [curl, curl]\n", want: []string{`FILE:3: apt[1]: "curl" is listed twice`}},
		{name: "pip without requirements", yaml: head + "pip: {index: \"https://pypi.org/simple\"}\n", want: []string{"FILE:3: pip.requirements: is missing"}},
		{name: "pip requirements missing", yaml: head + "pip: {requirements: r.txt}\n", want: []string{`FILE:3: pip.requirements: "r.txt" cannot be read`}},
		{name: "pip requirements outside", yaml: head + "pip: {requirements: ../r.txt}\n", want: []string{`FILE:3: pip.requirements: "../r.txt" leaves the image file's directory`}},
		{name: "pip requirements absolute", yaml: head + "pip: {requirements: /etc/passwd}\n", want: []string{`FILE:3: pip.requirements: "/etc/passwd" is an absolute path`}},
		{name: "pip requirements through a symlink out", yaml: head + "pip: {requirements: link/r.txt}\n", files: map[string]string{"SYMLINK link": "/etc"}, want: []string{`FILE:3: pip.requirements: "link/r.txt" cannot be read`}},
		{name: "pip unpinned", yaml: head + "pip: {requirements: r.txt}\n", files: map[string]string{"r.txt": "a==1 --hash=" + testHash + "\nb>=2\n"}, want: []string{"FILE:3: pip.requirements:", "r.txt:2: \"b>=2\" is not pinned to one version with =="}},
		{name: "pip unhashed", yaml: head + "pip: {requirements: r.txt}\n", files: map[string]string{"r.txt": "b==2\n"}, want: []string{"r.txt:1: b==2 has no --hash"}},
		{name: "pip http index", yaml: head + "pip: {requirements: r.txt, index: \"http://pypi.org/simple\"}\n", files: reqOK, want: []string{`FILE:3: pip.index: "http://pypi.org/simple" is not an https:// URL`}},
		{name: "pip index with credentials", yaml: head + "pip: {requirements: r.txt, index: \"https://u:p@pypi.example.com/simple\"}\n", files: reqOK, want: []string{`FILE:3: pip.index:`, "carries credentials"}},
		{name: "pip index without host", yaml: head + "pip: {requirements: r.txt, index: \"https:///simple\"}\n", files: reqOK, want: []string{"FILE:3: pip.index:", "has no host"}},
		{name: "pip find_links not a dir", yaml: head + "pip: {requirements: r.txt, find_links: r.txt}\n", files: reqOK, want: []string{`FILE:3: pip.find_links: "r.txt" is not a directory`}},
		{name: "pip find_links missing", yaml: head + "pip: {requirements: r.txt, find_links: wheels}\n", files: reqOK, want: []string{`FILE:3: pip.find_links: "wheels" cannot be used`}},
		{name: "pip unknown key", yaml: head + "pip: {requirements: r.txt, extra_index: x}\n", files: reqOK, want: []string{"FILE:3: pip.extra_index: is not a known key", "accepted under pip: find_links, index, requirements"}},
		{name: "npm without lockfile", yaml: head + "npm: {dir: /opt/app}\n", want: []string{"FILE:3: npm.lockfile: is missing"}},
		{name: "npm lockfile misnamed", yaml: head + "npm: {lockfile: lock.json, dir: /opt/app}\n", want: []string{`FILE:3: npm.lockfile: "lock.json" is not named package-lock.json`}},
		{name: "npm without package.json", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/app}\n", files: map[string]string{"package-lock.json": "{}"}, want: []string{`FILE:3: npm.lockfile: "package-lock.json" has no package.json beside it`}},
		{name: "npm lockfile v1", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/app}\n", files: map[string]string{"package.json": "{}", "package-lock.json": `{"lockfileVersion": 1, "dependencies": {}}`}, want: []string{"lockfileVersion 1 is not accepted"}},
		{name: "npm package without integrity", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/app}\n", files: map[string]string{"package.json": "{}", "package-lock.json": `{"lockfileVersion": 3, "packages": {"node_modules/evil": {"version": "1.0.0", "resolved": "git+ssh://git@example.com/evil.git"}}}`}, want: []string{`package "evil"@"1.0.0" has no integrity hash`}},
		{name: "npm without dir", yaml: head + "npm: {lockfile: package-lock.json}\n", files: npmOK, want: []string{"FILE:3: npm.dir: is missing"}},
		{name: "npm dir relative", yaml: head + "npm: {lockfile: package-lock.json, dir: app}\n", files: npmOK, want: []string{`FILE:3: npm.dir: "app" is not an absolute path`}},
		{name: "npm dir in tmp", yaml: head + "npm: {lockfile: package-lock.json, dir: /tmp/app}\n", files: npmOK, want: []string{`FILE:3: npm.dir: "/tmp/app" is under /tmp, which every run mounts fresh`}},
		{name: "npm http registry", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/a, registry: \"http://registry.npmjs.org\"}\n", files: npmOK, want: []string{`FILE:3: npm.registry: "http://registry.npmjs.org" is not an https:// URL`}},
		{name: "npm dev not a bool", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/a, dev: \"yes\"}\n", files: npmOK, want: []string{`FILE:3: npm.dev: "yes" is a string; expected true or false`}},
		{name: "npm scripts not a bool", yaml: head + "npm: {lockfile: package-lock.json, dir: /opt/a, scripts: 1}\n", files: npmOK, want: []string{`FILE:3: npm.scripts: "1" is an integer; expected true or false`}},
		{name: "files not a list", yaml: head + "files: {src: a}\n", want: []string{"FILE:3: files: is a mapping; expected a list"}},
		{name: "files empty", yaml: head + "files: []\n", want: []string{"FILE:3: files: has 0 entries"}},
		{name: "files src missing key", yaml: head + "files: [{dest: /opt/a}]\n", want: []string{"FILE:3: files[0].src: is missing"}},
		{name: "files src does not exist", yaml: head + "files: [{src: nope, dest: /opt/a}]\n", want: []string{`FILE:3: files[0].src: "nope" cannot be used`}},
		{name: "files src escapes", yaml: head + "files:\n  - {src: ../x, dest: /opt/a}\n", want: []string{`FILE:4: files[0].src: "../x" leaves the image file's directory`}},
		{name: "files src symlink out", yaml: head + "files: [{src: link/passwd, dest: /opt/a}]\n", files: map[string]string{"SYMLINK link": "/etc"}, want: []string{`FILE:3: files[0].src: "link/passwd" cannot be used`}},
		{name: "files dest missing", yaml: head + "files: [{src: a}]\n", files: map[string]string{"a": "x"}, want: []string{"FILE:3: files[0].dest: is missing"}},
		{name: "files dest relative", yaml: head + "files: [{src: a, dest: opt/a}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dest: "opt/a" is not an absolute path`}},
		{name: "files dest root", yaml: head + "files: [{src: a, dest: /}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dest: "/" is the image's root`}},
		{name: "files dest dotdot", yaml: head + "files: [{src: a, dest: /opt/../etc}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dest: "/opt/../etc" contains ..`}},
		{name: "files dest workspace", yaml: head + "files: [{src: a, dest: /workspace/a}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dest: "/workspace/a" is under /workspace`}},
		{name: "files dest proc", yaml: head + "files: [{src: a, dest: /proc}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dest: "/proc" is under /proc`}},
		{name: "files dest dev", yaml: head + "files: [{src: a, dest: /dev/x}]\n", files: map[string]string{"a": "x"}, want: []string{`is under /dev`}},
		{name: "files owner", yaml: head + "files: [{src: a, dest: /a, owner: \"0\"}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].owner: "0" is not an owner; accepted: root`}},
		{name: "files unknown key", yaml: head + "files: [{src: a, dst: /a}]\n", files: map[string]string{"a": "x"}, want: []string{`FILE:3: files[0].dst: is not a known key (did you mean "dest"?)`}},
		{name: "env not a mapping", yaml: head + "env: [A=1]\n", want: []string{"FILE:3: env: is a list; expected a mapping"}},
		{name: "env bad name", yaml: head + "env: {1A: x}\n", want: []string{"FILE:3: env.1A: is not a variable name"}},
		{name: "env number", yaml: head + "env: {A: 1}\n", want: []string{`FILE:3: env.A: "1" is an integer; expected a string (put it in quotes)`}},
		{name: "env null", yaml: head + "env: {A: }\n", want: []string{`FILE:3: env.A: has no value; write "" for an empty one`}},
		{name: "workdir relative", yaml: head + "workdir: app\n", want: []string{`FILE:3: workdir: "app" is not an absolute path`}},
		{name: "workdir tmp", yaml: head + "workdir: /tmp\n", want: []string{`FILE:3: workdir: "/tmp" is under /tmp`}},
		{name: "run empty string", yaml: head + "run: [\"\"]\n", want: []string{"FILE:3: run[0]: is empty"}},
		{name: "run not a list", yaml: head + "run: make\n", want: []string{`FILE:3: run: "make" is a string; expected a list of strings`}},
		{name: "cmd empty", yaml: head + "cmd: []\n", want: []string{"FILE:3: cmd: is an empty list"}},
		{name: "entrypoint NUL", yaml: head + "entrypoint: [\"a\\0b\"]\n", want: []string{"FILE:3: entrypoint[0]:", "contains a NUL byte"}},
		{name: "several problems at once", yaml: "version: 1\nbase: {image: python}\nworkdir: x\ncmd: []\n", want: []string{"FILE:3: workdir:", "FILE:4: cmd:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files := map[string]string{}
			var links [][2]string
			for k, v := range tc.files {
				if name, ok := strings.CutPrefix(k, "SYMLINK "); ok {
					links = append(links, [2]string{name, v})
					continue
				}
				files[k] = v
			}
			path := buildDirWith(t, tc.yaml, files)
			for _, l := range links {
				if err := os.Symlink(l[1], filepath.Join(filepath.Dir(path), l[0])); err != nil {
					t.Fatal(err)
				}
			}
			p, err := ReadImageFile(path, tc.args)
			if err == nil {
				t.Fatalf("ReadImageFile accepted it: %#v", p)
			}
			for _, w := range tc.want {
				w = strings.ReplaceAll(w, "FILE", path)
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n%v\ndoes not contain\n%s", err, w)
				}
			}
		})
	}
}

func TestReadImageFileMissing(t *testing.T) {
	_, err := ReadImageFile(filepath.Join(t.TempDir(), "none.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Fatalf("err = %v, want one naming none.yaml", err)
	}
}

// FuzzReadImageFile: no panic, and every error names the file.
func FuzzReadImageFile(f *testing.F) {
	for _, s := range []string{
		"version: 1\nbase: {debian: bookworm}\napt: [curl]\n",
		"version: 1\nbase: {image: python}\nfiles: [{src: a, dest: /opt/a, owner: sandbox}]\nenv: {A: b}\nworkdir: /opt\nrun: [\"true\"]\nentrypoint: [x]\ncmd: [y]\n",
		"version: 1\nbase: {image: python}\npip: {requirements: r.txt, index: \"https://pypi.org/simple\", find_links: w}\n",
		"version: 1\nbase: {image: node}\nnpm: {lockfile: package-lock.json, dir: /opt/app, dev: true, scripts: false}\n",
		"version: 1\nbase: {<<: {image: x}}\n",
		"a: &x 1\nb: *x\n",
		"? [a]\n: b\n",
		"version: 1\n---\n",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "r.txt"), []byte("a==1 --hash="+testHash+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "image.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := ReadImageFile(path, nil)
		if err != nil {
			if strings.Contains(err.Error(), "internal error") {
				t.Fatalf("panic: %v", err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, path) {
					t.Fatalf("error line %q does not name the file %s", line, path)
				}
			}
			return
		}
		if p.Base.Debian == "" && p.Base.Image == "" {
			t.Fatalf("accepted a plan with no base: %#v", p)
		}
	})
}
