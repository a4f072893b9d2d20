package egress

import "net/netip"

// SetAllow replaces the proxy's allowlist (Policy.Allow and
// AllowAddresses) at once, for the connections it decides from now on:
// one already let through keeps going, as it would under a firewall whose
// rules changed. The secrets' hosts stay destinations, and the limits,
// budgets, log and canaries are the proxy's as before: only what may be
// reached changes (E2B's updateNetwork of a live sandbox).
func (p *Proxy) SetAllow(allow []Rule, addrs []netip.Prefix) {
	np := compilePolicy(Policy{Allow: allow, AllowAddresses: addrs, Secrets: p.base.Secrets, Limits: p.base.Limits})
	p.acc.Store(&np)
}
