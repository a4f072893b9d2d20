package imagebuild

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func testLock() *Lock {
	plan := &Plan{File: "/src/app/image.yaml", Base: Base{Image: "python"}, Pins: []Pin{
		{Manager: "pip", Name: "zed", Version: "1", Hash: "sha256:aa"},
		{Manager: "npm", Name: "is-number", Version: "7.0.0", Hash: isNumberSRI},
		{Manager: "pip", Name: "attrs", Version: "23.1.0", Hash: "sha256:bb"},
	}}
	return NewLock(plan, "f00d", "sha256:base", map[string]string{"curl": "7.88.1-10", "bash": "5.2.15-2"},
		map[string]string{"curl": "sha256:c1", "bash": "sha256:b1"}, "sha256:result")
}

func TestNewLock(t *testing.T) {
	want := &Lock{
		Version: 1, File: "image.yaml", FileSHA256: "f00d",
		Base:         LockBase{Image: "python", ImageDigest: "sha256:base"},
		Debian:       map[string]string{"curl": "7.88.1-10", "bash": "5.2.15-2"},
		DebianSHA256: map[string]string{"curl": "sha256:c1", "bash": "sha256:b1"},
		Pins: []LockPin{
			{Manager: "npm", Name: "is-number", Version: "7.0.0", Hash: isNumberSRI},
			{Manager: "pip", Name: "attrs", Version: "23.1.0", Hash: "sha256:bb"},
			{Manager: "pip", Name: "zed", Version: "1", Hash: "sha256:aa"},
		},
		Digest: "sha256:result",
	}
	if got := testLock(); !reflect.DeepEqual(got, want) {
		t.Errorf("got %#v\nwant %#v", got, want)
	}
	// A Debian base records the suite, never a base digest.
	deb := NewLock(&Plan{File: "x.yaml", Base: Base{Debian: "bookworm"}}, "f", "sha256:ignored", nil, nil, "sha256:d")
	if deb.Base != (LockBase{Debian: "bookworm"}) || deb.Pins == nil || deb.Debian == nil || deb.DebianSHA256 == nil {
		t.Errorf("debian-based lock %#v", deb)
	}
}

func TestLockRoundTripAndStableBytes(t *testing.T) {
	dir := t.TempDir()
	path := LockPath(filepath.Join(dir, "image.yaml"))
	if filepath.Base(path) != "image.yaml.lock" {
		t.Fatalf("LockPath = %s", path)
	}
	l := testLock()
	if err := WriteLock(path, l); err != nil {
		t.Fatal(err)
	}
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadLock(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, l) {
		t.Errorf("round trip:\n got %#v\nwant %#v", got, l)
	}
	// The same content in another order gives the same bytes.
	shuffled := *l
	shuffled.Pins = []LockPin{l.Pins[2], l.Pins[0], l.Pins[1]}
	if err := WriteLock(path, &shuffled); err != nil {
		t.Fatal(err)
	}
	second, _ := os.ReadFile(path)
	if !bytes.Equal(first, second) {
		t.Errorf("bytes differ:\n%s\n%s", first, second)
	}
	want := `{
  "version": 1,
  "file": "image.yaml",
  "file_sha256": "f00d",
  "base": {
    "image": "python",
    "image_digest": "sha256:base"
  },
  "debian": {
    "bash": "5.2.15-2",
    "curl": "7.88.1-10"
  },
  "debian_sha256": {
    "bash": "sha256:b1",
    "curl": "sha256:c1"
  },
  "pins": [
    {
      "manager": "npm",
      "name": "is-number",
      "version": "7.0.0",
      "hash": "` + isNumberSRI + `"
    },
    {
      "manager": "pip",
      "name": "attrs",
      "version": "23.1.0",
      "hash": "sha256:bb"
    },
    {
      "manager": "pip",
      "name": "zed",
      "version": "1",
      "hash": "sha256:aa"
    }
  ],
  "digest": "sha256:result"
}
`
	if string(first) != want {
		t.Errorf("bytes:\n%s\nwant\n%s", first, want)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("WriteLock left %d files, want only the lockfile", len(entries))
	}
}

