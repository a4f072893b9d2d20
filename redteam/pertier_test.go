package redteam

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

func TestPerTierValidation(t *testing.T) {
	base := func() Case {
		return Case{ID: "x", Category: "c", Severity: "low", Threat: "t", Sh: "true",
			Expect: Expect{Termination: []string{"exited"}}}
	}
	reason := "the tier serves this call in its own kernel; the host-side evidence is the runtime's confinement"
	tests := []struct {
		name string
		pt   map[string]TierExpect
		err  string // substring; "" for valid
	}{
		{"expect with reason", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{HostProcs: true}}}, ""},
		{"not applicable with reason", map[string]TierExpect{"gvisor": {Reason: reason, NotApplicable: true}}, ""},
		{"no reason", map[string]TierExpect{"gvisor": {Expect: &Expect{HostProcs: true}}}, "reason"},
		{"short reason", map[string]TierExpect{"gvisor": {Reason: "differs", NotApplicable: true}}, "reason"},
		{"both", map[string]TierExpect{"gvisor": {Reason: reason, NotApplicable: true, Expect: &Expect{HostProcs: true}}}, "exactly one"},
		{"neither", map[string]TierExpect{"gvisor": {Reason: reason}}, "exactly one"},
		{"empty expectation", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{}}}, "no expectation"},
		{"denied without host_procs", map[string]TierExpect{"gvisor": {Reason: reason, Expect: &Expect{Denied: []string{"op"}}}}, "host_procs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			c.PerTier = tc.pt
			err := c.validate()
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("valid case refused: %v", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %v, want an error containing %q", err, tc.err)
			}
		})
	}
}

func TestForTier(t *testing.T) {
	c := Case{ID: "x", Expect: Expect{Denied: []string{"a", "b"}, HostProcs: true},
		PerTier: map[string]TierExpect{"gvisor": {Reason: "r", Expect: &Expect{Denied: []string{"b"}, HostProcs: true}}}}
	if cc, te := c.forTier("native"); te != nil || len(cc.Expect.Denied) != 2 {
		t.Errorf("native: got %v %v, want the default expectation", cc.Expect, te)
	}
	if cc, te := c.forTier("gvisor"); te == nil || len(cc.Expect.Denied) != 1 || len(c.Expect.Denied) != 2 {
		t.Errorf("gvisor: got %v %v (default now %v), want the tier's, default untouched", cc.Expect, te, c.Expect)
	}
}

// TestInspectRuntimeCanFail runs the runtime-process judgment on this test
// process, which is neither runsc nor seccomp-filtered: both must be found.
func TestInspectRuntimeCanFail(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, exe, want string
	}{
		{"not the runtime's executable", "/nonexistent/runsc", "not the runtime"},
		{"not seccomp-filtered", self, "not seccomp-filtered"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := &procWatch{runtime: true, runtimeExe: tc.exe}
			w.inspectRuntime(os.Getpid())
			if ev := w.verdict(); !strings.Contains(ev, tc.want) {
				t.Errorf("verdict %q, want it to contain %q", ev, tc.want)
			}
		})
	}
}

func TestTierTable(t *testing.T) {
	all, err := Cases()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range all {
		if _, ok := c.PerTier["wasm"]; ok {
			n++
		}
	}
	if n != len(wasmTable) {
		t.Errorf("%d cases carry a wasm entry, the table has %d", n, len(wasmTable))
	}
	m := 0
	for _, c := range all {
		if _, ok := c.PerTier["microvm"]; ok {
			m++
		}
	}
	if m != len(microvmTable) {
		t.Errorf("%d cases carry a microvm entry, the table has %d", m, len(microvmTable))
	}
	// A variant replaces the program, keeping the case's attack id.
	var c Case
	for _, x := range all {
		if x.ID == "res-disk-bomb" {
			c = x
		}
	}
	cc, te := c.forTier("wasm")
	if te == nil || cc.Sh != "" || cc.Python == "" || c.Sh == "" {
		t.Errorf("res-disk-bomb on wasm: sh %q python %q (default sh %q), want the Python variant", cc.Sh, cc.Python, c.Sh)
	}
	// Entries naming a missing case, or a tier entry twice, are refused.
	one := []Case{{ID: "only", PerTier: map[string]TierExpect{"wasm": {Reason: "already has an entry for the wasm tier here", NotApplicable: true}}}}
	if err := applyTierTable(one); err == nil {
		t.Error("a table naming cases that do not exist was accepted")
	}
}

