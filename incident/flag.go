package incident

import (
	"fmt"
	"slices"

	"github.com/moat-sandbox/moat/result"
)

// FlaggingKinds are the result.Violation kinds that flag a run: each means
// the program tried to get something out or past the sandbox, not merely
// that it used too much of something. Limits (timeout, memory, pids,
// output, disk, files, file-size, diff, cancelled, trap, open-files) do
// not flag: an honest program hits them every day, and keeping evidence
// of each would bury the incidents that matter.
var FlaggingKinds = []string{
	result.ViolationCanary,             // a planted decoy credential was seen leaving
	result.ViolationSecretExfiltration, // a secret's placeholder was sent to a host it is not bound to
	"package",                          // a typosquat, a package not allowed, a hash mismatch at the guarded index
	"syscall",                          // killed by the seccomp filter: a refused kernel interface was tried
	result.ViolationFilename,           // a diff entry's name carries terminal escapes or bidi overrides
	"policy",                           // refused or killed by policy (an effects policy's deny, when it reports one)
}

// Reasons says why res is flagged: one line per flagging violation (kind:
// detail, each kind at most maxPerKind times) and "termination: policy"
// when policy ended the run. Empty: the run is not flagged.
func Reasons(res *result.Result) []string {
	if res == nil {
		return nil
	}
	const maxPerKind = 3
	var out []string
	seen := map[string]int{}
	for _, v := range res.Violations {
		if !slices.Contains(FlaggingKinds, v.Kind) {
			continue
		}
		seen[v.Kind]++
		if seen[v.Kind] > maxPerKind {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s", v.Kind, v.Detail))
	}
	if res.Termination == result.Policy && seen["syscall"] == 0 && seen["policy"] == 0 {
		out = append(out, "termination: policy")
	}
	return out
}

// Flagged reports whether res is flagged (Reasons is not empty).
func Flagged(res *result.Result) bool { return len(Reasons(res)) > 0 }
