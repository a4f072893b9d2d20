package engines_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/engines"
)

// The images the tests import: a pause image built from ./pause and the
// python image's root file system (scripts/setup builds it), which has
// sh and python3 for the workloads and the red-team corpus.
const (
	pauseImage   = "moat.local/pause:1"
	pythonImage  = "moat.local/python:1"
	pythonRoot   = "/var/lib/moat/images/python/current/rootfs"
	busyboxImage = "moat.local/busybox:1"
	busyboxPath  = "/bin/busybox"
	// runscPath is the gVisor tier's runsc (scripts/setup builds it),
	// offered as a third handler for the start figures.
	runscPath  = "/usr/local/lib/moat/runsc"
	crictlPath = "/var/cache/moat/crictl-v1.37.0/crictl"
)

// fixture is what every test of the package shares: the binaries, the
// image archives and one private containerd with handlers moat and runc.
// Starting containerd and importing the python image takes seconds, so
// it is done once; TestMain stops it and checks for residue.
type fixture struct {
	dir            string
	moat           string // the moat binary built from this tree
	moatRuntime    string // moat-runtime, a symlink to moat
	guest          string
	policy         string // moat-runtime's policy file (MOAT_RUNTIME_POLICY)
	results        string // its result_dir
	auditDB        string // its audit_db
	moatErr        error  // why moat-runtime cannot serve as a runtime, or nil
	pyLayer        string
	pauseArchive   string
	pyArchive      string
	busyboxArchive string
	busyboxLayer   string
	cgroupParent   string
	cd             *engines.Containerd
	dockerd        *engines.Dockerd
	netnsBefore    map[string]bool
	// hostPaths the engines create outside their directories whatever
	// their configuration (containerd 1.6's shim socket directory, CNI's
	// result cache, dockerd 20.10's trust key), mapped to whether each
	// was there before; teardown removes those that were not (if empty).
	hostPaths map[string]bool
}

var engineHostPaths = []string{"/etc/docker/key.json", "/etc/docker", "/run/containerd/s", "/run/containerd", "/var/lib/cni/results", "/var/lib/cni"}

var shared struct {
	once sync.Once
	f    *fixture
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if f := shared.f; f != nil {
		left := f.teardown()
		if len(left) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the container engine tests left residue:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}
	os.Exit(code)
}

// require fails the test when CI=true and skips it otherwise, naming
// what is missing: CI must run the engines, a developer's machine may
// lack them.
func require(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and %s (scripts/setup --deps installs the engines)", why)
	}
	t.Skip(why)
}

// preconditions checks root and every engine tool.
func preconditions(t testing.TB, tools ...string) {
	t.Helper()
	require(t, os.Geteuid() == 0, "needs root: the engines create namespaces, mounts and cgroups")
	for _, tool := range tools {
		_, err := exec.LookPath(tool)
		require(t, err == nil, fmt.Sprintf("%s is not installed", tool))
	}
	_, err := os.Stat(pythonRoot)
	require(t, err == nil, "the python image is not built ("+pythonRoot+"): scripts/setup builds it")
}

// shared fixture; the first caller builds it.
func getFixture(t testing.TB) *fixture {
	t.Helper()
	preconditions(t, "containerd", "ctr", "runc", "containerd-shim-runc-v2", crictlPath, "/usr/lib/cni/loopback")
	shared.once.Do(func() { shared.f, shared.err = newFixture() })
	if shared.err != nil {
		t.Fatalf("setting up the private containerd: %v", shared.err)
	}
	return shared.f
}

