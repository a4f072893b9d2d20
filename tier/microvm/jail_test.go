package microvm_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/microvm"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// liveRun is a run whose program waits on its stdin: the test inspects
// its VMM from the host while it lives, then ends it by closing stdin.
type liveRun struct {
	id    string
	pid   int // the VMM's host pid
	stdin *io.PipeWriter
	done  chan runEnd
}

type runEnd struct {
	res *result.Result
	err error
}

// startLive starts argv (which must print "ready" once it waits on stdin)
// and returns once it printed it.
func startLive(t *testing.T, e *engine.Engine, adjust func(*manifest.Manifest), argv ...string) *liveRun {
	t.Helper()
	m := manifest.Default()
	m.Tier = microvm.Name
	m.Resources.Timeout = manifest.Duration(120 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if adjust != nil {
		adjust(m)
	}
	r, w := io.Pipe()
	lr := &liveRun{stdin: w, done: make(chan runEnd, 1)}
	ready := make(chan struct{})
	started := make(chan string, 1)
	var procs func() ([]int, error)
	var mu sync.Mutex
	req := &engine.Request{Manifest: m, Argv: argv, Stdin: r, LiveStdout: &notifyWriter{want: "ready", ch: ready},
		OnRuntime: func(p func() ([]int, error)) { mu.Lock(); procs = p; mu.Unlock() },
		OnStart:   func(id string, _ func() ([]int, error)) { started <- id },
	}
	go func() {
		res, err := e.Run(context.Background(), req)
		lr.done <- runEnd{res, err}
	}()
	select {
	case <-ready:
	case end := <-lr.done:
		t.Fatalf("the run ended before it was ready: %+v %v", end.res, end.err)
	case <-time.After(2 * time.Minute):
		w.Close()
		t.Fatal("the program never said ready")
	}
	lr.id = <-started
	mu.Lock()
	pids, err := procs()
	mu.Unlock()
	if err != nil || len(pids) != 1 {
		w.Close()
		t.Fatalf("the VMM's pids: %v %v", pids, err)
	}
	lr.pid = pids[0]
	return lr
}

// end closes the program's stdin and returns its result.
func (lr *liveRun) end(t *testing.T) *result.Result {
	t.Helper()
	lr.stdin.Close()
	end := <-lr.done
	if end.err != nil {
		t.Fatal(end.err)
	}
	return end.res
}

// notifyWriter closes ch the first time the output contains want.
type notifyWriter struct {
	want string
	ch   chan struct{}
	mu   sync.Mutex
	seen bytes.Buffer
	done bool
}

func (w *notifyWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen.Write(p)
	if !w.done && strings.Contains(w.seen.String(), w.want) {
		w.done = true
		close(w.ch)
	}
	return len(p), nil
}

func procStatus(pid int, task string) map[string]string {
	p := fmt.Sprintf("/proc/%d/status", pid)
	if task != "" {
		p = task
	}
	b, _ := os.ReadFile(p)
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m
}

// jailFiles are the only files a VMM's jail may hold (patterns of
// filepath.Match, paths inside the jail): QEMU, its dynamic linker and
// libraries, its TCG module, its firmware, the guest's kernel and
// initramfs, its sockets and its three devices.
var jailFiles = []string{
	"/usr/bin/qemu-system-x86_64", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/lib*.so*",
	"/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so", "/usr/share/qemu/bios-microvm.bin",
	"/vm/vmlinuz", "/vm/initramfs", "/run/vm/agent.sock", "/run/vm/qmp.sock",
	"/dev/null", "/dev/zero", "/dev/urandom",
}

func jailFile(p string) bool {
	for _, pat := range jailFiles {
		if ok, _ := filepath.Match(pat, p); ok {
			return true
		}
	}
	return false
}

// TestVMMJail boots one VM and, while its program waits on stdin, reads
// the live VMM's host /proc: a table of checks shares that one boot.
func TestVMMJail(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	canary := fmt.Sprintf("moat-jail-canary-%d", time.Now().UnixNano())
	for _, dir := range []string{"/root", "/etc"} {
		p := filepath.Join(dir, canary)
		if err := os.WriteFile(p, []byte("host secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
	}
	lr := startLive(t, e, nil, "python3", "-c", "import sys; print('ready', flush=True); sys.stdin.read(); print('done')")
	pid := lr.pid
	root := fmt.Sprintf("/proc/%d/root", pid)
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if len(tasks) == 0 {
		lr.stdin.Close()
		t.Fatalf("the VMM %d has no threads to read", pid)
	}
	t.Logf("VMM pid %d, %d threads, run %s", pid, len(tasks), lr.id)
	tests := []struct {
		name  string
		check func() string // "" when the check holds
	}{
		{"its own unprivileged uid and the jail's gid, no groups", func() string {
			st := procStatus(pid, "")
			uid, gid := strconv.Itoa(jail.UIDBase+pid), strconv.Itoa(jail.GID)
			if st["Uid"] != strings.Repeat(uid+"\t", 3)+uid || st["Gid"] != strings.Repeat(gid+"\t", 3)+gid || st["Groups"] != "" {
				return fmt.Sprintf("Uid %q Gid %q Groups %q, want uid %s gid %s and no groups", st["Uid"], st["Gid"], st["Groups"], uid, gid)
			}
			return ""
		}},
		{"every capability set empty on every thread", func() string {
			for _, task := range tasks {
				st := procStatus(pid, task)
				for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
					if st[set] != "0000000000000000" {
						return fmt.Sprintf("%s: %s %s", task, set, st[set])
					}
				}
			}
			return ""
		}},
		{"no_new_privs and two seccomp filters (Moat's, then QEMU's -sandbox) on every thread", func() string {
			for _, task := range tasks {
				if st := procStatus(pid, task); st["NoNewPrivs"] != "1" || st["Seccomp"] != "2" || st["Seccomp_filters"] != "2" {
					return fmt.Sprintf("%s: NoNewPrivs %s Seccomp %s Seccomp_filters %s", task, st["NoNewPrivs"], st["Seccomp"], st["Seccomp_filters"])
				}
			}
			return ""
		}},
		{"none of the host's mnt, pid, net, ipc, uts, cgroup namespaces", func() string {
			for _, ns := range []string{"mnt", "pid", "net", "ipc", "uts", "cgroup"} {
				mine, err1 := os.Readlink("/proc/self/ns/" + ns)
				its, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
				if err1 != nil || err2 != nil || mine == its {
					return fmt.Sprintf("%s namespace %s, ours %s (%v %v)", ns, its, mine, err1, err2)
				}
			}
			return ""
		}},
		{"PID 1 of its namespace", func() string {
			if ns := strings.Fields(procStatus(pid, "")["NSpid"]); len(ns) != 2 || ns[1] != "1" {
				return fmt.Sprintf("NSpid %v", ns)
			}
			return ""
		}},
		{"in the run's cgroup", func() string { return inRunCgroup(pid, lr.id) }},
		{"the run's cgroup: memory RAM+overhead, pids, the manifest's CPU while the program runs", func() string {
			read := func(glob string) string {
				m, _ := filepath.Glob(glob)
				if len(m) == 0 {
					return ""
				}
				b, _ := os.ReadFile(m[0])
				return strings.TrimSpace(string(b))
			}
			mem := strconv.Itoa((512 + microvm.GuestOverheadMiB + microvm.VMMOverheadMiB) << 20)
			got := []string{read("/sys/fs/cgroup/memory/moat/" + lr.id + "/memory.limit_in_bytes"), read("/sys/fs/cgroup/pids/moat/" + lr.id + "/pids.max"), read("/sys/fs/cgroup/cpu*/moat/" + lr.id + "/cpu.cfs_quota_us")}
			want := []string{mem, "129", "100000"}
			if got[0] == "" { // cgroup v2
				got = []string{read("/sys/fs/cgroup/moat/" + lr.id + "/memory.max"), read("/sys/fs/cgroup/moat/" + lr.id + "/pids.max"), read("/sys/fs/cgroup/moat/" + lr.id + "/cpu.max")}
				want[2] = "100000 100000"
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				return fmt.Sprintf("memory, pids, CPU limits %q, want %q", got, want)
			}
			return ""
		}},
		{"its root holds only what QEMU needs", func() string {
			for _, p := range []string{"/root/" + canary, "/etc/" + canary, "/etc", "/root", "/home", "/proc", "/sys", "/var", "/tmp"} {
				if _, err := os.Lstat(root + p); err == nil {
					return "the jail has " + p
				}
			}
			var bad []string
			n := 0
			filepath.WalkDir(root+"/", func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				n++
				if rel := strings.TrimPrefix(p, root); !jailFile(rel) {
					bad = append(bad, rel)
				}
				return nil
			})
			if len(bad) > 0 || n < 10 {
				return fmt.Sprintf("unexpected files %v (%d files)", bad, n)
			}
			return ""
		}},
		{"every mount read-only, nosuid, nodev but the run directory and /dev", func() string { return jailMounts(pid) }},
		{"no core dumps, 1024 descriptors", func() string {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
			for _, want := range []string{`Max core file size\s+0\s+0\s`, `Max open files\s+1024\s+1024\s`} {
				if !matches(want, string(b)) {
					return fmt.Sprintf("limits lack %q:\n%s", want, b)
				}
			}
			return ""
		}},
		{"every descriptor is one it should have", func() string {
			msg, all := vmmFDs(pid)
			t.Logf("VMM descriptors: %v", all)
			return msg
		}},
		{"the initramfs it opens is readable by the jails' group only, its disk by root only", func() string {
			disk := ""
			fds, _ := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", pid))
			for _, fd := range fds {
				if t, _ := os.Readlink(fd); strings.HasSuffix(t, ".ext4") {
					disk = fd
				}
			}
			for _, c := range []struct {
				path string
				perm fs.FileMode
				gid  uint32
			}{{root + "/vm/initramfs", 0o640, jail.GID}, {disk, 0o600, 0}} {
				fi, err := os.Stat(c.path)
				if err != nil {
					return err.Error()
				}
				if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != c.perm || st.Uid != 0 || st.Gid != c.gid {
					return fmt.Sprintf("%s: mode %v owner %d:%d, want %v 0:%d", c.path, fi.Mode().Perm(), st.Uid, st.Gid, c.perm, c.gid)
				}
			}
			return ""
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if msg := tc.check(); msg != "" {
				t.Error(msg)
			}
		})
	}
	res := lr.end(t)
	if res.Termination != result.Exited || res.ExitCode != 0 || res.Stdout.Data != "ready\ndone\n" {
		t.Errorf("termination %s exit %d stdout %q error %q", res.Termination, res.ExitCode, res.Stdout.Data, res.Error)
	}
	if left := leftovers(e.Home(), res.ID); len(left) > 0 {
		t.Errorf("run %s left: %v", res.ID, left)
	}
}

func matches(re, s string) bool {
	ok, _ := regexp.MatchString(re, s)
	return ok
}

// inRunCgroup checks /proc/PID/cgroup: in every hierarchy Moat uses, the
// process is in moat/<id>.
func inRunCgroup(pid int, id string) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err == nil {
		err = cgroup.InRun(b, id)
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// jailMounts checks the VMM's own mount table: every mount point is a
// jail file or one of its directories; everything read-only, nosuid and
// nodev, except the run directory (read-write) and /dev (devices);
// noexec except QEMU and its libraries.
func jailMounts(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		return err.Error()
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			return "bad mountinfo line " + line
		}
		n++
		point, opts := f[4], ","+f[5]+","
		want := []string{",nosuid,", ",ro,", ",nodev,", ",noexec,"}
		code := strings.HasPrefix(point, "/lib") || point == "/usr/bin/qemu-system-x86_64" || strings.HasPrefix(point, "/usr/lib/")
		switch {
		case point == "/run/vm":
			want = []string{",nosuid,", ",rw,", ",nodev,", ",noexec,"}
		case point == "/dev":
			want = []string{",nosuid,", ",ro,", ",noexec,"}
		case code:
			want = []string{",nosuid,", ",ro,", ",nodev,"}
		case point == "/" || jailFile(point):
		default:
			return "unexpected mount point " + point
		}
		for _, w := range want {
			if !strings.Contains(opts, w) {
				return fmt.Sprintf("mount %s has options %s, lacking %s", point, f[5], strings.Trim(w, ","))
			}
		}
	}
	if n < 10 {
		return fmt.Sprintf("only %d mounts", n)
	}
	return ""
}

