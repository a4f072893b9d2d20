// Package redteam is Moat's attack corpus and its runner: real attacks run
// against each tier, each judged from the host side (a canary the host
// planted, a host listener that must see no connection, a host file's hash,
// the Result's host-measured fields, the sandbox's processes as the host's
// /proc shows them) rather than by what the attacking program says.
//
// An escape found here is a first-class bug. The package must never weaken
// a sandbox to make a case pass, and never count a case that could not run
// as contained.
package redteam

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Verdicts.
const (
	Contained     = "contained"
	Escaped       = "escaped"
	NotApplicable = "not-applicable"
	Error         = "error"
)

// Severities, highest first.
var severities = []string{"critical", "high", "medium", "low"}

// Case is one attack. Cases live as YAML under cases/, one file per
// category, embedded in the binary so `moat redteam` runs anywhere.
type Case struct {
	ID       string   `yaml:"id"`
	Category string   `yaml:"category"`
	Severity string   `yaml:"severity"`
	Threat   string   `yaml:"threat"`
	Tiers    []string `yaml:"tiers"` // empty: every tier
	// Manifest is a partial manifest (YAML) applied over the defaults.
	Manifest string `yaml:"manifest"`
	// Exactly one of Sh, Python, Argv is the attack program. "{key}" in
	// it is replaced by the values Setup made (canary, canary_path,
	// port, host_pid, moat_exe).
	Sh     string   `yaml:"sh"`
	Python string   `yaml:"python"`
	Argv   []string `yaml:"argv"`
	Setup  Setup    `yaml:"setup"`
	Expect Expect   `yaml:"expect"`
	// PerTier replaces Expect on the named tier, only with a written
	// reason: a tier whose boundary is elsewhere (gVisor's Sentry serves
	// the program's system calls itself) is judged by the host-side
	// evidence of that boundary, never by a weaker check of the same
	// thing. NotApplicable there is for attacks that make no sense on the
	// tier; such verdicts are counted apart, never as contained.
	PerTier map[string]TierExpect `yaml:"per_tier"`
	// Repeat runs the attack several times (races); every run must be
	// contained.
	Repeat int `yaml:"repeat"`
	// Requires names host facilities without which the case is
	// not-applicable: "root"; "ia32", the kernel's 32-bit system call
	// entry (int 0x80), which some hosts' kernels lack.
	Requires []string `yaml:"requires"`
	// Why says what the case proves when contained (docs/REDTEAM.md).
	Why string `yaml:"why"`
	// Unsandboxed marks a case that is harmless to run directly on the host
	// as root, where it must report escaped: the test suite does exactly
	// that to prove the case can fail.
	Unsandboxed bool `yaml:"unsandboxed"`

	// custom runs a case written in Go (races, several sandboxes at once,
	// host-wide checks) instead of the declarative program and checks.
	custom func(ctx context.Context, r *runner) (verdict, evidence string, runs int)
	// alone: the custom case must not share the machine with other cases.
	alone bool
}

// Setup is what the host prepares before the attack.
type Setup struct {
	// Canary plants a secret in a world-readable host file and in moat's
	// own environment: {canary}, {canary_path}.
	Canary bool `yaml:"canary"`
	// Listener starts a TCP listener on host loopback: {port}; every
	// connection it accepts is evidence of an escape.
	Listener bool `yaml:"listener"`
	// Inputs are files handed to the run (copied into /workspace/in):
	// path -> content; a content of "symlink:TARGET" makes a symlink.
	Inputs map[string]string `yaml:"inputs"`
	// Output requests --output copy-out into a fresh host directory,
	// next to a sentinel directory that must stay untouched.
	Output bool `yaml:"output"`
}

// Expect lists the host-side checks. Every check that is set must hold for
// the case to be contained.
type Expect struct {
	// OutputLacks: substrings that must not appear in stdout or stderr
	// (canaries: output is how data leaves a sandbox).
	OutputLacks []string `yaml:"output_lacks"`
	// CanaryIntact: the host canary file's content and mode are unchanged.
	CanaryIntact bool `yaml:"canary_intact"`
	// NoConnections: the host listener accepted nothing.
	NoConnections bool `yaml:"no_connections"`
	// Termination: the run must have ended one of these ways.
	Termination []string `yaml:"termination"`
	// Violations: each kind must be recorded in the result.
	Violations []string `yaml:"violations"`
	// MaxDurationMS bounds the run's wall time (a kill that came late is
	// a resource escape).
	MaxDurationMS float64 `yaml:"max_duration_ms"`
	// MaxPeakMemory bounds the cgroup's peak memory, e.g. "80MiB", give or
	// take the kernel's forced charges (forcedChargeSlack).
	MaxPeakMemory string `yaml:"max_peak_memory"`
	// Denied: operations the program attempts and reports as
	// "<name>: ok" or "<name>: denied ...". Each must be reported, and none
	// as ok. This is the program's word, so cases that use it also check
	// the host's view of the process (HostProcs).
	Denied []string `yaml:"denied"`
	// HostProcs: while the run lives, every thread of every sandbox
	// process, read from the host's /proc, has no capabilities,
	// no_new_privs, seccomp filtering and an unprivileged host uid.
	HostProcs bool `yaml:"host_procs"`
	// CopyOutSafe: with Setup.Output, the host output directory holds only
	// regular files and directories, no setuid, setgid or sticky bits,
	// nothing writable by group or others, nothing outside it, and the
	// sentinel next to it is untouched.
	CopyOutSafe bool `yaml:"copy_out_safe"`
	// FilesAbsent: paths (relative to /workspace) that must not be in the
	// diff as added or modified.
	FilesAbsent []string `yaml:"files_absent"`
	// DiffBounded: the diff is no longer than this many entries.
	DiffBounded int `yaml:"diff_bounded"`
}

