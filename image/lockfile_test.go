package image

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCompareLock(t *testing.T) {
	locked := map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10"}
	lockedSHA := map[string]string{"python3": "sha256:aa", "bash": "sha256:bb", "libc6": "sha256:cc"}
	tests := []struct {
		name     string
		resolved map[string]string
		hashes   map[string]string // nil: lockedSHA
		wantErr  bool
		want     []string // substrings of the error
	}{
		{
			name:     "same version, other bytes",
			resolved: map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10"},
			hashes:   map[string]string{"python3": "sha256:aa", "bash": "sha256:b0", "libc6": "sha256:cc"},
			wantErr:  true,
			want:     []string{"bash 5.2.15-2+b7 sha256: locked sha256:bb, resolved sha256:b0"},
		},
		{
			name:     "a hash the build lacks",
			resolved: map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10"},
			hashes:   map[string]string{"python3": "sha256:aa", "bash": "sha256:bb"},
			wantErr:  true,
			want:     []string{"libc6 2.36-9+deb12u10 sha256: locked sha256:cc, resolved (none)"},
		},
		{name: "identical", resolved: map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10"}},
		{
			name:     "security update",
			resolved: map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u11"},
			wantErr:  true,
			want:     []string{"libc6: locked 2.36-9+deb12u10, resolved 2.36-9+deb12u11"},
		},
		{
			name:     "new dependency",
			resolved: map[string]string{"python3": "3.11.2-1+b1", "bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10", "libfoo1": "1.0-1"},
			wantErr:  true,
			want:     []string{"not in lockfile: libfoo1 1.0-1"},
		},
		{
			name:     "dropped package",
			resolved: map[string]string{"python3": "3.11.2-1+b1", "libc6": "2.36-9+deb12u10"},
			wantErr:  true,
			want:     []string{"missing from build: bash 5.2.15-2+b7"},
		},
		{
			name:     "all at once",
			resolved: map[string]string{"python3": "3.11.4-1", "libc6": "2.36-9+deb12u10", "zlib1g": "1:1.2.13"},
			wantErr:  true,
			want:     []string{"python3: locked 3.11.2-1+b1, resolved 3.11.4-1", "zlib1g 1:1.2.13", "bash 5.2.15-2+b7", "without --locked"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hashes := tc.hashes
			if hashes == nil {
				hashes = lockedSHA
			}
			err := compareLock("images/python.lock", &Lockfile{Name: "python", Packages: locked, SHA256: lockedSHA}, tc.resolved, hashes)
			if (err != nil) != tc.wantErr {
				t.Fatalf("compareLock = %v, wantErr %v", err, tc.wantErr)
			}
			if err == nil {
				return
			}
			var mm *LockMismatchError
			if !errors.As(err, &mm) {
				t.Errorf("error %T is not a *LockMismatchError", err)
			}
			for _, w := range append(tc.want, "images/python.lock") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestLockfileRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := &Lockfile{Name: "python", Suite: "bookworm", Digest: "sha256:" + strings.Repeat("0", 64),
		Packages: map[string]string{"b": "2", "a": "1"}, BuiltWith: "mmdebstrap 1.3.5"}
	if err := WriteLockfile(dir, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadLockfile(dir, "python")
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest != want.Digest || got.Suite != want.Suite || got.BuiltWith != want.BuiltWith || len(got.Packages) != 2 {
		t.Errorf("round trip = %+v, want %+v", got, want)
	}
	data, err := os.ReadFile(filepath.Join(dir, "python.lock"))
	if err != nil {
		t.Fatal(err)
	}
	// Sorted keys keep lockfile diffs reviewable.
	if bytes.Index(data, []byte(`"a"`)) > bytes.Index(data, []byte(`"b"`)) || !bytes.HasSuffix(data, []byte("}\n")) {
		t.Errorf("lockfile not sorted or not newline-terminated:\n%s", data)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".*")); len(m) != 0 {
		t.Errorf("temp files left: %v", m)
	}
}

func TestReadLockfileErrors(t *testing.T) {
	tests := []struct {
		name    string
		content string // "" = no file
		wantMsg string
	}{
		{name: "missing", wantMsg: "moat image build python"},
		{name: "not json", content: "{", wantMsg: "parse lockfile"},
		{name: "other image", content: `{"name":"node","packages":{"a":"1"}}`, wantMsg: `name is "node"`},
		{name: "no packages", content: `{"name":"python","packages":{}}`, wantMsg: "no packages"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.content != "" {
				mustWrite(t, filepath.Join(dir, "python.lock"), tc.content, 0o644)
			}
			_, err := ReadLockfile(dir, "python")
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("ReadLockfile = %v, want error mentioning %q", err, tc.wantMsg)
			}
		})
	}
}

func TestParsePackages(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    map[string]string
		wantErr bool
	}{
		{
			name: "installed only",
			in:   "ii \tbash\t5.2.15-2+b7\nrc \told\t1.0\nii \tlibc6\t2.36-9+deb12u10\n",
			want: map[string]string{"bash": "5.2.15-2+b7", "libc6": "2.36-9+deb12u10"},
		},
		{name: "epoch kept", in: "ii \tpython3-numpy\t1:1.24.2-1+deb12u1\n", want: map[string]string{"python3-numpy": "1:1.24.2-1+deb12u1"}},
		{name: "garbage line", in: "ii bash\n", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePackages([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("parsePackages = %v, %v; wantErr %v", got, err, tc.wantErr)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("parsePackages = %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestClassifyFailure(t *testing.T) {
	def, err := definition("python")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		tail       []string
		wantMirror bool
		want       string
	}{
		{
			name: "dns failure names the mirror",
			tail: []string{"I: running apt-get update...",
				"E: Failed to fetch http://deb.debian.org/debian-security/dists/bookworm-security/InRelease  Temporary failure resolving 'deb.debian.org'"},
			wantMirror: true,
			want:       "mirror http://deb.debian.org/debian-security:",
		},
		{
			name: "the failing mirror, not one that worked",
			tail: []string{"Hit:1 http://deb.debian.org/debian bookworm InRelease",
				"Err:2 http://mirror.invalid/debian bookworm InRelease",
				"W: Failed to fetch http://mirror.invalid/debian/dists/bookworm/InRelease  Could not resolve 'mirror.invalid'"},
			wantMirror: true,
			want:       "mirror http://deb.debian.org/debian, http://deb.debian.org/debian-security",
		},
		{
			name:       "unknown host still lists mirrors",
			tail:       []string{"W: Unable to connect to proxy"},
			wantMirror: true,
			want:       "debian-security",
		},
		{
			name: "package problem shows the last lines",
			tail: []string{"E: Unable to locate package python3-nonexistent", "E: apt-get install failed"},
			want: "python3-nonexistent",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := classifyFailure(def, errors.New("exit status 1"), tc.tail)
			if errors.Is(err, ErrMirror) != tc.wantMirror {
				t.Errorf("classifyFailure = %v, ErrMirror %v, want %v", err, errors.Is(err, ErrMirror), tc.wantMirror)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("classifyFailure = %q, want it to mention %q", err, tc.want)
			}
		})
	}
}

func TestCondenser(t *testing.T) {
	var out bytes.Buffer
	c := &condenser{w: &out}
	// Writes split mid-line, as pipes do.
	for _, chunk := range []string{"I: downloading pack", "ages...\nGet:1 http://x y\r\n", "E: oops", ""} {
		c.Write([]byte(chunk))
	}
	c.flush()
	if got, want := out.String(), "    mmdebstrap I: downloading packages...\n    mmdebstrap E: oops\n"; got != want {
		t.Errorf("progress = %q, want %q", got, want)
	}
	if tail := c.tail(); len(tail) != 3 || tail[1] != "Get:1 http://x y" {
		t.Errorf("tail = %q", tail)
	}
}

func TestMmdebstrapArgs(t *testing.T) {
	def, err := definition("python")
	if err != nil {
		t.Fatal(err)
	}
	args := mmdebstrapArgs(def, "/store/python/.build-1/rootfs")
	joined := strings.Join(args, " ")
	for _, want := range []string{"--mode=root", "--variant=essential", "--include=bash,coreutils,curl,git,python3,python3-pip,python3-numpy,python3-yaml",
		"bookworm /store/python/.build-1/rootfs deb http://deb.debian.org/debian bookworm main",
		"deb http://deb.debian.org/debian-security bookworm-security main",
		"--skip=essential/unlink,cleanup/apt/cache bookworm"} {
		if !strings.Contains(joined, want) {
			t.Errorf("mmdebstrap args %q lack %q", joined, want)
		}
	}
	if strings.Contains(joined, "--customize-hook") || strings.Contains(joined, "cleanup/apt/lists") {
		t.Errorf("a built-in image's args %q download extra packages or keep the lists", joined)
	}

	// An image file's packages: bootstrapped with apt, downloaded only.
	def.Packages, def.Download = []string{"apt"}, []string{"jq", "libc++1"}
	joined = strings.Join(mmdebstrapArgs(def, "/r"), " ")
	for _, want := range []string{"--include=apt ",
		`--customize-hook=APT_CONFIG="$MMDEBSTRAP_APT_CONFIG" apt-get install --download-only -y --no-install-recommends jq libc++1 `,
		"--skip=essential/unlink,cleanup/apt/cache,cleanup/apt/lists bookworm /r"} {
		if !strings.Contains(joined, want) {
			t.Errorf("mmdebstrap args %q lack %q", joined, want)
		}
	}
}

func TestDefinitionsAreCopies(t *testing.T) {
	d := Definitions()
	d[0].Packages[0] = "mutated"
	if Definitions()[0].Packages[0] == "mutated" {
		t.Error("Definitions returned shared slices; callers could change what Build installs")
	}
}