// vmmFDs checks every descriptor of the VMM: pipes, sockets, anonymous
// inodes (eventfds, signalfds, KVM), /dev/null, /dev/zero, /dev/urandom,
// and read-only: the image disk and a snapshot it restored.
func vmmFDs(pid int) (string, []string) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err.Error(), nil
	}
	var seen []string
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		seen = append(seen, fd.Name()+"="+target)
		info, _ := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		var flags int64
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			}
		}
		switch {
		case strings.HasPrefix(target, "pipe:"), strings.HasPrefix(target, "socket:"), strings.HasPrefix(target, "anon_inode:"):
		case target == "/dev/null", target == "/dev/zero", target == "/dev/urandom":
		case strings.HasPrefix(target, filepath.Join(home, "microvm", "images")+"/"), strings.HasPrefix(target, filepath.Join(home, "microvm", "snapshots")+"/"):
			if flags&3 != 0 {
				return fmt.Sprintf("fd %s: %s is open for writing (flags %o)", fd.Name(), target, flags), seen
			}
		default:
			return fmt.Sprintf("fd %s is %s", fd.Name(), target), seen
		}
	}
	return "", seen
}

// vmmMemory reads the run's cgroup: its memory limit, peak and OOM kills
// (cgroup v1 or v2).
func vmmMemory(t *testing.T, id string) (limit, peak int64, ooms int) {
	t.Helper()
	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	num := func(s string) int64 { n, _ := strconv.ParseInt(s, 10, 64); return n }
	keyed := func(s, k string) int {
		for _, l := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(l, k+" "); ok {
				return int(num(v))
			}
		}
		return 0
	}
	if d := "/sys/fs/cgroup/memory/moat/" + id; exists(d) {
		return num(read(d + "/memory.limit_in_bytes")), num(read(d + "/memory.max_usage_in_bytes")), keyed(read(d+"/memory.oom_control"), "oom_kill")
	}
	ds, _ := filepath.Glob("/sys/fs/cgroup/moat/" + id)
	if len(ds) == 0 {
		t.Fatalf("no memory cgroup for run %s", id)
	}
	return num(read(ds[0] + "/memory.max")), num(read(ds[0] + "/memory.peak")), keyed(read(ds[0]+"/memory.events"), "oom_kill")
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestVMMMemory: the VMM's cgroup allows the VM's RAM plus the measured
// overhead. One boot has QEMU touch all of the VM's RAM at start (as a
// guest that used all its memory would), and its program then allocates
// up to its own limit: QEMU's peak stays under the cgroup's limit, with
// no OOM kill. The peaks are logged: they are the measurement behind
// vmmOverheadMiB.
func TestVMMMemory(t *testing.T) {
	const memMiB = 128
	full := need(t, microvm.Options{NoSnapshot: true})
	microvm.SetPrealloc(full)
	e := newEngine(t, full)
	lr := startLive(t, e, func(m *manifest.Manifest) { m.Resources.Memory = memMiB << 20 },
		"python3", "-c", "import sys, json, decimal, email, http.client, xml.dom.minidom, unittest, asyncio\nx = bytearray(100 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nprint('ready', flush=True); sys.stdin.read()")
	limit, peak, ooms := vmmMemory(t, lr.id)
	if b, err := os.ReadFile("/sys/fs/cgroup/memory/moat/" + lr.id + "/memory.stat"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "rss ") || strings.HasPrefix(l, "cache ") || strings.HasPrefix(l, "mapped_file ") {
				t.Logf("memory.stat %s MiB", l[:strings.IndexByte(l, ' ')]+" "+strconv.FormatInt(mustInt(l[strings.IndexByte(l, ' ')+1:])>>20, 10))
			}
		}
	}
	res := lr.end(t)
	ram := int64(memMiB + microvm.GuestOverheadMiB)
	t.Logf("all RAM touched: VM RAM %d MiB, VMM cgroup limit %d MiB, VMM peak %d MiB (QEMU and the jailer beyond the RAM: %d MiB of the %d allowed)",
		ram, limit>>20, peak>>20, peak>>20-ram, microvm.VMMOverheadMiB)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Errorf("termination %s exit %d error %q", res.Termination, res.ExitCode, res.Error)
	}
	if ooms != 0 || !cgroup.PeakWithin(peak, limit) || limit != (ram+microvm.VMMOverheadMiB)<<20 {
		t.Errorf("VMM cgroup: limit %d, peak %d, %d OOM kills", limit, peak, ooms)
	}
}