// binaries builds moat and moat-guest from this tree into a fresh
// directory (searchable by all: the native tier's init runs moat-guest as
// an unprivileged id) with moat-runtime beside them.
func (f *fixture) binaries() error {
	f.moat, f.guest = filepath.Join(f.dir, "bin", "moat"), filepath.Join(f.dir, "bin", "moat-guest")
	f.moatRuntime = filepath.Join(f.dir, "bin", "moat-runtime")
	if err := os.MkdirAll(filepath.Dir(f.moat), 0o755); err != nil {
		return err
	}
	cmd := exec.Command("scripts/build-pair", f.moat, f.guest)
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("scripts/build-pair: %v: %s", err, out)
	}
	if err := os.Symlink("moat", f.moatRuntime); err != nil {
		return err
	}
	// The runc shim runs "BINARY features" only in newer containerd;
	// asking here says whether this tree has the OCI runtime at all.
	if out, err := exec.Command(f.moatRuntime, "features").CombinedOutput(); err != nil {
		f.moatErr = fmt.Errorf("%s features: %v: %s", f.moatRuntime, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newFixture() (*fixture, error) {
	dir, err := os.MkdirTemp("", "moat-engines-")
	if err != nil {
		return nil, err
	}
	os.Chmod(dir, 0o755)
	f := &fixture{dir: dir, cgroupParent: "/" + filepath.Base(dir), netnsBefore: engines.Netns(), hostPaths: map[string]bool{}}
	for _, p := range engineHostPaths {
		_, err := os.Lstat(p)
		f.hostPaths[p] = err == nil
	}
	ok := false
	defer func() {
		if !ok {
			f.teardown()
		}
	}()
	if err := engines.SharedNetnsDir(); err != nil {
		return nil, err
	}
	if err := f.binaries(); err != nil {
		return nil, err
	}
	if err := f.images(); err != nil {
		return nil, err
	}
	cdDir := filepath.Join(dir, "containerd")
	if err := os.Mkdir(cdDir, 0o700); err != nil {
		return nil, err
	}
	// The engines keep the per-container files they bind into every
	// container (/etc/hosts, /etc/resolv.conf, the pod's /dev/shm) under
	// their root and state, here below dir rather than /var/lib/containerd:
	// the runtime policy names it (engine_state_dirs), as an operator's
	// would for k3s's /var/lib/rancher/k3s/agent/containerd; and allows
	// binds from it (bind_sources: the red team's /workspace volumes).
	f.policy = filepath.Join(dir, "runtime.yaml")
	// Results and audit records of annotated containers stay here too;
	// their proxies may reach this host's loopback (TestCRIAnnotations).
	f.results = filepath.Join(dir, "results")
	f.auditDB = filepath.Join(dir, "audit.db")
	pol := "engine_state_dirs: [" + strconv.Quote(dir) + "]\nbind_sources: [" + strconv.Quote(dir) + "]\n" +
		"result_dir: " + strconv.Quote(f.results) + "\naudit_db: " + strconv.Quote(f.auditDB) + "\negress:\n  addresses: [127.0.0.0/8]\n"
	if err := os.WriteFile(f.policy, []byte(pol), 0o644); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	f.cd, err = engines.StartContainerd(ctx, engines.ContainerdConfig{
		Dir:          cdDir,
		Runtimes:     []engines.Runtime{{Handler: "runc", Binary: "/usr/sbin/runc"}, {Handler: "moat", Binary: f.moatRuntime, Annotations: []string{"moat.sandbox/*"}}},
		SandboxImage: pauseImage,
		Env:          []string{"MOAT_GUEST=" + f.guest, "MOAT_RUNTIME_POLICY=" + f.policy},
		Bridge:       "moat" + strings.TrimPrefix(filepath.Base(dir), "moat-engines-"),
	}, crictlPath)
	if err != nil {
		return nil, err
	}
	for _, a := range []string{f.pauseArchive, f.pyArchive, f.busyboxArchive} {
		if err := f.cd.Import(ctx, a); err != nil {
			return nil, err
		}
	}
	ok = true
	return f, nil
}

// images builds the pause program and writes both image archives.
func (f *fixture) images() error {
	pause := filepath.Join(f.dir, "pause")
	cmd := exec.Command("go", "build", "-o", pause, "./pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./pause: %v: %s", err, out)
	}
	b, err := os.ReadFile(pause)
	if err != nil {
		return err
	}
	layer := filepath.Join(f.dir, "pause-layer.tar")
	if err := writeFile(layer, func(w *os.File) error {
		return engines.WriteLayer(w, []engines.LayerEntry{{Name: "pause", Content: b}})
	}); err != nil {
		return err
	}
	f.pauseArchive = filepath.Join(f.dir, "pause.tar")
	if err := writeFile(f.pauseArchive, func(w *os.File) error {
		return engines.WriteDockerArchive(w, pauseImage, layer, engines.ImageConfig{Entrypoint: []string{"/pause"}})
	}); err != nil {
		return err
	}
	// busybox: a small image (one static binary) for the tests that
	// start many containers, where the python image's 276 MB would be
	// copied per container by the native snapshotter.
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("busybox image: %w (scripts/setup installs busybox-static)", err)
	}
	bbEntries := []engines.LayerEntry{{Name: "bin/busybox", Content: bb}}
	for _, applet := range []string{"sh", "echo", "cat", "sleep", "true", "ls", "nc"} {
		bbEntries = append(bbEntries, engines.LayerEntry{Name: "bin/" + applet, Link: "busybox"})
	}
	bbLayer := filepath.Join(f.dir, "busybox-layer.tar")
	f.busyboxLayer = bbLayer
	if err := writeFile(bbLayer, func(w *os.File) error { return engines.WriteLayer(w, bbEntries) }); err != nil {
		return err
	}
	f.busyboxArchive = filepath.Join(f.dir, "busybox.tar")
	if err := writeFile(f.busyboxArchive, func(w *os.File) error {
		return engines.WriteDockerArchive(w, busyboxImage, bbLayer, engines.ImageConfig{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}})
	}); err != nil {
		return err
	}
	// The python rootfs as one layer, by tar (hard links, modes and
	// owners as they are).
	f.pyLayer = filepath.Join(f.dir, "python-layer.tar")
	if out, err := exec.Command("tar", "-C", pythonRoot, "-cf", f.pyLayer, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar %s: %v: %s", pythonRoot, err, out)
	}
	f.pyArchive = filepath.Join(f.dir, "python.tar")
	return writeFile(f.pyArchive, func(w *os.File) error {
		return engines.WriteDockerArchive(w, pythonImage, f.pyLayer, engines.ImageConfig{
			Cmd: []string{"python3"}, Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		})
	})
}

