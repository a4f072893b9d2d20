// Package microvm is the microVM isolation tier: each run boots its own
// guest kernel in a VM started by a real VMM (QEMU's microvm machine),
// with the image as a read-only virtio disk, no network device, and
// Moat's guest agent (guest/vmagent) as PID 1, spoken to over one
// virtio-serial port. A run granted egress gets a second port whose
// streams the host relays to Moat's egress proxy, and nothing else.
//
// The host never trusts the guest: frames are bounded, output and
// workspace are capped, paths are resolved inside the workspace with
// os.Root, and a silent or flooding guest is killed with its VMM. This
// package must never give a VM a network device or a writable image.
package microvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/guestkernel"
	"github.com/moat-sandbox/moat/seccomp"
	"github.com/moat-sandbox/moat/tier"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// Name is the tier's manifest name.
const Name = "microvm"

// Options configure the tier. Zero values take the documented defaults.
type Options struct {
	// Home is Moat's state directory; caches live in Home/microvm.
	Home string
	// Agent is a static binary that runs vmagent.Main as the guest's
	// /init (the moat binary itself, or moat-guest, cmd/moat-guest).
	Agent string
	// KernelDir holds vmlinuz and lib/modules/VERSION (default:
	// $MOAT_MICROVM_KERNEL, else DefaultKernelDir).
	KernelDir string
	// QEMU is the qemu-system-x86_64 binary (default: $MOAT_QEMU, else PATH).
	QEMU string
	// Accel forces "kvm" or "tcg" (default: $MOAT_MICROVM_ACCEL, else the
	// cached boot test).
	Accel string
	// BootTimeout bounds a boot up to the agent's hello (default 60 s:
	// TCG on a loaded host is slow).
	BootTimeout time.Duration
	// MaxOutputBytes bounds stdout plus stderr from one guest; past it the
	// VM is killed (default 1 GiB: far past any output cap, so a program's
	// flood is counted like on the other tiers, while a guest cannot keep
	// the host reading forever). The writers cap what is kept.
	MaxOutputBytes int64
	// NoSnapshot turns snapshots off: every VM boots its kernel (default:
	// on unless $MOAT_MICROVM_SNAPSHOT=off). With snapshots, the first VM
	// of a configuration is saved once booted and later ones restore it.
	NoSnapshot bool
	// Console, when set, is a directory where each VM's serial console is
	// written (debugging only).
	Console string
	// Jailer is the binary re-executed as the VMM's jailer (package jail):
	// the moat binary, or a test binary that dispatches jail.Arg from its
	// TestMain (default: /proc/self/exe, this very process).
	Jailer string
}

// MicroVM is the tier.
type MicroVM struct {
	opts   Options
	vmm    VMM
	kernel *kernel
	cache  string
	// cmdline is the guest kernel's command line.
	cmdline string

	// cg creates each run's cgroup, which holds its jailed VMM.
	cg *cgroup.Host
	// vmmOverheadMiB is what the VMM's cgroup allows beyond the VM's RAM
	// (tests lower it to provoke an OOM kill of the VMM).
	vmmOverheadMiB int64
	// prealloc: every VM touches all its RAM at start; vmmPids, when set,
	// replaces the VMM's pids limit (tests).
	prealloc bool
	vmmPids  int

	// filter is the native tier's seccomp policy, compiled once: the
	// agent installs it on every command (vmwire.Request.Seccomp), and
	// the jailer on the VMM (jail.Spec.Seccomp).
	filter []unix.SockFilter

	mu        sync.Mutex
	initramfs string
	accel     *AccelReport
	digests   map[string]digestEntry // file digests, by path
	verified  map[string]fileID      // snapshot files whose sha256 was checked, by key
	saving    map[string]bool        // snapshots being made, by key
}

var _ tier.Tier = (*MicroVM)(nil)

