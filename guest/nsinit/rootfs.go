package nsinit

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"github.com/moat-sandbox/moat/internal/rootfs"
)

// maskedPaths are hidden behind /dev/null (files) or an empty read-only
// tmpfs (directories). They leak host kernel state or offer attack surface
// (runc's default list, plus the kernel memory and symbol views).
var maskedPaths = []string{
	"/proc/acpi",
	"/proc/asound",
	"/proc/interrupts",
	"/proc/kcore", // physical memory image
	"/proc/keys",  // the kernel keyring list
	"/proc/latency_stats",
	"/proc/timer_list",  // host timers, leaks other processes' names
	"/proc/timer_stats", // same
	"/proc/sched_debug", // every host task
	"/proc/scsi",
	"/proc/kallsyms", // kernel symbol addresses (KASLR)
	"/proc/kmsg",
	"/proc/kpagecount",
	"/proc/kpageflags",
	"/proc/kpagecgroup",
	"/proc/modules",
	"/proc/mtrr",
	"/proc/slabinfo",
	"/proc/vmallocinfo",
	"/proc/config.gz",
	// Host identity and activity, masked because it costs nothing (issue
	// 17): the boot command line (root device, options), the kernel's
	// build string, the id of this boot (which tells runs, and tenants,
	// that they share a host), every disk's activity and the host-wide
	// AIO count (both readable traces of other tenants). The kernel
	// release stays visible through uname(2), which programs need.
	"/proc/cmdline",
	"/proc/version",
	"/proc/diskstats",
	"/proc/sys/kernel/random/boot_id",
	"/proc/sys/fs/aio-nr",
}

// readonlyPaths stay visible but can never be written, even by a process
// that somehow regained privilege in the user namespace.
var readonlyPaths = []string{
	"/proc/bus",
	"/proc/fs",
	"/proc/irq",
	"/proc/sys",           // sysctls (core_pattern, modprobe path, ...)
	"/proc/sysrq-trigger", // host reboot/crash keys
}

// devices are the only device nodes in the sandbox, bind-mounted from the
// host (mknod is impossible in a user namespace, and should be).
var devices = []string{"null", "zero", "full", "random", "urandom"}

// sandboxDevices are the device files the program may read and write
// (Landlock): devices, and /dev/tty where buildDev made it.
func sandboxDevices() []string {
	out := make([]string, 0, len(devices)+1)
	for _, d := range devices {
		out = append(out, "/dev/"+d)
	}
	if _, err := os.Stat("/dev/tty"); err == nil {
		out = append(out, "/dev/tty")
	}
	return out
}

// maxPTYs bounds the terminals a sandbox may have open at once (devpts's
// max): each holds kernel buffers.
const maxPTYs = 64

// buildRoot assembles the sandbox's root filesystem under cfg.Root and
// pivots into it. It runs as root of the new user namespace, in a mount
// namespace that is still a copy of the host's. Order matters: everything
// that needs a host path (/dev/null to mask with, the image directory) is
// done before pivot_root, after which the host tree is detached.
func buildRoot(cfg *nswire.Config) error {
	root := cfg.Root

	// Stop every mount event from propagating back to the host (and from
	// the host into the sandbox) before touching anything.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}

	// The image becomes its own mount so it can be made read-only and
	// pivoted into. Read-only, nosuid and nodev are set with mount_setattr,
	// which changes only the named attributes: a classic MS_REMOUNT would
	// have to repeat the host's locked atime flags or fail with EPERM.
	if err := unix.Mount(root, root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind image %s: %w", root, err)
	}
	if err := rootfs.SetAttr(root, rootAttr(cfg.WritableRoot)); err != nil {
		return fmt.Errorf("make image read-only: %w", err)
	}
	if cfg.WritableRoot {
		// A build step's tree may lack a mount point (a fresh base): the
		// sandbox's own mounts need them. They stay in the image, empty,
		// as every Moat image has them.
		if err := mountPoints(root); err != nil {
			return err
		}
	}

	// A fresh procfs for our PID namespace: only the sandbox's processes
	// are visible. noexec so nothing runs from /proc/self/fd tricks.
	proc := filepath.Join(root, "proc")
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	if err := confineProcDevTmp(root, cfg); err != nil {
		return err
	}

	// /workspace is a tmpfs the host created with fsmount and holds by fd,
	// so the host can read the diff after everything here is dead, and a
	// killed run leaves no mount on the host. Its size and inode limits
	// were set by the host; this namespace cannot remount it (its
	// superblock belongs to the host's user namespace).
	if err := unix.MoveMount(nswire.WorkspaceFD, "", unix.AT_FDCWD, filepath.Join(root, "workspace"), unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach /workspace: %w", err)
	}
	unix.Close(nswire.WorkspaceFD)

	// Into the image, the host's tree detached.
	if err := rootfs.PivotInto(root); err != nil {
		return err
	}
	if len(cfg.TrustPEM) > 0 {
		return installTrust(cfg)
	}
	return nil
}

