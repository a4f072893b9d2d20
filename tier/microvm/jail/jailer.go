package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/rootfs"
	"github.com/moat-sandbox/moat/seccomp"
)

func init() {
	// Per-thread state the program must inherit (the cgroup namespace,
	// no_new_privs, the capability sets, the parent-death signal) is set
	// on the thread that execs it: keep main on one OS thread.
	if IsJailer() {
		runtime.LockOSThread()
	}
}

// IsJailer reports whether this process was started as the jailer.
func IsJailer() bool { return len(os.Args) > 2 && os.Args[1] == Arg }

// Main is the jailer: it builds the jail described by its config pipe and
// execs the program in it. It never returns.
func Main() {
	// Only Start runs the jailer, as PID 1 of a new PID namespace with its
	// pipes after the program's files. Anyone else typing the hidden
	// argument gets an explanation, not a half-built jail.
	n, err := strconv.Atoi(os.Args[2])
	if os.Getpid() != 1 || err != nil || n < 0 || n > 64 {
		fmt.Fprintln(os.Stderr, "moat: "+Arg+" is Moat's internal VMM jailer; use 'moat run --tier microvm'")
		os.Exit(2)
	}
	cfgFD, statusFD := 3+n, 4+n
	// The status pipe must not reach the program: its EOF tells Start the
	// exec happened.
	unix.CloseOnExec(statusFD)
	err = run(cfgFD, statusFD)
	// Only a failure returns.
	status := os.NewFile(uintptr(statusFD), "status")
	fmt.Fprintf(status, "%v", err)
	os.Exit(1)
}

func run(cfgFD, statusFD int) error {
	f := os.NewFile(uintptr(cfgFD), "config")
	c, err := readConfig(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if c.UID <= UIDBase || c.UID > UIDLimit {
		return fmt.Errorf("uid %d is outside the jail's range", c.UID)
	}
	if len(c.Seccomp) == 0 {
		return errors.New("the config has no seccomp filter; a jailed program never runs unfiltered")
	}
	// Start placed us in the run's cgroup before sending the config: a
	// cgroup namespace made now has that cgroup as its root, so the
	// program sees "/" there, not the host's cgroup tree.
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare the cgroup namespace: %w", err)
	}
	if err := buildRoot(c); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte("moat-vmm")); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	// No core dumps (a VMM's core is the guest's memory), and a bounded
	// descriptor table. syscall.Setrlimit, not unix's: it also stops the
	// Go runtime from restoring its own RLIMIT_NOFILE at exec.
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fmt.Errorf("setrlimit core: %w", err)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: c.NoFile, Max: c.NoFile}); err != nil {
		return fmt.Errorf("setrlimit nofile=%d: %w", c.NoFile, err)
	}
	if err := dropPrivileges(c.UID); err != nil {
		return err
	}
	// The credential change cleared the parent-death signal (the kernel
	// resets it on any uid, gid or capability change); set it again on
	// this thread, which the program inherits across exec.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set the parent-death signal: %w", err)
	}
	// If moat died before that, no signal will come. As PID 1 of our own
	// namespace getppid() is 0 whoever the parent is; moat's end of the
	// status pipe tells instead: closed, poll reports an error on ours.
	fds := []unix.PollFd{{Fd: int32(statusFD)}}
	if k, err := unix.Poll(fds, 0); err == nil && k > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0 {
		return errors.New("moat went away during the jail's setup")
	}
	// no_new_privs: the program can never gain a privilege by exec (it is
	// also what lets QEMU install its seccomp filter unprivileged).
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	// Files the program creates (its sockets) are its own alone.
	unix.Umask(0o077)
	// The program gets stdio and its files 3..3+NFiles-1; everything else
	// (the config and status pipes, the Go runtime's descriptors) closes
	// at exec.
	if err := unix.CloseRange(uint(3+c.NFiles), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fmt.Errorf("mark descriptors close-on-exec: %w", err)
	}
	// Last, the filter (on every thread of the jailer, so none of them
	// runs unfiltered, and inherited across the exec). The program may
	// stack its own on top (QEMU's -sandbox); the kernel applies the
	// stricter answer of the two to every system call.
	if err := seccomp.Install(c.Seccomp); err != nil {
		return fmt.Errorf("install the seccomp filter: %w", err)
	}
	err = syscall.Exec(c.Path, c.Args, c.Env)
	return fmt.Errorf("exec %s: %w", c.Path, err)
}