// New locates QEMU and the guest kernel. It does not boot anything: the
// accelerator is boot-tested on first use (Accel).
func New(opts Options) (*MicroVM, error) {
	if opts.Home == "" {
		return nil, errors.New("microvm: Options.Home is required")
	}
	if opts.Agent == "" {
		return nil, errors.New("microvm: Options.Agent is required")
	}
	if opts.KernelDir == "" {
		opts.KernelDir = os.Getenv("MOAT_MICROVM_KERNEL")
	}
	if opts.KernelDir == "" {
		opts.KernelDir = DefaultKernelDir
	}
	if opts.Accel == "" {
		opts.Accel = os.Getenv("MOAT_MICROVM_ACCEL")
	}
	if opts.Accel != "" && opts.Accel != "kvm" && opts.Accel != "tcg" {
		return nil, fmt.Errorf("microvm: accelerator %q: use kvm or tcg", opts.Accel)
	}
	if opts.Console == "" {
		opts.Console = os.Getenv("MOAT_MICROVM_CONSOLE")
	}
	if os.Getenv("MOAT_MICROVM_SNAPSHOT") == "off" {
		opts.NoSnapshot = true
	}
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 60 * time.Second
	}
	if opts.MaxOutputBytes == 0 {
		opts.MaxOutputBytes = 1 << 30
	}
	if opts.Jailer == "" {
		opts.Jailer = "/proc/self/exe"
	}
	if opts.QEMU == "" {
		q, err := findQEMU()
		if err != nil {
			return nil, fmt.Errorf("%w: %w", tier.ErrUnavailable, err)
		}
		opts.QEMU = q
	}
	// Fail closed: without what the VMM's jail needs, no VM starts (there
	// is no unconfined mode).
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the microvm tier needs root to jail its VMM (new namespaces, a cgroup, an unprivileged uid); run moat as root", tier.ErrUnavailable)
	}
	cg, err := cgroup.Detect()
	if err != nil {
		return nil, fmt.Errorf("%w: the VMM's cgroup: %v", tier.ErrUnavailable, err)
	}
	if err := checkJailIDs("/etc/passwd", "/etc/group"); err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	q, err := NewQEMU(opts.QEMU)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrUnavailable, err)
	}
	opts.QEMU = q.Binary
	k, err := findKernel(opts.KernelDir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrUnavailable, err)
	}
	// The jailed VMM opens the kernel by path as its own uid.
	if err := jailReadable(k.vmlinuz); err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	m := &MicroVM{opts: opts, vmm: q, kernel: k, cache: homeCache(opts.Home), cg: cg, vmmOverheadMiB: vmmOverheadMiB,
		digests: map[string]digestEntry{}, verified: map[string]fileID{}, saving: map[string]bool{}}
	if m.filter, err = seccomp.Default().Compile(); err != nil {
		return nil, fmt.Errorf("microvm: compile the seccomp policy: %w", err)
	}
	m.cmdline = guestkernel.Cmdline(false)
	if err := os.MkdirAll(m.cache, 0o700); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *MicroVM) Name() string { return Name }

// VMM names the VMM and its binary.
func (m *MicroVM) VMM() string { return m.vmm.Name() + " " + m.opts.QEMU }

// Jail says how the VMM is confined on this host (moat doctor).
func (m *MicroVM) Jail() string {
	return fmt.Sprintf("VMM jailed as uid %d+pid, gid %d, no capabilities, own mount/pid/net/ipc/uts/cgroup namespaces, in the run's cgroup (%s, VM RAM + %d MiB)",
		jail.UIDBase, jail.GID, m.cg.Version, m.vmmOverheadMiB)
}

// KernelVersion is the guest kernel's release.
func (m *MicroVM) KernelVersion() string { return m.kernel.version }

