package engines

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Runtime is one CRI runtime handler: the name a RuntimeClass's handler
// (or crictl runp --runtime) selects, and the runc-compatible binary
// containerd's runc shim (io.containerd.runc.v2) calls for it.
type Runtime struct {
	Handler string
	Binary  string
	// Annotations are the annotation patterns ("moat.sandbox/*") the CRI
	// passes from a pod (pod_annotations) and a container
	// (container_annotations) to the runtime's config.json; others are
	// dropped.
	Annotations []string
}

// ContainerdConfig describes a private containerd.
type ContainerdConfig struct {
	// Dir holds everything the instance writes: root, state, socket,
	// CNI configuration, logs. It must exist and be empty.
	Dir string
	// StateDir, if set, is the state directory instead of Dir/state
	// (created, and removed by Stop): where the CRI keeps each pod's
	// /dev/shm, which a runtime may accept only from known places.
	StateDir string
	// Runtimes are the CRI handlers; the first is the default.
	Runtimes []Runtime
	// SandboxImage is the pause image (imported locally, never pulled).
	SandboxImage string
	// Env is added to containerd's environment, which its shims and the
	// runtimes they call inherit (MOAT_GUEST, say).
	Env []string
	// Snapshotter is the CRI's snapshotter: "overlayfs" (the default,
	// and containerd's) or "native" (plain directories, one full copy per
	// container), for runtimes that id-map the rootfs, which an overlay
	// mount does not support.
	Snapshotter string
	// Bridge names the host bridge the pods' network attaches to (at most
	// 15 bytes); the CNI bridge plugin creates it, Stop deletes it.
	Bridge string
}

// Containerd is a running private containerd.
type Containerd struct {
	Dir    string
	Socket string
	state  string // the state directory, Dir/state or outside Dir
	bridge string
	// snapshotter images are unpacked for.
	snapshotter string
	cmd         *exec.Cmd
	done        chan struct{}
	log         *bytes.Buffer
	crictl      string
}

// ConfigTOML is the config.toml of a private containerd (version 2, CRI
// plugin). The stanza of each runtime handler is the one an operator adds
// to /etc/containerd/config.toml (docs/ENGINES.md).
func (c ContainerdConfig) ConfigTOML() string {
	var b strings.Builder
	q := strconv.Quote
	fmt.Fprintf(&b, "version = 2\nroot = %s\nstate = %s\n", q(filepath.Join(c.Dir, "root")), q(c.stateDir()))
	// Plugins that would write outside Dir (opt: /opt/containerd) or are
	// unused here are off; the snapshotter is overlayfs.
	b.WriteString(`disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]` + "\n")
	fmt.Fprintf(&b, "\n[grpc]\n  address = %s\n\n[ttrpc]\n  address = %s\n\n[debug]\n  address = \"\"\n\n[metrics]\n  address = \"\"\n",
		q(filepath.Join(c.Dir, "containerd.sock")), q(filepath.Join(c.Dir, "containerd.sock.ttrpc")))
	fmt.Fprintf(&b, "\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = %s\n", q(filepath.Join(c.Dir, "opt")))
	cri := `[plugins."io.containerd.grpc.v1.cri"]`
	// restrict_oom_score_adj: the CRI sets the pause container's
	// oom_score_adj to -998, which a host (or a container running the
	// tests) without CAP_SYS_RESOURCE cannot lower to; runc then fails
	// with "failed to update /proc/self/oom_score_adj: Permission
	// denied". Restricted, no container goes below containerd's own.
	fmt.Fprintf(&b, "\n%s\n  sandbox_image = %s\n  disable_apparmor = true\n  restrict_oom_score_adj = true\n  stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n", cri, q(c.SandboxImage))
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"/usr/lib/cni\"\n    conf_dir = %s\n", q(filepath.Join(c.Dir, "cni")))
	def := "runc"
	if len(c.Runtimes) > 0 {
		def = c.Runtimes[0].Handler
	}
	snap := c.Snapshotter
	if snap == "" {
		snap = "overlayfs"
	}
	fmt.Fprintf(&b, "  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = %s\n    default_runtime_name = %s\n", q(snap), q(def))
	for _, r := range c.Runtimes {
		fmt.Fprintf(&b, "    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.%s]\n      runtime_type = \"io.containerd.runc.v2\"\n", r.Handler)
		if len(r.Annotations) > 0 {
			// Keys of the runtime's table: before its options table.
			var qs []string
			for _, a := range r.Annotations {
				qs = append(qs, q(a))
			}
			l := "[" + strings.Join(qs, ", ") + "]"
			fmt.Fprintf(&b, "      pod_annotations = %s\n      container_annotations = %s\n", l, l)
		}
		fmt.Fprintf(&b, "      [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.%s.options]\n        BinaryName = %s\n        Root = %s\n",
			r.Handler, q(r.Binary), q(filepath.Join(c.Dir, "runtime-"+r.Handler)))
	}
	return b.String()
}

