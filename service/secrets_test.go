package service_test

import (
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// TestSecretGrants: a key's manifest may name only the secrets granted to
// it; the refusal is Forbidden, names the secret and the fix, and comes
// before anything runs or is audited.
func TestSecretGrants(t *testing.T) {
	s, be, au := newService(t, nil)
	ctx := context.Background()
	m := manifest.Default()
	m.Network.Mode = "allowlist"
	m.Network.Allow = []string{"api.example.com"}
	m.Secrets = []manifest.Secret{
		{Name: "github", Hosts: []string{"api.example.com"}, Env: "GITHUB"},
		{Name: "openai", Hosts: []string{"api.example.com"}, Env: "OPENAI"},
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	none := audit.Key{ID: "knone", Quota: audit.DefaultQuota}
	one := audit.Key{ID: "kone", Quota: audit.DefaultQuota, Secrets: []string{"github"}}
	both := audit.Key{ID: "kboth", Quota: audit.DefaultQuota, Secrets: []string{"github", "openai"}}
	tests := []struct {
		name   string
		key    audit.Key
		field  string // "" when allowed
		secret string
	}{
		{"no grants", none, "manifest.secrets[0].name", "github"},
		{"one of two", one, "manifest.secrets[1].name", "openai"},
		{"both", both, "", ""},
	}
	for _, tc := range tests {
		for _, op := range []struct {
			name string
			do   func() error
		}{
			{"run", func() error {
				_, err := s.Run(ctx, tc.key, service.RunArgs{Manifest: m, Argv: []string{"echo"}})
				return err
			}},
			{"sandbox", func() error {
				sb, err := s.CreateSandbox(ctx, tc.key, service.SandboxArgs{Manifest: m})
				if err == nil {
					s.DeleteSandbox(ctx, tc.key, sb.ID)
				}
				return err
			}},
		} {
			t.Run(tc.name+"/"+op.name, func(t *testing.T) {
				_, created, runs, _ := be.Counts()
				err := op.do()
				if tc.field == "" {
					if err != nil {
						t.Fatalf("granted key refused: %v", err)
					}
					return
				}
				wantKind(t, err, service.Forbidden, tc.field)
				if msg := err.Error(); !strings.Contains(msg, `"`+tc.secret+`"`) || !strings.Contains(msg, "moat keys grant "+tc.key.ID+" "+tc.secret) {
					t.Errorf("message %q does not name the secret and the fix", msg)
				}
				if _, c, r, _ := be.Counts(); c != created || r != runs {
					t.Errorf("a refused request reached the backend: sessions %d -> %d, runs %d -> %d", created, c, runs, r)
				}
				if ids := au.Unfinished(); len(ids) > 0 {
					t.Errorf("a refused request left audit records %v", ids)
				}
			})
		}
	}
}
