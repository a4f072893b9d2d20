package microvm_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/microvm"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
	"github.com/moat-sandbox/moat/tier/tiertest"
)

var (
	skipReason string
	agentBin   string
	home       string
)

// testHome keeps the tier's caches (image disks, initramfs) across test
// runs; runs themselves leave nothing there.
const testHome = "/var/lib/moat-microvm-test"

func TestMain(m *testing.M) {
	// The tier re-executes this test binary as its VMM's jailer
	// (Options.Jailer defaults to /proc/self/exe), as the moat binary's
	// main does.
	if jail.IsJailer() {
		jail.Main()
	}
	// TestKilledMoatLeavesNothing's stand-in for a moat process.
	if os.Getenv(helperEnv) != "" {
		os.Exit(helperRun())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	switch {
	case os.Geteuid() != 0:
		skipReason = "needs root: the tier writes its caches under /var/lib and reads the shared python image"
	case !haveQEMU():
		skipReason = "qemu-system-x86_64 is not installed: run scripts/setup"
	}
	if skipReason != "" {
		fmt.Fprintln(os.Stderr, "microvm tests skipped:", skipReason)
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "moat-vmagent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	agentBin = filepath.Join(dir, "moat-guest")
	build := exec.Command("go", "build", "-o", agentBin, "github.com/moat-sandbox/moat/cmd/moat-guest")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build moat-guest: %v\n%s", err, out)
		return 1
	}
	home = testHome
	if err := os.MkdirAll(home, 0o711); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	code := m.Run()
	// Every run checks its own id; check once more for anything of these
	// tests that persists: a VMM using this agent build or cache, half
	// written cache files, probe directories.
	if left := residue(dir); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "residual state after the microvm tests: %v\n", left)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func residue(agentDir string) []string {
	var left []string
	for _, pat := range []string{".tmp-*", ".probe-root-*", "images/.tmp-*", "snapshots/.tmp-*"} {
		m, _ := filepath.Glob(filepath.Join(home, "microvm", pat))
		left = append(left, m...)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte("qemu-system")) && (bytes.Contains(b, []byte(home)) || bytes.Contains(b, []byte(agentDir))) {
			left = append(left, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	// The VMMs' cgroups are moat/<run id>: Destroy removes the moat/
	// parents too once no run uses them. Other packages' tests may be
	// running sandboxes meanwhile, so only an empty parent that stays
	// empty for 10 s counts.
	for i := 0; i < 6; i++ {
		empty := emptyMoatParents()
		if len(empty) == 0 {
			break
		}
		if i == 5 {
			left = append(left, empty...)
		}
		time.Sleep(2 * time.Second)
	}
	return left
}

// emptyMoatParents lists the moat/ cgroup parents with no run below.
func emptyMoatParents() []string {
	var empty []string
	parents, _ := filepath.Glob("/sys/fs/cgroup/*/moat")
	if v2, _ := filepath.Glob("/sys/fs/cgroup/moat"); len(v2) > 0 {
		parents = append(parents, v2...)
	}
	for _, p := range parents {
		kids, err := os.ReadDir(p)
		if err != nil {
			continue
		}
		n := 0
		for _, k := range kids {
			if k.IsDir() {
				n++
			}
		}
		if n == 0 {
			empty = append(empty, "empty cgroup parent "+p)
		}
	}
	return empty
}

func haveQEMU() bool {
	_, err := exec.LookPath("qemu-system-x86_64")
	return err == nil || os.Getenv("MOAT_QEMU") != ""
}

func need(t testing.TB, opts microvm.Options) *microvm.MicroVM {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	opts.Home, opts.Agent = home, agentBin
	v, err := microvm.New(opts)
	if err != nil {
		t.Fatalf("microvm.New: %v", err)
	}
	return v
}

// newEngine is an engine over the shared python image whose runs
// directory is private to these tests.
func newEngine(t testing.TB, v *microvm.MicroVM) *engine.Engine {
	t.Helper()
	e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{microvm.Name: v}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Images().Lookup("python"); err != nil {
		t.Skipf("the python image is not built (%v): run moat image build python", err)
	}
	return e
}

func runVM(t *testing.T, e *engine.Engine, adjust func(*manifest.Manifest), argv ...string) *result.Result {
	t.Helper()
	m := manifest.Default()
	m.Tier = microvm.Name
	m.Resources.Timeout = manifest.Duration(90 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	if adjust != nil {
		adjust(m)
	}
	if err := m.Validate(); err != nil {
		t.Fatalf("test manifest invalid: %v", err)
	}
	res, err := e.Run(context.Background(), &engine.Request{Manifest: m, Argv: argv})
	if err != nil {
		t.Fatalf("run %q: %v", argv, err)
	}
	if left := leftovers(e.Home(), res.ID); len(left) > 0 {
		t.Errorf("run %s left: %v", res.ID, left)
	}
	return res
}

// leftovers lists what run id left: its run directory (sockets,
// workspace copy), its cgroup (the VMM's), any host mount naming it, and
// any process naming it or in its cgroup.
func leftovers(home, id string) []string {
	var left []string
	if _, err := os.Stat(filepath.Join(home, "runs", id)); err == nil {
		left = append(left, "run directory "+filepath.Join(home, "runs", id))
	}
	for _, pat := range []string{"/sys/fs/cgroup/*/moat/" + id, "/sys/fs/cgroup/moat/" + id} {
		cgs, _ := filepath.Glob(pat)
		for _, cg := range cgs {
			left = append(left, "cgroup "+cg)
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				left = append(left, "mount "+line)
			}
		}
	}
	cgs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, p := range cgs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("/moat/"+id+"\n")) {
			left = append(left, "process "+filepath.Base(filepath.Dir(p))+" in the run's cgroup")
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(id)) {
			left = append(left, fmt.Sprintf("process %s (%s)", filepath.Base(filepath.Dir(p)), bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
		}
	}
	return left
}

func hostKernel(t *testing.T) string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// TestIsolation shares one boot across a table of checks: the guest
// script prints one line per check, and each row asserts its line.
func TestIsolation(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	secretFile := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secretFile, []byte("s3cret"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOAT_HOST_SECRET", "hunter2")
	script := fmt.Sprintf(`
import os, socket, platform, json
out = {}
out["kernel"] = platform.release()
out["uid"] = os.getuid()
out["secret_file"] = os.path.exists(%q)
out["secret_env"] = "hunter2" in json.dumps(dict(os.environ))
out["ifaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
try:
    s = socket.create_connection(("10.0.2.2", 80), timeout=2); out["net"] = "connected"
except OSError as e:
    out["net"] = type(e).__name__
try:
    open("/usr/moat-write-test", "w"); out["image_writable"] = True
except OSError:
    out["image_writable"] = False
out["block_devices"] = [d for d in os.listdir("/dev") if d.startswith("vd")]
open("/workspace/made-in-vm.txt", "w").write("hello from the guest\n")
print(json.dumps(out))
`, secretFile)
	res := runVM(t, e, nil, "python3", "-c", script)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination %s exit %d error %q stderr %q", res.Termination, res.ExitCode, res.Error, res.Stderr.Data)
	}
	if !strings.Contains(res.Runtime, "accel=") || !strings.Contains(res.Runtime, "guest-kernel=") {
		t.Errorf("runtime %q does not name the accelerator and guest kernel", res.Runtime)
	}
	t.Logf("runtime: %s; duration %.0f ms", res.Runtime, res.DurationMS)
	got := res.Stdout.Data
	tests := []struct {
		name, want string
	}{
		{"runs unprivileged", `"uid": 1000`},
		{"host file unreachable", `"secret_file": false`},
		{"host environment unreachable", `"secret_env": false`},
		{"no network interface but loopback", `"ifaces": ["lo"]`},
		{"network unreachable", `"net": "OSError"`},
		{"image read-only", `"image_writable": false`},
		{"no block device visible", `"block_devices": []`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(got, tc.want) {
				t.Errorf("stdout %q lacks %q", got, tc.want)
			}
		})
	}
	t.Run("guest kernel differs from the host's", func(t *testing.T) {
		hk := hostKernel(t)
		if strings.Contains(got, `"kernel": "`+hk+`"`) || !strings.Contains(got, `"kernel": "`) {
			t.Errorf("guest kernel line in %q is the host's %q or missing", got, hk)
		}
	})
	t.Run("workspace comes back", func(t *testing.T) {
		found := false
		for _, f := range res.Files {
			if f.Path == "made-in-vm.txt" {
				found = true
			}
		}
		if !found {
			t.Errorf("files %+v lack made-in-vm.txt", res.Files)
		}
	})
}

// TestLimits boots one VM per row: each limit ends its own VM.
func TestLimits(t *testing.T) {
	v := need(t, microvm.Options{})
	small := need(t, microvm.Options{MaxOutputBytes: 1 << 20})
	tests := []struct {
		name   string
		tier   *microvm.MicroVM
		adjust func(*manifest.Manifest)
		argv   []string
		want   result.Termination
	}{
		{"memory limit", v, func(m *manifest.Manifest) { m.Resources.Memory = 64 << 20 },
			[]string{"python3", "-c", "x = []\nwhile True: x.append(bytearray(1 << 20))"}, result.OOM},
		{"wall timeout kills the VM", v, func(m *manifest.Manifest) { m.Resources.Timeout = manifest.Duration(3 * time.Second) },
			[]string{"sleep", "600"}, result.Timeout},
		{"output flood is capped and the VM killed", small, nil,
			[]string{"sh", "-c", "yes moat-flood-line"}, result.OutputLimit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, tc.tier)
			start := time.Now()
			res := runVM(t, e, tc.adjust, tc.argv...)
			if res.Termination != tc.want {
				t.Fatalf("termination %s (exit %d, error %q, stderr %q), want %s", res.Termination, res.ExitCode, res.Error, clip(res.Stderr.Data), tc.want)
			}
			if res.Stdout.Bytes > 64<<20 {
				t.Errorf("kept %d bytes of stdout", res.Stdout.Bytes)
			}
			t.Logf("%s after %v (%s)", res.Termination, time.Since(start).Round(time.Millisecond), res.Runtime)
		})
	}
}

