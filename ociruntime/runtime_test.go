package ociruntime_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/testbin"
	"github.com/moat-sandbox/moat/ociruntime"
	"github.com/moat-sandbox/moat/result"
)

// imageRoot is the python image's rootfs that scripts/setup builds: the
// bundles' root.
const imageRoot = "/var/lib/moat/images/python/current/rootfs"

var (
	runtimeBin string // moat-runtime: a symlink to a moat built from this tree
	skipReason string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		skipReason = "needs root: the runtime creates cgroups and user namespaces"
		return m.Run()
	}
	if _, err := os.Stat(imageRoot); err != nil {
		skipReason = "needs the python image (scripts/setup): " + err.Error()
		return m.Run()
	}
	bin, cleanup, err := testbin.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	runtimeBin = filepath.Join(filepath.Dir(bin), "moat-runtime")
	if err := os.Symlink(bin, runtimeBin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Like containerd's shim: a subreaper, so that each container's
	// init, orphaned when create exits, becomes our child to wait for.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

func needRoot(t *testing.T) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
}

// shim drives the runtime the way containerd-shim-runc-v2 does: global
// --root, --log and --log-format json, pipes as the container's stdio, a
// pid file, waiting for the init as its (subreaper) parent.
type shim struct {
	t    *testing.T
	root string
	log  string
	pol  string
	// console, when set, is passed to create as --console-socket.
	console string
	// stdin, when set, is the container's stdin (else /dev/null).
	stdin *os.File
}

func newShim(t *testing.T) *shim {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	s := &shim{t: t, root: filepath.Join(dir, "state"), log: filepath.Join(dir, "log.json"), pol: filepath.Join(dir, "runtime.yaml")}
	if err := os.WriteFile(s.pol, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *shim) cmd(args ...string) *exec.Cmd {
	g := []string{"--root", s.root, "--log", s.log, "--log-format", "json", "--policy", s.pol}
	return exec.Command(runtimeBin, append(g, args...)...)
}

// run runs a runtime command and returns its stdout and error (with
// stderr).
func (s *shim) run(args ...string) (string, error) {
	c := s.cmd(args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	if err := c.Run(); err != nil {
		return out.String(), fmt.Errorf("%v: %w: %s", args, err, errb.String())
	}
	return out.String(), nil
}

// container is one created container and its stdio.
type container struct {
	id     string
	pid    int
	stdout *os.File // read ends
	stderr *os.File
}

// create makes a bundle of spec and creates the container.
func (s *shim) create(id string, spec map[string]any) (*container, error) {
	s.t.Helper()
	bundle := s.t.TempDir()
	b, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o644); err != nil {
		s.t.Fatal(err)
	}
	outR, outW, _ := os.Pipe()
	errR, errW, _ := os.Pipe()
	defer outW.Close()
	defer errW.Close()
	pidFile := filepath.Join(bundle, "init.pid")
	args := []string{"create", "--bundle", bundle, "--pid-file", pidFile}
	if s.console != "" {
		args = append(args, "--console-socket", s.console)
	}
	c := s.cmd(append(args, id)...)
	c.Stdout, c.Stderr = outW, errW
	if s.stdin != nil {
		c.Stdin = s.stdin
	}
	if err := c.Run(); err != nil {
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("create: %v (log: %s)", err, s.lastLog())
	}
	p, err := os.ReadFile(pidFile)
	if err != nil {
		s.t.Fatal(err)
	}
	pid, err := strconv.Atoi(string(p))
	if err != nil {
		s.t.Fatalf("pid file %q: %v", p, err)
	}
	ct := &container{id: id, pid: pid, stdout: outR, stderr: errR}
	s.t.Cleanup(func() {
		s.run("delete", "--force", id)
		outR.Close()
		errR.Close()
	})
	return ct, nil
}

// wait reaps the container's init and returns its exit status and
// output.
func (s *shim) wait(c *container) (code int, stdout, stderr string) {
	s.t.Helper()
	// A container that never ends fails its test, not the whole run.
	timer := time.AfterFunc(60*time.Second, func() {
		s.t.Errorf("process %d did not end in 60s: killed", c.pid)
		unix.Kill(c.pid, unix.SIGKILL)
	})
	defer timer.Stop()
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(c.pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			s.t.Fatalf("wait4 %d: %v", c.pid, err)
		}
		break
	}
	o, _ := io.ReadAll(c.stdout)
	e, _ := io.ReadAll(c.stderr)
	switch {
	case ws.Exited():
		code = ws.ExitStatus()
	case ws.Signaled():
		code = 128 + int(ws.Signal())
	}
	return code, string(o), string(e)
}

func (s *shim) status(id string) string {
	s.t.Helper()
	out, err := s.run("state", id)
	if err != nil {
		s.t.Fatalf("state: %v", err)
	}
	var st ociruntime.State
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		s.t.Fatalf("state %q: %v", out, err)
	}
	return st.Status
}

