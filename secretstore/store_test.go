package secretstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const value = "ghp_s3cr3tVALUEthatMustNeverLeak42"

func newStore(t *testing.T) (*Store, string) {
	t.Helper()
	home := t.TempDir()
	return Open(home, ""), home
}

func TestRoundTrip(t *testing.T) {
	t.Setenv("MOAT_TEST_SECRET", value)
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, kind, payload string
		wantSource          string
	}{
		{"stored value", KindValue, value, ""},
		{"file reference", KindFile, file, "file:" + file},
		{"env reference", KindEnv, "MOAT_TEST_SECRET", "env:MOAT_TEST_SECRET"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			if err := s.Add("gh", tc.kind, tc.payload); err != nil {
				t.Fatal(err)
			}
			got, err := s.Value("gh")
			if err != nil || got != value {
				t.Fatalf("Value = %q, %v; want the value", got, err)
			}
			src, err := s.Source("gh")
			if err != nil || src != tc.wantSource {
				t.Errorf("Source = %q, %v; want %q", src, err, tc.wantSource)
			}
			if err := s.Add("gh", tc.kind, tc.payload); err == nil || !strings.Contains(err.Error(), "rotate") {
				t.Errorf("adding gh twice: %v, want an error pointing at rotate", err)
			}
		})
	}
}

func TestNoPlaintextAndModes(t *testing.T) {
	s, home := newStore(t)
	if err := s.Add("gh", KindValue, value); err != nil {
		t.Fatal(err)
	}
	if err := s.Rotate("gh", KindValue, value+"2"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Join(home, "secrets.key"), 0o600},
		{filepath.Join(home, "secrets"), 0o700 | os.ModeDir},
		{filepath.Join(home, "secrets", "gh.json"), 0o600},
	} {
		st, err := os.Stat(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != tc.mode {
			t.Errorf("%s has mode %v, want %v", tc.path, st.Mode(), tc.mode)
		}
	}
	// Nothing under home holds the value, in clear or as base64 of it in
	// the entry's JSON (the key file is random bytes).
	filepath.WalkDir(home, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte("s3cr3t")) {
			t.Errorf("%s holds the value in clear", p)
		}
		return nil
	})
	ents, err := os.ReadDir(filepath.Join(home, "secrets"))
	if err != nil || len(ents) != 1 {
		t.Errorf("secrets dir holds %v (%v); want only gh.json (no temp files left)", ents, err)
	}
}

func TestOpenFails(t *testing.T) {
	tests := []struct {
		name   string
		damage func(t *testing.T, s *Store, home string)
		want   string
	}{
		{"wrong key", func(t *testing.T, s *Store, home string) {
			writeKey(t, filepath.Join(home, "secrets.key"), bytes.Repeat([]byte{7}, keySize))
		}, "does not open it"},
		{"tampered ciphertext", func(t *testing.T, s *Store, home string) {
			editEntry(t, home, func(e *sealed) { e.Ciphertext[0] ^= 1 })
		}, "does not open it"},
		{"kind relabelled", func(t *testing.T, s *Store, home string) {
			editEntry(t, home, func(e *sealed) { e.Kind = KindEnv })
		}, "does not open it"},
		{"entry moved to another name", func(t *testing.T, s *Store, home string) {
			b, _ := os.ReadFile(filepath.Join(home, "secrets", "gh.json"))
			b = bytes.Replace(b, []byte(`"name": "gh"`), []byte(`"name": "other"`), 1)
			os.WriteFile(filepath.Join(home, "secrets", "other.json"), b, 0o600)
			os.Remove(filepath.Join(home, "secrets", "gh.json"))
		}, "does not open it"},
		{"key readable by others", func(t *testing.T, s *Store, home string) {
			os.Chmod(filepath.Join(home, "secrets.key"), 0o644)
		}, "chmod 600"},
		{"key missing", func(t *testing.T, s *Store, home string) {
			os.Remove(filepath.Join(home, "secrets.key"))
		}, "does not exist"},
		{"key short", func(t *testing.T, s *Store, home string) {
			writeKey(t, filepath.Join(home, "secrets.key"), []byte("short"))
		}, "want 32 random bytes"},
		{"damaged json", func(t *testing.T, s *Store, home string) {
			os.WriteFile(filepath.Join(home, "secrets", "gh.json"), []byte("{"), 0o600)
		}, "is damaged"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, home := newStore(t)
			if err := st.Add("gh", KindValue, value); err != nil {
				t.Fatal(err)
			}
			tc.damage(t, st, home)
			name := "gh"
			if tc.name == "entry moved to another name" {
				name = "other"
			}
			v, err := st.Value(name)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Value = %q, %v; want an error containing %q", v, err, tc.want)
			}
			if strings.Contains(err.Error(), value) {
				t.Errorf("error %q holds the value", err)
			}
		})
	}
}