// TestFullWorkspaceComesBack: a run that fills its workspace's inodes
// gets its whole result. The agent powered the VM off right after writing
// the result, and a host still unpacking the workspace lost the frames QEMU
// had not yet passed on: "the VM ended before the agent's result" (the red
// team's io-many-files, which this mirrors, 3 runs in 4 here).
func TestFullWorkspaceComesBack(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	res := runVM(t, e, nil, "python3", "-c", `import os
os.chdir("/workspace")
try:
    for d in range(30):
        os.mkdir("d%d" % d)
        for i in range(1000): open("d%d/f%d" % (d, i), "w").close()
except OSError as e:
    print("full:", e.strerror)`)
	if res.Termination != result.Exited || res.ExitCode != 0 || res.Stdout.Data != "full: No space left on device\n" {
		t.Fatalf("termination %s exit %d error %q stdout %q, want exited 0 at a full workspace", res.Termination, res.ExitCode, res.Error, res.Stdout.Data)
	}
	if len(res.Files) < 9000 {
		t.Errorf("%d files in the result, want the workspace's 10000 inodes' worth", len(res.Files))
	}
}

func clip(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

func TestConformance(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	img, err := e.Images().Lookup("python")
	if err != nil {
		t.Fatal(err)
	}
	tiertest.Run(t, tiertest.Target{Tier: v, ImageRoot: img.Root, ImageEnv: img.Env, ImageDigest: img.Digest,
		Leftovers: func(id string) []string { return leftovers(e.Home(), id) }})
}

// TestPool takes a VM booted before the request from a warm pool of one;
// the engine destroys the pool (and its refilled VM) on Close.
func TestPool(t *testing.T) {
	v := need(t, microvm.Options{})
	m := manifest.Default()
	m.Tier = microvm.Name
	m.Resources.Timeout = manifest.Duration(90 * time.Second)
	m.Resources.CPUTime = m.Resources.Timeout
	e, err := engine.New(engine.Options{NoAutoBuild: true, Tiers: map[string]tier.Tier{microvm.Name: v}, Pools: []engine.PoolConfig{{Manifest: m, Size: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.StartPools(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := e.WaitPools(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := e.Run(ctx, &engine.Request{Manifest: m, Argv: []string{"python3", "-c", "print(6*7)"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Pooled || res.Termination != result.Exited || res.Stdout.Data != "42\n" {
		t.Errorf("pooled=%v termination=%s stdout=%q error=%q", res.Pooled, res.Termination, res.Stdout.Data, res.Error)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if left := leftovers(e.Home(), res.ID); len(left) > 0 {
		t.Errorf("run %s left: %v", res.ID, left)
	}
	for _, st := range e.PoolStats() {
		t.Logf("pool after close: %+v", st)
	}
}

// TestEgress: with an allowlist the VM reaches the granted host (on the
// host's loopback, through Moat's proxy over the egress port) with curl
// and urllib, many connections at once; a host that is not granted is
// refused and logged; the byte budget holds; there is no DNS, no route
// off the VM, no raw socket and no UDP out. Then a second VM of the same
// configuration is restored from its snapshot and its egress works too.
// Two VMs in all.
func TestEgress(t *testing.T) {
	v := need(t, microvm.Options{})
	e := newEngine(t, v)
	granted, grantedHits := tiertest.HTTPServer(t, "granted-body", 2<<20)
	other, otherHits := tiertest.HTTPServer(t, "other-body", 0)
	grant := func(m *manifest.Manifest) {
		// A memory limit of its own: this configuration's snapshot is not
		// another test's.
		m.Resources.Memory = 320 << 20
		m.Network.Mode = "allowlist"
		m.Network.Allow = []string{"localhost:" + granted}
		m.Network.AllowAddresses = tiertest.LoopbackAddresses
		m.Network.MaxBytesIn = 1 << 20
	}
	base := runtime.NumGoroutine()
	script := strings.NewReplacer("GRANTED", granted, "OTHER", other).Replace(`
import json, os, socket, subprocess, threading, urllib.request
out = {}
def get(path, port=GRANTED):
    try:
        return urllib.request.urlopen("http://localhost:%s%s" % (port, path), timeout=20).read().decode()[:40]
    except Exception as e:
        return "ERR " + type(e).__name__
out["urllib"] = get("/")
out["curl"] = subprocess.run(["curl", "-sS", "-m", "20", "http://localhost:GRANTED/"], capture_output=True, text=True).stdout
res = [None] * 12
def worker(i): res[i] = get("/")
ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(res))]
[t.start() for t in ts]; [t.join() for t in ts]
out["parallel"] = sum(r == "granted-body" for r in res)
out["other"] = get("/", OTHER)
try:
    n = len(urllib.request.urlopen("http://localhost:GRANTED/big", timeout=20).read())
    out["big"] = n
except Exception as e:
    out["big"] = "ERR " + type(e).__name__
try:
    socket.getaddrinfo("example.com", 80); out["dns"] = "RESOLVED"
except OSError as e:
    out["dns"] = "failed"
out["resolv"] = [l for l in open("/etc/resolv.conf").read().splitlines() if l.startswith("nameserver")] if os.path.exists("/etc/resolv.conf") else []
out["routes"] = open("/proc/net/route").read().splitlines()[1:]
out["ifaces"] = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
def attempt(name, f):
    try:
        f(); out[name] = "OK"
    except OSError as e:
        out[name] = e.errno
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("icmp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("8.8.8.8", 53)))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM).sendto(b"x", ("2001:4860:4860::8888", 53)))
attempt("tcp", lambda: socket.create_connection(("10.0.2.2", GRANTED), timeout=3))
attempt("tcp_host", lambda: socket.create_connection(("169.254.169.254", 80), timeout=3))
print(json.dumps(out))
`)
	res := runVM(t, e, grant, "python3", "-c", script)
	if res.Termination != result.Exited || res.ExitCode != 0 {
		t.Fatalf("termination %s exit %d error %q stderr %q", res.Termination, res.ExitCode, res.Error, clip(res.Stderr.Data))
	}
	t.Logf("runtime: %s; %.0f ms; stdout %s", res.Runtime, res.DurationMS, res.Stdout.Data)
	var out map[string]any
	if err := json.Unmarshal([]byte(res.Stdout.Data), &out); err != nil {
		t.Fatalf("stdout %q: %v", res.Stdout.Data, err)
	}
	for _, tc := range []struct {
		name string
		key  string
		want any
	}{
		{"urllib through the proxy", "urllib", "granted-body"},
		{"curl through the proxy", "curl", "granted-body"},
		{"twelve connections at once", "parallel", float64(12)},
		{"a host not granted is refused", "other", "ERR HTTPError"},
		{"the byte budget ends the download", "big", "ERR IncompleteRead"},
		{"no DNS", "dns", "failed"},
		{"no resolver configured", "resolv", []any{}},
		{"no route", "routes", []any{}},
		{"loopback only", "ifaces", []any{"lo"}},
		{"no raw socket", "raw", float64(syscall.EPERM)},
		{"no ICMP socket", "icmp", float64(syscall.EACCES)},
		// The seccomp policy refuses the family before the kernel's
		// permission check would.
		{"no packet socket", "packet", float64(syscall.EAFNOSUPPORT)},
		{"no UDP out", "udp", float64(syscall.ENETUNREACH)},
		{"no UDP out over IPv6", "udp6", float64(syscall.ENETUNREACH)},
		{"no direct TCP", "tcp", float64(syscall.ENETUNREACH)},
		{"no metadata service", "tcp_host", float64(syscall.ENETUNREACH)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := out[tc.key]; fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%s = %#v, want %#v", tc.key, got, tc.want)
			}
		})
	}
	if n := otherHits.Load(); n != 0 {
		t.Errorf("the server that is not granted was reached %d times", n)
	}
	if n := grantedHits.Load(); n != 15 {
		t.Errorf("the granted server was reached %d times, want 15", n)
	}
	log := map[string]int{}
	for _, a := range res.Network {
		log[fmt.Sprintf("%s:%d %s", a.Host, a.Port, a.Reason)]++
	}
	t.Logf("network log: %v", log)
	for k, n := range map[string]int{
		"localhost:" + granted + " allowed":       14,
		"localhost:" + granted + " limit-bytes":   1,
		"localhost:" + other + " not-allowlisted": 1,
	} {
		if log[k] != n {
			t.Errorf("network log has %d × %q, want %d: %v", log[k], k, n, log)
		}
	}

	// The second VM of this configuration is restored from the snapshot
	// the first one saved (or restored): the egress port works after a
	// restore too.
	res = runVM(t, e, grant, "python3", "-c", `import urllib.request as u; print(u.urlopen("http://localhost:`+granted+`/", timeout=20).read().decode())`)
	if res.Termination != result.Exited || res.ExitCode != 0 || res.Stdout.Data != "granted-body\n" {
		t.Errorf("restored: termination %s exit %d stdout %q stderr %q", res.Termination, res.ExitCode, res.Stdout.Data, clip(res.Stderr.Data))
	}
	if !strings.Contains(res.Runtime, "start=restored") {
		t.Errorf("the second VM was not restored: %s", res.Runtime)
	}
	if len(res.Network) != 1 || !res.Network[0].Allowed {
		t.Errorf("restored VM's network log: %+v", res.Network)
	}
	// Both runs are destroyed: their egress sessions, streams, relays
	// and proxies are gone with them.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left after the runs, %d before:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}
