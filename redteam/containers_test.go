package redteam

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeEngine answers every container with a fixed report, or an error.
type fakeEngine struct {
	run ContainerRun
	err error
}

func (f fakeEngine) RunContainer(ctx context.Context, argv []string, onStart func(func() ([]int, error))) (ContainerRun, error) {
	return f.run, f.err
}

// hostEngine runs the "container" directly on the host, as root, with no
// isolation at all: every case the corpus marks unsandboxed must be
// judged escaped through it, which shows that the container path's
// checks can fail.
type hostEngine struct{}

func (hostEngine) RunContainer(ctx context.Context, argv []string, onStart func(func() ([]int, error))) (ContainerRun, error) {
	dir, err := os.MkdirTemp("", "moat-redteam-host-")
	if err != nil {
		return ContainerRun{}, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return ContainerRun{}, err
	}
	pid := cmd.Process.Pid
	onStart(func() ([]int, error) { return []int{pid}, nil })
	err = cmd.Wait()
	run := ContainerRun{Output: out.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		run.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			run.ExitCode = 128 + int(ws.Signal())
		}
	} else if err != nil {
		return run, err
	}
	return run, nil
}

func TestRunContainersJudges(t *testing.T) {
	canaryCase := Case{ID: "t-canary", Category: "t", Severity: "high", Threat: "t",
		Sh: "cat {canary_path}", Setup: Setup{Canary: true}, Expect: Expect{OutputLacks: []string{"{canary}"}, CanaryIntact: true}}
	withManifest := canaryCase
	withManifest.Manifest = "limits:\n  memory: 64MiB\n"
	withOutput := canaryCase
	withOutput.Setup.Output = true
	timeout := canaryCase
	timeout.Expect.Termination = []string{"timeout"}
	exited := canaryCase
	exited.Expect.Termination = []string{"exited"}
	denied := Case{ID: "t-denied", Category: "t", Severity: "high", Threat: "t", Sh: "true", Expect: Expect{Denied: []string{"mount"}}}
	notOnNative := canaryCase
	notOnNative.Tiers = []string{"gvisor"}
	custom := canaryCase
	custom.custom = func(context.Context, *runner) (string, string, int) { return Contained, "", 1 }

	tests := []struct {
		name       string
		c          Case
		eng        ContainerEngine
		want       string
		inEvidence string
	}{
		{"silent container is contained", canaryCase, fakeEngine{run: ContainerRun{Output: "cat: no such file\n", ExitCode: 1}}, Contained, "host canary intact"},
		{"engine failure is an error, never contained", canaryCase, fakeEngine{err: errors.New("shim died")}, Error, "shim died"},
		{"a Moat manifest is not-applicable", withManifest, fakeEngine{}, NotApplicable, "manifest"},
		{"copy-out is not-applicable", withOutput, fakeEngine{}, NotApplicable, "/workspace"},
		{"a termination only Moat reports is not-applicable", timeout, fakeEngine{}, NotApplicable, "termination timeout"},
		{"a signal where exit was required escapes", exited, fakeEngine{run: ContainerRun{ExitCode: 137}}, Escaped, "termination signaled"},
		{"denied: ok reported escapes", denied, fakeEngine{run: ContainerRun{Output: "mount: ok\n"}}, Escaped, "mount succeeded"},
		{"denied: refusal reported is contained", denied, fakeEngine{run: ContainerRun{Output: "mount: denied EPERM\n"}}, Contained, "refused"},
		{"denied: silence is an error", denied, fakeEngine{run: ContainerRun{Output: ""}}, Error, "never reported"},
		{"another tier's case is not-applicable", notOnNative, fakeEngine{}, NotApplicable, "native"},
		{"a Go-written case is not-applicable", custom, fakeEngine{}, NotApplicable, "Go-written"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := RunContainers(context.Background(), tc.eng, "cri-moat", []Case{tc.c})
			if len(vs) != 1 {
				t.Fatalf("%d verdicts, want 1", len(vs))
			}
			v := vs[0]
			if v.Verdict != tc.want || !strings.Contains(v.Evidence, tc.inEvidence) || v.Tier != "cri-moat" {
				t.Errorf("verdict %s (%s) on %s, want %s with %q", v.Verdict, v.Evidence, v.Tier, tc.want, tc.inEvidence)
			}
		})
	}
}

// TestRunContainersCanFail runs the cases marked unsandboxed that apply to
// containers on the host itself through RunContainers: each must be
// judged escaped, or the container path could not see an escape.
func TestRunContainersCanFail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the unsandboxed cases demonstrate what root on the host could do")
	}
	cases, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range cases {
		cc, te := c.forTier(containerTier)
		if !c.Unsandboxed || (te != nil && te.NotApplicable) || containerNA(&cc) != "" {
			continue
		}
		n++
		t.Run(c.ID, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			v := RunContainers(ctx, hostEngine{}, "host", []Case{c})[0]
			if v.Verdict != Escaped {
				t.Errorf("run on the host, %s was judged %s (%s): the container path cannot detect its escape", c.ID, v.Verdict, v.Evidence)
			}
		})
	}
	if n < 5 {
		t.Errorf("only %d unsandboxed cases apply to containers; the container path is barely shown to fail", n)
	}
}
