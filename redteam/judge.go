package redteam

// Judging: a case's expectations checked against what the host observed
// (the Result's host-measured fields, the canary, the output directory,
// the sandbox's processes), and the Verdict that comes of it.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Verdict is the outcome of one case on one tier.
type Verdict struct {
	Case     string `json:"case"`
	Category string `json:"category"`
	Severity string `json:"severity"`
	Tier     string `json:"tier"`
	Verdict  string `json:"verdict"`
	// Evidence says what the host observed: for contained, what held;
	// for escaped, what broke; for not-applicable, why it could not run.
	Evidence string  `json:"evidence"`
	Runs     int     `json:"runs"`
	Seconds  float64 `json:"seconds"`
}

// peakWithin says whether a run's peak memory respects limit, allowing the
// kernel's forced charges (cgroup.PeakWithin), and describes the peak.
func peakWithin(peak, limit int64) (bool, string) {
	note := fmt.Sprintf("peak memory %d MiB", peak>>20)
	if over := peak - limit; over > 0 {
		note += fmt.Sprintf(", %d KiB over the limit in forced charges", over>>10)
	}
	return cgroup.PeakWithin(peak, limit), note
}

// judge applies every expectation; the first that fails is the evidence of
// an escape.
func judge(c *Case, en *env, res *result.Result, procs *procWatch) (string, string) {
	e := c.Expect
	var held []string
	if res.Termination == result.InfraError {
		// Moat failed to run the attack: nothing was judged.
		return Error, "the tier failed to run the case (infra-error): " + clip(res.Error, 200)
	}
	out := decode(res.Stdout) + "\n" + decode(res.Stderr)
	for _, s := range e.OutputLacks {
		s = expand(s, en.vars)
		if s == "" || strings.Contains(s, "{") {
			return Error, "output_lacks refers to an unset value: " + s
		}
		if strings.Contains(out, s) {
			return Escaped, fmt.Sprintf("the output contains %q", clip(s, 60))
		}
		held = append(held, "output lacks the canary")
	}
	if e.CanaryIntact {
		if en.canaryFP == "" {
			return Error, "canary_intact without setup.canary"
		}
		if fp := fingerprint(en.vars["canary_path"]); fp != en.canaryFP {
			return Escaped, "the host canary file changed"
		}
		held = append(held, "host canary intact")
	}
	if e.NoConnections {
		if en.accepted == nil {
			return Error, "no_connections without setup.listener"
		}
		if n := en.accepted.Load(); n > 0 {
			return Escaped, fmt.Sprintf("the host listener accepted %d connection(s) from the sandbox", n)
		}
		held = append(held, "host listener saw no connection")
	}
	if len(e.Termination) > 0 {
		if !contains(e.Termination, string(res.Termination)) {
			return Escaped, fmt.Sprintf("termination %s (exit %d), want one of %v", res.Termination, res.ExitCode, e.Termination)
		}
		held = append(held, "terminated: "+string(res.Termination))
	}
	for _, k := range e.Violations {
		found := false
		for _, v := range res.Violations {
			found = found || v.Kind == k
		}
		if !found {
			return Escaped, fmt.Sprintf("no %s violation recorded (violations: %v)", k, res.Violations)
		}
		held = append(held, k+" limit enforced")
	}
	if e.MaxDurationMS > 0 {
		if res.DurationMS > e.MaxDurationMS {
			return Escaped, fmt.Sprintf("ran %.0f ms, bound %.0f ms", res.DurationMS, e.MaxDurationMS)
		}
		held = append(held, fmt.Sprintf("stopped after %.0f ms", res.DurationMS))
	}
	if e.MaxPeakMemory != "" {
		lim, err := manifest.ParseSize(e.MaxPeakMemory)
		if err != nil {
			return Error, "max_peak_memory: " + err.Error()
		}
		ok, note := peakWithin(res.PeakMemoryBytes, int64(lim))
		if !ok {
			return Escaped, fmt.Sprintf("peak memory %d bytes exceeds %s by more than the kernel's forced charges (%s)", res.PeakMemoryBytes, e.MaxPeakMemory, note)
		}
		held = append(held, note)
	}
	if len(e.Denied) > 0 {
		reports := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if name, rest, ok := strings.Cut(line, ": "); ok {
				reports[strings.TrimSpace(name)] = rest
			}
		}
		for _, op := range e.Denied {
			rep, ok := reports[op]
			switch {
			case !ok:
				return Error, fmt.Sprintf("the program never reported on %s (output %q)", op, clip(out, 300))
			case strings.HasPrefix(rep, "ok"):
				return Escaped, fmt.Sprintf("%s succeeded: %s", op, clip(rep, 120))
			}
		}
		held = append(held, fmt.Sprintf("%d operations refused", len(e.Denied)))
	}
	if e.HostProcs && procs.inProcess {
		if ev := procs.verdict(); ev != "" {
			if strings.HasPrefix(ev, "error: ") {
				return Error, ev
			}
			return Escaped, ev
		}
		held = append(held, fmt.Sprintf("host /proc: %d samples while the guest ran in moat's process, no host process created", procs.samples))
	} else if e.HostProcs {
		if ev := procs.verdict(); ev != "" {
			if strings.HasPrefix(ev, "error: ") {
				return Error, ev
			}
			return Escaped, ev
		}
		if procs.vmm {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples of the VMM (%d processes) are %s, jailed (%s) with no capability in any set, under Moat's seccomp filter and QEMU's -sandbox, no_new_privs, in their own mnt, pid, net, ipc, uts and cgroup namespaces and the run's cgroup, holding no writable host file outside moat's state and the root disk read-only (%d start-up samples before both filters were on, the jailer's setup included, not judged)", procs.threads, len(procs.pids), procs.runtimeExe, procs.vmmIDs, procs.preSandbox))
		} else if procs.runtime {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples of the runtime (%d processes) seccomp-filtered, no_new_privs, no capability beyond gVisor's, in their own namespaces", procs.threads, len(procs.pids)))
		} else {
			held = append(held, fmt.Sprintf("host /proc: %d thread samples unprivileged and filtered", procs.threads))
		}
	}
	if e.CopyOutSafe {
		if ev := copyOutEvidence(en); ev != "" {
			return Escaped, ev
		}
		held = append(held, "copy-out wrote only plain files and directories inside the output directory, none writable by group or others, no setuid, setgid or sticky bit")
	}
	for _, p := range e.FilesAbsent {
		for _, f := range res.Files {
			if f.Path == p && f.Change != result.Deleted {
				return Escaped, fmt.Sprintf("%s is in the workspace diff (%s)", p, f.Change)
			}
		}
	}
	if len(e.FilesAbsent) > 0 {
		held = append(held, "forbidden paths absent from the diff")
	}
	if e.DiffBounded > 0 {
		if len(res.Files) > e.DiffBounded {
			return Escaped, fmt.Sprintf("diff has %d entries, bound %d", len(res.Files), e.DiffBounded)
		}
		held = append(held, fmt.Sprintf("diff bounded (%d entries)", len(res.Files)))
	}
	return Contained, strings.Join(held, "; ")
}

