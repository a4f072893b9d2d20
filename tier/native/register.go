package native

import (
	"context"
	"fmt"

	"github.com/moat-sandbox/moat/tier"
)

func init() { tier.Register(Name, newFromConfig) }

// newFromConfig is the native tier's tier.Constructor: init is Config.Exe.
func newFromConfig(c tier.Config) (tier.Tier, error) {
	n, err := New(Options{Exe: c.Exe})
	if err != nil {
		return nil, err // not a typed nil *Native in the interface
	}
	return n, nil
}

var (
	_ tier.OrphanCollector = (*Native)(nil)
	_ tier.Describer       = (*Native)(nil)
)

// Describe implements tier.Describer: on cgroup v1 it tells what moving
// init into the run's cgroup would cost done the usual way (by pid), and
// that the native tier avoids it.
func (n *Native) Describe(context.Context) (string, []string, error) {
	ms, err := n.cg.MigrationCost()
	if err != nil || ms <= 0 {
		return "", nil, nil
	}
	return "", []string{
		"cgroup v1: each run's init moves its main thread into the run's cgroup itself, which",
		fmt.Sprintf("skips the RCU grace period (%.2f ms here) that a move by pid waits for when cold", float64(ms.Microseconds())/1000),
	}, nil
}