// TestNotGuest: a case that ran only refused commands cannot be contained or
// escaped; one that also ran a guest keeps an escape.
func TestNotGuest(t *testing.T) {
	var n notGuest
	if cmd, _ := n.command(); cmd != "" {
		t.Fatalf("nothing marked, got %q", cmd)
	}
	n.mark([]string{"sh", "-c", "x"}, false)
	if cmd, none := n.command(); cmd != "sh -c" || !none {
		t.Errorf("got %q %v, want sh -c and nothing ran", cmd, none)
	}
	n.mark([]string{"python3", "-c", "x"}, true)
	if _, none := n.command(); none {
		t.Error("a guest ran, but the case says nothing did")
	}
}

// TestMoatChildrenCanFail: a child of this process must be seen and judged
// an escape by the in-process (wasm) check.
func TestMoatChildrenCanFail(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary: ", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	w := &procWatch{inProcess: true}
	pids, err := w.moatChildren()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		w.inspectChild(p)
	}
	if ev := w.verdict(); !strings.Contains(ev, "child of moat") {
		t.Errorf("verdict %q with child %d running, want an escape", ev, cmd.Process.Pid)
	}
	w2 := &procWatch{inProcess: true}
	if ev := w2.verdict(); !strings.HasPrefix(ev, "error: ") {
		t.Errorf("no sample taken, verdict %q, want an error", ev)
	}
}

// TestInspectVMMCanFail: a VMM never seen under both seccomp filters (this
// test process; QEMU with only its own -sandbox) is an escape, not a pass;
// so is a QEMU under both filters that runs outside the tier's jail
// (started here as it was before the jail: the test's uid, every
// capability root has, the host's namespaces, no run cgroup).
func TestInspectVMMCanFail(t *testing.T) {
	w := &procWatch{runtime: true, vmm: true, runtimeExe: "/nonexistent/qemu", runID: "r1"}
	w.inspectVMM(os.Getpid())
	w.inspectVMM(os.Getpid())
	const unfiltered = "never had both seccomp filters"
	if ev := w.verdict(); !strings.Contains(ev, unfiltered) {
		t.Errorf("verdict %q, want the missing filters found", ev)
	}

	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("no qemu-system-x86_64 for the unjailed VMM")
	}
	qemu, _ = filepath.EvalSymlinks(qemu)
	args := []string{"-M", "none", "-nodefaults", "-nographic", "-display", "none", "-serial", "none", "-monitor", "none",
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"}
	underMoat := exec.Command(os.Args[0], append([]string{qemu}, args...)...)
	underMoat.Env = []string{filteredExecEnv + "=1"}
	unjailed := "not the jail's unprivileged range"
	if os.Geteuid() == 0 {
		unjailed = "runs as host uid 0"
	}
	for _, tc := range []struct {
		name    string
		cmd     *exec.Cmd
		filters string // Seccomp_filters once QEMU is up
		want    string
	}{
		{"QEMU with only its own filter", exec.Command(qemu, args...), "1", unfiltered},
		{"QEMU under Moat's filter and its own, unjailed", underMoat, "2", unjailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { tc.cmd.Process.Kill(); tc.cmd.Wait() }()
			pid := tc.cmd.Process.Pid
			w := &procWatch{runtime: true, vmm: true, runtimeExe: qemu, runID: "r1"}
			up := false
			for deadline := time.Now().Add(10 * time.Second); !up && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
				up = exe == qemu && parseStatus(string(b))["Seccomp_filters"] == tc.filters
			}
			if !up {
				t.Fatalf("QEMU (pid %d) did not come up with %s seccomp filter(s) within 10 s", pid, tc.filters)
			}
			w.inspectVMM(pid)
			w.inspectVMM(pid)
			if ev := w.verdict(); !strings.Contains(ev, tc.want) {
				t.Errorf("verdict %q, want %q", ev, tc.want)
			}
		})
	}
}

