package redteam

// The microvm tier's own expectations (see wasmtier.go for the mechanism).
// The program runs in a guest kernel; the host-side process check judges
// the VMM (procWatch.inspectVMM).
//
// None at present: the egress-proxy cases (net-egress-*,
// supply-allowlisted-index) were not applicable while the tier refused
// network.mode allowlist; it now reaches the proxy over its egress port
// (tier/microvm/egress.go) and they run as written.
var microvmTable = map[string]TierExpect{}
