package redteam

// The microvm tier's own expectations (see wasmtier.go for the mechanism).
// The program runs in a guest kernel under the native tier's seccomp
// filter; the host-side process check judges the VMM
// (procWatch.inspectVMM).
//
// The egress-proxy cases (net-egress-*, supply-allowlisted-index) run as
// written: the tier reaches the proxy over its egress port
// (tier/microvm/egress.go). What differs is speed: on a host where KVM
// does not work (this one, a nested VM; the result's runtime says
// accel=tcg) the guest is emulated instruction by instruction, many times
// slower than native for memory- and disk-heavy work, and two resource
// cases whose attack must reach its limit within a 4 s timeout cannot.
const tcgSlow = "under TCG software emulation (KVM does not work on this host; the result's runtime says accel=tcg) the guest runs this write-heavy attack many times slower than the native tier, so the case's 4 s timeout can end it before it reaches the limit it attacks. Contained if it ends as the default expects, at its timeout or at its CPU-time limit (which defaults to the timeout, and which the emulated, CPU-bound program can reach first: seen once in CI), and still within the memory limit"

var microvmTable = map[string]TierExpect{
	"res-zip-bomb": {Reason: tcgSlow + ", with a bounded diff; the workspace limit itself (a tmpfs of workspace.size in the guest) is enforced and tested by tier/microvm's conformance case 'filling the disk stops at the workspace limit'",
		Expect: &Expect{Termination: []string{"disk-limit", "timeout", "cpu-time"}, MaxPeakMemory: "128MiB", DiffBounded: 5, MaxDurationMS: 4500}},
	"res-tmpfs-bomb": {Reason: tcgSlow + "; /tmp is a tmpfs in the guest's RAM, bounded by its size and charged to the guest cgroup's memory limit (tier/microvm TestLimits)",
		Expect: &Expect{Termination: []string{"exited", "oom", "timeout", "cpu-time"}, MaxPeakMemory: "64MiB", MaxDurationMS: 4500}},
	"sc-int80-thread": {Reason: "the same kill, by the guest's kernel under the native tier's filter; under TCG software emulation (KVM does not work on this host) the guest's Python starts and the agent reports more slowly, and a loaded host measured 1508 ms against native's 1500: the bound that proves the point is the main thread's 2 s sleep, which the whole process must not outlive",
		Expect: &Expect{Termination: []string{"policy"}, Violations: []string{"syscall"}, MaxDurationMS: 1950}},
}