// TestJudgeVMMThread: each part of the jail, missing alone, is an escape.
func TestJudgeVMMThread(t *testing.T) {
	uid := strconv.Itoa(jail.UIDBase + 4242)
	gid := strconv.Itoa(jail.GID)
	jailed := func() map[string]string {
		return map[string]string{"Uid": uid + "\t" + uid + "\t" + uid + "\t" + uid, "Gid": gid + "\t" + gid + "\t" + gid + "\t" + gid, "Groups": "",
			"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000"}
	}
	const v1 = "12:pids:/moat/r1\n11:memory:/moat/r1\n10:cpu,cpuacct:/moat/r1\n9:freezer:/moat/r1\n5:devices:/\n0::/\n"
	tests := []struct {
		name    string
		adjust  func(map[string]string)
		shared  []string
		cgroups string
		want    string // "" = confined
	}{
		{"jailed, cgroup v1 (hybrid)", nil, nil, v1, ""},
		{"jailed, cgroup v2", nil, nil, "0::/moat/r1\n", ""},
		{"jailed, cgroup v2 below a delegated parent", nil, nil, "0::/system.slice/moat.service/moat/r1\n", ""},
		{"root", func(s map[string]string) { s["Uid"] = "0\t0\t0\t0" }, nil, v1, "runs as host uid 0"},
		{"saved uid root", func(s map[string]string) { s["Uid"] = uid + "\t" + uid + "\t0\t" + uid }, nil, v1, "runs as host uid 0"},
		{"the native tier's sandbox uid", func(s map[string]string) { s["Uid"] = "1879049192\t1879049192\t1879049192\t1879049192" }, nil, v1, "not the jail's unprivileged range"},
		{"another gid", func(s map[string]string) { s["Gid"] = "0\t0\t0\t0" }, nil, v1, "gid 0"},
		{"supplementary groups", func(s map[string]string) { s["Groups"] = "6 993" }, nil, v1, "supplementary groups 6 993"},
		{"a bounding set", func(s map[string]string) { s["CapBnd"] = "000001ffffffffff" }, nil, v1, "CapBnd"},
		{"an ambient capability", func(s map[string]string) { s["CapAmb"] = "0000000000200000" }, nil, v1, "CapAmb"},
		{"an inheritable capability", func(s map[string]string) { s["CapInh"] = "0000000000000001" }, nil, v1, "CapInh"},
		{"the host's network namespace", nil, []string{"net"}, v1, "shares the host's [net]"},
		{"another run's cgroup", nil, nil, strings.ReplaceAll(v1, "pids:/moat/r1", "pids:/moat/r2"), "outside the run's cgroup moat/r1"},
		{"no moat cgroup", nil, nil, "12:pids:/\n11:memory:/user.slice\n0::/\n", "outside the run's cgroup"},
		{"moat's own cgroup (v2)", nil, nil, "0::/moat-supervisor\n", "outside the run's cgroup"},
		{"no hierarchy of Moat's", nil, nil, "5:devices:/\n", "none of Moat's cgroup hierarchies"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := jailed()
			if tc.adjust != nil {
				tc.adjust(st)
			}
			got := judgeVMMThread(st, tc.shared, tc.cgroups, "r1")
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("judgeVMMThread = %q, want %q", got, tc.want)
			}
		})
	}
	if got := judgeVMMThread(jailed(), nil, v1, ""); got == "" {
		t.Error("a VMM matched to no run was judged confined")
	}
}

func TestRunDirOf(t *testing.T) {
	tests := []struct {
		path, want string
		ok         bool
	}{
		{"/var/lib/moat/runs/269cb798ec1450fc/workspace", "/var/lib/moat/runs/269cb798ec1450fc", true},
		{"/tmp/home/runs/abc/tmp/x", "/tmp/home/runs/abc", true},
		{"/var/lib/moat/runs/", "", false},
		{"/var/lib/moat/images/x", "", false},
	}
	for _, tc := range tests {
		got, ok := runDirOf(tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("runDirOf(%q) = %q, %v; want %q, %v", tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

// TestRunning: a live process runs; an exited one (a zombie until reaped)
// does not.
func TestRunning(t *testing.T) {
	if !running(os.Getpid()) {
		t.Error("this test process does not count as running")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	for i := 0; i < 200 && running(pid); i++ {
		time.Sleep(5 * time.Millisecond) // exits, then waits as a zombie
	}
	if running(pid) {
		t.Error("an exited process counts as running")
	}
	cmd.Wait()
}

// TestPeakWithin: a memory limit holds when the peak stays within it plus
// the kernel's forced charges, and not beyond.
func TestPeakWithin(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		peak, limit int64
		ok          bool
		note        string
	}{
		{"under", 10 * mib, 64 * mib, true, "peak memory 10 MiB"},
		{"at the limit", 64 * mib, 64 * mib, true, "peak memory 64 MiB"},
		{"a few forced pages over (seen on gVisor)", 64*mib + 12288, 64 * mib, true, "peak memory 64 MiB, 12 KiB over the limit in forced charges"},
		{"one MiB over", 65 * mib, 64 * mib, true, "peak memory 65 MiB, 1024 KiB over the limit in forced charges"},
		{"unenforced", 65*mib + 1, 64 * mib, false, "peak memory 65 MiB, 1024 KiB over the limit in forced charges"},
		{"far over", 200 * mib, 64 * mib, false, "peak memory 200 MiB, 139264 KiB over the limit in forced charges"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, note := peakWithin(tc.peak, tc.limit)
			if ok != tc.ok || note != tc.note {
				t.Errorf("peakWithin(%d, %d) = %v, %q; want %v, %q", tc.peak, tc.limit, ok, note, tc.ok, tc.note)
			}
		})
	}
}