func (m *MicroVM) Capabilities() tier.Capabilities {
	return tier.Capabilities{
		Seccomp:     true, // the native policy, installed by the agent in the guest
		Landlock:    true, // the native ruleset, in the guest kernel (refused there if missing)
		MemoryLimit: true, // the VM's RAM, and a cgroup in the guest
		PidsLimit:   true,
		CPULimit:    true, // the VMM's cgroup, from the program's start
		NetworkNone: true, // no network device at all
		// Egress through Moat's proxy only, over a second virtio-serial
		// port (egress.go); still no network device.
		NetworkEgress: true,
		WorkspaceCap:  true,
		// The agent installs the run CA (guest/vmagent/trust.go).
		TrustStore: true,
		Missing: []string{
			"sessions: one command per VM",
		},
	}
}

func (m *MicroVM) assets() (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.initramfs != "" {
		return m.initramfs, nil
	}
	p, err := buildInitramfs(m.cache, m.opts.Agent, m.kernel)
	if err != nil {
		return "", fmt.Errorf("build initramfs: %w", err)
	}
	// The jailed VMM opens it by path: readable by the jails' group only
	// (it holds the agent, and stays unreadable to other host users).
	if err := os.Chown(p, 0, jail.GID); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	m.initramfs = p
	return p, nil
}

// AccelReport is what the accelerator check found.
type AccelReport struct {
	Accel  string `json:"accel"`  // "kvm" or "tcg"
	Reason string `json:"reason"` // why
	Key    string `json:"key"`    // what the cached answer depends on
}

// Accel returns the accelerator this host gives VMs, boot-testing KVM once
// (the answer is cached in Home/microvm/accel.json): /dev/kvm opening is
// not enough, since on nested hosts a real kernel can hang under it.
func (m *MicroVM) Accel(ctx context.Context) (*AccelReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.accel != nil {
		return m.accel, nil
	}
	if m.opts.Accel != "" {
		m.accel = &AccelReport{Accel: m.opts.Accel, Reason: "forced by configuration ($MOAT_MICROVM_ACCEL)"}
		return m.accel, nil
	}
	key := m.kernel.version
	if fi, err := os.Stat(m.opts.QEMU); err == nil {
		key += fmt.Sprintf(" qemu:%d:%d", fi.Size(), fi.ModTime().Unix())
	}
	cacheFile := filepath.Join(m.cache, "accel.json")
	var cached AccelReport
	if b, err := os.ReadFile(cacheFile); err == nil && json.Unmarshal(b, &cached) == nil && cached.Key == key {
		m.accel = &cached
		return m.accel, nil
	}
	rep := &AccelReport{Accel: "tcg", Key: key}
	if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
		rep.Reason = "no usable /dev/kvm (" + err.Error() + "): software emulation"
	} else {
		f.Close()
		m.mu.Unlock()
		kernel, err := m.bootTest(ctx, "kvm", 15*time.Second)
		m.mu.Lock()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			rep.Accel, rep.Reason = "kvm", "a test VM booted under KVM (guest kernel "+kernel+")"
		} else {
			rep.Reason = "/dev/kvm opens but a test VM did not boot under it (" + err.Error() + "): software emulation"
		}
	}
	b, _ := json.Marshal(rep)
	writeAtomic(cacheFile, b)
	m.accel = rep
	return rep, nil
}

// bootTest boots a VM with an empty disk up to the agent's hello.
func (m *MicroVM) bootTest(ctx context.Context, accel string, timeout time.Duration) (string, error) {
	empty, err := os.MkdirTemp(m.cache, ".probe-root-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(empty)
	disk := filepath.Join(empty, "disk")
	if err := os.Mkdir(filepath.Join(empty, "root"), 0o755); err != nil {
		return "", err
	}
	if b, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", filepath.Join(empty, "root"), disk, "1024").CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.ext4: %v: %s", err, b)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Jailed like every VMM, but in no run's cgroup: it runs Moat's own
	// kernel and agent on an empty disk, for at most timeout, and a cgroup
	// named after no run would escape the engine's GC if moat died now.
	vm, err := m.boot(empty, disk, accel, 128, 1)
	if err != nil {
		return "", err
	}
	defer vm.kill()
	h, err := vm.waitHello(ctx)
	if err != nil {
		return "", err
	}
	return h.Kernel, nil
}
