package redteam

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
)

// unsandboxed is a "tier" with no isolation at all: the program runs on the
// host as moat's own user, with moat's environment. Every case marked
// unsandboxed: true must report escaped against it, which proves the case's
// checks can fail.
type unsandboxed struct{}

func (unsandboxed) Name() string                    { return "unsandboxed" }
func (unsandboxed) Capabilities() tier.Capabilities { return tier.Capabilities{} }
func (unsandboxed) Prepare(ctx context.Context, spec *tier.Spec) (tier.Sandbox, error) {
	dir, err := os.MkdirTemp("", "moat-redteam-unsandboxed-")
	if err != nil {
		return nil, err
	}
	return &plainSandbox{dir: dir}, nil
}

type plainSandbox struct {
	dir string
	cmd *exec.Cmd
}

func (p *plainSandbox) Workspace() tier.Workspace {
	return tier.Workspace{Dir: p.dir, UID: os.Getuid(), GID: os.Getgid()}
}

func (p *plainSandbox) Procs() ([]int, error) {
	if p.cmd == nil || p.cmd.Process == nil {
		return nil, nil
	}
	return []int{p.cmd.Process.Pid}, nil
}

func (p *plainSandbox) Exec(ctx context.Context, c *tier.Command) (*tier.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	p.cmd = exec.CommandContext(ctx, c.Argv[0], c.Argv[1:]...)
	p.cmd.Dir = p.dir
	// A careless runner: the host's environment leaks in.
	p.cmd.Env = append(os.Environ(), c.Env...)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = c.Stdin, c.Stdout, c.Stderr
	start := time.Now()
	err := p.cmd.Run()
	out := &tier.Outcome{Termination: result.Exited, Duration: time.Since(start)}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			out.Termination, out.Signal, out.ExitCode = result.Signaled, int(ws.Signal()), 128+int(ws.Signal())
		} else {
			out.ExitCode = ee.ExitCode()
		}
	} else if err != nil {
		return nil, err
	}
	return out, nil
}

func (p *plainSandbox) Destroy() error { return os.RemoveAll(p.dir) }

// TestCasesCanFail runs every case marked unsandboxed against a runner
// without any isolation; each must be judged escaped.
func TestCasesCanFail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the unsandboxed cases demonstrate what root on the host could do")
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{"unsandboxed": unsandboxed{}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Fatalf("%v (build it with: moat image build python)", err)
	}
	cases, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{e: e, tier: "unsandboxed"}
	n := 0
	for i := range cases {
		c := &cases[i]
		if !c.Unsandboxed {
			continue
		}
		n++
		t.Run(c.ID, func(t *testing.T) {
			for _, req := range c.Requires {
				if why := missing(req, r.tier); why != "" {
					t.Skip(why)
				}
			}
			v := r.run(context.Background(), c)
			if v.Verdict != Escaped {
				t.Errorf("unsandboxed, %s was judged %s (%s): its checks cannot detect an escape", c.ID, v.Verdict, v.Evidence)
			}
		})
	}
	if n < 10 {
		t.Errorf("only %d cases are shown to fail unsandboxed; mark more (unsandboxed: true) or explain", n)
	}
}

// TestCorpusOnNative runs the whole corpus against the native tier.
func TestCorpusOnNative(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the native tier creates cgroups and maps user namespaces")
	}
	if os.Getenv("MOAT_REDTEAM_STEP") == "1" {
		t.Skip("scripts/test's red-team step runs the whole corpus on native (and every other tier) with the moat binary a user runs; not twice in one CI run")
	}
	bin, cleanup, err := testbin.Build()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	secrets, err := NewSecretStore()
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(engine.Options{Exe: bin, NoAutoBuild: true, Secrets: secrets, UpstreamRootCAs: secrets.RootCAs()})
	if err != nil {
		t.Fatal(err)
	}
	verdicts, err := Run(context.Background(), e, Options{Tiers: []string{"native"}, Secrets: secrets})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range verdicts {
		switch v.Verdict {
		case Contained:
		case NotApplicable:
			t.Logf("not applicable: %s: %s", v.Case, v.Evidence)
		default:
			t.Errorf("%s on %s: %s: %s", v.Case, v.Tier, v.Verdict, v.Evidence)
		}
	}
}

func TestCorpusIsValidAndDocumented(t *testing.T) {
	cases, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/REDTEAM.md")
	if err != nil {
		t.Fatalf("docs/REDTEAM.md: %v (generate: moat redteam --list --markdown > docs/REDTEAM.md)", err)
	}
	if string(doc) != Markdown(cases) {
		t.Errorf("docs/REDTEAM.md is out of date: regenerate with: moat redteam --list --markdown > docs/REDTEAM.md")
	}
}