// maxTrustBundle bounds the image's CA bundle init reads (Debian's is
// about 220 KiB).
const maxTrustBundle = 8 << 20

// installTrust makes the sandbox trust the egress proxy's run CA for the
// run: the image's bundle plus the run CA go to TrustFile (in /tmp, the
// one writable place, created exclusively and then bound read-only), and
// over the image's bundle when it has one, so clients that read only
// the system bundle trust it too. It runs after pivot_root, so the
// image's bundle is read inside the sandbox's own tree: a symlink in the
// image cannot name a host file.
func installTrust(cfg *nswire.Config) error {
	if !filepath.IsAbs(cfg.TrustFile) || !filepath.IsAbs(cfg.TrustBundle) {
		return fmt.Errorf("setup: trust paths %q, %q are not absolute", cfg.TrustFile, cfg.TrustBundle)
	}
	var bundle []byte
	imageHas := false
	if f, err := os.Open(cfg.TrustBundle); err == nil {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			bundle, err = io.ReadAll(io.LimitReader(f, maxTrustBundle+1))
			if err != nil || len(bundle) > maxTrustBundle {
				f.Close()
				return fmt.Errorf("read the image's CA bundle %s: too large or unreadable", cfg.TrustBundle)
			}
			imageHas = true
		}
		f.Close()
	}
	data := append(append(bundle, '\n'), cfg.TrustPEM...)
	f, err := os.OpenFile(cfg.TrustFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o444)
	if err != nil {
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write the run CA bundle: %w", err)
	}
	// Read-only, so the program cannot swap what it trusts for the rest
	// of the run behind a later process's back (sticky /tmp already
	// keeps it from deleting the file).
	if err := readonly(cfg.TrustFile); err != nil {
		return err
	}
	if !imageHas {
		return nil
	}
	if err := unix.Mount(cfg.TrustFile, cfg.TrustBundle, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the run CA bundle over %s: %w", cfg.TrustBundle, err)
	}
	if err := rootfs.SetAttr(cfg.TrustBundle, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return fmt.Errorf("make %s read-only: %w", cfg.TrustBundle, err)
	}
	return nil
}