func mustInt(s string) int64 { n, _ := strconv.ParseInt(strings.TrimSpace(s), 10, 64); return n }

// TestVMMLimitHit: a VMM stopped by its cgroup (the OOM killer at the
// memory limit, a thread it cannot create at the pids limit) ends the run
// as an infra-error that names the limit, without a hang. Each row's VM
// fails during its start, in well under the boot timeout.
func TestVMMLimitHit(t *testing.T) {
	const memMiB = 64
	tests := []struct {
		name   string
		adjust func(*microvm.MicroVM)
		want   string
	}{
		{"QEMU touching all its RAM under a limit below it is OOM-killed", func(v *microvm.MicroVM) {
			microvm.SetPrealloc(v)
			microvm.SetVMMOverheadMiB(v, -(memMiB + microvm.GuestOverheadMiB - 160))
		}, "killed by the kernel's OOM killer at its cgroup's memory limit of 160 MiB"},
		{"QEMU unable to start its threads", func(v *microvm.MicroVM) { microvm.SetVMMPids(v, 2) }, "reached its cgroup's limit of 2 tasks"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := need(t, microvm.Options{NoSnapshot: true})
			tc.adjust(v)
			e := newEngine(t, v)
			start := time.Now()
			res := runVM(t, e, func(m *manifest.Manifest) { m.Resources.Memory = memMiB << 20 }, "true")
			t.Logf("%s after %v: %s", res.Termination, time.Since(start).Round(time.Millisecond), res.Error)
			if res.Termination != result.InfraError || !strings.Contains(res.Error, tc.want) {
				t.Errorf("termination %s error %q, want infra-error naming %q", res.Termination, res.Error, tc.want)
			}
		})
	}
}

