// Package jail confines a virtual machine monitor the way Firecracker's
// jailer does, for any VMM: the caller names the program, its command
// line and the host files it needs; the jail runs it as a dedicated
// unprivileged host user with every capability set empty, no_new_privs,
// a seccomp filter the caller compiles, rlimits and a parent-death signal, in the run's cgroup, in new mount,
// PID, network, IPC, UTS and cgroup namespaces, with a fresh read-only root
// holding only those files.
//
// The work is done by a re-exec of the moat binary under a hidden argument
// (Arg), as runc's init does: namespaces and credentials cannot be changed
// safely in a multithreaded Go process that goes on running. Start is the
// host half, Main the jailer.
//
// This package must never mount a host path writable other than the ones
// the caller marks Writable, never exec the program as host root or with a
// capability, and never leave a mount on the host: every mount is made in
// the jail's own mount namespace, which dies with the program.
package jail

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/seccomp"
)

// Arg is the hidden argument under which the moat binary (or a test binary
// that dispatches it from TestMain) becomes the jailer.
const Arg = "moat-vmm-jail"

// Host ids of jailed programs. Each runs as UIDBase plus its own host pid:
// pids are unique among live processes, so two live VMMs never share a
// uid, and with it the kernel's per-user state (RLIMIT_NPROC's count, the
// user keyring, inotify and pipe-buffer quotas, signal and ptrace
// permission), without any allocation state that a killed moat could
// leave behind. The range lies below the native tier's (one range of
// 65536 per live sandbox from 0x72000000 up) and holds PID_MAX_LIMIT
// (2^22) ids. All jailed programs share
// GID, the one group the files they must open by path (the guest's
// initramfs) are readable by; no host account has these ids (New of the
// microvm tier refuses a host whose /etc/passwd or /etc/group uses them).
const (
	UIDBase  = 0x71000000
	GID      = 0x71000000
	MaxPid   = 1 << 22
	UIDLimit = UIDBase + MaxPid
)

// Mount is one host file or directory in the jail.
type Mount struct {
	// Source is the host path. Symlinks in it are followed (the caller
	// resolves them); a directory is bound without what is mounted below it.
	Source string `json:"source"`
	// Target is the absolute path inside the jail.
	Target string `json:"target"`
	// Exec marks program code (the VMM and its shared libraries): every
	// other mount is noexec.
	Exec bool `json:"exec,omitempty"`
	// Writable marks the program's own run directory (its sockets): the
	// only read-write mount. Start gives the directory to the program's
	// uid, mode 0700.
	Writable bool `json:"writable,omitempty"`
}

// Device is a character device node made in the jail's /dev (never a bind
// of the host's node, so its owner and mode are the jail's own).
type Device struct {
	Path  string `json:"path"` // absolute, below /dev
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	Mode  uint32 `json:"mode"` // permission bits
	// Private makes the node owned by the program's uid (e.g. /dev/kvm,
	// mode 0600: this VMM alone may open it); otherwise it is root's.
	Private bool `json:"private,omitempty"`
}

// HostDevice describes the host's character device at path for the jail.
func HostDevice(path string, mode uint32, private bool) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("device %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return Device{}, fmt.Errorf("device %s is not a character device", path)
	}
	return Device{Path: path, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev), Mode: mode, Private: private}, nil
}

// Spec is one program to run jailed.
type Spec struct {
	// Path is the program inside the jail; Args its argv (argv[0] too).
	Path string
	Args []string
	Env  []string
	// Mounts are the host files the program may see, read-only unless
	// marked Writable. Nothing else of the host's tree is in the jail.
	Mounts []Mount
	// Devices are made in the jail's /dev.
	Devices []Device
	// NoFile is RLIMIT_NOFILE (0: 1024). RLIMIT_CORE is always 0.
	NoFile uint64
	// Root is an empty host directory the jail's root tmpfs is mounted on,
	// in the jail's own mount namespace (the host never sees that mount).
	Root string
	// Files are the program's descriptors 3, 4, ... (nil leaves one
	// closed). The program gets these and stdio, nothing else.
	Files []*os.File
	// Stderr receives the jailer's and then the program's standard error.
	Stderr io.Writer
	// Seccomp is the filter the jailer installs last, right before the
	// exec, on top of no_new_privs. It is required: a jailed program never
	// runs unfiltered, whatever filter it may add itself (QEMU's -sandbox).
	Seccomp seccomp.Program
}