func writeKey(t *testing.T, p string, key []byte) {
	t.Helper()
	if err := os.WriteFile(p, key, 0o600); err != nil {
		t.Fatal(err)
	}
}

func editEntry(t *testing.T, home string, edit func(*sealed)) {
	t.Helper()
	p := filepath.Join(home, "secrets", "gh.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var e sealed
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	edit(&e)
	b, _ = json.Marshal(e)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestListRotateRemove(t *testing.T) {
	s, _ := newStore(t)
	if ents, err := s.List(); err != nil || len(ents) != 0 {
		t.Fatalf("empty store lists %v, %v", ents, err)
	}
	for _, n := range []string{"b", "a"} {
		if err := s.Add(n, KindValue, value); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := s.List()
	if err := s.Rotate("a", KindEnv, "NEW_VAR"); err != nil {
		t.Fatal(err)
	}
	ents, err := s.List()
	if err != nil || len(ents) != 2 || ents[0].Name != "a" || ents[1].Name != "b" {
		t.Fatalf("List = %+v, %v; want a, b", ents, err)
	}
	if ents[0].Rotated == nil || !ents[0].Created.Equal(before[0].Created) || ents[0].Kind != KindEnv {
		t.Errorf("rotated entry %+v: want rotated set, created kept (%v), kind env", ents[0], before[0].Created)
	}
	if err := s.Rotate("zz", KindValue, value); !errors.Is(err, ErrNotFound) {
		t.Errorf("rotating a missing secret: %v, want ErrNotFound", err)
	}
	if err := s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("removing twice: %v, want ErrNotFound", err)
	}
	if _, err := s.Value("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Value of removed: %v, want ErrNotFound", err)
	}
}

func TestBadInput(t *testing.T) {
	tests := []struct {
		name, secret, kind, payload, want string
	}{
		{"bad name", "../x", KindValue, value, "secret name"},
		{"empty value", "a", KindValue, "", "is empty"},
		{"newline in value", "a", KindValue, "a\nb", "CR or LF"},
		{"NUL in value", "a", KindValue, "a\x00b", "NUL"},
		{"huge value", "a", KindValue, strings.Repeat("x", MaxValue+1), "at most"},
		{"relative file", "a", KindFile, "token", "absolute path"},
		{"bad env", "a", KindEnv, "1X", "variable name"},
		{"unknown kind", "a", "vault", "x", "unknown kind"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			err := s.Add(tc.secret, tc.kind, tc.payload)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Add: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestReferenceFailures(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	os.WriteFile(big, bytes.Repeat([]byte("x"), MaxValue+10), 0o600)
	two := filepath.Join(dir, "two")
	os.WriteFile(two, []byte("a\nb\n"), 0o600)
	tests := []struct {
		name, kind, payload, want string
	}{
		{"missing file", KindFile, filepath.Join(dir, "nope"), "no such file"},
		{"file too large", KindFile, big, "larger than"},
		{"file of two lines", KindFile, two, "CR or LF"},
		{"unset variable", KindEnv, "MOAT_TEST_UNSET_VARIABLE", "is not set"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t)
			if err := s.Add("r", tc.kind, tc.payload); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Value("r"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Value: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseSource(t *testing.T) {
	tests := []struct {
		ref, kind, payload string
		wantErr            bool
	}{
		{"file:/etc/moat/token", KindFile, "/etc/moat/token", false},
		{"file:/etc/../etc/token", KindFile, "/etc/token", false},
		{"file:token", "", "", true},
		{"env:GITHUB_TOKEN", KindEnv, "GITHUB_TOKEN", false},
		{"env:", "", "", true},
		{"vault:x", "", "", true},
		{"ghp_literal", "", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.ref, func(t *testing.T) {
			k, p, err := ParseSource(tc.ref)
			if (err != nil) != tc.wantErr || k != tc.kind || p != tc.payload {
				t.Errorf("ParseSource(%q) = %q, %q, %v", tc.ref, k, p, err)
			}
		})
	}
}
