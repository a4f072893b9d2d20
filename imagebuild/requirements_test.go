package imagebuild

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseRequirements(t *testing.T) {
	h := testHash
	h2 := "sha512:" + strings.Repeat("ab", 64)
	tests := []struct {
		name string
		in   string
		want []Requirement
	}{
		{"one", "a==1 --hash=" + h, []Requirement{{Line: 1, Name: "a", Version: "1", Hashes: []string{h}}}},
		{"continuation lines and comments", "# header\n\nflask==3.0.0 \\\n    --hash=" + h + " \\\n    --hash=" + h2 + "\n    # via app\n",
			[]Requirement{{Line: 3, Name: "flask", Version: "3.0.0", Hashes: []string{h, h2}}}},
		{"extras", "requests[socks,security]==2.31.0 --hash=" + h, []Requirement{{Line: 1, Name: "requests", Version: "2.31.0", Hashes: []string{h}}}},
		{"environment marker", "tomli==2.0.1 ; python_version < \"3.11\" --hash=" + h, []Requirement{{Line: 1, Name: "tomli", Version: "2.0.1", Hashes: []string{h}}}},
		{"hash as a separate word and CRLF", "a==1.0rc1 --hash " + h + "\r\nb_c.d==2!1.0+local --hash=" + h + "\r\n",
			[]Requirement{{Line: 1, Name: "a", Version: "1.0rc1", Hashes: []string{h}}, {Line: 2, Name: "b_c.d", Version: "2!1.0+local", Hashes: []string{h}}}},
		{"spaces around ==", "a == 1 --hash=" + h + " # trailing comment", []Requirement{{Line: 1, Name: "a", Version: "1", Hashes: []string{h}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequirements([]byte(tc.in), "r.txt")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestParseRequirementsRefusals(t *testing.T) {
	h := " --hash=" + testHash
	tests := []struct {
		name, in, want string
	}{
		{"empty", "# nothing\n", "r.txt: has no requirements"},
		{"unpinned", "a" + h, `r.txt:1: "a" is not pinned to one version with ==`},
		{"range", "a>=1" + h, `r.txt:1: "a>=1" is not pinned`},
		{"arbitrary equality", "a===1" + h, `r.txt:1: "a===1" is not pinned`},
		{"wildcard", "a==1.*" + h, `r.txt:1: a: version "1.*" is not one exact version`},
		{"two clauses", "a==1,!=1.1" + h, `r.txt:1: a: version "1,!=1.1" is not one exact version`},
		{"no hash", "a==1\n", "r.txt:1: a==1 has no --hash"},
		{"md5 hash", "a==1 --hash=md5:d41d8cd98f00b204e9800998ecf8427e", `r.txt:1: a: hash "md5:d41d8cd98f00b204e9800998ecf8427e" is not sha256:<hex>`},
		{"short hash", "a==1 --hash=sha256:abcd", "a sha256 digest is 64 hex digits, not 4"},
		{"upper-case hash", "a==1 --hash=sha256:" + strings.Repeat("A", 64), "is not lower-case hex"},
		{"editable", "-e ." + h, `r.txt:1: option "-e" is not accepted`},
		{"include", "-r other.txt\n", `r.txt:1: option "-r" is not accepted`},
		{"constraints", "-c c.txt\n", `option "-c" is not accepted`},
		{"index option", "--index-url https://evil.example/simple\n", `option "--index-url" is not accepted`},
		{"option after requirement", "a==1 --no-binary :all:" + h, `r.txt:1: a: option "--no-binary" is not accepted`},
		{"direct reference", "a @ https://example.com/a.whl" + h, `r.txt:1: "a @ https://example.com/a.whl" is a URL or direct reference`},
		{"URL", "https://example.com/a-1-py3-none-any.whl" + h, "is a URL or direct reference"},
		{"bad name", "a$b==1" + h, `r.txt:1: "a$b" is not a valid package name`},
		{"bad extras", "a[x==1" + h, "has malformed extras"},
		{"empty marker", "a==1 ;" + h, "has an empty environment marker"},
		{"duplicate", "a==1" + h + "\nA==2" + h, "r.txt:2: A is already required on line 1"},
		{"duplicate normalised", "a_b==1" + h + "\na.b==1" + h, "r.txt:2: a.b is already required on line 1"},
		{"error on the line it starts", "a==1" + h + "\nb==1 \\\n --hash=x\n", `r.txt:2: b: hash "x"`},
		{"invalid UTF-8", "a==1\xff" + h, "r.txt: is not valid UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequirements([]byte(tc.in), "r.txt")
			if err == nil {
				t.Fatalf("accepted: %#v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func FuzzParseRequirements(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "pip", "requirements.txt")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		"a==1 --hash=" + testHash,
		"a[x]==1 ; python_version < \"3\" \\\n --hash " + testHash + "\n# c\n",
		"-e .\n", "a @ https://x/y.whl\n", "a==1 \\", "\\\n\\\n", "a==1 --hash",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ParseRequirements(data, "r.txt")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "r.txt") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, r := range reqs {
			if r.Name == "" || r.Version == "" || len(r.Hashes) == 0 || r.Line < 1 {
				t.Fatalf("accepted an incomplete requirement %#v", r)
			}
			for _, h := range r.Hashes {
				if checkHash(h) != nil {
					t.Fatalf("accepted hash %q", h)
				}
			}
		}
	})
}

func TestParseNpmLock(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []NpmPackage
	}{
		{"fixture (npm 10, v3)", fixture(t, "npm/package-lock.json"),
			[]NpmPackage{{Path: "node_modules/is-number", Name: "is-number", Version: "7.0.0", Integrity: isNumberSRI}}},
		{"v2 nested, scoped, dev, alias, bundled", `{"lockfileVersion": 2, "dependencies": {"ignored": {}}, "packages": {
			"": {"name": "app"},
			"node_modules/@s/a": {"version": "1.0.0", "integrity": "sha512-AA== sha1-BB"},
			"node_modules/@s/a/node_modules/b": {"version": "2.0.0", "integrity": "sha256-CC", "dev": true},
			"node_modules/c": {"name": "real-c", "version": "3.0.0", "integrity": "sha384-DD"},
			"node_modules/c/node_modules/d": {"version": "4.0.0", "inBundle": true}}}`,
			[]NpmPackage{
				{Path: "node_modules/@s/a", Name: "@s/a", Version: "1.0.0", Integrity: "sha512-AA=="},
				{Path: "node_modules/@s/a/node_modules/b", Name: "b", Version: "2.0.0", Integrity: "sha256-CC", Dev: true},
				{Path: "node_modules/c", Name: "real-c", Version: "3.0.0", Integrity: "sha384-DD"},
			}},
		{"no packages", `{"lockfileVersion": 3, "packages": {"": {}}}`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNpmLock([]byte(tc.in), "package-lock.json")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v\nwant %#v", got, tc.want)
			}
		})
	}
}

func TestParseNpmLockRefusals(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not JSON", "{", "package-lock.json: is not a package-lock.json"},
		{"no version", `{"packages": {}}`, "has no lockfileVersion"},
		{"v1", `{"lockfileVersion": 1}`, "lockfileVersion 1 is not accepted (2 or 3 are)"},
		{"missing version", `{"lockfileVersion": 3, "packages": {"node_modules/a": {"integrity": "sha512-AA"}}}`, `package "node_modules/a" has no version`},
		{"missing integrity", `{"lockfileVersion": 3, "packages": {"node_modules/a": {"version": "1.0.0", "resolved": "https://x/a.tgz"}}}`, `package "a"@"1.0.0" has no integrity hash`},
		{"weak integrity", `{"lockfileVersion": 3, "packages": {"node_modules/a": {"version": "1.0.0", "integrity": "sha1-AAAA"}}}`, `integrity "sha1-AAAA" is not sha512-<base64>`},
		{"link", `{"lockfileVersion": 3, "packages": {"node_modules/a": {"resolved": "../a", "link": true}}}`, `package "node_modules/a" is a link to local files`},
		{"workspace", `{"lockfileVersion": 3, "packages": {"packages/a": {"version": "1.0.0"}}}`, `package "packages/a" is not under node_modules`},
		{"wrong type", `{"lockfileVersion": 3, "packages": {"node_modules/a": {"version": 1}}}`, `package "node_modules/a":`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNpmLock([]byte(tc.in), "package-lock.json")
			if err == nil {
				t.Fatalf("accepted: %#v", got)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func FuzzParseNpmLock(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("testdata", "npm", "package-lock.json")); err == nil {
		f.Add(b)
	}
	for _, s := range []string{
		`{"lockfileVersion": 2, "packages": {"node_modules/a": {"version": "1", "integrity": "sha512-AA=="}}}`,
		`{"lockfileVersion": 3, "packages": {"node_modules/a": {"link": true}}}`,
		`{"lockfileVersion": 3, "packages": {"node_modules/": {"inBundle": true}}}`,
		`[]`, `{"lockfileVersion": "3"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pkgs, err := ParseNpmLock(data, "package-lock.json")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "package-lock.json") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, p := range pkgs {
			if p.Version == "" || !npmIntegrity.MatchString(p.Integrity) {
				t.Fatalf("accepted a package without version or integrity: %#v", p)
			}
		}
	})
}