// config is what the jailer reads from its config pipe.
type config struct {
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	Mounts  []Mount  `json:"mounts"`
	Devices []Device `json:"devices"`
	NoFile  uint64   `json:"nofile"`
	Root    string   `json:"root"`
	UID     int      `json:"uid"`
	NFiles  int      `json:"nfiles"`
	// Seccomp is Spec.Seccomp; the jailer refuses a config without one.
	Seccomp seccomp.Program `json:"seccomp"`
}

// maxConfig bounds the config frame the jailer reads.
const maxConfig = 1 << 20

// setupTimeout bounds the jail's setup (milliseconds when the host is
// idle); past it the jailer is killed and Start fails, saying where its
// threads were waiting. Generous: in CI a microVM run's jailer once had
// not exec'd QEMU after 30 s, on a two-core host running several test
// packages' TCG VMs at once.
const setupTimeout = 2 * time.Minute

// check refuses a Spec the jailer could not build safely: relative or
// unclean paths (a target with .. could land outside the new root), two
// mounts on one target, devices outside /dev.
func (s *Spec) check() error {
	abs := func(what, p string) error {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			return fmt.Errorf("jail: %s %q must be a clean absolute path other than /", what, p)
		}
		return nil
	}
	if err := abs("program", s.Path); err != nil {
		return err
	}
	if len(s.Args) == 0 {
		return errors.New("jail: no argv")
	}
	if len(s.Seccomp) == 0 {
		return errors.New("jail: no seccomp filter; a jailed program never runs unfiltered")
	}
	if err := abs("root", s.Root); err != nil {
		return err
	}
	seen := map[string]bool{}
	for _, m := range s.Mounts {
		if err := abs("mount source", m.Source); err != nil {
			return err
		}
		if err := abs("mount target", m.Target); err != nil {
			return err
		}
		if seen[m.Target] {
			return fmt.Errorf("jail: two mounts on %s", m.Target)
		}
		seen[m.Target] = true
	}
	for _, d := range s.Devices {
		if err := abs("device", d.Path); err != nil {
			return err
		}
		if filepath.Dir(d.Path) != "/dev" {
			return fmt.Errorf("jail: device %s is not directly below /dev", d.Path)
		}
		if seen[d.Path] || d.Mode&^0o777 != 0 {
			return fmt.Errorf("jail: device %s: mounted twice or mode %o beyond permission bits", d.Path, d.Mode)
		}
		seen[d.Path] = true
	}
	for t := range seen {
		if strings.HasPrefix(t, "/dev/") && !slices.ContainsFunc(s.Devices, func(d Device) bool { return d.Path == t }) {
			return fmt.Errorf("jail: %s: /dev holds only the devices the jail makes", t)
		}
	}
	return nil
}

// UIDOf is the host uid a jailed program with host pid pid runs as.
func UIDOf(pid int) (int, error) {
	if pid <= 0 || pid > MaxPid {
		return 0, fmt.Errorf("jail: pid %d outside 1..%d", pid, MaxPid)
	}
	return UIDBase + pid, nil
}

