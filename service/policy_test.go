package service_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/policy"
	"github.com/moat-sandbox/moat/service"
)

const testPolicy = `
default:
  resources: {memory: 1GiB}
keys:
  kbig:
    resources: {memory: 2GiB}
`

// TestPolicyCeilings: a manifest beyond the key's ceiling is Forbidden,
// one that widens a default without a justification is Invalid; both
// name the field, the value and the ceiling, and come before anything
// runs or is audited. An admitted run's audit record keeps the
// justifications.
func TestPolicyCeilings(t *testing.T) {
	pol, err := policy.Parse([]byte(testPolicy), "/etc/moat/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, be, au := newService(t, func(c *service.Config) { c.Policy = pol })
	ctx := context.Background()
	mk := func(doc string) *manifest.Manifest {
		m, err := service.ParseManifest([]byte(doc))
		if err != nil {
			t.Fatalf("manifest %s: %v", doc, err)
		}
		return m
	}
	small := audit.Key{ID: "ksmall", Quota: audit.DefaultQuota}
	big := audit.Key{ID: "kbig", Quota: audit.DefaultQuota}
	tests := []struct {
		name     string
		key      audit.Key
		manifest string
		kind     service.Kind
		field    string   // "" admits
		texts    []string // in the message
	}{
		{"default manifest", small, `{}`, 0, "", nil},
		{"within, justified", small, `{"resources":{"memory":"768MiB"},"justifications":{"resources.memory":"pandas"}}`, 0, "", nil},
		{"at the ceiling, justified", small, `{"resources":{"memory":"1GiB"},"justifications":{"resources.memory":"pandas"}}`, 0, "", nil},
		{"beyond the default ceiling", small, `{"resources":{"memory":"2GiB"},"justifications":{"resources.memory":"pandas"}}`, service.Forbidden, "manifest.resources.memory",
			[]string{"2GiB exceeds this key's ceiling 1GiB", "policy /etc/moat/policy.yaml"}},
		{"at the key's ceiling", big, `{"resources":{"memory":"2GiB"},"justifications":{"resources.memory":"pandas"}}`, 0, "", nil},
		{"beyond the key's ceiling", big, `{"resources":{"memory":"8GiB"},"justifications":{"resources.memory":"pandas"}}`, service.Forbidden, "manifest.resources.memory",
			[]string{"8GiB exceeds this key's ceiling 2GiB"}},
		{"within but unjustified", small, `{"resources":{"memory":"1GiB"}}`, service.Invalid, "manifest.justifications.resources.memory",
			[]string{"1GiB widens Moat's default 512MiB without a justification"}},
		{"tier beyond", small, `{"tier":"gvisor"}`, service.Forbidden, "manifest.tier", []string{"gvisor exceeds"}},
		{"network beyond", big, `{"network":{"mode":"allowlist","allow":["example.com"]},"justifications":{"network.allow":"x"}}`, service.Forbidden, "manifest.network.mode", nil},
	}
	for _, tc := range tests {
		m := mk(tc.manifest)
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
						t.Fatalf("admitted manifest refused: %v", err)
					}
					return
				}
				wantKind(t, err, tc.kind, tc.field)
				for _, want := range tc.texts {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("message %q does not contain %q", err, want)
					}
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

	t.Run("justifications reach the audit record", func(t *testing.T) {
		m := mk(`{"resources":{"memory":"1GiB"},"justifications":{"resources.memory":"pandas on a 700MB frame"}}`)
		resp, err := s.Run(ctx, small, service.RunArgs{Manifest: m, Argv: []string{"echo"}})
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := au.Record(resp.ID)
		if !ok {
			t.Fatalf("no audit record for run %s", resp.ID)
		}
		var got manifest.Manifest
		if err := json.Unmarshal([]byte(rec.Manifest), &got); err != nil {
			t.Fatal(err)
		}
		if got.Justifications["resources.memory"] != "pandas on a 700MB frame" {
			t.Errorf("audit record's manifest justifications = %v", got.Justifications)
		}
	})
}