// The environment of the test binary re-executed as a moat process that
// runs one microVM (TestKilledMoatLeavesNothing).
const (
	helperEnv      = "MOAT_MICROVM_TEST_HELPER" // the agent binary
	helperReadyMsg = "helper-program-ready"
)

// helperRun is a moat process: a microvm run of a program that prints
// helperReadyMsg (forwarded to our stdout) and sleeps.
func helperRun() int {
	v, err := microvm.New(microvm.Options{Home: testHome, Agent: os.Getenv(helperEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{microvm.Name: v}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m := manifest.Default()
	m.Tier = microvm.Name
	m.Resources.Timeout = manifest.Duration(5 * time.Minute)
	m.Resources.CPUTime = m.Resources.Timeout
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: []string{"sh", "-c", "echo " + helperReadyMsg + "; sleep 300"}, LiveStdout: os.Stdout})
	fmt.Fprintln(os.Stderr, res, err)
	return 1
}

// TestKilledMoatLeavesNothing kills a moat process (this test binary
// re-executed) with SIGKILL while its microVM's program runs: the VMM dies
// with it (its parent-death signal survived the jail's uid change), no
// mount is left on the host (the jail's lived in its own namespace), and
// what remains, the run's cgroup and directory (its sockets), is removed
// by the engine's GC, as the next moat start runs it.
func TestKilledMoatLeavesNothing(t *testing.T) {
	need(t, microvm.Options{})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+agentBin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.Contains(sc.Text(), helperReadyMsg) {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("the helper ended: %s", stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the helper's program never started: %s", stderr.String())
	}
	// Its VMM: the helper's child, in a run's cgroup.
	vmm, id := 0, ""
	kids, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, k := range kids {
		b, _ := os.ReadFile(k)
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(cmd.Process.Pid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(k)))
			cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
			if _, rest, ok := strings.Cut(string(cg), "/moat/"); ok {
				vmm, id = pid, strings.TrimSpace(strings.SplitN(rest, "\n", 2)[0])
			}
		}
	}
	if vmm == 0 {
		t.Fatal("the helper has no VMM child in a run's cgroup")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	deadline := time.Now().Add(5 * time.Second)
	gone := func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", vmm))
		return err != nil || strings.Contains(string(b), ") Z ")
	}
	for !gone() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !gone() {
		syscall.Kill(vmm, syscall.SIGKILL)
		t.Fatalf("the VMM %d outlived the killed moat", vmm)
	}
	e, err := engine.New(engine.Options{NoAutoBuild: true})
	if err != nil {
		t.Fatal(err)
	}
	before := leftovers(e.Home(), id)
	t.Logf("left by the killed run %s before gc: %v", id, before)
	for _, l := range before {
		if strings.HasPrefix(l, "mount ") || strings.HasPrefix(l, "process ") {
			t.Errorf("the killed run left %s", l)
		}
	}
	rep, err := e.GC()
	if err != nil {
		t.Errorf("gc: %v", err)
	}
	t.Logf("gc removed runs %v, cgroups %v", rep.Runs, rep.Cgroups)
	if left := leftovers(e.Home(), id); len(left) > 0 {
		t.Errorf("after gc, run %s still left: %v", id, left)
	}
}