func (c ContainerdConfig) stateDir() string {
	if c.StateDir != "" {
		return c.StateDir
	}
	return filepath.Join(c.Dir, "state")
}

// cniConfig is the pods' network: a bridge of their own (Bridge) with no
// address on the host, no gateway and no masquerading, so that a pod has
// its own network namespace with an eth0 (containerd 1.6's CRI requires
// one: with loopback alone RunPodSandbox fails with "failed to find
// network info") and no route to the host or beyond. IP addresses come
// from host-local, whose state lives under Dir.
func (c ContainerdConfig) cniConfig() string {
	return fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "moat-engines", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": false, "isDefaultGateway": false, "ipMasq": false, "hairpinMode": false,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.247.0.0/16"}]]}},
  {"type": "loopback"}
]}`, c.Bridge, filepath.Join(c.Dir, "cni-ipam"))
}

// StartContainerd starts a private containerd and waits until its CRI
// answers. crictl is the crictl binary the instance's Crictl runs.
func StartContainerd(ctx context.Context, cfg ContainerdConfig, crictl string) (*Containerd, error) {
	for _, d := range []string{"cni", "logs"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(cfg.Dir, "cni", "10-moat-engines.conflist"), []byte(cfg.cniConfig()), 0o644); err != nil {
		return nil, err
	}
	conf := filepath.Join(cfg.Dir, "config.toml")
	if err := os.WriteFile(conf, []byte(cfg.ConfigTOML()), 0o644); err != nil {
		return nil, err
	}
	c := &Containerd{Dir: cfg.Dir, Socket: filepath.Join(cfg.Dir, "containerd.sock"), done: make(chan struct{}), log: &bytes.Buffer{}, crictl: crictl, bridge: cfg.Bridge, state: cfg.stateDir(), snapshotter: cmp.Or(cfg.Snapshotter, "overlayfs")}
	c.cmd = exec.Command("containerd", "--config", conf, "--log-level", "warn")
	c.cmd.Env = append(os.Environ(), cfg.Env...)
	c.cmd.Stdout, c.cmd.Stderr = &lockedWriter{b: c.log}, &lockedWriter{b: c.log}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	go func() { c.cmd.Wait(); close(c.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if conn, err := net.Dial("unix", c.Socket); err == nil {
			conn.Close()
			if _, err := c.Crictl(ctx, "info"); err == nil {
				return c, nil
			}
		}
		select {
		case <-c.done:
			return nil, fmt.Errorf("containerd exited at start: %s", c.Log())
		case <-ctx.Done():
			c.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.Stop()
			return nil, fmt.Errorf("containerd's CRI did not answer within 60 s: %s", c.Log())
		}
	}
}

// Log is what containerd wrote so far (warnings and errors).
func (c *Containerd) Log() string { return lockedString(c.log) }

// Crictl runs crictl against this instance and returns its stdout; the
// error carries stderr, where crictl prints the CRI's error message.
func (c *Containerd) Crictl(ctx context.Context, args ...string) (string, error) {
	ep := "unix://" + c.Socket
	full := append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "60s"}, args...)
	return run(ctx, nil, c.crictl, full...)
}

// CrictlOutput is Crictl with stdout and stderr apart: crictl logs
// writes the container's stderr to its own.
func (c *Containerd) CrictlOutput(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	ep := "unix://" + c.Socket
	full := append([]string{"--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "60s"}, args...)
	cmd := exec.CommandContext(ctx, c.crictl, full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// Ctr runs containerd's ctr against this instance in the CRI's
// namespace (k8s.io).
func (c *Containerd) Ctr(ctx context.Context, stdin *os.File, args ...string) (string, error) {
	full := append([]string{"--address", c.Socket, "--namespace", "k8s.io"}, args...)
	return run(ctx, stdin, "ctr", full...)
}

// Import imports an image archive (WriteDockerArchive) for the CRI.
func (c *Containerd) Import(ctx context.Context, archive string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = c.Ctr(ctx, nil, "images", "import", "--snapshotter", c.snapshotter, archive)
	return err
}

// Stop removes every pod still there, stops containerd and removes its
// directory. It returns what was left behind: pods it had to remove,
// mounts under Dir, processes (shims) still serving its socket.
func (c *Containerd) Stop() []string {
	var left []string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	select {
	case <-c.done:
	default:
		if out, err := c.Crictl(ctx, "pods", "-q"); err == nil {
			for _, id := range strings.Fields(out) {
				left = append(left, "pod "+id+" still there at stop")
				c.Crictl(ctx, "stopp", id)
				c.Crictl(ctx, "rmp", "-f", id)
			}
		}
		c.cmd.Process.Signal(os.Interrupt)
		select {
		case <-c.done:
		case <-time.After(30 * time.Second):
			c.cmd.Process.Kill()
			<-c.done
			left = append(left, "containerd did not stop within 30 s of SIGINT")
		}
	}
	left = append(left, Residue(c.Dir)...)
	cleanupDir(c.Dir)
	if !strings.HasPrefix(c.state, c.Dir+"/") {
		left = append(left, Residue(c.state)...)
		cleanupDir(c.state)
	}
	if c.bridge != "" {
		if _, err := os.Stat("/sys/class/net/" + c.bridge); err == nil {
			if out, err := exec.Command("ip", "link", "del", c.bridge).CombinedOutput(); err != nil {
				left = append(left, fmt.Sprintf("bridge %s: ip link del: %v: %s", c.bridge, err, out))
			}
		}
	}
	return left
}

// Residue lists what processes and mounts refer to dir: processes whose
// command line or executable names a path below it, and mount points
// below it. An engine stopped cleanly leaves none.
func Residue(dir string) []string {
	var left []string
	for _, p := range procsUnder(dir) {
		left = append(left, "process "+p)
	}
	for _, m := range mountsUnder(dir) {
		left = append(left, "mount "+m)
	}
	sort.Strings(left)
	return left
}

// cleanupDir kills what still runs from dir, unmounts what is mounted
// below it (deepest first) and removes it, so that a failed test leaves
// the machine clean; the failure itself was reported by Residue.
func cleanupDir(dir string) {
	for _, p := range procsUnder(dir) {
		pid, _, _ := strings.Cut(p, " ")
		if n, err := strconv.Atoi(pid); err == nil {
			if proc, err := os.FindProcess(n); err == nil {
				proc.Kill()
			}
		}
	}
	ms := mountsUnder(dir)
	sort.Slice(ms, func(i, j int) bool { return len(ms[i]) > len(ms[j]) })
	for _, m := range ms {
		exec.Command("umount", "-l", m).Run()
	}
	os.RemoveAll(dir)
}

func run(ctx context.Context, stdin *os.File, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != nil {
		cmd.Stdin = stdin
	}
	if err := cmd.Run(); err != nil {
		return out.String(), &CmdError{Args: append([]string{name}, args...), Err: err, Stderr: strings.TrimSpace(errb.String())}
	}
	return out.String(), nil
}

// CmdError is a failed engine command with what it printed on stderr.
type CmdError struct {
	Args   []string
	Err    error
	Stderr string
}

func (e *CmdError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Stderr)
}

// ExitCode is the command's exit status, or -1.
func (e *CmdError) ExitCode() int {
	if ee, ok := e.Err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}
