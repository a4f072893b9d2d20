package microvm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/internal/guestkernel"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// This file is the VM lifecycle: configuring, booting and jailing one VMM,
// reaching its agent and egress ports, and killing it.

// vmOverheadMiB is RAM the guest kernel, the initramfs and the agent need
// beyond the command's memory limit.
const vmOverheadMiB = 192

// vm is one running VMM process and the host end of its agent port (and
// of its egress port, when it has one).
type vm struct {
	cmd         *exec.Cmd
	socket      string
	qmp         string // QMP socket path, when the VMM has one
	egressSock  string // the egress port's socket, when the VM has one
	egressProxy string // where the egress port's streams are relayed
	stderr      *boundedBuffer

	killOnce sync.Once
	exited   chan struct{}
	conn     net.Conn
	r        *bufio.Reader

	mu     sync.Mutex // guards egress and killed against a kill during connect
	egress *egressChannel
	killed bool
}

// boot starts a VM whose files live in dir, in moat's own cgroup (the
// accelerator's boot test).
func (m *MicroVM) boot(dir, disk, accel string, memMiB int64, vcpus int) (*vm, error) {
	cfg, err := m.config(dir, disk, accel, memMiB, vcpus)
	if err != nil {
		return nil, err
	}
	return m.startVMM(cfg, nil)
}

// config is the VM for one sandbox. Its VMM's files live in dir: the run
// directory dir/vmm (its sockets, the one place it may write) and the
// empty dir/jail on which its jail's root is mounted (in the jail's own
// mount namespace).
func (m *MicroVM) config(dir, disk, accel string, memMiB int64, vcpus int) (*VMConfig, error) {
	initrd, err := m.assets()
	if err != nil {
		return nil, err
	}
	run := filepath.Join(dir, "vmm")
	for _, d := range []string{run, jailRoot(dir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	cfg := &VMConfig{
		Kernel: m.kernel.vmlinuz, Initramfs: initrd, Cmdline: m.cmdline, RootDisk: disk, RunDir: run,
		Socket: filepath.Join(run, "agent.sock"), MemoryMiB: memMiB, VCPUs: vcpus, Accel: accel, Prealloc: m.prealloc,
	}
	if m.opts.Console != "" {
		cfg.Cmdline = guestkernel.Cmdline(true)
		cfg.Console = filepath.Join(m.opts.Console, filepath.Base(filepath.Dir(dir))+".console")
	}
	return cfg, nil
}

// jailRoot is where a VM's jail root is mounted, for VM files in dir.
func jailRoot(dir string) string { return filepath.Join(dir, "jail") }

// startVMM starts the VMM for cfg in its jail (package jail), in the run's
// cgroup cg (nil: moat's own, for the boot test only). A jail that cannot
// be built is an error: no VMM ever runs unconfined.
func (m *MicroVM) startVMM(cfg *VMConfig, cg *cgroup.Cgroup) (*vm, error) {
	v := &vm{socket: cfg.Socket, qmp: cfg.QMP, egressSock: cfg.Egress, egressProxy: cfg.EgressProxy, stderr: &boundedBuffer{max: 8 << 10}, exited: make(chan struct{})}
	spec, err := m.vmm.Jail(cfg)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", m.vmm.Name(), err)
	}
	defer func() {
		for _, f := range spec.Files {
			if f != nil {
				f.Close()
			}
		}
	}()
	spec.Root = jailRoot(filepath.Dir(cfg.RunDir))
	spec.Stderr = v.stderr
	// The VMM runs under the native tier's filter too, beneath its own
	// (QEMU's -sandbox is a denylist that leaves keyctl, bpf, io_uring,
	// perf_event_open and ptrace open): see docs/THREATS.md.
	spec.Seccomp = m.filter
	// The VMM gets stdio and its own descriptors, nothing else: the jailer
	// marks everything else close-on-exec before it execs QEMU, and a
	// descriptor Moat's process holds without close-on-exec (one a library
	// or an embedding program opened without it) does not even reach the
	// jailer.
	if err := closeOnExec(); err != nil {
		return nil, fmt.Errorf("start %s: %w", m.vmm.Name(), err)
	}
	cmd, err := jail.Start(m.opts.Jailer, spec, cg)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", m.vmm.Name(), err)
	}
	v.cmd = cmd
	go func() { cmd.Wait(); close(v.exited) }()
	return v, nil
}

