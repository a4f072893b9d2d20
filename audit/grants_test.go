package audit

import (
	"errors"
	"path/filepath"
	"slices"
	"testing"
)

func TestSecretGrants(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	token, k, err := s.CreateKey("agent", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	_, other, err := s.CreateKey("other", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		do      func() error
		wantErr error // nil: success; errAny: any error
		want    []string
	}{
		{"a new key has no secrets", func() error { return nil }, nil, nil},
		{"grant", func() error { return s.GrantSecret(k.ID, "github") }, nil, []string{"github"}},
		{"grant twice", func() error { return s.GrantSecret(k.ID, "github") }, nil, []string{"github"}},
		{"grant another", func() error { return s.GrantSecret(k.ID, "api-key") }, nil, []string{"api-key", "github"}},
		{"bad name", func() error { return s.GrantSecret(k.ID, "../x") }, errAny, []string{"api-key", "github"}},
		{"unknown key", func() error { return s.GrantSecret("k000000000000", "github") }, ErrNotFound, []string{"api-key", "github"}},
		{"revoke", func() error { return s.RevokeSecret(k.ID, "github") }, nil, []string{"api-key"}},
		{"revoke what was not granted", func() error { return s.RevokeSecret(k.ID, "github") }, ErrNotFound, []string{"api-key"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			err := st.do()
			switch {
			case st.wantErr == nil && err != nil:
				t.Fatal(err)
			case st.wantErr == errAny && err == nil, st.wantErr != nil && st.wantErr != errAny && !errors.Is(err, st.wantErr):
				t.Fatalf("error %v, want %v", err, st.wantErr)
			}
			// Every way of reading a key sees the same grants.
			got, err := s.Key(k.ID)
			if err != nil {
				t.Fatal(err)
			}
			auth, err := s.Authenticate(token)
			if err != nil {
				t.Fatal(err)
			}
			keys, err := s.Keys()
			if err != nil {
				t.Fatal(err)
			}
			for what, have := range map[string][]string{"Key": got.Secrets, "Authenticate": auth.Secrets, "Keys": keys[0].Secrets} {
				if !slices.Equal(have, st.want) {
					t.Errorf("%s: secrets %v, want %v", what, have, st.want)
				}
			}
			if o, _ := s.Key(other.ID); len(o.Secrets) != 0 {
				t.Errorf("another key got secrets %v", o.Secrets)
			}
		})
	}
}

var errAny = errors.New("any error")