func (s *shim) lastLog() string {
	b, _ := os.ReadFile(s.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// noResidue checks that nothing of the container is left: state
// directory, cgroup, mounts, processes.
func (s *shim) noResidue(c *container) {
	s.t.Helper()
	for _, d := range []string{filepath.Join(s.root, c.id), filepath.Join(ociruntime.StageDir, c.id)} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			s.t.Errorf("%s left: %v", d, err)
		}
	}
	h, err := cgroup.Detect()
	if err != nil {
		s.t.Fatal(err)
	}
	if h.Existing(c.id) != nil {
		s.t.Errorf("cgroup moat/%s left", c.id)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if bytes.Contains(mi, []byte(s.root)) {
		s.t.Errorf("a mount under %s is left on the host", s.root)
	}
	if c.pid > 0 {
		if err := unix.Kill(c.pid, 0); err == nil {
			s.t.Errorf("init %d still exists", c.pid)
		}
	}
}

// spec returns a config.json like containerd's default for a container
// running args on the python image.
func spec(args ...string) map[string]any {
	return map[string]any{
		"ociVersion": "1.0.2",
		"process": map[string]any{
			"user": map[string]any{"uid": 0, "gid": 0},
			"args": args,
			"env":  []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root"},
			"cwd":  "/",
			"capabilities": map[string]any{
				"bounding":  []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"},
				"effective": []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"},
				"permitted": []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_BIND_SERVICE"},
			},
			"rlimits":         []map[string]any{{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}},
			"noNewPrivileges": true,
		},
		"root":     map[string]any{"path": imageRoot, "readonly": false},
		"hostname": "ctr",
		"mounts": []map[string]any{
			{"destination": "/proc", "type": "proc", "source": "proc"},
			{"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": []string{"nosuid", "mode=755", "size=65536k"}},
			{"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
			{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"},
			{"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": []string{"ro"}},
		},
		"linux": map[string]any{
			"namespaces": []map[string]any{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}},
		},
	}
}

func set(m map[string]any, v any, path ...string) {
	for _, p := range path[:len(path)-1] {
		m = m[p].(map[string]any)
	}
	m[path[len(path)-1]] = v
}

var seq int

func newID(prefix string) string {
	seq++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq)
}

func TestLifecycle(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		edit       func(m map[string]any)
		code       int
		stdout     string // contained in the output
		stderr     string
		notStdout  string
		beforeRuns bool
	}{
		{name: "exit code and both streams", args: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, code: 3, stdout: "out", stderr: "err"},
		{name: "writable root on an overlay", args: []string{"sh", "-c", "echo x > /f && cat /f && touch /etc/new"}, stdout: "x"},
		{name: "read-only root", args: []string{"sh", "-c", "echo x > /f"}, edit: func(m map[string]any) { set(m, true, "root", "readonly") }, code: 2, stderr: "Read-only file system"},
		{name: "the root is the bundle's owner's: root owns /etc", args: []string{"stat", "-c", "%u %U", "/etc"}, stdout: "0 root"},
		{name: "user mapped", args: []string{"sh", "-c", "id -u; id -g"}, edit: func(m map[string]any) { set(m, 1000, "process", "user", "uid"); set(m, 1000, "process", "user", "gid") }, stdout: "1000\n1000\n"},
		{name: "env and cwd", args: []string{"sh", "-c", "echo $FOO; pwd"}, edit: func(m map[string]any) {
			set(m, []string{"PATH=/usr/bin:/bin", "FOO=bar"}, "process", "env")
			set(m, "/usr/lib", "process", "cwd")
		}, stdout: "bar\n/usr/lib"},
		{name: "hostname", args: []string{"hostname"}, stdout: "ctr"},
		{name: "stdio reopened by path", args: []string{"sh", "-c", "echo reopened > /dev/stdout"}, stdout: "reopened"},
		{name: "not found", args: []string{"/no/such/program"}, code: 127},
		{name: "rlimit applied", args: []string{"sh", "-c", "ulimit -n"}, stdout: "1024"},
		{name: "no capability (the engines' defaults asked for)", args: []string{"sh", "-c", "grep -E 'Cap(Eff|Prm|Bnd)' /proc/self/status"}, stdout: "CapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000"},
		{name: "masked proc", args: []string{"sh", "-c", "wc -c < /proc/kallsyms"}, stdout: "0"},
		{name: "tmpfs mount from the spec", args: []string{"sh", "-c", "echo y > /run/t && cat /run/t && grep ' /run ' /proc/mounts"}, edit: func(m map[string]any) {
			m["mounts"] = append(m["mounts"].([]map[string]any), map[string]any{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": []string{"size=1m"}})
		}, stdout: "y\ntmpfs /run tmpfs"},
		{name: "docker's port sysctl in the container's own network namespace", args: []string{"cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"}, edit: func(m map[string]any) {
			set(m, map[string]any{"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ping_group_range": "0 2147483647"}, "linux", "sysctl")
		}, stdout: "0\n"},
		{name: "nothing runs before start", args: []string{"sh", "-c", "echo ran"}, beforeRuns: true, stdout: "ran"},
	}
	s := newShim(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			m := spec(tc.args...)
			if tc.edit != nil {
				tc.edit(m)
			}
			id := newID("life")
			c, err := s.create(id, m)
			if err != nil {
				t.Fatal(err)
			}
			if st := s.status(id); st != ociruntime.StatusCreated {
				t.Errorf("status after create = %q, want created", st)
			}
			if tc.beforeRuns {
				time.Sleep(300 * time.Millisecond)
				if err := unix.Kill(c.pid, 0); err != nil {
					t.Fatalf("init gone before start: %v", err)
				}
				var ws unix.WaitStatus
				if got, _ := unix.Wait4(c.pid, &ws, unix.WNOHANG, nil); got != 0 {
					t.Fatal("the program ran before start")
				}
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			code, out, errs := s.wait(c)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errs, tc.stderr) || (tc.notStdout != "" && strings.Contains(out, tc.notStdout)) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, %q, %q", code, out, errs, tc.code, tc.stdout, tc.stderr)
			}
			if st := s.status(id); st != ociruntime.StatusStopped {
				t.Errorf("status after exit = %q, want stopped", st)
			}
			if _, err := s.run("delete", id); err != nil {
				t.Fatal(err)
			}
			s.noResidue(c)
		})
	}
}

func TestKillAndDelete(t *testing.T) {
	tests := []struct {
		name string
		// steps after create and start: kill SIGNAL, or "" to delete
		// --force the running container.
		signal string
		all    bool
		code   int
	}{
		{name: "TERM by name reaches the program", signal: "TERM", code: 128 + 15},
		{name: "signal by number", signal: "9", code: 128 + 9},
		{name: "kill --all", signal: "KILL", all: true, code: 128 + 9},
		{name: "delete --force of a running container", code: 128 + 9},
	}
	s := newShim(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			id := newID("kill")
			c, err := s.create(id, spec("sleep", "1000"))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			if st := s.status(id); st != ociruntime.StatusRunning {
				t.Errorf("status after start = %q, want running", st)
			}
			if tc.signal == "" {
				if _, err := s.run("delete", id); err == nil || !strings.Contains(err.Error(), "running") {
					t.Errorf("delete of a running container = %v, want refused", err)
				}
				if _, err := s.run("delete", "--force", id); err != nil {
					t.Fatal(err)
				}
			} else {
				args := []string{"kill"}
				if tc.all {
					args = append(args, "--all")
				}
				if _, err := s.run(append(args, id, tc.signal)...); err != nil {
					t.Fatal(err)
				}
			}
			code, _, _ := s.wait(c)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			if tc.signal != "" {
				if _, err := s.run("kill", id, "TERM"); err == nil || !strings.Contains(err.Error(), "container not running") {
					t.Errorf("kill of a stopped container = %v, want 'container not running'", err)
				}
				if _, err := s.run("delete", id); err != nil {
					t.Fatal(err)
				}
			}
			s.noResidue(c)
		})
	}
}

