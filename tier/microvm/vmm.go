package microvm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"github.com/moat-sandbox/moat/internal/guestkernel"
	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// VMConfig is one VM to boot: what every VMM needs, in Moat's terms.
// Paths are the host's; the VMM's own process sees them through its jail
// (Jail).
type VMConfig struct {
	Kernel    string
	Initramfs string
	Cmdline   string
	RootDisk  string // read-only raw disk: the image
	// RunDir is the host directory for the VMM's sockets: the one place
	// its jail may write. Socket and QMP are inside it.
	RunDir    string
	Socket    string // Unix socket the VMM listens on for the agent's port
	MemoryMiB int64
	VCPUs     int
	Accel     string // "kvm" or "tcg"
	// QMP, when set, is a Unix socket path for QEMU's machine protocol
	// (snapshot and restore).
	QMP string
	// Incoming, when set, is a migration stream (a snapshot) the VM waits
	// to load (QMP migrate-incoming) instead of booting the kernel.
	Incoming *os.File
	// Console, when set, receives the guest's serial console (debugging).
	Console string
	// Egress, when set, is the Unix socket path (in RunDir) the VMM
	// listens on for a second virtio-serial port, the egress channel
	// (only with an egress grant; the VM never gets a network device).
	Egress string
	// EgressProxy is the host's egress proxy socket that the host end of
	// the egress port relays each stream to. It is not part of the VMM's
	// command line, and not in its jail.
	EgressProxy string
	// Prealloc makes the VMM touch all of the VM's RAM at start, as a
	// guest that used all of it would (tests measure the VMM's worst
	// case against its cgroup with it).
	Prealloc bool
}

// VMM starts VMs. QEMU's microvm machine is the one implementation;
// Firecracker or Cloud Hypervisor fit the same shape.
type VMM interface {
	Name() string
	// Jail is the VMM process for cfg as package jail runs it: the
	// program, its command line (naming cfg's files by their paths in the
	// jail, or as the descriptors it is handed), the host files it needs,
	// read-only but for cfg.RunDir, and its devices. The caller sets Root
	// and Stderr and closes Files once the jail has started.
	Jail(cfg *VMConfig) (*jail.Spec, error)
}

// Where a VM's files are inside its VMM's jail.
const (
	jailKernel    = "/vm/vmlinuz"
	jailInitramfs = "/vm/initramfs"
	jailRunDir    = "/run/vm"
)

// The VMM's descriptors (package jail passes them at these numbers).
const (
	diskFD     = 3 // the image, opened read-only by Moat
	incomingFD = 4 // a snapshot to restore
	consoleFD  = 5 // the serial console file (debugging)
)

// tcgCacheMiB is TCG's translation-block cache (-accel tcg,tb-size).
// QEMU's default is 1 GiB, touched as guest code is translated, which
// would make the VMM's memory grow far past the VM's RAM: bounded, it is
// part of the overhead the run's cgroup allows (vmmOverheadMiB).
const tcgCacheMiB = 64

// QEMU is the VMM behind QEMU's minimal "microvm" machine type.
type QEMU struct {
	// Binary is qemu-system-x86_64, symlinks resolved.
	Binary string
	// files are what it opens from the host (strace of a boot): itself,
	// its shared libraries, under TCG its accelerator module (Debian
	// builds QEMU with modules) and the machine's firmware (qboot,
	// bios-microvm.bin). Found relative to its own directory, as QEMU
	// finds them.
	files   []jail.Mount
	libDirs []string
}