func writeFile(p string, fill func(*os.File) error) error {
	w, err := os.Create(p)
	if err != nil {
		return err
	}
	if err := fill(w); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// teardown stops containerd and reports residue: its own, the pods'
// cgroups and network namespaces.
func (f *fixture) teardown() []string {
	var left []string
	if f.dockerd != nil {
		left = append(left, f.dockerd.Stop()...)
	}
	if f.cd != nil {
		left = append(left, f.cd.Stop()...)
	}
	left = append(left, engines.RemoveCgroupParent(f.cgroupParent)...)
	for n := range engines.Netns() {
		if !f.netnsBefore[n] && strings.HasPrefix(n, "cni-") {
			left = append(left, "network namespace "+n)
			exec.Command("ip", "netns", "delete", n).Run() // reported; now leave the host clean
		}
	}
	left = append(left, engines.Residue(f.dir)...)
	os.RemoveAll(f.dir)
	for _, p := range engineHostPaths {
		if !f.hostPaths[p] {
			os.Remove(p) // only files and empty directories
		}
	}
	return left
}

// needMoat fails (CI) or skips when this tree's moat cannot serve as an
// OCI runtime.
func (f *fixture) needMoat(t testing.TB, handler string) {
	t.Helper()
	if handler == "moat" {
		require(t, f.moatErr == nil, fmt.Sprintf("moat-runtime is not an OCI runtime in this tree: %v", f.moatErr))
	}
}

// pod is one pod sandbox run through the CRI the way the kubelet runs it.
type pod struct {
	f       *fixture
	id      string
	cfgPath string
	dir     string
}

// runPod runs a pod sandbox with the runtime handler (crictl runp
// --runtime, what the kubelet does for a RuntimeClass's handler). linux
// is merged into the pod config's "linux" object.
func (f *fixture) runPod(ctx context.Context, handler, name string, linux map[string]any) (*pod, error) {
	return f.runPodAnnotated(ctx, handler, name, linux, nil)
}

// runPodAnnotated is runPod with the pod's annotations (metadata.annotations
// of a Kubernetes pod).
func (f *fixture) runPodAnnotated(ctx context.Context, handler, name string, linux map[string]any, annotations map[string]string) (*pod, error) {
	dir, err := os.MkdirTemp(f.dir, "pod-")
	if err != nil {
		return nil, err
	}
	// The namespaces the kubelet asks for by default: the pod's network
	// and IPC, a PID namespace per container (shareProcessNamespace
	// false). The CRI's zero value would be a pod-wide PID namespace.
	lx := map[string]any{"cgroup_parent": f.cgroupParent, "security_context": map[string]any{"namespace_options": kubeletNamespaces}}
	for k, v := range linux {
		lx[k] = v
	}
	withKubeletNamespaces(map[string]any{"linux": lx})
	cfg := map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "moat-engines", "uid": filepath.Base(dir), "attempt": 0},
		"log_directory": filepath.Join(dir, "logs"),
		"linux":         lx,
	}
	if annotations != nil {
		cfg["annotations"] = annotations
	}
	p := &pod{f: f, dir: dir, cfgPath: filepath.Join(dir, "pod.json")}
	if err := writeJSON(p.cfgPath, cfg); err != nil {
		return nil, err
	}
	out, err := f.cd.Crictl(ctx, "runp", "--runtime", handler, p.cfgPath)
	if err != nil {
		return nil, fmt.Errorf("%w\ncontainerd's log:\n%s", err, lastLines(f.cd.Log(), 20))
	}
	p.id = strings.TrimSpace(out)
	return p, nil
}

// kubeletNamespaces is the kubelet's default namespace_options: network
// and IPC of the pod (0), PID of the container (1).
var kubeletNamespaces = map[string]any{"network": 0, "pid": 1, "ipc": 0}