// TestDeleteCreated: deleting a container never started ends its init.
func TestDeleteCreated(t *testing.T) {
	s := newShim(t)
	id := newID("created")
	c, err := s.create(id, spec("sh", "-c", "echo never"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	code, out, _ := s.wait(c)
	if code != 128+9 || out != "" {
		t.Errorf("exit %d, output %q; want killed, no output", code, out)
	}
	s.noResidue(c)
	if _, err := s.run("state", id); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("state of a deleted container = %v, want 'does not exist'", err)
	}
}

// TestRefusalsLogged: a refused spec creates nothing, and the log's last
// line (which the shim shows the user) names the field and the fix.
func TestRefusalsLogged(t *testing.T) {
	tests := []struct {
		name string
		edit func(m map[string]any)
		want []string
	}{
		{name: "host bind", edit: func(m map[string]any) {
			m["mounts"] = append(m["mounts"].([]map[string]any), map[string]any{"destination": "/host", "type": "bind", "source": "/etc", "options": []string{"rbind"}})
		}, want: []string{"mounts[5].source", "/etc", "bind_sources"}},
		{name: "host network namespace by path", edit: func(m map[string]any) {
			set(m, []map[string]any{{"type": "pid"}, {"type": "network", "path": fmt.Sprintf("/proc/%d/ns/net", os.Getpid())}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}, "linux", "namespaces")
		}, want: []string{"network", "/ns/net", "host's own"}},
		{name: "privileged capability", edit: func(m map[string]any) {
			set(m, []string{"CAP_SYS_ADMIN"}, "process", "capabilities", "bounding")
		}, want: []string{"process.capabilities", "CAP_SYS_ADMIN", "accept_privileged"}},
	}
	s := newShim(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			m := spec("true")
			tc.edit(m)
			id := newID("refuse")
			_, err := s.create(id, m)
			if err == nil {
				t.Fatal("create succeeded, want refused")
			}
			var line struct{ Level, Msg, Time string }
			if err := json.Unmarshal([]byte(s.lastLog()), &line); err != nil {
				t.Fatalf("log line %q: %v", s.lastLog(), err)
			}
			if line.Level != "error" || line.Time == "" {
				t.Errorf("log line %+v, want level error with a time", line)
			}
			for _, w := range tc.want {
				if !strings.Contains(line.Msg, w) {
					t.Errorf("log message %q lacks %q", line.Msg, w)
				}
			}
			s.noResidue(&container{id: id})
		})
	}
}

