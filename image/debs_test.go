package image

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseDebFileName(t *testing.T) {
	tests := []struct {
		name, file string
		want       Deb
		wantErr    bool
	}{
		{name: "plain", file: "jq_1.6-2.1+deb12u3_amd64.deb", want: Deb{Name: "jq", Version: "1.6-2.1+deb12u3", Arch: "amd64"}},
		{name: "epoch", file: "bsdutils_1%3a2.38.1-5+deb12u3_amd64.deb", want: Deb{Name: "bsdutils", Version: "1:2.38.1-5+deb12u3", Arch: "amd64"}},
		{name: "upper-case escape", file: "libgmp10_2%3A6.2.1+dfsg1-1.1_amd64.deb", want: Deb{Name: "libgmp10", Version: "2:6.2.1+dfsg1-1.1", Arch: "amd64"}},
		{name: "tilde and plus in the name", file: "libstdc++6_12.2.0-14~deb12u1_all.deb", want: Deb{Name: "libstdc++6", Version: "12.2.0-14~deb12u1", Arch: "all"}},
		{name: "not a deb", file: "lock", wantErr: true},
		{name: "two parts", file: "jq_1.6.deb", wantErr: true},
		{name: "four parts", file: "jq_1_6_amd64.deb", wantErr: true},
		{name: "bad escape", file: "jq_1%zz_amd64.deb", wantErr: true},
		{name: "slash in version", file: "jq_1%2f..%2f_amd64.deb", wantErr: true},
		{name: "upper-case name", file: "JQ_1.6_amd64.deb", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseDebFileName(tc.file)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseDebFileName(%q) = %+v, %v; wantErr %v", tc.file, got, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("ParseDebFileName(%q) = %+v, want %+v", tc.file, got, tc.want)
			}
		})
	}
}

// TestArchiveDebs hashes a tree's apt cache as the builder does: regular
// .deb files only, a symlink (which a sandboxed step could plant to make
// the host read its files) skipped, and only the installed version of an
// installed package picked.
func TestArchiveDebs(t *testing.T) {
	root := t.TempDir()
	if debs, err := ArchiveDebs(root); err != nil || debs != nil {
		t.Fatalf("a tree without an apt cache: %v, %v", debs, err)
	}
	dir := filepath.Join(root, ArchivesDir)
	if err := os.MkdirAll(filepath.Join(dir, "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	for name, content := range map[string]string{
		"jq_1.6-2.1_amd64.deb":            "jq",
		"jq_1.5-1_amd64.deb":              "old jq",
		"bsdutils_1%3a2.38.1-5_amd64.deb": "bsdutils",
		"notinstalled_1.0_all.deb":        "x",
		"lock":                            "",
		"notes.deb":                       "not named by apt",
		"partial/half_1.0_amd64.deb":      "half",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(secret, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, filepath.Join(dir, "evil_1.0_amd64.deb")); err != nil {
		t.Fatal(err)
	}
	debs, err := ArchiveDebs(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range debs {
		names = append(names, d.Name+"="+d.Version)
	}
	if want := []string{"bsdutils=1:2.38.1-5", "jq=1.5-1", "jq=1.6-2.1", "notinstalled=1.0"}; !reflect.DeepEqual(names, want) {
		t.Errorf("ArchiveDebs = %q, want %q", names, want)
	}
	got := DebHashes(debs, map[string]string{"jq": "1.6-2.1", "bsdutils": "1:2.38.1-5", "bash": "5.2"})
	want := map[string]string{"jq": debSHA("jq"), "bsdutils": debSHA("bsdutils")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("DebHashes = %v, want %v", got, want)
	}
}

func debSHA(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// FuzzParseDebFileName: file names in a tree's apt cache may have been
// chosen by a sandboxed step. Whatever is accepted names a package,
// version and architecture without a path separator or NUL.
func FuzzParseDebFileName(f *testing.F) {
	for _, s := range []string{"jq_1.6-2.1+deb12u3_amd64.deb", "bsdutils_1%3a2.38.1-5+deb12u3_amd64.deb", "a_%_b.deb", "x__.deb", "lock"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, file string) {
		d, err := ParseDebFileName(file)
		if err != nil {
			return
		}
		for _, s := range []string{d.Name, d.Version, d.Arch} {
			if s == "" || strings.ContainsAny(s, "/\x00_%") {
				t.Fatalf("ParseDebFileName(%q) = %+v", file, d)
			}
		}
	})
}