// TierExpect is one tier's own expectation for a case.
type TierExpect struct {
	// Reason says why the tier differs and what host-side evidence
	// stands for the default expectation there. Printed with the verdict.
	Reason string `yaml:"reason"`
	// Exactly one of Expect and NotApplicable.
	Expect        *Expect `yaml:"expect"`
	NotApplicable bool    `yaml:"not_applicable"`
	// Python, with Expect, replaces the attack program on the tier by the
	// same attack written in Python, for a tier that runs no shell (wasm):
	// the attack is the case's, only its language differs.
	Python string `yaml:"python"`
}

// forTier returns the case as it is judged on tier, and the reason when
// the tier has its own expectation.
func (c *Case) forTier(tier string) (Case, *TierExpect) {
	te, ok := c.PerTier[tier]
	if !ok {
		return *c, nil
	}
	cc := *c
	if te.Expect != nil {
		cc.Expect = *te.Expect
	}
	if te.Python != "" {
		cc.Sh, cc.Argv, cc.Python = "", nil, te.Python
	}
	return cc, &te
}

// Program returns the argv of the attack.
func (c *Case) Program() []string {
	switch {
	case c.Sh != "":
		return []string{"sh", "-c", c.Sh}
	case c.Python != "":
		return []string{"python3", "-c", c.Python}
	}
	return c.Argv
}

func (c *Case) validate() error {
	if c.ID == "" || strings.ContainsAny(c.ID, " \t/") {
		return fmt.Errorf("case %q: id must be non-empty without spaces or slashes", c.ID)
	}
	n := 0
	for _, p := range []bool{c.Sh != "", c.Python != "", len(c.Argv) > 0} {
		if p {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("case %s: exactly one of sh, python, argv is required", c.ID)
	}
	if !contains(severities, c.Severity) {
		return fmt.Errorf("case %s: severity %q: want one of %v", c.ID, c.Severity, severities)
	}
	if c.Category == "" || c.Threat == "" {
		return fmt.Errorf("case %s: category and threat are required", c.ID)
	}
	if err := c.Expect.validate(c); err != nil {
		return err
	}
	for tier, te := range c.PerTier {
		if err := c.validateTier(tier, te); err != nil {
			return err
		}
	}
	return nil
}

// validateTier checks one tier's own expectation.
func (c *Case) validateTier(tier string, te TierExpect) error {
	if len(strings.Fields(te.Reason)) < 8 {
		return fmt.Errorf("case %s: per_tier %s: a reason of at least a sentence is required (why the tier differs, what host-side evidence stands instead)", c.ID, tier)
	}
	if (te.Expect != nil) == te.NotApplicable {
		return fmt.Errorf("case %s: per_tier %s: exactly one of expect and not_applicable", c.ID, tier)
	}
	if te.Python != "" && (te.Expect == nil || c.custom != nil) {
		return fmt.Errorf("case %s: per_tier %s: python (a variant of the attack) needs expect, and a declarative case", c.ID, tier)
	}
	if te.Expect != nil {
		if err := te.Expect.validate(c); err != nil {
			return fmt.Errorf("per_tier %s: %w", tier, err)
		}
	}
	return nil
}

func (e *Expect) validate(c *Case) error {
	if len(e.OutputLacks) == 0 && !e.CanaryIntact && !e.NoConnections && len(e.Termination) == 0 &&
		len(e.Violations) == 0 && e.MaxDurationMS == 0 && e.MaxPeakMemory == "" && len(e.Denied) == 0 &&
		!e.HostProcs && !e.CopyOutSafe && len(e.FilesAbsent) == 0 && e.DiffBounded == 0 {
		return fmt.Errorf("case %s: no expectation: a case that checks nothing cannot fail", c.ID)
	}
	if len(e.Denied) > 0 && !e.HostProcs {
		return fmt.Errorf("case %s: denied (the program's own report) needs host_procs: true as the host-side check", c.ID)
	}
	if e.CopyOutSafe && !c.Setup.Output {
		return fmt.Errorf("case %s: copy_out_safe needs setup.output: true", c.ID)
	}
	return nil
}

//go:embed cases/*.yaml
var caseFiles embed.FS

// Cases returns the whole corpus, sorted by category then id.
func Cases() ([]Case, error) {
	files, err := fs.Glob(caseFiles, "cases/*.yaml")
	if err != nil {
		return nil, err
	}
	var all []Case
	seen := map[string]string{}
	for _, f := range files {
		b, err := caseFiles.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(strings.NewReader(string(b)))
		dec.KnownFields(true)
		var cs []Case
		if err := dec.Decode(&cs); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, c := range cs {
			if err := c.validate(); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if prev, ok := seen[c.ID]; ok {
				return nil, fmt.Errorf("%s: case %s already defined in %s", f, c.ID, prev)
			}
			seen[c.ID] = f
			all = append(all, c)
		}
	}
	all = append(all, goCases()...)
	if err := applyTierTable(all); err != nil {
		return nil, err
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].Category != all[j].Category {
			return all[i].Category < all[j].Category
		}
		return all[i].ID < all[j].ID
	})
	return all, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