// TestResources: linux.resources become the container's cgroup limits,
// and the memory limit is enforced.
func TestResources(t *testing.T) {
	s := newShim(t)
	h, err := cgroup.Detect()
	if err != nil {
		t.Fatal(err)
	}
	m := spec("python3", "-c", "x = bytearray(400 << 20); print('survived')")
	set(m, map[string]any{"memory": map[string]any{"limit": 64 << 20}, "pids": map[string]any{"limit": 32}, "cpu": map[string]any{"quota": 50000, "period": 100000}}, "linux", "resources")
	id := newID("res")
	c, err := s.create(id, m)
	if err != nil {
		t.Fatal(err)
	}
	cg := h.Existing(id)
	if cg == nil {
		t.Fatal("no cgroup for the container")
	}
	var checks map[string]string
	if h.Version == cgroup.V1 {
		checks = map[string]string{"memory/moat/" + id + "/memory.limit_in_bytes": "67108864", "pids/moat/" + id + "/pids.max": "32", "cpu/moat/" + id + "/cpu.cfs_quota_us": "50000"}
	} else {
		checks = map[string]string{"memory.max": "67108864", "pids.max": "32", "cpu.max": "50000 100000"}
	}
	for f, want := range checks {
		var p string
		if h.Version == cgroup.V1 {
			p = filepath.Join("/sys/fs/cgroup", f)
		} else {
			p = filepath.Join(cg.Dirs()[0], f)
		}
		b, err := os.ReadFile(p)
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	pids, err := s.run("ps", "--format", "json", id)
	if err != nil || !strings.Contains(pids, strconv.Itoa(c.pid)) {
		t.Errorf("ps = %q, %v; want the init's pid %d", pids, err, c.pid)
	}
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	code, out, _ := s.wait(c)
	if code == 0 || strings.Contains(out, "survived") {
		t.Errorf("a 400 MiB allocation under a 64 MiB limit: exit %d, output %q; want killed", code, out)
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	s.noResidue(c)
}

// TestPod: like containerd's CRI, a pause container gets new namespaces
// and each container of the pod joins its network, IPC and UTS
// namespaces by /proc/<pause>/ns/... path.
func TestPod(t *testing.T) {
	s := newShim(t)
	pause := spec("sleep", "1000")
	set(pause, "pod-host", "hostname")
	pid := newID("pause")
	p, err := s.create(pid, pause)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("start", pid); err != nil {
		t.Fatal(err)
	}
	podNet, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", p.pid))
	if err != nil {
		t.Fatal(err)
	}
	hostNet, _ := os.Readlink("/proc/1/ns/net")
	probe := []string{"sh", "-c", "readlink /proc/self/ns/net; hostname; ip -o link 2>/dev/null | wc -l; cat /proc/net/dev | grep -c lo:"}
	tests := []struct {
		name     string
		join     bool
		sameNet  bool
		hostname string
	}{
		{name: "a container of the pod shares its namespaces", join: true, sameNet: true, hostname: "pod-host"},
		{name: "a container outside the pod does not", hostname: "ctr"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			m := spec(probe...)
			if tc.join {
				set(m, []map[string]any{
					{"type": "pid"}, {"type": "mount"},
					{"type": "network", "path": fmt.Sprintf("/proc/%d/ns/net", p.pid)},
					{"type": "ipc", "path": fmt.Sprintf("/proc/%d/ns/ipc", p.pid)},
					{"type": "uts", "path": fmt.Sprintf("/proc/%d/ns/uts", p.pid)},
				}, "linux", "namespaces")
			}
			id := newID("app")
			c, err := s.create(id, m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			code, out, errs := s.wait(c)
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, out, errs)
			}
			sc := bufio.NewScanner(strings.NewReader(out))
			sc.Scan()
			net := sc.Text()
			sc.Scan()
			host := sc.Text()
			if (net == podNet) != tc.sameNet || net == hostNet {
				t.Errorf("container netns %s, pod's %s, host's %s; want shared %v", net, podNet, hostNet, tc.sameNet)
			}
			if host != tc.hostname {
				t.Errorf("hostname %q, want %q", host, tc.hostname)
			}
			if _, err := s.run("delete", id); err != nil {
				t.Fatal(err)
			}
			s.noResidue(c)
		})
	}
	s.t = t
	if _, err := s.run("kill", pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	s.wait(p)
	if _, err := s.run("delete", pid); err != nil {
		t.Fatal(err)
	}
	s.noResidue(p)
}

// TestExec: exec like the shim's (--process, --detach, --pid-file; the
// proxy's pid is waited for and signalled directly), and without
// --detach as a person would.
func TestExec(t *testing.T) {
	s := newShim(t)
	id := newID("exec")
	c, err := s.create(id, spec("sleep", "1000"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("exec", "--process", "/dev/null", id); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("exec in a created container = %v, want refused (not running)", err)
	}
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		proc   map[string]any
		signal unix.Signal // sent to the proxy's pid once started
		code   int
		stdout string
		err    string // exec itself refused, containing this
	}{
		{name: "exit status and output", proc: map[string]any{"args": []string{"sh", "-c", "echo in-exec; id -u; exit 7"}, "cwd": "/", "env": []string{"PATH=/bin:/usr/bin"}}, code: 7, stdout: "in-exec\n0\n"},
		{name: "sees the container's processes", proc: map[string]any{"args": []string{"sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; ps -e 2>/dev/null | grep -c sleep || ls /proc"}, "cwd": "/", "env": []string{"PATH=/bin:/usr/bin"}}, stdout: "moat-init"},
		{name: "signal to the proxy reaches the process", proc: map[string]any{"args": []string{"sleep", "100"}, "cwd": "/", "env": []string{"PATH=/bin:/usr/bin"}}, signal: unix.SIGTERM, code: 128 + 15},
		{name: "SIGKILL of the proxy kills the process", proc: map[string]any{"args": []string{"sleep", "100"}, "cwd": "/", "env": []string{"PATH=/bin:/usr/bin"}}, signal: unix.SIGKILL, code: 128 + 9},
		{name: "not found", proc: map[string]any{"args": []string{"/nope"}, "cwd": "/"}, code: 127},
		{name: "another user refused", proc: map[string]any{"args": []string{"id"}, "cwd": "/", "user": map[string]any{"uid": 1000, "gid": 1000}}, err: "process.user"},
		{name: "terminal without a console socket refused", proc: map[string]any{"args": []string{"id"}, "cwd": "/", "terminal": true}, err: "console-socket"},
		{name: "extra capability refused", proc: map[string]any{"args": []string{"id"}, "cwd": "/", "capabilities": map[string]any{"bounding": []string{"CAP_SYS_ADMIN"}}}, err: "CAP_SYS_ADMIN"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			dir := t.TempDir()
			pf := filepath.Join(dir, "process.json")
			b, _ := json.Marshal(tc.proc)
			os.WriteFile(pf, b, 0o644)
			outR, outW, _ := os.Pipe()
			defer outR.Close()
			pidFile := filepath.Join(dir, "exec.pid")
			cmd := s.cmd("exec", "--process", pf, "--detach", "--pid-file", pidFile, id)
			// Files, as the shim's: a Go buffer would make Run wait
			// for the proxy, which inherits them, to end.
			cmd.Stdout, cmd.Stderr = outW, outW
			err := cmd.Run()
			outW.Close()
			if tc.err != "" {
				if err == nil || !strings.Contains(s.lastLog(), tc.err) {
					t.Errorf("exec = %v (log %s), want refused with %q", err, s.lastLog(), tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("exec: %v: %s", err, s.lastLog())
			}
			p, _ := os.ReadFile(pidFile)
			pid, err := strconv.Atoi(string(p))
			if err != nil {
				t.Fatalf("pid file %q", p)
			}
			if tc.signal != 0 {
				time.Sleep(100 * time.Millisecond)
				if err := unix.Kill(pid, tc.signal); err != nil {
					t.Errorf("kill %d: %v", pid, err)
				}
			}
			code, out, _ := s.wait(&container{pid: pid, stdout: outR, stderr: outR})
			if code != tc.code || !strings.Contains(out, tc.stdout) {
				t.Errorf("exec exit %d, output %q; want %d, %q", code, out, tc.code, tc.stdout)
			}
			// Whatever way the exec ended, it is gone from the
			// container: only init and the program are left.
			var pids []int
			for range 100 {
				o, err := s.run("ps", "--format", "json", id)
				if err != nil {
					t.Fatal(err)
				}
				json.Unmarshal([]byte(o), &pids)
				if len(pids) == 2 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if len(pids) != 2 {
				t.Errorf("processes left in the container: %v, want init and the program", pids)
			}
		})
	}
	s.t = t
	t.Run("attached", func(t *testing.T) {
		s.t = t
		out, err := s.run("exec", "--env", "X=42", "--cwd", "/usr", id, "sh", "-c", "echo $X; pwd")
		if err != nil || out != "42\n/usr\n" {
			t.Errorf("exec = %q, %v; want 42 and /usr", out, err)
		}
		_, err = s.run("exec", id, "sh", "-c", "exit 5")
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 5 {
			t.Errorf("exec exit = %v, want status 5", err)
		}
	})
	s.t = t
	if _, err := s.run("delete", "--force", id); err != nil {
		t.Fatal(err)
	}
	s.wait(c)
	s.noResidue(c)
}

// TestOverlayRootfs: containerd's overlayfs snapshotter and Docker's
// overlay2 hand the runtime a rootfs that is an overlay mount, which
// cannot be id-mapped; its layers are, one by one.
func TestOverlayRootfs(t *testing.T) {
	s := newShim(t)
	dir := t.TempDir()
	upper, work, rootfs := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(upper, "from-upper"), []byte("upper layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", imageRoot, upper, work)
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		t.Skipf("cannot mount an overlay here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	m := spec("sh", "-c", "cat /from-upper; stat -c %U /etc; python3 -c 'print(6*7)'; echo w > /from-upper && cat /from-upper")
	set(m, rootfs, "root", "path")
	id := newID("overlay")
	c, err := s.create(id, m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	code, out, errs := s.wait(c)
	if code != 0 || out != "upper layer\nroot\n42\nw\n" {
		t.Errorf("exit %d, output %q (%s); want the upper layer's file, root-owned /etc, python, a writable root", code, out, errs)
	}
	if b, _ := os.ReadFile(filepath.Join(upper, "from-upper")); string(b) != "upper layer\n" {
		t.Errorf("the engine's upper layer was written: %q", b)
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	s.noResidue(c)
}

// consoleSocket listens like the shim's console socket and returns its
// path and a channel that gets the terminal master the runtime sends.
func consoleSocket(t *testing.T) (string, <-chan *os.File) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "console.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	unix.Listen(fd, 1)
	ch := make(chan *os.File, 1)
	go func() {
		defer unix.Close(fd)
		c, _, err := unix.Accept4(fd, unix.SOCK_CLOEXEC)
		if err != nil {
			close(ch)
			return
		}
		defer unix.Close(c)
		buf := make([]byte, 256)
		oob := make([]byte, unix.CmsgSpace(4))
		_, oobn, _, _, err := unix.Recvmsg(c, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			close(ch)
			return
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		if len(msgs) != 1 {
			close(ch)
			return
		}
		fds, _ := unix.ParseUnixRights(&msgs[0])
		if len(fds) != 1 {
			close(ch)
			return
		}
		ch <- os.NewFile(uintptr(fds[0]), "master")
	}()
	return path, ch
}

// readAll reads a terminal master until the slave side is gone (EIO).
func readTerminal(m *os.File) string {
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for {
		n, err := m.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			return out.String()
		}
	}
}

// TestTerminal: process.terminal with --console-socket, for the
// container's program and for an exec, as `docker run -t` and `crictl
// exec -it` ask: the master reaches the console socket, the process has
// the terminal as its stdio and controlling terminal.
func TestTerminal(t *testing.T) {
	s := newShim(t)
	path, masters := consoleSocket(t)
	m := spec("sh", "-c", "tty; stty size; read line; echo got $line; sleep 100")
	set(m, true, "process", "terminal")
	set(m, map[string]any{"height": 30, "width": 100}, "process", "consoleSize")
	id := newID("tty")
	if _, err := s.create(id, m); err == nil {
		t.Fatal("a terminal without --console-socket was accepted")
	}
	s.console = path
	c, err := s.create(id, m)
	if err != nil {
		t.Fatal(err)
	}
	s.console = ""
	master := <-masters
	if master == nil {
		t.Fatal("no terminal master on the console socket")
	}
	defer master.Close()
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	master.Write([]byte("hello\n"))

	// An exec with a terminal of its own.
	epath, emasters := consoleSocket(t)
	pf := filepath.Join(t.TempDir(), "p.json")
	b, _ := json.Marshal(map[string]any{"args": []string{"sh", "-c", "tty; test -t 0 && echo interactive"}, "cwd": "/", "terminal": true, "consoleSize": map[string]any{"height": 10, "width": 40}})
	os.WriteFile(pf, b, 0o644)
	epidFile := filepath.Join(t.TempDir(), "e.pid")
	if _, err := s.run("exec", "--process", pf, "--detach", "--console-socket", epath, "--pid-file", epidFile, id); err != nil {
		t.Fatal(err)
	}
	em := <-emasters
	if em == nil {
		t.Fatal("no terminal master for the exec")
	}
	eout := readTerminal(em)
	em.Close()
	p, _ := os.ReadFile(epidFile)
	epid, _ := strconv.Atoi(string(p))
	if code, _, _ := s.wait(&container{pid: epid, stdout: devNull(t), stderr: devNull(t)}); code != 0 {
		t.Errorf("exec exit %d", code)
	}
	if !strings.Contains(eout, "/dev/pts/") || !strings.Contains(eout, "interactive") {
		t.Errorf("exec's terminal output %q, want a /dev/pts terminal as stdin", eout)
	}

	if _, err := s.run("kill", id, "KILL"); err != nil {
		t.Fatal(err)
	}
	out := readTerminal(master)
	c.stdout, c.stderr = devNull(t), devNull(t)
	s.wait(c)
	for _, w := range []string{"/dev/pts/0", "30 100", "got hello"} {
		if !strings.Contains(out, w) {
			t.Errorf("terminal output %q lacks %q", out, w)
		}
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	s.noResidue(c)
}

func devNull(t *testing.T) *os.File {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestResult: a container annotated moat.sandbox/result gets its Moat
// result written to the policy's result_dir when it is deleted.
func TestResult(t *testing.T) {
	s := newShim(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "audit.db")
	if err := os.WriteFile(s.pol, []byte("result_dir: "+dir+"\naudit_db: "+db+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		args        []string
		annotate    bool
		memory      int64
		termination string
		code        int
	}{
		{name: "exit status", args: []string{"sh", "-c", "exit 3"}, annotate: true, termination: "exited", code: 3},
		{name: "OOM", args: []string{"python3", "-c", "x = bytearray(400 << 20)"}, annotate: true, memory: 64 << 20, termination: "oom", code: 137},
		{name: "not annotated: no result", args: []string{"true"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			m := spec(tc.args...)
			if tc.annotate {
				m["annotations"] = map[string]string{ociruntime.AnnotationResult: "true"}
			}
			if tc.memory > 0 {
				set(m, map[string]any{"memory": map[string]any{"limit": tc.memory}}, "linux", "resources")
			}
			id := newID("result")
			c, err := s.create(id, m)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			s.wait(c)
			if _, err := s.run("delete", id); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dir, id+".json"))
			if !tc.annotate {
				if err == nil {
					t.Errorf("a result was written without the annotation")
				}
				if _, err := os.Stat(db); err == nil {
					if st, err := audit.Open(db); err == nil {
						recs, _ := st.Query(audit.Filter{})
						st.Close()
						for _, r := range recs {
							if strings.HasPrefix(r.ID, "oci-"+id+"-") {
								t.Errorf("an audit record %s was written without the annotation", r.ID)
							}
						}
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var res struct {
				ID          string   `json:"id"`
				Termination string   `json:"termination"`
				ExitCode    int      `json:"exit_code"`
				Command     []string `json:"command"`
				PeakMemory  int64    `json:"peak_memory_bytes"`
			}
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			if res.ID != id || res.Termination != tc.termination || res.ExitCode != tc.code || len(res.Command) == 0 || res.PeakMemory <= 0 {
				t.Errorf("result %s; want %s, exit %d", b, tc.termination, tc.code)
			}
			// The same result is a finished run in the audit log.
			if r := auditRecord(t, db, id); r != nil {
				if r.Status != audit.Done || string(r.Termination) != tc.termination || r.ExitCode != tc.code || r.Kind != audit.KindRun || len(r.Command) == 0 {
					t.Errorf("audit record %+v; want done, %s, exit %d", r, tc.termination, tc.code)
				}
			}
			s.noResidue(c)
		})
	}
}

// auditRecord returns the audit record of container id in db (an error
// and nil when there is none).
func auditRecord(t *testing.T, db, id string) *audit.Record {
	t.Helper()
	st, err := audit.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Query(audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range recs {
		if strings.HasPrefix(recs[i].ID, "oci-"+id+"-") {
			return &recs[i]
		}
	}
	t.Errorf("no audit record oci-%s-* in %s (%d records)", id, db, len(recs))
	return nil
}

// TestHooks: the spec's hooks run on the host (by default: they are the
// engine's) with the container's state on stdin (Docker's network hook
// reads the init's pid from it): prestart at create, poststart after
// start, poststop at delete. hooks: false refuses them.
func TestHooks(t *testing.T) {
	s := newShim(t)
	dir := t.TempDir()
	hook := func(name string) map[string]any {
		return map[string]any{"path": "/bin/sh", "args": []string{"sh", "-c", "cat > " + filepath.Join(dir, name)}}
	}
	m := spec("true")
	m["hooks"] = map[string]any{"prestart": []any{hook("prestart")}, "poststart": []any{hook("poststart")}, "poststop": []any{hook("poststop")}}
	if err := os.WriteFile(s.pol, []byte("hooks: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	id := newID("hooks")
	if _, err := s.create(id, m); err == nil || !strings.Contains(s.lastLog(), "hooks: false") {
		t.Errorf("create with hooks: false in the policy = %v (log %s), want refused", err, s.lastLog())
	}
	if err := os.WriteFile(s.pol, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := s.create(id, m)
	if err != nil {
		t.Fatal(err)
	}
	var st ociruntime.State
	b, _ := os.ReadFile(filepath.Join(dir, "prestart"))
	if err := json.Unmarshal(b, &st); err != nil || st.Pid != c.pid || st.ID != id {
		t.Errorf("prestart hook's state %s (%v); want the init's pid %d", b, err, c.pid)
	}
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	s.wait(c)
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"poststart", "poststop"} {
		if b, err := os.ReadFile(filepath.Join(dir, h)); err != nil || !bytes.Contains(b, []byte(id)) {
			t.Errorf("%s hook: %q, %v", h, b, err)
		}
	}
	s.noResidue(c)
}

// TestKillCreated: a terminating signal to a container that was never
// started ends it, as it ends runc's init waiting on its FIFO.
func TestKillCreated(t *testing.T) {
	s := newShim(t)
	id := newID("killcreated")
	c, err := s.create(id, spec("sh", "-c", "echo never"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("kill", id, "TERM"); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := s.wait(c); code != 128+15 || out != "" {
		t.Errorf("exit %d, output %q; want 143 and nothing run", code, out)
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	s.noResidue(c)
}

// TestCLI: what engines call besides the lifecycle (runc --version,
// features), and the refusals of the command line, each in the log.
func TestCLI(t *testing.T) {
	s := newShim(t)
	tests := []struct {
		name   string
		policy string
		args   []string
		ok     bool
		stdout string // contained in stdout
		log    string // contained in the log's last line
	}{
		{name: "version as docker parses it", args: []string{"--version"}, ok: true, stdout: "moat-runtime version "},
		{name: "features", args: []string{"features"}, ok: true, stdout: `"ociVersionMax": "1.1.0"`},
		{name: "unknown command", args: []string{"frob", "x"}, log: "unknown command"},
		{name: "pause refused", args: []string{"pause", "x"}, log: "pause: not supported"},
		{name: "systemd cgroup refused", args: []string{"--systemd-cgroup", "state", "x"}, log: "SystemdCgroup = false"},
		{name: "unknown container", args: []string{"state", "nope"}, log: "does not exist"},
		{name: "bad id", args: []string{"state", "../etc"}, log: "container id"},
		{name: "bad policy fails closed", policy: "bind_sourcez: [/]\n", args: []string{"state", "x"}, log: "bind_sourcez"},
		{name: "force-delete of an unknown container", args: []string{"delete", "--force", "nope"}, ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			if err := os.WriteFile(s.pol, []byte(tc.policy), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := s.run(tc.args...)
			if (err == nil) != tc.ok || !strings.Contains(out, tc.stdout) {
				t.Errorf("%v = %q, %v; want ok %v and %q", tc.args, out, err, tc.ok, tc.stdout)
			}
			if tc.log != "" && !strings.Contains(s.lastLog(), tc.log) {
				t.Errorf("log %q lacks %q", s.lastLog(), tc.log)
			}
		})
	}
}

// TestNamedNetns: containerd's CRI gives the pause container the network
// namespace CNI set up, by its /var/run/netns path.
func TestNamedNetns(t *testing.T) {
	s := newShim(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip to make a named network namespace")
	}
	name := fmt.Sprintf("moat-oci-test-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "delete", name).Run() })
	path := "/var/run/netns/" + name
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	m := spec("sh", "-c", "stat -L -c %i /proc/self/ns/net")
	set(m, []map[string]any{{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}, {"type": "network", "path": path}}, "linux", "namespaces")
	id := newID("cni")
	c, err := s.create(id, m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.run("start", id); err != nil {
		t.Fatal(err)
	}
	code, out, errs := s.wait(c)
	if code != 0 || strings.TrimSpace(out) != strconv.FormatUint(want.Ino, 10) {
		t.Errorf("exit %d, netns inode %q (%s); want %d", code, out, errs, want.Ino)
	}
	if _, err := s.run("delete", id); err != nil {
		t.Fatal(err)
	}
	s.noResidue(c)
}

// TestIsolation: what a container's root program tries against the host
// fails, through the runtime as through the native tier.
func TestIsolation(t *testing.T) {
	s := newShim(t)
	tests := []struct {
		name string
		cmd  string // must fail (exit non-zero)
	}{
		{"mount", "mount -t tmpfs x /mnt"},
		{"write a sysctl", "echo '|/bin/sh' > /proc/sys/kernel/core_pattern"},
		{"read init's environment", "cat /proc/1/environ"},
		{"reach init's root", "ls /proc/1/root/"},
		{"new user namespace", "unshare -U true"},
		{"make a device", "mknod /tmp/sda b 8 0"},
		{"keyring", "python3 -c 'import ctypes,sys; sys.exit(0 if ctypes.CDLL(None).syscall(248, b\"user\", b\"k\", b\"v\", 1, -3) >= 0 else 1)'"},
		{"host files", "test -e /var/lib/moat"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			id := newID("iso")
			c, err := s.create(id, spec("sh", "-c", tc.cmd))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			if code, out, errs := s.wait(c); code == 0 {
				t.Errorf("%q succeeded in the container: %s %s", tc.cmd, out, errs)
			}
			if _, err := s.run("delete", id); err != nil {
				t.Fatal(err)
			}
		})
	}

	// A symlink in the image cannot aim a spec mount at the host: the
	// mount point is resolved inside the root, without symlinks.
	t.Run("mount through an image symlink", func(t *testing.T) {
		s.t = t
		dir := t.TempDir()
		upper, work, rootfs, victim := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "rootfs"), filepath.Join(dir, "victim")
		for _, d := range []string{upper, work, rootfs, victim} {
			os.Mkdir(d, 0o755)
		}
		if err := os.Symlink(victim, filepath.Join(upper, "lnk")); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("overlay", rootfs, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", imageRoot, upper, work)); err != nil {
			t.Skipf("overlay: %v", err)
		}
		t.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
		m := spec("true")
		set(m, rootfs, "root", "path")
		m["mounts"] = append(m["mounts"].([]map[string]any), map[string]any{"destination": "/lnk/sub", "type": "tmpfs", "source": "tmpfs"})
		id := newID("iso")
		if _, err := s.create(id, m); err == nil {
			t.Error("a mount through an image symlink was made")
		} else if !strings.Contains(s.lastLog(), "/lnk/sub") {
			t.Errorf("refused for another reason: %s", s.lastLog())
		}
		if ents, _ := os.ReadDir(victim); len(ents) != 0 {
			t.Errorf("the host directory the symlink names was written: %v", ents)
		}
		s.noResidue(&container{id: id})
	})
}

// monitorOf returns the pid of a container's monitor from its record (0:
// none), so that the test, the monitor's subreaper as a shim is, can
// reap it.
func (s *shim) monitorOf(id string) int {
	s.t.Helper()
	b, err := os.ReadFile(filepath.Join(s.root, id, "state.json"))
	if err != nil {
		s.t.Fatal(err)
	}
	var rec struct {
		Monitor int `json:"monitor"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		s.t.Fatal(err)
	}
	return rec.Monitor
}

// reapMonitor checks that delete left the monitor ended, and reaps it.
func (s *shim) reapMonitor(pid int) {
	s.t.Helper()
	var ws unix.WaitStatus
	got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil)
	if err != nil || got != pid {
		s.t.Errorf("the monitor %d is still running after delete (wait4 = %d, %v)", pid, got, err)
		unix.Kill(pid, unix.SIGKILL)
		unix.Wait4(pid, &ws, 0, nil)
	}
}

// TestEgressAndDiff: moat.sandbox/egress gives the container its own
// network namespace whose only way out is Moat's egress proxy, which
// lets through the allowlist and logs every attempt; with
// moat.sandbox/result the result has that network log and the diff of
// the container's root (added, modified, deleted), and its monitor
// leaves nothing behind.
func TestEgressAndDiff(t *testing.T) {
	s := newShim(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "audit.db")
	if err := os.WriteFile(s.pol, []byte("result_dir: "+dir+"\naudit_db: "+db+"\negress:\n  addresses: [127.0.0.0/8]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func(body string) (int, func()) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, body) })}
		go srv.Serve(l)
		return l.Addr().(*net.TCPAddr).Port, func() { srv.Close() }
	}
	granted, stop1 := serve("granted-body")
	defer stop1()
	other, stop2 := serve("other-body")
	defer stop2()
	prog := fmt.Sprintf(`
import os, socket, urllib.request
names = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
print('interfaces', names)
print('proxy', os.environ.get('HTTP_PROXY', 'unset'))
for port in (%d, %d):
    try:
        print('fetch', port, urllib.request.urlopen('http://localhost:%%d/' %% port, timeout=10).read().decode())
    except Exception as e:
        print('fetch', port, 'refused', type(e).__name__)
try:
    socket.create_connection(('127.0.0.1', %d), timeout=3)
    print('direct reached')
except OSError as e:
    print('direct refused', e.errno)
open('/etc/moat-added', 'w').write('hello')
open('/etc/debian_version', 'a').write('changed')
os.remove('/etc/issue')
os.makedirs('/opt/moat-dir/sub')
`, granted, other, granted)
	tests := []struct {
		name     string
		egress   string
		wantOut  []string
		network  map[int]string // port -> reason
		readonly bool
	}{
		{name: "allowlist", egress: fmt.Sprintf("localhost:%d", granted),
			wantOut: []string{"interfaces ['lo']", "proxy http://127.0.0.1:3128", fmt.Sprintf("fetch %d granted-body", granted), fmt.Sprintf("fetch %d refused", other), "direct refused"},
			network: map[int]string{granted: "allowed", other: "not-allowlisted"}},
		{name: "none", egress: "none",
			wantOut: []string{"interfaces ['lo']", "proxy unset", fmt.Sprintf("fetch %d refused", granted), "direct refused"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s.t = t
			m := spec("python3", "-c", prog)
			m["annotations"] = map[string]string{
				ociruntime.AnnotationResult: "true", ociruntime.AnnotationEgress: tc.egress,
			}
			if tc.egress != "none" {
				m["annotations"].(map[string]string)[ociruntime.AnnotationEgressAddresses] = "127.0.0.1"
			}
			id := newID("egress")
			c, err := s.create(id, m)
			if err != nil {
				t.Fatal(err)
			}
			mon := s.monitorOf(id)
			if mon == 0 {
				t.Fatal("no monitor recorded")
			}
			if _, err := s.run("start", id); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := s.wait(c)
			if code != 0 {
				t.Fatalf("exit %d: %s %s", code, out, errOut)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if _, err := s.run("delete", id); err != nil {
				t.Fatal(err)
			}
			s.reapMonitor(mon)
			b, err := os.ReadFile(filepath.Join(dir, id+".json"))
			if err != nil {
				t.Fatal(err)
			}
			var res result.Result
			if err := json.Unmarshal(b, &res); err != nil {
				t.Fatal(err)
			}
			if os.Getenv("MOAT_TEST_SHOW") != "" {
				t.Logf("output:\n%s\nresult: %s", out, b)
			}
			files := map[string]result.Change{}
			for _, f := range res.Files {
				files[f.Path] = f.Change
			}
			for p, want := range map[string]result.Change{
				"etc/moat-added": result.Added, "etc/debian_version": result.Modified, "etc/issue": result.Deleted,
				"opt/moat-dir": result.Added, "opt/moat-dir/sub": result.Added,
			} {
				if files[p] != want {
					t.Errorf("files[%s] = %q, want %q (files %+v)", p, files[p], want, res.Files)
				}
			}
			for _, p := range []string{"etc", "proc", "dev", "tmp"} {
				if _, ok := files[p]; ok {
					t.Errorf("files has %s, which the program did not change: %+v", p, res.Files)
				}
			}
			got := map[int]string{}
			for _, a := range res.Network {
				got[a.Port] = a.Reason
			}
			if tc.network == nil {
				if len(res.Network) != 0 || res.NetworkSummary != nil {
					t.Errorf("network %+v, summary %+v; want none (no proxy)", res.Network, res.NetworkSummary)
				}
			} else {
				if !reflect.DeepEqual(got, tc.network) {
					t.Errorf("network %+v; want reasons %v", res.Network, tc.network)
				}
				if res.NetworkSummary == nil || res.NetworkSummary.Attempts != 2 || res.NetworkSummary.Allowed != 1 {
					t.Errorf("network_summary %+v; want 2 attempts, 1 allowed", res.NetworkSummary)
				}
			}
			// The audit log has the same: the network attempts, how many
			// files changed.
			if r := auditRecord(t, db, id); r != nil && (len(r.Network) != len(tc.network) || r.Files != len(res.Files)) {
				t.Errorf("audit record: network %+v, files %d; want %d attempts, %d files", r.Network, r.Files, len(tc.network), len(res.Files))
			}
			if _, err := os.Stat(filepath.Join(ociruntime.StageDir, id+".egress")); !os.IsNotExist(err) {
				t.Errorf("the egress socket is left: %v", err)
			}
			s.noResidue(c)
		})
	}

	// Fail closed: a monitor killed while its container runs takes the
	// proxy with it; the container's connections fail (no other way
	// out), delete still ends everything, and the result says the
	// monitor's record is missing.
	t.Run("a killed monitor closes the way out", func(t *testing.T) {
		s.t = t
		m := spec("python3", "-c", fmt.Sprintf(`
import sys, time, urllib.request
def fetch():
    try:
        return urllib.request.urlopen('http://localhost:%d/', timeout=5).read().decode()
    except Exception as e:
        return 'refused ' + type(e).__name__
print('before', fetch(), flush=True)
sys.stdin.read(1)
print('after', fetch(), flush=True)
`, granted))
		m["annotations"] = map[string]string{
			ociruntime.AnnotationResult: "true", ociruntime.AnnotationEgress: fmt.Sprintf("localhost:%d", granted),
			ociruntime.AnnotationEgressAddresses: "127.0.0.1",
		}
		id := newID("egress-kill")
		inR, inW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		s.stdin = inR
		defer func() { s.stdin = nil }()
		c, err := s.create(id, m)
		inR.Close()
		if err != nil {
			t.Fatal(err)
		}
		mon := s.monitorOf(id)
		if _, err := s.run("start", id); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(c.stdout).ReadString('\n')
		if !strings.Contains(line, "before granted-body") {
			t.Fatalf("first fetch: %q", line)
		}
		if err := unix.Kill(mon, unix.SIGKILL); err != nil {
			t.Fatal(err)
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(mon, &ws, 0, nil); err != nil {
			t.Fatal(err)
		}
		inW.Write([]byte("x"))
		inW.Close()
		code, out, _ := s.wait(c)
		if code != 0 || !strings.Contains(out, "after refused") {
			t.Errorf("after the monitor died: exit %d, output %q; want the fetch refused", code, out)
		}
		if _, err := s.run("delete", id); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(dir, id+".json"))
		if err != nil || !bytes.Contains(b, []byte("monitor left no record")) {
			t.Errorf("result %s (%v); want a degradation naming the missing monitor record", b, err)
		}
		s.noResidue(c)
	})

	// Fail closed: an interface that the engine's hook put into the
	// container's namespace (Docker's bridge) would bypass the proxy.
	t.Run("an engine's interface refuses start", func(t *testing.T) {
		s.t = t
		m := spec("true")
		m["annotations"] = map[string]string{ociruntime.AnnotationEgress: "none"}
		m["hooks"] = map[string]any{"prestart": []any{map[string]any{"path": "/bin/sh", "args": []string{"sh", "-c",
			`pid=$(sed -n 's/.*"pid":\([0-9]*\).*/\1/p'); nsenter -t "$pid" -n ip link add moat-t0 type veth peer name moat-t1`}}}}
		id := newID("egress-veth")
		c, err := s.create(id, m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.run("start", id); err == nil || !strings.Contains(err.Error(), "moat-t0") {
			t.Errorf("start = %v, want refused naming the interface", err)
		}
		if _, err := s.run("delete", "--force", id); err != nil {
			t.Fatal(err)
		}
		s.wait(c)
		s.noResidue(c)
	})
}