// NewQEMU finds what the QEMU at binary needs to run in a jail.
func NewQEMU(binary string) (*QEMU, error) {
	bin, err := filepath.EvalSymlinks(binary)
	if err != nil {
		return nil, fmt.Errorf("%w: QEMU %s: %v", errUnavailable, binary, err)
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return nil, err
	}
	prefix := filepath.Dir(filepath.Dir(bin))
	objs := []string{bin}
	for _, d := range []string{"lib/x86_64-linux-gnu/qemu", "lib64/qemu", "lib/qemu"} {
		if m := filepath.Join(prefix, d, "accel-tcg-x86_64.so"); exists(m) {
			objs = append(objs, m)
			break
		}
	}
	files, libDirs, err := jail.Program(objs...)
	if err != nil {
		return nil, fmt.Errorf("%w: what QEMU %s loads: %v", errUnavailable, bin, err)
	}
	fw := filepath.Join(prefix, "share/qemu/bios-microvm.bin")
	src, err := filepath.EvalSymlinks(fw)
	if err != nil {
		return nil, fmt.Errorf("%w: QEMU's microvm firmware: %v (Debian: apt-get install qemu-system-data)", errUnavailable, err)
	}
	files = append(files, jail.Mount{Source: src, Target: fw})
	return &QEMU{Binary: bin, files: files, libDirs: libDirs}, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (q *QEMU) Name() string { return "qemu-microvm" }

// Args is the QEMU command line for cfg, inside its jail: no default
// devices, no network, no option ROMs; one virtio-mmio disk (descriptor
// diskFD), one virtio-serial port, and a second one for the egress
// channel only when cfg has one.
func (q *QEMU) Args(cfg *VMConfig) []string {
	cpu, accel := guestkernel.TCGCPU, "tcg,tb-size="+strconv.Itoa(tcgCacheMiB)
	if cfg.Accel == "kvm" {
		cpu, accel = "host", "kvm"
	}
	// Port 0 of a virtio-serial device is reserved for a console, so
	// max_ports is the named ports plus one.
	ports := 2
	if cfg.Egress != "" {
		ports = 3
	}
	serial := "none"
	if cfg.Console != "" {
		serial = "file:/dev/fdset/" + strconv.Itoa(consoleFD)
	}
	args := []string{
		"-M", guestkernel.Machine(cfg.Console != ""),
		"-accel", accel,
		"-cpu", cpu,
		"-m", strconv.FormatInt(cfg.MemoryMiB, 10) + "M",
		"-smp", strconv.Itoa(cfg.VCPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// QEMU's own seccomp filter: a guest that takes over the emulator
		// cannot exec, change privileges or use obsolete syscalls.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-kernel", jailKernel,
		"-initrd", jailInitramfs,
		"-append", cfg.Cmdline,
		// The image is a descriptor Moat opened read-only (QEMU's fd sets):
		// it stays root-only on the host, and no path to it is in the jail.
		"-add-fd", fmt.Sprintf("fd=%d,set=%d", diskFD, diskFD),
		"-drive", fmt.Sprintf("id=root,file=/dev/fdset/%d,format=raw,if=none,readonly=on", diskFD),
		"-device", "virtio-blk-device,drive=root",
		"-chardev", "socket,id=agent,path=" + jailRunDir + "/" + filepath.Base(cfg.Socket) + ",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=" + strconv.Itoa(ports),
		"-device", "virtserialport,chardev=agent,name=moat",
	}
	if cfg.Egress != "" {
		args = append(args,
			"-chardev", "socket,id=egress,path="+jailRunDir+"/"+filepath.Base(cfg.Egress)+",server=on,wait=off",
			"-device", "virtserialport,chardev=egress,name="+vmwire.EgressPortName)
	}
	if cfg.Console != "" {
		args = append(args, "-add-fd", fmt.Sprintf("fd=%d,set=%d", consoleFD, consoleFD))
	}
	args = append(args, "-serial", serial)
	if cfg.QMP != "" {
		args = append(args, "-qmp", "unix:"+jailRunDir+"/"+filepath.Base(cfg.QMP)+",server=on,wait=off")
	}
	if cfg.Incoming != nil {
		args = append(args, "-incoming", "defer")
	}
	if cfg.Prealloc {
		args = append(args, "-mem-prealloc")
	}
	return args
}

// Jail is QEMU for cfg in its jail: the files it needs read-only, the
// kernel and initramfs at fixed paths, cfg.RunDir its only writable
// directory, /dev with null, zero and urandom (and under KVM its own
// /dev/kvm), and as descriptors the image (read-only), the snapshot to
// restore and the console file.
func (q *QEMU) Jail(cfg *VMConfig) (*jail.Spec, error) {
	for _, p := range []string{cfg.Socket, cfg.QMP, cfg.Egress} {
		if p != "" && filepath.Dir(p) != cfg.RunDir {
			return nil, fmt.Errorf("socket %s is not in the VMM's run directory %s", p, cfg.RunDir)
		}
		// QEMU's option syntax has no escape for a comma.
		if strings.ContainsRune(filepath.Base(p), ',') {
			return nil, fmt.Errorf("socket name %q contains a comma, which QEMU's option syntax cannot take", p)
		}
	}
	mounts := append(slices.Clone(q.files),
		jail.Mount{Source: cfg.Kernel, Target: jailKernel},
		jail.Mount{Source: cfg.Initramfs, Target: jailInitramfs},
		jail.Mount{Source: cfg.RunDir, Target: jailRunDir, Writable: true},
	)
	var devs []jail.Device
	for _, d := range []string{"/dev/null", "/dev/zero", "/dev/urandom"} {
		dev, err := jail.HostDevice(d, 0o666, false)
		if err != nil {
			return nil, err
		}
		devs = append(devs, dev)
	}
	if cfg.Accel == "kvm" {
		// This VMM's own node, owned by its uid: the host's /dev/kvm
		// (often root-only) is not touched.
		dev, err := jail.HostDevice("/dev/kvm", 0o600, true)
		if err != nil {
			return nil, err
		}
		devs = append(devs, dev)
	}
	disk, err := os.OpenFile(cfg.RootDisk, os.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the image disk: %w", err)
	}
	files := []*os.File{disk, cfg.Incoming, nil}
	if cfg.Console != "" {
		c, err := os.OpenFile(cfg.Console, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			disk.Close()
			return nil, fmt.Errorf("console: %w", err)
		}
		files[consoleFD-3] = c
	}
	return &jail.Spec{
		Path:    q.Binary,
		Args:    append([]string{q.Binary}, q.Args(cfg)...),
		Env:     []string{"LD_LIBRARY_PATH=" + strings.Join(q.libDirs, ":")},
		Mounts:  mounts,
		Devices: devs,
		// QEMU holds a few dozen descriptors (eventfds per virtqueue,
		// sockets, the disk); 1024 is far above that and bounds a VMM
		// a guest took over.
		NoFile: 1024,
		Files:  files,
	}, nil
}

// findQEMU returns the QEMU binary: $MOAT_QEMU or qemu-system-x86_64.
func findQEMU() (string, error) {
	if p := os.Getenv("MOAT_QEMU"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "", fmt.Errorf("%w: qemu-system-x86_64 not found (apt-get install qemu-system-x86, or run scripts/setup)", errUnavailable)
	}
	return p, nil
}