// rootAttr is the image root's mount attributes: never setuid binaries or
// device nodes, and read-only unless it is a build step's tree
// (Setup.WritableRoot), which the step exists to change.
func rootAttr(writable bool) uint64 {
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !writable {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	return attr
}

// confineProcDevTmp masks and write-protects the mounted /proc under root,
// builds the sandbox's /dev and mounts its bounded /tmp: the same for a
// run's root and an OCI container's.
func confineProcDevTmp(root string, cfg *nswire.Config) error {
	for _, p := range maskedPaths {
		if err := mask(root, p); err != nil {
			return err
		}
	}
	for _, p := range readonlyPaths {
		if err := readonly(filepath.Join(root, p)); err != nil {
			return err
		}
	}
	if err := buildDev(filepath.Join(root, "dev")); err != nil {
		return err
	}
	// /tmp: small, memory-backed, world-writable with the sticky bit,
	// bounded in bytes and inodes so it cannot be used to exhaust memory.
	tmpOpts := fmt.Sprintf("mode=1777,size=%d,nr_inodes=%d", cfg.TmpBytes, cfg.TmpFiles)
	if err := unix.Mount("tmpfs", filepath.Join(root, "tmp"), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return fmt.Errorf("mount /tmp: %w", err)
	}
	return nil
}

// mountPoints creates the directories buildRoot mounts on where a
// writable root lacks them. Mkdir does not follow a final symlink, and
// a symlink already there makes the mount below fail, never land outside.
func mountPoints(root string) error {
	for _, d := range []struct {
		name string
		mode os.FileMode
	}{{"proc", 0o555}, {"dev", 0o755}, {"tmp", 0o755}, {"workspace", 0o755}} {
		if err := os.Mkdir(filepath.Join(root, d.name), d.mode); err != nil && !os.IsExist(err) {
			return fmt.Errorf("create mount point /%s in the build tree: %w", d.name, err)
		}
	}
	return nil
}

// buildDev makes a minimal /dev: a tiny tmpfs holding bind mounts of the
// harmless host devices and the usual symlinks, then made read-only.
func buildDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k,nr_inodes=64"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devices {
		target := filepath.Join(dev, d)
		f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0666)
		if err != nil {
			return fmt.Errorf("create /dev/%s: %w", d, err)
		}
		f.Close()
		if err := unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/%s: %w", d, err)
		}
	}
	// /dev/tty is the caller's controlling terminal, whatever it is: a
	// terminal of the sandbox's own devpts below, or none (ENXIO). A host
	// without the node (a minimal container) leaves it out.
	if _, err := os.Stat("/dev/tty"); err == nil {
		target := filepath.Join(dev, "tty")
		if err := os.WriteFile(target, nil, 0o666); err != nil {
			return fmt.Errorf("create /dev/tty: %w", err)
		}
		if err := unix.Mount("/dev/tty", target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind /dev/tty: %w", err)
		}
	}
	// A devpts instance of the sandbox's own (a new one is all a user
	// namespace can mount): terminals for commands started with a TTY and
	// for the program's own (script, expect), none shared with the host
	// or another sandbox, at most maxPTYs at once.
	pts := filepath.Join(dev, "pts")
	if err := os.Mkdir(pts, 0o755); err != nil {
		return fmt.Errorf("create /dev/pts: %w", err)
	}
	if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, fmt.Sprintf("newinstance,ptmxmode=0666,mode=0600,max=%d", maxPTYs)); err != nil {
		return fmt.Errorf("mount /dev/pts: %w", err)
	}
	// nosuid and noexec on /dev and every device below it at once; the
	// devices must keep dev, so nodev goes on /dev alone, at the end.
	if err := unix.MountSetattr(unix.AT_FDCWD, dev, unix.AT_SYMLINK_NOFOLLOW|unix.AT_RECURSIVE, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}); err != nil {
		return fmt.Errorf("restrict the devices in /dev: %w", err)
	}
	links := [][2]string{
		{"/proc/self/fd", "fd"},
		{"/proc/self/fd/0", "stdin"},
		{"/proc/self/fd/1", "stdout"},
		{"/proc/self/fd/2", "stderr"},
		// POSIX shared memory and semaphores (Python multiprocessing) live
		// in /dev/shm; point it at the bounded /tmp rather than adding
		// another writable filesystem.
		{"../tmp", "shm"},
		{"pts/ptmx", "ptmx"},
	}
	for _, l := range links {
		if err := os.Symlink(l[0], filepath.Join(dev, l[1])); err != nil {
			return fmt.Errorf("create /dev/%s: %w", l[1], err)
		}
	}
	return rootfs.SetAttr(dev, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NODEV)
}

// mask hides p (relative to the image root): files behind /dev/null,
// directories behind an empty read-only tmpfs. Paths the kernel does not
// have are skipped.
func mask(root, p string) error {
	target := filepath.Join(root, p)
	fi, err := os.Lstat(target)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	if fi.IsDir() {
		err = unix.Mount("tmpfs", target, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1")
	} else {
		err = unix.Mount("/dev/null", target, "", unix.MS_BIND, "")
	}
	if err != nil {
		return fmt.Errorf("mask %s: %w", p, err)
	}
	return nil
}

// readonly bind-mounts target over itself read-only.
func readonly(target string) error {
	if _, err := os.Lstat(target); os.IsNotExist(err) {
		return nil
	}
	if err := unix.Mount(target, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", target, err)
	}
	if err := rootfs.SetAttr(target, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC); err != nil {
		return fmt.Errorf("make %s read-only: %w", target, err)
	}
	return nil
}
