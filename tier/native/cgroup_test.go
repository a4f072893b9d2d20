package native_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/native"
)

// TestInitJoinsCgroup: a prepared sandbox's init is inside the run's
// cgroup, in every hierarchy Moat manages, before the program starts: its
// main thread (the process's leader, whose cgroup v1 charges the process's
// memory to, and from which every program is forked) moved itself in
// through the tasks files the host passed (cgroup.Join) on v1, or init was
// born there on v2. The program, forked from that thread, is inside too.
// Either outside would let the program's memory or processes go uncounted.
func TestInitJoinsCgroup(t *testing.T) {
	needRoot(t)
	n, img, home := nativeTier(t)
	host, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("cgjoin-%x", time.Now().UnixNano())
	sb, err := prepareSmall(t, n, img, id)
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	defer func() {
		if !destroyed {
			sb.Destroy()
		}
	}()
	if err := sb.(tier.Readier).WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	pids, err := sb.(tier.ProcessLister).Procs()
	if err != nil || len(pids) != 1 {
		t.Fatalf("processes in the run's cgroup: %v, %v; want init alone", pids, err)
	}
	want := "/moat/" + id
	check := func(what string, b []byte) {
		t.Helper()
		in := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.SplitN(line, ":", 3)
			if len(f) == 3 && strings.HasSuffix(f[2], want) {
				for _, c := range strings.Split(f[1], ",") {
					in[c] = true
				}
				if f[1] == "" {
					in["unified"] = true
				}
			}
		}
		var missing []string
		if host.Version == cgroup.V2 {
			if !in["unified"] {
				missing = append(missing, "the v2 cgroup")
			}
		} else {
			for _, c := range []string{"memory", "pids", "cpu", "cpuacct", "freezer"} {
				if !in[c] {
					missing = append(missing, c)
				}
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s is not in %s's %v:\n%s", what, want, missing, b)
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/cgroup", pids[0], pids[0]))
	if err != nil {
		t.Fatal(err)
	}
	check("init's main thread", b)
	var stdout strings.Builder
	out, err := sb.Exec(context.Background(), &tier.Command{Argv: []string{"cat", "/proc/self/cgroup"}, Env: img.Env, Dir: "/workspace", Stdout: &stdout})
	if err != nil || out.ExitCode != 0 {
		t.Fatalf("program: %v %+v", err, out)
	}
	// Inside, paths are relative to the cgroup namespace init made at the
	// run's cgroup: "/" for every hierarchy Moat manages.
	got := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		if f := strings.SplitN(line, ":", 3); len(f) == 3 && f[2] == "/" {
			for _, c := range strings.Split(f[1], ",") {
				got[c] = true
			}
		}
	}
	for _, c := range []string{"memory", "pids", "cpu"} {
		if host.Version == cgroup.V1 && !got[c] {
			t.Errorf("the program is not at the root of its cgroup namespace for %s:\n%s", c, stdout.String())
		}
	}
	if err := sb.Destroy(); err != nil {
		t.Fatal(err)
	}
	destroyed = true
	if left := leftovers(home)(id); len(left) > 0 {
		t.Errorf("residue after Destroy: %v", left)
	}
}

// TestMoatGuest: the native tier works the same with moat-guest, the
// in-sandbox half alone, as init (what moat uses when scripts/setup
// installed it from the same commit, engine.GuestBinary).
func TestMoatGuest(t *testing.T) {
	needRoot(t)
	g, cleanup, err := testbin.BuildGuest()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	e, err := engine.New(engine.Options{Exe: g, NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m := manifest.Default()
	m.Resources.Pids = 16
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		argv []string
		term result.Termination
		code int
		out  string
	}{
		{"python runs", []string{"python3", "-c", "print(6*7)"}, result.Exited, 0, "42\n"},
		{"exit status", []string{"sh", "-c", "exit 3"}, result.Exited, 3, ""},
		{"command not found", []string{"no-such-command"}, result.Exited, 127, ""},
		{"pids limit", []string{"sh", "-c", "for i in $(seq 40); do sleep 1 & done; wait"}, result.Pids, -1, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var id string
			res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: tc.argv, OnStart: func(runID string, _ func() ([]int, error)) { id = runID }})
			if err != nil {
				t.Fatal(err)
			}
			if res.Termination != tc.term || (tc.code >= 0 && res.ExitCode != tc.code) || (tc.out != "" && res.Stdout.Data != tc.out) {
				t.Errorf("got %s exit %d stdout %q stderr %q; want %s exit %d stdout %q", res.Termination, res.ExitCode, res.Stdout.Data, res.Stderr.Data, tc.term, tc.code, tc.out)
			}
			if left := leftovers(e.Home())(id); len(left) > 0 {
				t.Errorf("residue: %v", left)
			}
		})
	}
}

// nativeTier returns the tier, the python image and the engine's home,
// for tests that prepare sandboxes themselves.
func nativeTier(t *testing.T) (*native.Native, *image.Image, string) {
	t.Helper()
	e, err := newEngine()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	n, err := native.New(native.Options{Exe: moatBin})
	if err != nil {
		t.Fatal(err)
	}
	return n, img, e.Home()
}

// prepareSmall prepares a one-shot sandbox of img with small limits.
func prepareSmall(t *testing.T, n *native.Native, img *image.Image, id string) (tier.Sandbox, error) {
	t.Helper()
	return n.Prepare(context.Background(), &tier.Spec{
		ID: id, ImageRoot: img.Root, ImageEnv: img.Env, StateDir: t.TempDir(),
		Limits: tier.Limits{CPUs: 1, MemoryBytes: 128 << 20, Pids: 32, Timeout: 10 * time.Second, CPUTime: 10 * time.Second,
			OpenFiles: 64, FileSizeBytes: 1 << 20, WorkspaceBytes: 1 << 20, WorkspaceFiles: 100, TmpBytes: 1 << 20},
	})
}
