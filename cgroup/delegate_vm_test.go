package cgroup

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDelegatedSubtree: on a real cgroup v2 kernel, a moat process in a
// cgroup that systemd delegated (Delegate=yes: trusted.delegate=1) puts
// its runs in that subtree although, as root, it could write the root of
// the hierarchy, and moves itself into the leaf moat-supervisor first
// (the no-internal-processes rule). The test plays systemd: it makes a
// unit's cgroup, marks it delegated and starts a helper moat process in
// it. This host is v1; TestV2InVM runs it on v2.
func TestDelegatedSubtree(t *testing.T) {
	h := requireHost(t)
	if h.Version != V2 {
		t.Skipf("needs cgroup v2 (this host has %v); TestV2InVM runs it in a VM", h.Version)
	}
	mnt := h.v2Base
	if err := writeFile(filepath.Join(mnt, "cgroup.subtree_control"), "+memory +pids +cpu"); err != nil {
		t.Fatal(err)
	}
	unitRel := fmt.Sprintf("/moat-test-%d.service", os.Getpid())
	unit := filepath.Join(mnt, unitRel)
	if err := os.Mkdir(unit, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Children first; the helper has exited by now.
		for _, d := range []string{filepath.Join(unit, parentName), filepath.Join(unit, supervisorName), unit} {
			if err := unix.Rmdir(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("cleanup: rmdir %s: %v", d, err)
			}
		}
	})
	if err := unix.Setxattr(unit, "trusted.delegate", []byte("1"), 0); err != nil {
		t.Fatalf("mark %s delegated as systemd does: %v", unit, err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=delegated")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// As systemd starts a unit's main process: in the unit's cgroup.
	if err := writeFile(filepath.Join(unit, "cgroup.procs"), fmt.Sprint(cmd.Process.Pid)); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal(err)
	}
	stdin.Write([]byte("x"))
	got := map[string]string{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			got[k] = v
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("helper: %v (reported %v)", err, got)
	}
	tests := []struct{ key, want string }{
		{"parent", filepath.Join(unit, parentName)},
		{"run", filepath.Join(unit, parentName, "delegated-run")},
		{"self", filepath.Join(unitRel, supervisorName)},
		{"pids.max", "8"},
	}
	for _, tc := range tests {
		if got[tc.key] != tc.want {
			t.Errorf("%s = %q, want %q", tc.key, got[tc.key], tc.want)
		}
	}
	if exists(filepath.Join(mnt, parentName, "delegated-run")) {
		t.Errorf("the run's cgroup was made at the root of the hierarchy too")
	}
}

// delegatedHelper is TestDelegatedSubtree's moat process: Detect, one
// run's cgroup, its limit read back, where moat itself ended up, Destroy.
func delegatedHelper() int {
	h, err := Detect()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := h.Create("delegated-run", Limits{Pids: 8})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("parent=%s\n", h.v2Parent)
	fmt.Printf("run=%s\n", c.Dirs()[0])
	if b, err := os.ReadFile(filepath.Join(c.Dirs()[0], "pids.max")); err == nil {
		fmt.Printf("pids.max=%s\n", strings.TrimSpace(string(b)))
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		fmt.Printf("self=%s\n", strings.TrimPrefix(strings.TrimSpace(string(b)), "0::"))
	}
	if err := c.Destroy(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := h.Prune(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
