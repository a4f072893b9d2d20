package redteam

// The corpus through a foreign container engine: each declarative case's
// attack program runs as a container that an engine (containerd's CRI
// with Moat's OCI runtime as the handler, in internal/engines) starts,
// and is judged from the host's side by the same checks as on a tier,
// as far as what an engine reports allows. What an engine cannot carry
// (a Moat manifest, a workspace, the Result's measurements) makes a case
// not-applicable with the reason, never contained.

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// ContainerRun is what an engine reports of one container.
type ContainerRun struct {
	// Output is the container's stdout and stderr (its log).
	Output string
	// ExitCode is the status the engine reports: 128+N for signal N, as
	// containerd's shim and Docker report it.
	ExitCode int
}

// ContainerEngine runs one program as a container and waits for it.
// Once the container has started it calls onStart with a lister of the
// container's host pids (every process in its PID namespace), which the
// host samples while the container lives: the cases' host_procs check.
type ContainerEngine interface {
	RunContainer(ctx context.Context, argv []string, onStart func(procs func() ([]int, error))) (ContainerRun, error)
}

// containerTier is the tier whose expectations apply through an OCI
// runtime: moat-runtime runs a bundle with the native tier's machinery
// (namespaces, seccomp, Landlock, cgroups), so a case's per-tier
// expectation for native holds there too.
const containerTier = "native"

// containerNA says why a case cannot be judged through a container
// engine, or "".
func containerNA(c *Case) string {
	switch {
	case c.custom != nil:
		return "a Go-written case drives Moat's engine itself (several sandboxes, sessions, the egress proxy)"
	case len(c.Tiers) > 0 && !contains(c.Tiers, containerTier):
		return "the case does not apply to the " + containerTier + " tier, whose machinery the OCI runtime uses"
	case strings.TrimSpace(c.Manifest) != "":
		return "the case sets a Moat manifest (limits, network policy, copy modes), which a container engine does not pass; its pod spec is the runtime's input"
	case len(c.Setup.Inputs) > 0 || c.Setup.Output:
		return "the case copies files in or out of /workspace, which a container engine does not do"
	}
	e := c.Expect
	var need []string
	if len(e.Violations) > 0 {
		need = append(need, "recorded violations")
	}
	if e.MaxPeakMemory != "" {
		need = append(need, "peak memory")
	}
	if e.MaxDurationMS > 0 {
		need = append(need, "the run's duration")
	}
	if e.CopyOutSafe || len(e.FilesAbsent) > 0 || e.DiffBounded > 0 {
		need = append(need, "the workspace diff")
	}
	for _, t := range e.Termination {
		if t != string(result.Exited) && t != string(result.Signaled) {
			need = append(need, "termination "+t)
		}
	}
	if len(need) > 0 {
		return "the case is judged by " + strings.Join(need, ", ") + ", which only Moat's Result reports, not a container engine"
	}
	return ""
}

// RunContainers runs every case of cases through eng, labelled label in
// the verdicts: each applicable case's attack as one container, judged
// from the host (canary, listener, output, exit); the others
// not-applicable with the reason.
func RunContainers(ctx context.Context, eng ContainerEngine, label string, cases []Case) []Verdict {
	var out []Verdict
	for _, c := range cases {
		start := time.Now()
		v := Verdict{Case: c.ID, Category: c.Category, Severity: c.Severity, Tier: label}
		cc, te := c.forTier(containerTier)
		if te != nil && te.NotApplicable {
			v.Verdict, v.Evidence = NotApplicable, "not applicable on "+containerTier+": "+te.Reason
		} else if why := containerNA(&cc); why != "" {
			v.Verdict, v.Evidence = NotApplicable, why
		} else {
			n := max(cc.Repeat, 1)
			for i := 0; i < n; i++ {
				v.Runs++
				v.Verdict, v.Evidence = runContainer(ctx, eng, &cc)
				if v.Verdict != Contained {
					break
				}
			}
		}
		v.Seconds = time.Since(start).Seconds()
		out = append(out, v)
	}
	return out
}

// runContainer is one attempt: the host's setup (canary, listener), the
// container, then the declarative checks on what the engine reported.
func runContainer(ctx context.Context, eng ContainerEngine, c *Case) (string, string) {
	r := &runner{tier: containerTier}
	en, err := r.setup(c)
	defer en.close()
	if err != nil {
		return Error, "host setup: " + err.Error()
	}
	argv := c.Program()
	expanded := make([]string, len(argv))
	for i, a := range argv {
		expanded[i] = expand(a, en.vars)
	}
	if en.canary != "" {
		// As on a tier: a careless host keeps secrets in the environment
		// of what starts containers; none may reach the container.
		os.Setenv("MOAT_REDTEAM_CANARY_"+c.envKey(), en.canary)
		defer os.Unsetenv("MOAT_REDTEAM_CANARY_" + c.envKey())
	}
	var procs procWatch
	onStart := func(pl func() ([]int, error)) {
		if c.Expect.HostProcs {
			procs.start("", pl)
		}
	}
	run, err := eng.RunContainer(ctx, expanded, onStart)
	procs.stop()
	if err != nil {
		return Error, "the engine failed to run the case: " + clip(err.Error(), 300)
	}
	res := &result.Result{ExitCode: run.ExitCode, Termination: result.Exited, Stdout: result.Stream{Data: run.Output}}
	if run.ExitCode > 128 {
		res.Termination = result.Signaled
	}
	return judge(c, en, res, &procs)
}

// ContainerSummary counts verdicts by kind, for the test's log.
func ContainerSummary(vs []Verdict) string {
	n := map[string]int{}
	for _, v := range vs {
		n[v.Verdict]++
	}
	return fmt.Sprintf("%d cases: %d contained, %d escaped, %d not-applicable, %d error", len(vs), n[Contained], n[Escaped], n[NotApplicable], n[Error])
}
