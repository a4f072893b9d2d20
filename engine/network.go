package engine

import (
	"fmt"

	"github.com/moat-sandbox/moat/manifest"
)

// SetNetwork replaces the live sandbox's allowlist with n's network.allow
// and network.allow_addresses, for the connections its egress proxy
// decides from now on (egress.Proxy.SetAllow); the proxy's limits and the
// secrets' hosts stay. Only a sandbox created with mode allowlist has a
// proxy to change: one created with mode none has no route out at all,
// and gets none now.
func (s *Session) SetNetwork(n manifest.Network) error {
	if err := s.open(); err != nil {
		return err
	}
	eg := s.p.liveEgress()
	if eg == nil {
		return fmt.Errorf("%w: this sandbox was created with network.mode none: it has no egress proxy and no route out, and none can be added to a live sandbox; create it with network.mode allowlist (E2B: network.allowOut) to change its allowlist later", ErrUsage)
	}
	pol, err := egressPolicy(n)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	eg.proxy.SetAllow(pol.Allow, pol.AllowAddresses)
	return nil
}
