package microvm

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/moat-sandbox/moat/tier"
)

func init() { tier.Register(Name, newFromConfig) }

// newFromConfig is the microvm tier's tier.Constructor: the guest's agent
// is Config.Exe, the VMM's jailer Config.Moat, its caches below
// Config.Home.
func newFromConfig(c tier.Config) (tier.Tier, error) {
	v, err := New(Options{Home: c.Home, Agent: cmp.Or(c.Exe, "/proc/self/exe"), Jailer: c.Moat})
	if err != nil {
		return nil, err // not a typed nil *MicroVM in the interface
	}
	return v, nil
}

var _ tier.Describer = (*MicroVM)(nil)

// Describe implements tier.Describer: the VMM, the guest kernel, the
// accelerator this host gives VMs (boot-testing it the first time) and
// why, and how the VMM is jailed. An accelerator that cannot be
// determined makes the tier unusable.
func (m *MicroVM) Describe(ctx context.Context) (string, []string, error) {
	acc, err := m.Accel(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("accelerator check: %w", err)
	}
	return fmt.Sprintf("%s, guest kernel %s, accelerator %s", m.VMM(), m.KernelVersion(), acc.Accel),
		[]string{strings.ReplaceAll(acc.Reason, "\n", " "), m.Jail()}, nil
}
