package microvm

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/guest/vmagent"
)

// VMConfig is one VM to boot: what every VMM needs, in Moat's terms.
type VMConfig struct {
	Kernel    string
	Initramfs string
	Cmdline   string
	RootDisk  string // read-only raw disk: the image
	Socket    string // Unix socket path the VMM listens on for the agent's port
	MemoryMiB int64
	VCPUs     int
	Accel     string // "kvm" or "tcg"
	// QMP, when set, is a Unix socket path for QEMU's machine protocol
	// (snapshot and restore).
	QMP string
	// Incoming starts the VM waiting for a migration stream (QMP
	// migrate-incoming) instead of booting the kernel.
	Incoming bool
	// Console, when set, receives the guest's serial console (debugging).
	Console string
	// Egress, when set, is the Unix socket path the VMM listens on for a
	// second virtio-serial port, the egress channel (only with an egress
	// grant; the VM never gets a network device).
	Egress string
	// EgressProxy is the host's egress proxy socket that the host end of
	// the egress port relays each stream to. It is not part of the VMM's
	// command line.
	EgressProxy string
}

// VMM starts VMs. QEMU's microvm machine is the one implementation;
// Firecracker or Cloud Hypervisor fit the same shape.
type VMM interface {
	Name() string
	// Command is the VMM process for cfg. It must die with its parent
	// (Pdeathsig) and lead its own process group.
	Command(cfg *VMConfig) (*exec.Cmd, error)
}

// QEMU is the VMM behind QEMU's minimal "microvm" machine type.
type QEMU struct {
	Binary string
}

func (q *QEMU) Name() string { return "qemu-microvm" }

// Args is the QEMU command line for cfg: no default devices, no network,
// no option ROMs; one virtio-mmio disk, one virtio-serial port, and a
// second one for the egress channel only when cfg has one.
func (q *QEMU) Args(cfg *VMConfig) []string {
	// Under TCG the default CPU model: with "max" the guest kernel's TSC
	// calibration hangs on this QEMU.
	cpu := "qemu64"
	if cfg.Accel == "kvm" {
		cpu = "host"
	}
	// Port 0 of a virtio-serial device is reserved for a console, so
	// max_ports is the named ports plus one.
	ports := 2
	if cfg.Egress != "" {
		ports = 3
	}
	serial := "none"
	if cfg.Console != "" {
		serial = "file:" + cfg.Console
	}
	args := []string{
		"-M", "microvm,x-option-roms=off,pit=on,pic=on,rtc=on,isa-serial=" + strconv.FormatBool(cfg.Console != ""),
		"-accel", cfg.Accel,
		"-cpu", cpu,
		"-m", strconv.FormatInt(cfg.MemoryMiB, 10) + "M",
		"-smp", strconv.Itoa(cfg.VCPUs),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		// QEMU's own seccomp filter: a guest that takes over the emulator
		// cannot exec, change privileges or use obsolete syscalls.
		"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
		"-serial", serial,
		"-kernel", cfg.Kernel,
		"-initrd", cfg.Initramfs,
		"-append", cfg.Cmdline,
		"-drive", "id=root,file=" + cfg.RootDisk + ",format=raw,if=none,readonly=on",
		"-device", "virtio-blk-device,drive=root",
		"-chardev", "socket,id=agent,path=" + cfg.Socket + ",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=" + strconv.Itoa(ports),
		"-device", "virtserialport,chardev=agent,name=moat",
	}
	if cfg.Egress != "" {
		args = append(args,
			"-chardev", "socket,id=egress,path="+cfg.Egress+",server=on,wait=off",
			"-device", "virtserialport,chardev=egress,name="+vmagent.EgressPortName)
	}
	if cfg.QMP != "" {
		args = append(args, "-qmp", "unix:"+cfg.QMP+",server=on,wait=off")
	}
	if cfg.Incoming {
		args = append(args, "-incoming", "defer")
	}
	return args
}

// Command is the VMM process for cfg, not yet started.
func (q *QEMU) Command(cfg *VMConfig) (*exec.Cmd, error) {
	for _, p := range []string{cfg.Kernel, cfg.Initramfs, cfg.RootDisk, cfg.Socket, cfg.Console, cfg.QMP, cfg.Egress} {
		if strings.ContainsRune(p, ',') {
			return nil, fmt.Errorf("path %q contains a comma, which QEMU's option syntax cannot take", p)
		}
	}
	cmd := exec.Command(q.Binary, q.Args(cfg)...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	// Its own process group, and death with Moat: a crashed Moat leaves no
	// VMM behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
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