// waitHello connects to the agent port and waits for the agent's hello.
func (v *vm) waitHello(ctx context.Context) (*vmwire.Hello, error) {
	type res struct {
		h   *vmwire.Hello
		err error
	}
	ch := make(chan res, 1)
	go func() {
		h, err := v.hello()
		ch <- res{h, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			// Say why the VMM ended, when it did.
			select {
			case <-v.exited:
				r.err = fmt.Errorf("%w; VMM: %s", r.err, v.stderr.String())
			case <-time.After(200 * time.Millisecond):
			}
			v.kill()
		}
		return r.h, r.err
	case <-ctx.Done():
		v.kill()
		return nil, fmt.Errorf("guest did not boot: %w", ctx.Err())
	case <-v.exited:
		v.kill()
		return nil, fmt.Errorf("VMM exited during boot: %s", v.stderr.String())
	}
}

func (v *vm) hello() (*vmwire.Hello, error) {
	if err := v.connect(); err != nil {
		return nil, err
	}
	typ, p, err := vmwire.ReadFrame(v.r)
	if err != nil {
		return nil, fmt.Errorf("agent hello: %w", err)
	}
	if typ == vmwire.FrameFail {
		return nil, fmt.Errorf("guest agent failed: %s", sanitize(p))
	}
	if typ != vmwire.FrameHello {
		return nil, fmt.Errorf("agent hello: unexpected frame %q", typ)
	}
	var h vmwire.Hello
	if err := json.Unmarshal(p, &h); err != nil {
		return nil, fmt.Errorf("agent hello: %w", err)
	}
	return &h, nil
}

// connect connects to the VMM's end of the agent port, and of the egress
// port when the VM has one (whose host end then serves at once: the guest
// sends nothing on it before its request grants egress).
func (v *vm) connect() error {
	conn, err := v.dial(v.socket)
	if err != nil {
		return fmt.Errorf("connect to the agent port: %w", err)
	}
	v.conn = conn
	v.r = bufio.NewReaderSize(conn, 1<<20)
	if v.egressSock == "" {
		return nil
	}
	ec, err := v.dial(v.egressSock)
	if err != nil {
		return fmt.Errorf("connect to the egress port: %w", err)
	}
	ch, err := newEgressChannel(ec, v.egressProxy, vmwire.EgressMaxConns)
	if err != nil {
		return fmt.Errorf("egress port: %w", err)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.killed {
		ch.Close()
		return errors.New("VMM killed")
	}
	v.egress = ch
	return nil
}

// dial connects to one of the VMM's sockets, waiting for QEMU to create it.
func (v *vm) dial(path string) (net.Conn, error) {
	var conn net.Conn
	var err error
	for i := 0; i < 500; i++ {
		if conn, err = net.Dial("unix", path); err == nil {
			return conn, nil
		}
		select {
		case <-v.exited:
			return nil, errors.New("VMM exited")
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil, err
}

// kill ends the VMM by its pid (and its process group) and waits for it.
func (v *vm) kill() {
	if v == nil { // the VMM never started
		return
	}
	v.killOnce.Do(func() {
		if v.cmd != nil && v.cmd.Process != nil {
			syscall.Kill(-v.cmd.Process.Pid, syscall.SIGKILL)
			v.cmd.Process.Kill()
			<-v.exited
		}
		if v.conn != nil {
			v.conn.Close()
		}
		v.mu.Lock()
		v.killed = true
		ch := v.egress
		v.mu.Unlock()
		if ch != nil {
			ch.Close()
		}
		os.Remove(v.socket)
		if v.qmp != "" {
			os.Remove(v.qmp)
		}
		if v.egressSock != "" {
			os.Remove(v.egressSock)
		}
	})
}

// boundedBuffer keeps the first max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *boundedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.TrimSpace(b.buf.String())
}

// sanitize makes a guest-supplied message safe to show: bounded, printable.
func sanitize(p []byte) string {
	if len(p) > 512 {
		p = p[:512]
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, string(bytes.ToValidUTF8(p, []byte("?"))))
}

// VMMBinary is the host path of the VMM executable.
func (m *MicroVM) VMMBinary() string { return m.opts.QEMU }

// closeOnExec marks every descriptor of this process above stderr
// close-on-exec. exec.Cmd still passes ExtraFiles (the child dup2s them
// into place, which clears the flag on the copy).
func closeOnExec() error {
	err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	if err == nil {
		return nil
	}
	// Kernels before 5.11: each open descriptor by name.
	ents, rerr := os.ReadDir("/proc/self/fd")
	if rerr != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %v; list them: %w", err, rerr)
	}
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		if fd > 2 {
			unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC)
		}
	}
	return nil
}
