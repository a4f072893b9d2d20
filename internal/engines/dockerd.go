package engines

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// DockerClient is the docker client the tests use: Debian's, from the
// same docker.io package as dockerd (20.10), rather than whatever newer
// client comes first on PATH, so that client and daemon are one tested
// pair (docs/RATIONALE.md).
const DockerClient = "/usr/bin/docker"

// DockerdConfig describes a private dockerd.
type DockerdConfig struct {
	// Dir holds its data root, exec root, socket and logs.
	Dir string
	// DataRoot, if set, is the data root instead of Dir/data (removed by
	// Stop): where Docker keeps each container's /dev/shm, which a
	// runtime may accept only from known places.
	DataRoot string
	// Runtimes are added with --add-runtime HANDLER=BINARY.
	Runtimes []Runtime
	// CgroupParent is the parent cgroup of its containers (cgroupfs).
	CgroupParent string
	// Env is added to dockerd's environment (and its containerd's).
	Env []string
	// StorageDriver is "overlay2" (the default) or "vfs" (plain
	// directories, a full copy per container), for runtimes that id-map
	// the rootfs, which an overlay mount does not support.
	StorageDriver string
}

func (cfg DockerdConfig) dataRoot() string {
	if cfg.DataRoot != "" {
		return cfg.DataRoot
	}
	return filepath.Join(cfg.Dir, "data")
}

func (cfg DockerdConfig) storageDriver() string {
	if cfg.StorageDriver == "" {
		return "overlay2"
	}
	return cfg.StorageDriver
}

// Dockerd is a running private dockerd.
type Dockerd struct {
	Dir      string
	Socket   string
	dataRoot string
	cmd      *exec.Cmd
	done     chan struct{}
	log      *bytes.Buffer
}

// Args are dockerd's arguments for cfg: no iptables, no bridge (the
// containers run with --network none), its own config file so that
// /etc/docker/daemon.json is not read, and the cgroupfs driver.
func (cfg DockerdConfig) Args() []string {
	args := []string{
		"--data-root", cfg.dataRoot(),
		"--exec-root", filepath.Join(cfg.Dir, "exec"),
		"--pidfile", filepath.Join(cfg.Dir, "docker.pid"),
		"--config-file", filepath.Join(cfg.Dir, "daemon.json"),
		"-H", "unix://" + filepath.Join(cfg.Dir, "docker.sock"),
		"--iptables=false", "--ip6tables=false", "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
		"--storage-driver", cfg.storageDriver(), "--exec-opt", "native.cgroupdriver=cgroupfs",
		"--log-level", "warn",
	}
	if cfg.CgroupParent != "" {
		args = append(args, "--cgroup-parent", cfg.CgroupParent)
	}
	for _, r := range cfg.Runtimes {
		args = append(args, "--add-runtime", r.Handler+"="+r.Binary)
	}
	return args
}

// StartDockerd starts a private dockerd (which starts a containerd of
// its own under its exec root) and waits until it answers.
func StartDockerd(ctx context.Context, cfg DockerdConfig) (*Dockerd, error) {
	if err := os.WriteFile(filepath.Join(cfg.Dir, "daemon.json"), []byte("{}\n"), 0o644); err != nil {
		return nil, err
	}
	d := &Dockerd{Dir: cfg.Dir, dataRoot: cfg.dataRoot(), Socket: filepath.Join(cfg.Dir, "docker.sock"), done: make(chan struct{}), log: &bytes.Buffer{}}
	d.cmd = exec.Command("dockerd", cfg.Args()...)
	d.cmd.Env = append(os.Environ(), cfg.Env...)
	d.cmd.Stdout, d.cmd.Stderr = &lockedWriter{b: d.log}, &lockedWriter{b: d.log}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dockerd: %w", err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if _, err := d.Docker(ctx, nil, "version"); err == nil {
			return d, nil
		}
		select {
		case <-d.done:
			return nil, fmt.Errorf("dockerd exited at start: %s", d.Log())
		case <-ctx.Done():
			d.Stop()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			d.Stop()
			return nil, fmt.Errorf("dockerd did not answer within 90 s: %s", d.Log())
		}
	}
}

// Log is what dockerd wrote so far.
func (d *Dockerd) Log() string { return lockedString(d.log) }

// Docker runs the docker client against this instance.
func (d *Dockerd) Docker(ctx context.Context, stdin *os.File, args ...string) (string, error) {
	return run(ctx, stdin, DockerClient, append([]string{"-H", "unix://" + d.Socket}, args...)...)
}

// Stop removes every container still there, stops dockerd and removes
// its directory, returning what was left behind.
func (d *Dockerd) Stop() []string {
	var left []string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	select {
	case <-d.done:
	default:
		if out, err := d.Docker(ctx, nil, "ps", "-aq"); err == nil {
			for _, id := range bytes.Fields([]byte(out)) {
				left = append(left, "container "+string(id)+" still there at stop")
				d.Docker(ctx, nil, "rm", "-f", string(id))
			}
		}
		d.cmd.Process.Signal(os.Interrupt)
		select {
		case <-d.done:
		case <-time.After(60 * time.Second):
			d.cmd.Process.Kill()
			<-d.done
			left = append(left, "dockerd did not stop within 60 s of SIGINT")
		}
	}
	// dockerd's own containerd exits with it, a moment later.
	for i := 0; i < 50 && len(procsUnder(d.Dir)) > 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	left = append(left, Residue(d.Dir)...)
	cleanupDir(d.Dir)
	if !strings.HasPrefix(d.dataRoot, d.Dir+"/") {
		left = append(left, Residue(d.dataRoot)...)
		cleanupDir(d.dataRoot)
	}
	return left
}