// Start runs the program of s jailed and returns once it has been exec'd
// in the jail, or with the reason the jail could not be built (then the
// jailer is dead and nothing of it is left; the caller still owns s.Files).
// exe is the binary that dispatches Arg (the moat binary, or a test
// binary). cg is the run's cgroup, which the jailer joins before anything
// of the jail is built; nil leaves the program in moat's own cgroup (only
// for a VMM that runs no untrusted code, such as a boot test).
//
// The setup protocol, over two pipes that follow the program's files:
//
//	moat (Start)                            jailer (Main), root, new mnt/pid/net/ipc/uts ns
//	  start the jailer ---------------------> (cgroup v2: born in the run's cgroup)
//	  cgroup v1: move it into the cgroup
//	  give Writable dirs to UIDBase+pid
//	  write the config ------(config)------>  read it; unshare the cgroup ns; build the
//	                                          root and pivot into it; rlimits; drop to
//	                                          the uid; parent-death signal; no_new_privs;
//	                                          the seccomp filter
//	  read until EOF  <------(status)-------  on failure: the reason, exit 1;
//	                                          on success: exec (status is close-on-exec: EOF)
func Start(exe string, s *Spec, cg *cgroup.Cgroup) (_ *exec.Cmd, err error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	defer cfgW.Close()
	stR, stW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		return nil, fmt.Errorf("jail: %w", err)
	}
	defer stR.Close()
	n := len(s.Files)
	cmd := &exec.Cmd{
		Path: exe,
		Args: []string{"moat-vmm-jail", Arg, strconv.Itoa(n)},
		// Nothing of moat's environment. One P: the jailer's threads count
		// against the run's pids limit until the exec.
		Env:        []string{"GOMAXPROCS=1"},
		Stderr:     s.Stderr,
		ExtraFiles: append(slices.Clone(s.Files), cfgR, stW),
		SysProcAttr: &syscall.SysProcAttr{
			// No user namespace: the jailer is real root while it builds the
			// jail, and the namespaces it made belong to the host's user
			// namespace, in which the program then holds no capability at
			// all (so it cannot mount, unmount or setns in them).
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS,
			// Its own process group (the caller kills the group), and death
			// with moat. The jailer sets the signal again after its uid
			// changes, which clears it.
			Setpgid:   true,
			Pdeathsig: unix.SIGKILL,
		},
	}
	v2 := false
	if cg != nil {
		if fd, ok := cg.FD(); ok {
			// cgroup v2: born inside the run's cgroup, no window outside it.
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
			v2 = true
		}
	}
	err = cmd.Start()
	cfgR.Close()
	stW.Close()
	if err != nil {
		return nil, fmt.Errorf("jail: start %s: %w", exe, err)
	}
	defer func() {
		if err != nil {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	if cg != nil && !v2 {
		// cgroup v1: the jailer reads its config only after this, so the
		// program never runs outside the cgroup.
		if err := cg.Add(cmd.Process.Pid); err != nil {
			return nil, fmt.Errorf("jail: %w", err)
		}
	}
	uid, err := UIDOf(cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	for _, m := range s.Mounts {
		if !m.Writable {
			continue
		}
		if err := os.Chown(m.Source, uid, GID); err != nil {
			return nil, fmt.Errorf("jail: give %s to uid %d: %w", m.Source, uid, err)
		}
		if err := os.Chmod(m.Source, 0o700); err != nil {
			return nil, fmt.Errorf("jail: %w", err)
		}
	}
	c := config{Path: s.Path, Args: s.Args, Env: s.Env, Mounts: s.Mounts, Devices: s.Devices, NoFile: s.NoFile, Root: s.Root, UID: uid, NFiles: n, Seccomp: s.Seccomp}
	if c.NoFile == 0 {
		c.NoFile = 1024
	}
	if err := writeConfig(cfgW, &c); err != nil {
		return nil, fmt.Errorf("jail: send config: %w", err)
	}
	cfgW.Close()
	stR.SetReadDeadline(time.Now().Add(setupTimeout))
	msg, rerr := io.ReadAll(io.LimitReader(stR, 4096))
	if len(msg) > 0 {
		return nil, fmt.Errorf("jail: %s", sanitize(msg))
	}
	if rerr != nil {
		return nil, fmt.Errorf("jail: setup did not finish within %v (%s): %w", setupTimeout, whereStuck(cmd.Process.Pid), rerr)
	}
	// EOF without a word: the jailer exec'd the program (or died, which
	// the caller sees as the program's exit, with its stderr).
	return cmd, nil
}

// whereStuck says, for a jailer that did not finish its setup, each of its
// threads' state and the kernel function it sleeps in (/proc's stat and
// wchan), so that a timeout can be told apart: a thread in D state waiting
// on a mount lock, one stopped in exec, a runnable one starved of CPU.
func whereStuck(pid int) string {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/[0-9]*", pid))
	var out []string
	for _, t := range tasks {
		st, err := os.ReadFile(filepath.Join(t, "stat"))
		if err != nil {
			continue
		}
		state := "?"
		if i := bytes.LastIndexByte(st, ')'); i >= 0 {
			if f := strings.Fields(string(st[i+1:])); len(f) > 0 {
				state = f[0]
			}
		}
		wchan, _ := os.ReadFile(filepath.Join(t, "wchan"))
		out = append(out, fmt.Sprintf("thread %s state %s in %s", filepath.Base(t), state, sanitize(wchan)))
		if len(out) == 8 {
			break
		}
	}
	if len(out) == 0 {
		return "the jailer is gone"
	}
	return strings.Join(out, "; ")
}

func writeConfig(w io.Writer, c *config) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if len(b) > maxConfig {
		return fmt.Errorf("config of %d bytes exceeds %d", len(b), maxConfig)
	}
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(b)))
	_, err = w.Write(append(hdr[:], b...))
	return err
}

func readConfig(r io.Reader) (*config, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxConfig {
		return nil, fmt.Errorf("config of %d bytes exceeds %d", n, maxConfig)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// sanitize keeps a jailer's message printable and short.
func sanitize(b []byte) string {
	s := strings.TrimSpace(string(b))
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
}
