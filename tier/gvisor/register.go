package gvisor

import (
	"context"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier"
)

func init() { tier.Register(Name, newFromConfig) }

// newFromConfig is the gVisor tier's tier.Constructor: the sandbox's init
// is Config.Exe.
func newFromConfig(c tier.Config) (tier.Tier, error) {
	g, err := New(Options{Guest: c.Exe})
	if err != nil {
		return nil, err // not a typed nil *GVisor in the interface
	}
	return g, nil
}

var (
	_ tier.OrphanCollector = (*GVisor)(nil)
	_ tier.Describer       = (*GVisor)(nil)
)

// Describe implements tier.Describer: which runsc, and its version.
func (g *GVisor) Describe(context.Context) (string, []string, error) {
	return g.Runsc() + ", " + g.Version(), nil, nil
}

// Cgroups implements tier.OrphanCollector: the cgroups the tier confines
// runs in (moat/<run id>).
func (g *GVisor) Cgroups() *cgroup.Host { return g.cg }