// buildRoot mounts a small tmpfs on c.Root, binds every Mount into it,
// makes the devices, and pivots into it. Everything happens in the mount
// namespace Start made for us, after which the host's tree is detached.
func buildRoot(c *config) error {
	// No mount event may propagate back to the host (or in from it).
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	// The new root holds only directories and mount points: tiny, and
	// nosuid, nodev, noexec (the binds below carry their own flags).
	if err := unix.Mount("tmpfs", c.Root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=256k,nr_inodes=1024"); err != nil {
		return fmt.Errorf("mount the jail's root on %s: %w", c.Root, err)
	}
	for _, m := range c.Mounts {
		if err := bind(c.Root, m); err != nil {
			return err
		}
	}
	if len(c.Devices) > 0 {
		if err := makeDev(c.Root, c.Devices, c.UID); err != nil {
			return err
		}
	}
	// Read-only once populated: nothing in the jail is writable but the
	// Writable binds.
	if err := rootfs.SetAttr(c.Root, unix.MOUNT_ATTR_RDONLY); err != nil {
		return fmt.Errorf("make the jail's root read-only: %w", err)
	}
	// Into the jail's root, the host's tree detached.
	return rootfs.PivotInto(c.Root)
}

// bind mounts m.Source on its target below root: read-only, nosuid,
// nodev, and noexec unless it is program code.
func bind(root string, m Mount) error {
	t := filepath.Join(root, m.Target)
	fi, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount %s: %w", m.Source, err)
	}
	if err := os.MkdirAll(filepath.Dir(t), 0o755); err != nil {
		return fmt.Errorf("mount point for %s: %w", m.Target, err)
	}
	// The mount point: a directory or an empty file of the root tmpfs.
	if fi.IsDir() {
		err = os.Mkdir(t, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(t, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("mount point for %s: %w", m.Target, err)
	}
	// Not MS_REC: what is mounted below a source directory stays out.
	if err := unix.Mount(m.Source, t, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", m.Source, m.Target, err)
	}
	// mount_setattr changes only the named attributes: a classic
	// MS_REMOUNT would have to repeat the source mount's locked flags.
	if err := rootfs.SetAttr(t, attrs(m)); err != nil {
		return fmt.Errorf("restrict %s: %w", m.Target, err)
	}
	return nil
}

// attrs are the mount attributes of m: everything read-only but the run
// directory, never setuid or device files, code executable only where it
// is code.
func attrs(m Mount) uint64 {
	a := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !m.Writable {
		a |= unix.MOUNT_ATTR_RDONLY
	}
	if !m.Exec {
		a |= unix.MOUNT_ATTR_NOEXEC
	}
	return a
}

// makeDev makes /dev a tmpfs of its own (the only one without nodev)
// holding just the named device nodes, then read-only. Nodes are made,
// not bound from the host, so /dev/kvm can belong to this VMM's uid
// without touching the host's node.
func makeDev(root string, devs []Device, uid int) error {
	dev := filepath.Join(root, "dev")
	if err := os.Mkdir(dev, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("mkdir /dev: %w", err)
	}
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=16k,nr_inodes=16"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for _, d := range devs {
		p := filepath.Join(root, d.Path)
		if err := unix.Mknod(p, unix.S_IFCHR|d.Mode, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			return fmt.Errorf("mknod %s: %w", d.Path, err)
		}
		owner := 0
		if d.Private {
			owner = uid
		}
		if err := os.Chown(p, owner, 0); err != nil {
			return fmt.Errorf("chown %s: %w", d.Path, err)
		}
		// mknod applied the umask.
		if err := os.Chmod(p, os.FileMode(d.Mode)); err != nil {
			return fmt.Errorf("chmod %s: %w", d.Path, err)
		}
	}
	return rootfs.SetAttr(dev, unix.MOUNT_ATTR_RDONLY)
}

// dropPrivileges makes this thread the unprivileged uid with no
// capability in any set. Order matters: the bounding set can only be
// emptied while we still hold CAP_SETPCAP, i.e. before the uid changes.
func dropPrivileges(uid int) error {
	// Bounding set, on this thread (the one that execs): no exec can ever
	// regain a capability. Capabilities past the kernel's last give EINVAL.
	for c := 0; c < 64; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break
		}
		if err != nil {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear the ambient set: %w", err)
	}
	// No supplementary group: root's would otherwise stay (a VMM needs
	// none; /dev/kvm is made owned by its uid). These calls change every
	// thread of this process (the Go runtime's AllThreadsSyscall).
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(GID, GID, GID); err != nil {
		return fmt.Errorf("setresgid %d: %w", GID, err)
	}
	// Leaving uid 0 (without keep-caps) clears the permitted, effective
	// and ambient sets.
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	// The inheritable set survives a uid change: empty it too.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	// Verify rather than trust: every set empty on this thread.
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	for _, d := range data {
		if d.Effective|d.Permitted|d.Inheritable != 0 {
			return fmt.Errorf("capabilities left after the uid change: %+v", data)
		}
	}
	for c := 0; c < 64; c++ {
		on, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL {
			break
		}
		if err != nil || on != 0 {
			return fmt.Errorf("capability %d still in the bounding set (%v)", c, err)
		}
	}
	return nil
}