// create creates a container in the pod; extra is merged into the
// container config (a "linux" security context, say), whose default
// namespace options are the kubelet's.
func (p *pod) create(ctx context.Context, name string, argv []string, extra map[string]any) (string, error) {
	cfg := map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": pythonImage},
		"command":  argv,
		"log_path": name + ".log",
		"linux":    map[string]any{"security_context": map[string]any{"namespace_options": kubeletNamespaces}},
	}
	for k, v := range extra {
		cfg[k] = v
	}
	withKubeletNamespaces(cfg)
	path := filepath.Join(p.dir, name+".json")
	if err := writeJSON(path, cfg); err != nil {
		return "", err
	}
	out, err := p.f.cd.Crictl(ctx, "create", p.id, path, p.cfgPath)
	return strings.TrimSpace(out), err
}

// start creates and starts a container.
func (p *pod) start(ctx context.Context, name string, argv []string, extra map[string]any) (string, error) {
	id, err := p.create(ctx, name, argv, extra)
	if err != nil {
		return "", err
	}
	_, err = p.f.cd.Crictl(ctx, "start", id)
	return id, err
}

// wait waits until the container has exited and returns its exit code.
func (p *pod) wait(ctx context.Context, id string) (int, error) {
	for {
		out, err := p.f.cd.Crictl(ctx, "inspect", "-o", "json", id)
		if err != nil {
			return -1, err
		}
		var st struct {
			Status struct {
				State    string `json:"state"`
				ExitCode int    `json:"exitCode"`
			} `json:"status"`
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			return -1, fmt.Errorf("crictl inspect %s: %v", id, err)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			return st.Status.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("container %s still %s: %w", id, st.Status.State, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logs is the container's output as crictl logs prints it: stdout, then
// stderr.
func (p *pod) logs(ctx context.Context, id string) (string, error) {
	stdout, stderr, err := p.f.cd.CrictlOutput(ctx, "logs", id)
	return stdout + stderr, err
}

// remove stops and removes the pod the way the kubelet does: stop and
// remove each container, then stopp and rmp.
func (p *pod) remove(ctx context.Context) error {
	out, err := p.f.cd.Crictl(ctx, "ps", "-a", "-q", "--pod", p.id)
	if err != nil {
		return err
	}
	for _, id := range strings.Fields(out) {
		if _, err := p.f.cd.Crictl(ctx, "stop", "--timeout", "5", id); err != nil {
			return err
		}
		if _, err := p.f.cd.Crictl(ctx, "rm", id); err != nil {
			return err
		}
	}
	if _, err := p.f.cd.Crictl(ctx, "stopp", p.id); err != nil {
		return err
	}
	if _, err := p.f.cd.Crictl(ctx, "rmp", p.id); err != nil {
		return err
	}
	return nil
}

// residue lists what the removed pod left: processes, mounts and cgroups
// that name its id, and its network namespace.
func (p *pod) residue(netns string) []string {
	var left []string
	for _, s := range engines.Residue(p.f.cd.Dir) {
		if strings.Contains(s, p.id) {
			left = append(left, s)
		}
	}
	for _, c := range engines.CgroupsUnder(p.f.cgroupParent) {
		if strings.Contains(c, p.id) {
			left = append(left, "cgroup "+c)
		}
	}
	if netns != "" && engines.Netns()[netns] {
		left = append(left, "network namespace "+netns)
	}
	return left
}

// netnsOf is the name of the pod's pinned network namespace.
func (p *pod) netnsOf(ctx context.Context) (string, error) {
	out, err := p.f.cd.Crictl(ctx, "inspectp", "-o", "json", p.id)
	if err != nil {
		return "", err
	}
	var info struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string } `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		return "", err
	}
	for _, ns := range info.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			return filepath.Base(ns.Path), nil
		}
	}
	return "", nil
}

func writeJSON(p string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(p, b, 0o644)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// withKubeletNamespaces fills in cfg's linux.security_context.
// namespace_options with the kubelet's defaults where a test's own
// linux object left them out.
func withKubeletNamespaces(cfg map[string]any) {
	lx, _ := cfg["linux"].(map[string]any)
	if lx == nil {
		lx = map[string]any{}
		cfg["linux"] = lx
	}
	sc, _ := lx["security_context"].(map[string]any)
	if sc == nil {
		sc = map[string]any{}
		lx["security_context"] = sc
	}
	ns, _ := sc["namespace_options"].(map[string]any)
	merged := map[string]any{}
	for k, v := range kubeletNamespaces {
		merged[k] = v
	}
	for k, v := range ns {
		merged[k] = v
	}
	sc["namespace_options"] = merged
}