func TestReadLockRefusals(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"not JSON", "{", "is not a Moat lockfile"},
		{"unknown key", `{"version": 1, "digest": "d", "base": {"debian": "x"}, "extra": 1}`, "is not a Moat lockfile"},
		{"wrong version", `{"version": 2, "digest": "d", "base": {"debian": "x"}}`, "version 2 is not 1"},
		{"no digest", `{"version": 1, "base": {"debian": "x"}}`, "has no digest"},
		{"no base", `{"version": 1, "digest": "d", "base": {}}`, "base names neither or both"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.lock")
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadLock(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Errorf("err = %v, want %q naming %s", err, tc.want, path)
			}
		})
	}
	if _, err := ReadLock(filepath.Join(t.TempDir(), "none.lock")); err == nil || !strings.Contains(err.Error(), "without --locked") {
		t.Errorf("missing lockfile: err = %v", err)
	}
}

func TestLockCompare(t *testing.T) {
	tests := []struct {
		name   string
		change func(l *Lock)
		want   []string
	}{
		{"same", func(*Lock) {}, nil},
		{"renamed file only", func(l *Lock) { l.File = "other.yaml" }, nil},
		{"everything", func(l *Lock) {
			l.FileSHA256 = "beef"
			l.Base.ImageDigest = "sha256:base2"
			l.Debian["curl"] = "7.88.1-11"
			delete(l.Debian, "bash")
			l.Debian["git"] = "1:2.39.2-1"
			l.Pins[0].Version = "7.0.1"
			l.Pins = l.Pins[:2]
			l.Pins = append(l.Pins, LockPin{Manager: "pip", Name: "new", Version: "2", Hash: "sha256:cc"})
			l.Digest = "sha256:other"
		}, []string{
			"build file sha256: f00d -> beef",
			"base image digest: sha256:base -> sha256:base2",
			"debian package bash 5.2.15-2: removed",
			"debian package curl: 7.88.1-10 -> 7.88.1-11",
			"debian package git 1:2.39.2-1: added",
			"npm package is-number: 7.0.0 " + isNumberSRI + " -> 7.0.1 " + isNumberSRI,
			"pip package new 2 sha256:cc: added",
			"pip package zed 1 sha256:aa: removed",
			"digest: sha256:result -> sha256:other",
		}},
		{"base kind", func(l *Lock) { l.Base = LockBase{Debian: "bookworm"} }, []string{
			"base debian suite: (none) -> bookworm",
			"base image: python -> (none)",
			"base image digest: sha256:base -> (none)",
		}},
		{"hash only", func(l *Lock) { l.Pins[1].Hash = "sha256:evil" }, []string{"pip package attrs: 23.1.0 sha256:bb -> 23.1.0 sha256:evil"}},
		{"debian hash, same version", func(l *Lock) { l.DebianSHA256["curl"] = "sha256:evil" }, []string{"debian package curl sha256: sha256:c1 -> sha256:evil"}},
		{"debian hash gone", func(l *Lock) { delete(l.DebianSHA256, "bash") }, []string{"debian package bash sha256: sha256:b1 -> (none)"}},
		{"debian version and hash: one line", func(l *Lock) {
			l.Debian["curl"] = "7.88.1-11"
			l.DebianSHA256["curl"] = "sha256:c2"
		}, []string{"debian package curl: 7.88.1-10 -> 7.88.1-11"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old, cur := testLock(), testLock()
			tc.change(cur)
			err := old.Compare(cur)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Compare: %v", err)
				}
				return
			}
			var de *LockDiffError
			if !errors.As(err, &de) {
				t.Fatalf("err = %v, want a *LockDiffError", err)
			}
			if !reflect.DeepEqual(de.Differences, tc.want) {
				t.Errorf("differences:\n%s\nwant\n%s", strings.Join(de.Differences, "\n"), strings.Join(tc.want, "\n"))
			}
			if !strings.Contains(err.Error(), "without --locked") {
				t.Errorf("error %q does not say how to update", err)
			}
		})
	}
}

func FuzzParseLock(f *testing.F) {
	if b, err := testLock().Marshal(); err == nil {
		f.Add(b)
	}
	f.Add([]byte(`{"version": 1, "digest": "d", "base": {"debian": "x"}, "pins": null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := ParseLock(data)
		if err != nil {
			return
		}
		// What is accepted re-encodes to bytes that parse to the same lock.
		b, err := l.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		l2, err := ParseLock(b)
		if err != nil || !reflect.DeepEqual(l, l2) {
			t.Fatalf("round trip: %v\n%#v\n%#v", err, l, l2)
		}
	})
}