// decode returns a stream's bytes as the host received them: a canary
// hidden in binary (base64-encoded) output must be found too.
func decode(s result.Stream) string {
	if s.Encoding == "base64" {
		if b, err := base64.StdEncoding.DecodeString(s.Data); err == nil {
			return string(b)
		}
	}
	return s.Data
}

func copyOutEvidence(en *env) string {
	parent := filepath.Dir(en.outDir)
	if fp := treeFingerprint(parent, "out"); fp != en.sentFP {
		return "copy-out touched files outside the output directory"
	}
	var bad string
	filepath.Walk(en.outDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || bad != "" {
			return nil
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			bad = "copy-out created a symlink: " + p
		case !fi.Mode().IsRegular() && !fi.IsDir():
			bad = "copy-out created a special file: " + p
		case fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0:
			bad = "copy-out kept a setuid/setgid bit: " + p
		case fi.Mode()&os.ModeSticky != 0:
			bad = "copy-out kept a sticky bit: " + p
		case fi.Mode().Perm()&0o022 != 0 && p != en.outDir:
			// Another local user could plant or swap files in it.
			bad = fmt.Sprintf("copy-out created a group- or world-writable %v: %s", fi.Mode(), p)
		}
		return nil
	})
	return bad
}

// treeFingerprint hashes the names, modes and contents below dir, except
// the entry skip (the output directory itself).
func treeFingerprint(dir, skip string) string {
	h := sha256.New()
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			fmt.Fprintf(h, "err %s\n", p)
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == skip || strings.HasPrefix(rel, skip+string(filepath.Separator)) {
			if fi.IsDir() && rel == skip {
				return filepath.SkipDir
			}
			return nil
		}
		fmt.Fprintf(h, "%s %v %d\n", rel, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			h.Write(b)
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))
}

func fingerprint(p string) string {
	fi, err := os.Lstat(p)
	if err != nil {
		return "missing"
	}
	b, _ := os.ReadFile(p)
	sum := sha256.Sum256(b)
	return fmt.Sprintf("%v %x", fi.Mode(), sum)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
