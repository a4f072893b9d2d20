package redteam

// The microvm tier's own expectations (see wasmtier.go for the mechanism).
// The program runs in a guest kernel; the host-side process check judges
// the VMM (procWatch.inspectVMM).

const microvmAllow = "the microvm tier refuses network.mode allowlist before booting anything (the VM has no network device and no proxy channel yet), so the egress proxy this case attacks is never started for it; the no-network cases (net-*, supply-*, rt-metadata-service) run on the tier instead"

var microvmTable = map[string]TierExpect{
	"net-egress-address-grant-ports": {Reason: microvmAllow, NotApplicable: true},
	"net-egress-bypass-proxy":        {Reason: microvmAllow, NotApplicable: true},
	"net-egress-conn-flood":          {Reason: microvmAllow, NotApplicable: true},
	"net-egress-exfil-budget":        {Reason: microvmAllow, NotApplicable: true},
	"net-egress-dns":                 {Reason: microvmAllow, NotApplicable: true},
	"net-egress-ip-literal":          {Reason: microvmAllow, NotApplicable: true},
	"net-egress-fronting":            {Reason: microvmAllow, NotApplicable: true},
	"net-egress-metadata":            {Reason: microvmAllow, NotApplicable: true},
	"net-egress-name-to-loopback":    {Reason: microvmAllow, NotApplicable: true},
	"net-egress-matcher-tricks":      {Reason: microvmAllow, NotApplicable: true},
	"net-egress-slowloris":           {Reason: microvmAllow, NotApplicable: true},
	"supply-allowlisted-index":       {Reason: microvmAllow, NotApplicable: true},
}
