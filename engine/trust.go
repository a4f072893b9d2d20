package engine

import (
	"fmt"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/tier"
)

// trustRunCA gives the sandbox the egress proxy's run CA when the run has
// secrets (the proxy terminates TLS for their hosts), and refuses the run
// on a tier that cannot install it: without it every request to a bound
// host would fail verification, and a run must never go on quietly
// without what its manifest asked for.
func trustRunCA(t tier.Tier, spec *tier.Spec, p *egress.Proxy) error {
	if err := p.TrustError(); err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	pem := p.TrustPEM()
	if pem == nil {
		return nil
	}
	if !t.Capabilities().TrustStore {
		return &manifest.FieldError{Field: "secrets", Value: t.Name(), Problem: "cannot be used on the " + t.Name() +
			" tier: it cannot install the run CA the egress proxy needs for secret-bound hosts; use the native tier"}
	}
	spec.TrustPEM = pem
	return nil
}

// trustEnv points the program's TLS clients at the run's CA bundle when
// the sandbox has one (nil map otherwise).
func trustEnv(spec *tier.Spec) map[string]string {
	if spec == nil || spec.TrustPEM == nil {
		return nil
	}
	return tier.TrustEnv()
}
