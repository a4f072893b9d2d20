package engine

import (
	"errors"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

// trustTier declares only whether it installs a trust store.
type trustTier struct {
	tier.Tier
	store bool
}

func (t trustTier) Capabilities() tier.Capabilities { return tier.Capabilities{TrustStore: t.store} }
func (trustTier) Name() string                      { return "faketier" }

// TestTrustRunCA: a run with secrets gets the run CA in its Spec and the
// trust variables in its environment on a tier that installs it, and is
// refused (never run without) on one that cannot.
func TestTrustRunCA(t *testing.T) {
	secret := egress.Policy{Secrets: []egress.SecretBinding{{
		Name: "api", Placeholder: "moat-secret-api-0123456789abcdef0123456789abcdef", Value: "real",
		Hosts: []egress.Rule{egress.MustParseRule("api.example.com")},
	}}}
	tests := []struct {
		name    string
		pol     egress.Policy
		store   bool
		wantPEM bool
		wantErr bool
	}{
		{"secrets on a tier with a trust store", secret, true, true, false},
		{"secrets on a tier without", secret, false, false, true},
		{"no secrets, no CA, any tier", egress.Policy{}, false, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := egress.New(tc.pol, egress.Options{})
			defer p.Close()
			spec := &tier.Spec{}
			err := trustRunCA(trustTier{store: tc.store}, spec, p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v", err, tc.wantErr)
			}
			var fe *manifest.FieldError
			if err != nil && (!errors.As(err, &fe) || !strings.Contains(err.Error(), "faketier")) {
				t.Fatalf("error %v does not name the field and the tier", err)
			}
			if (spec.TrustPEM != nil) != tc.wantPEM {
				t.Fatalf("TrustPEM set %v, want %v", spec.TrustPEM != nil, tc.wantPEM)
			}
			env := trustEnv(spec)
			if tc.wantPEM && (env["SSL_CERT_FILE"] != tier.TrustFile || env["NODE_EXTRA_CA_CERTS"] != tier.TrustFile || env["REQUESTS_CA_BUNDLE"] != tier.TrustFile) {
				t.Fatalf("trust env %v", env)
			}
			if !tc.wantPEM && len(env) != 0 {
				t.Fatalf("trust env without a CA: %v", env)
			}
		})
	}
}
