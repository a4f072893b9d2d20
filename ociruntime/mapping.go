package ociruntime

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

// RefusalError is a config.json Moat will not run: the field, the value
// and how to make it acceptable. The engine shows it to its user (the shim
// reads the runtime's log), so it must say all three.
type RefusalError struct {
	Field string
	Value string
	Fix   string
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("moat refuses config.json %s = %s: %s", e.Field, e.Value, e.Fix)
}

func refuse(field, value, fix string) error {
	return &RefusalError{Field: field, Value: value, Fix: fix}
}

// Container is a config.json mapped onto Moat's sandbox: what the runtime
// builds, with nothing left to decide.
type Container struct {
	// RootFS is the bundle's root filesystem (absolute host path).
	RootFS       string
	ReadonlyRoot bool
	RootBytes    int64
	TmpBytes     int64
	Hostname     string
	UID, GID     int
	// KeepCaps are the capabilities a uid-0 program keeps inside its user
	// namespace (a subset of nswire.BuildCaps).
	KeepCaps []int
	Argv     []string
	Env      []string
	Cwd      string
	Rlimits  []nswire.Rlimit
	Limits   cgroup.Limits
	// Join maps "network", "ipc", "uts" to the path of a namespace to
	// join (a pod's); absent: a new one.
	Join   map[string]string
	Mounts []ContainerMount
	// Terminal, when set, is the size of the terminal the program gets
	// (process.terminal), whose master goes to the console socket.
	Terminal *nswire.Winsize
	// UnprivilegedPortStart, when set, is the container's own network
	// namespace's net.ipv4.ip_unprivileged_port_start.
	UnprivilegedPortStart *int
	// OOMScoreAdj, when set, is written for the container's init.
	OOMScoreAdj *int
	Hooks       *Hooks
	// Egress, when set, gives the container Moat's network instead of
	// the engine's (AnnotationEgress).
	Egress *Egress
	// Notes say what the spec asked for and Moat did not give, for the
	// log.
	Notes []string
}

// ContainerMount is a mount Moat makes in the container beyond its own.
type ContainerMount struct {
	Dest string
	// Type is "bind" (Source is a host path) or "tmpfs".
	Type      string
	Source    string
	ReadOnly  bool
	Recursive bool
	Data      string
}

// EngineStateDirs are where containerd's CRI plugin, Docker and the
// kubelet keep the per-container files they bind into every container.
var EngineStateDirs = []string{
	"/var/lib/containerd",
	"/run/containerd",
	"/var/run/containerd",
	"/var/lib/docker/containers",
	"/var/lib/kubelet/pods",
}

// engineFiles are the destinations engines always bind from their state
// directories.
var engineFiles = []string{"/etc/hosts", "/etc/hostname", "/etc/resolv.conf"}

// moatOwnedDirs are where Moat makes its own filesystems; the spec's
// mounts there (proc, sysfs, devpts, mqueue, cgroup, the engines' /dev
// tmpfs, /dev/shm, /dev/termination-log) are replaced by Moat's.
var moatOwnedDirs = []string{"/proc", "/dev", "/sys"}

// engineCaps are the capabilities Docker and containerd's CRI give every
// container by default. A spec may ask for them (it always does) and gets
// none of them; with the policy's namespaced_capabilities a uid-0
// program keeps those of them that are nswire.BuildCaps, inside its user
// namespace only. Any other is "more than an engine's default": refused.
var engineCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

var capNumbers = map[string]int{
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_FOWNER": unix.CAP_FOWNER,
	"CAP_FSETID": unix.CAP_FSETID, "CAP_SETUID": unix.CAP_SETUID, "CAP_SETGID": unix.CAP_SETGID, "CAP_KILL": unix.CAP_KILL,
}

// defaultDevices are the device nodes Moat's /dev has.
var defaultDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

var rlimitNumbers = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}

// maxContainerID is the largest uid or gid a container may use: its user
// namespace maps 65536 ids.
const maxContainerID = 65535

// Map turns a config.json into the container Moat runs, or refuses it.
// bundle is the bundle directory (absolute); pol the operator's policy.
// It is pure: it reads no file, so every refusal is testable as data;
// what only the host can tell (that a namespace path is the host's own,
// that a bind source resolves inside its allowed directory) the runtime
// checks after it.
func Map(s *Spec, bundle string, pol *Policy) (*Container, error) {
	if pol == nil {
		pol = &Policy{}
	}
	c := &Container{RootBytes: DefaultRootBytes, TmpBytes: DefaultTmpBytes, Join: map[string]string{}}
	if pol.RootBytes > 0 {
		c.RootBytes = pol.RootBytes
	}
	if pol.TmpBytes > 0 {
		c.TmpBytes = pol.TmpBytes
	}
	// privileged handles an ask for more than Moat gives: refused, or,
	// where the operator accepts such specs, noted and not granted.
	privileged := func(field, value, what string) error {
		if pol.AcceptPrivileged {
			c.Notes = append(c.Notes, fmt.Sprintf("%s = %s not granted: %s", field, value, what))
			return nil
		}
		return refuse(field, value, what+"; remove it from the container's configuration, or set accept_privileged: true in the runtime policy ("+DefaultPolicyFile+") to run such specs without it")
	}

	if s.Root == nil || s.Root.Path == "" {
		return nil, refuse("root.path", `""`, "the bundle must name its root filesystem")
	}
	c.RootFS = s.Root.Path
	if !filepath.IsAbs(c.RootFS) {
		c.RootFS = filepath.Join(bundle, c.RootFS)
	}
	c.ReadonlyRoot = s.Root.Readonly
	c.Hostname = s.Hostname
	if s.Process == nil {
		return nil, refuse("process", "null", "a container needs a process to run")
	}
	if err := mapProcess(c, s.Process, pol, privileged); err != nil {
		return nil, err
	}
	if s.Hooks != nil {
		if n := countHooks(s.Hooks); n > 0 {
			if !pol.hooksAllowed() {
				return nil, refuse("hooks", fmt.Sprintf("%d hooks (first: %s)", n, firstHook(s.Hooks)), "the runtime policy ("+DefaultPolicyFile+") has hooks: false; remove the hooks from the engine's configuration, or the policy line (Docker puts a network hook in every container)")
			}
			c.Hooks = s.Hooks
			if n := len(s.Hooks.CreateContainer) + len(s.Hooks.StartContainer); n > 0 {
				c.Notes = append(c.Notes, fmt.Sprintf("%d createContainer/startContainer hooks not run: they would run inside the container", n))
			}
		}
	}
	if err := mapMounts(c, s.Mounts, pol); err != nil {
		return nil, err
	}
	if s.Linux == nil {
		return nil, refuse("linux", "null", "Moat needs the linux section's namespaces: a spec without it shares every host namespace")
	}
	if err := mapLinux(c, s.Linux, privileged); err != nil {
		return nil, err
	}
	if err := mapEgress(c, s.Annotations, pol); err != nil {
		return nil, err
	}
	return c, nil
}

func mapProcess(c *Container, p *Process, pol *Policy, privileged func(field, value, what string) error) error {
	if p.Terminal {
		c.Terminal = &nswire.Winsize{Rows: 24, Cols: 80}
		if cs := p.ConsoleSize; cs != nil && cs.Height > 0 && cs.Width > 0 {
			c.Terminal = &nswire.Winsize{Rows: cs.Height, Cols: cs.Width}
		}
	}
	if len(p.Args) == 0 || p.Args[0] == "" {
		return refuse("process.args", fmt.Sprintf("%q", p.Args), "name the program to run")
	}
	c.Argv = p.Args
	c.Env = p.Env
	c.Cwd = p.Cwd
	if c.Cwd == "" {
		c.Cwd = "/"
	}
	if !filepath.IsAbs(c.Cwd) {
		return refuse("process.cwd", strconv.Quote(p.Cwd), "the working directory must be an absolute path")
	}
	if p.User.UID > maxContainerID || p.User.GID > maxContainerID {
		return refuse("process.user", fmt.Sprintf("uid %d gid %d", p.User.UID, p.User.GID), fmt.Sprintf("a container's user namespace maps ids 0-%d; use an id in that range", maxContainerID))
	}
	c.UID, c.GID = int(p.User.UID), int(p.User.GID)
	if len(p.User.AdditionalGids) > 0 {
		c.Notes = append(c.Notes, fmt.Sprintf("process.user.additionalGids %v not set: Moat's user namespace denies setgroups", p.User.AdditionalGids))
	}
	if p.Capabilities != nil {
		caps := slices.Concat(p.Capabilities.Bounding, p.Capabilities.Effective, p.Capabilities.Permitted, p.Capabilities.Inheritable, p.Capabilities.Ambient)
		slices.Sort(caps)
		caps = slices.Compact(caps)
		for _, name := range caps {
			if !slices.Contains(engineCaps, name) {
				if err := privileged("process.capabilities", name, "a capability beyond an engine's default set"); err != nil {
					return err
				}
			}
		}
		keep := pol != nil && pol.NamespacedCapabilities
		if c.UID == 0 && !keep && len(p.Capabilities.Effective) > 0 {
			c.Notes = append(c.Notes, fmt.Sprintf("process.capabilities.effective %v not kept: a container's program has no capability (namespaced_capabilities: true in the runtime policy keeps CHOWN, DAC_OVERRIDE, FOWNER, FSETID, SETUID, SETGID and KILL inside its user namespace)", p.Capabilities.Effective))
		}
		if c.UID == 0 && keep {
			for _, name := range p.Capabilities.Permitted {
				if n, ok := capNumbers[name]; ok && slices.Contains(p.Capabilities.Effective, name) && !slices.Contains(c.KeepCaps, n) {
					c.KeepCaps = append(c.KeepCaps, n)
				}
			}
			slices.Sort(c.KeepCaps)
		}
	}
	for _, r := range p.Rlimits {
		n, ok := rlimitNumbers[r.Type]
		if !ok {
			return refuse("process.rlimits", strconv.Quote(r.Type), "not a Linux rlimit; use RLIMIT_NOFILE, RLIMIT_NPROC, ...")
		}
		if r.Soft > r.Hard {
			return refuse("process.rlimits", fmt.Sprintf("%s soft %d > hard %d", r.Type, r.Soft, r.Hard), "the soft limit must not exceed the hard one")
		}
		c.Rlimits = append(c.Rlimits, nswire.Rlimit{Resource: n, Soft: r.Soft, Hard: r.Hard})
	}
	if p.OOMScoreAdj != nil {
		if *p.OOMScoreAdj < -1000 || *p.OOMScoreAdj > 1000 {
			return refuse("process.oomScoreAdj", strconv.Itoa(*p.OOMScoreAdj), "must be -1000 to 1000")
		}
		v := max(*p.OOMScoreAdj, 0) // never less likely to be killed than the host's own processes
		c.OOMScoreAdj = &v
	}
	if p.ApparmorProfile != "" || p.SelinuxLabel != "" {
		c.Notes = append(c.Notes, "process.apparmorProfile/selinuxLabel ignored: Moat confines with its own seccomp policy, Landlock and namespaces")
	}
	return nil
}

func countHooks(h *Hooks) int {
	return len(h.Prestart) + len(h.CreateRuntime) + len(h.CreateContainer) + len(h.StartContainer) + len(h.Poststart) + len(h.Poststop)
}

func firstHook(h *Hooks) string {
	for _, l := range [][]Hook{h.Prestart, h.CreateRuntime, h.CreateContainer, h.StartContainer, h.Poststart, h.Poststop} {
		if len(l) > 0 {
			return l[0].Path
		}
	}
	return ""
}

// under reports whether p is dir or inside it (lexically; p is clean).
func under(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func mapMounts(c *Container, mounts []Mount, pol *Policy) error {
	for i, m := range mounts {
		field := fmt.Sprintf("mounts[%d]", i)
		dest := m.Destination
		if !filepath.IsAbs(dest) || filepath.Clean(dest) != dest || strings.Contains(dest, "\x00") {
			return refuse(field+".destination", strconv.Quote(dest), "must be a clean absolute path")
		}
		if dest == "/" {
			return refuse(field+".destination", `"/"`, "the root is the bundle's rootfs; mount below it")
		}
		owned := slices.ContainsFunc(moatOwnedDirs, func(d string) bool { return under(dest, d) })
		switch m.Type {
		case "proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2":
			if !owned {
				return refuse(field, m.Type+" on "+dest, "Moat mounts its own "+m.Type+" where it belongs; remove this mount")
			}
			continue // Moat's own
		case "tmpfs":
			if owned {
				continue // Moat's own /dev, /dev/shm
			}
			data, ro, err := tmpfsData(m.Options)
			if err != nil {
				return refuse(field+".options", strconv.Quote(strings.Join(m.Options, ",")), err.Error())
			}
			c.Mounts = append(c.Mounts, ContainerMount{Dest: dest, Type: "tmpfs", ReadOnly: ro, Data: data})
			continue
		case "bind", "":
			if m.Type == "" && !slices.Contains(m.Options, "bind") && !slices.Contains(m.Options, "rbind") {
				return refuse(field+".type", `""`, "name the filesystem type, or give the bind option")
			}
		default:
			return refuse(field+".type", strconv.Quote(m.Type), "Moat mounts tmpfs and binds allowed by its policy only")
		}
		src := m.Source
		if !filepath.IsAbs(src) || filepath.Clean(src) != src {
			return refuse(field+".source", strconv.Quote(src), "a bind source must be a clean absolute host path")
		}
		if owned {
			// /dev/shm, /dev/termination-log from the engine's state:
			// Moat's /dev is its own (its /dev/shm is the bounded /tmp).
			if slices.ContainsFunc(pol.engineDirs(), func(d string) bool { return under(src, d) }) {
				c.Notes = append(c.Notes, fmt.Sprintf("%s: bind of %s on %s replaced by Moat's own /dev", field, src, dest))
				continue
			}
			return refuse(field, src+" on "+dest, "Moat makes /proc, /dev and /sys itself; host files are never bound there")
		}
		if !slices.ContainsFunc(pol.bindDirs(dest), func(d string) bool { return under(src, d) }) {
			return refuse(field+".source", strconv.Quote(src)+" on "+dest, "host paths are not bound into containers; add the directory to bind_sources in the runtime policy ("+DefaultPolicyFile+") to allow it")
		}
		c.Mounts = append(c.Mounts, ContainerMount{
			Dest: dest, Type: "bind", Source: src,
			ReadOnly:  slices.Contains(m.Options, "ro"),
			Recursive: slices.Contains(m.Options, "rbind"),
		})
	}
	return nil
}

// maxTmpfsBytes bounds a spec's tmpfs mount; tmpDefault is its size when
// the spec names none (tmpfs's own default, half of RAM, is too much).
const (
	maxTmpfsBytes = 16 << 30
	tmpDefault    = 64 << 20
)

// tmpfsData keeps the tmpfs options Moat honours (size, mode, nr_inodes)
// and says whether the mount is read-only; it always bounds the size.
func tmpfsData(opts []string) (data string, ro bool, err error) {
	size := int64(tmpDefault)
	var out []string
	for _, o := range opts {
		k, v, _ := strings.Cut(o, "=")
		switch k {
		case "ro":
			ro = true
		case "rw", "nosuid", "nodev", "noexec", "exec", "relatime", "strictatime", "private", "rprivate", "slave", "rslave":
		case "size":
			n, err := parseSize(v)
			if err != nil || n <= 0 || n > maxTmpfsBytes {
				return "", false, fmt.Errorf("size %q: give a size from 1 byte to 16g", v)
			}
			size = n
		case "mode":
			if _, err := strconv.ParseUint(v, 8, 32); err != nil {
				return "", false, fmt.Errorf("mode %q: give an octal mode", v)
			}
			out = append(out, "mode="+v)
		case "nr_inodes":
			if _, err := strconv.ParseUint(v, 10, 32); err != nil {
				return "", false, fmt.Errorf("nr_inodes %q: give a number", v)
			}
			out = append(out, "nr_inodes="+v)
		default:
			return "", false, fmt.Errorf("tmpfs option %q is not one Moat honours (size, mode, nr_inodes, ro)", o)
		}
	}
	out = append([]string{"size=" + strconv.FormatInt(size, 10)}, out...)
	return strings.Join(out, ","), ro, nil
}

// parseSize reads a tmpfs size: bytes, or with k, m, g suffix.
func parseSize(v string) (int64, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(v, "k"), strings.HasSuffix(v, "K"):
		mult, v = 1<<10, v[:len(v)-1]
	case strings.HasSuffix(v, "m"), strings.HasSuffix(v, "M"):
		mult, v = 1<<20, v[:len(v)-1]
	case strings.HasSuffix(v, "g"), strings.HasSuffix(v, "G"):
		mult, v = 1<<30, v[:len(v)-1]
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", v)
	}
	return n * mult, nil
}

func mapLinux(c *Container, l *Linux, privileged func(field, value, what string) error) error {
	seen := map[string]bool{}
	for i, ns := range l.Namespaces {
		field := fmt.Sprintf("linux.namespaces[%d]", i)
		if seen[ns.Type] {
			return refuse(field+".type", strconv.Quote(ns.Type), "each namespace type may appear once")
		}
		seen[ns.Type] = true
		switch ns.Type {
		case "network", "ipc", "uts":
			if ns.Path != "" {
				if !filepath.IsAbs(ns.Path) || filepath.Clean(ns.Path) != ns.Path {
					return refuse(field+".path", strconv.Quote(ns.Path), "a namespace path must be a clean absolute path")
				}
				c.Join[ns.Type] = ns.Path
			}
		case "pid", "mount", "user", "cgroup":
			if ns.Path != "" {
				if err := privileged(field+".path", strconv.Quote(ns.Path), "Moat gives every container its own "+ns.Type+" namespace; joining another's is not possible"); err != nil {
					return err
				}
			}
		case "time":
		default:
			return refuse(field+".type", strconv.Quote(ns.Type), "not a Linux namespace type")
		}
	}
	for _, t := range []string{"pid", "mount", "network", "ipc", "uts"} {
		if !seen[t] {
			if err := privileged("linux.namespaces", "no "+t+" namespace", "the container would share the host's "+t+" namespace; Moat always gives it one of its own"); err != nil {
				return err
			}
		}
	}
	for i, d := range l.Devices {
		if !slices.Contains(defaultDevices, d.Path) {
			if err := privileged(fmt.Sprintf("linux.devices[%d]", i), strconv.Quote(d.Path), "Moat's /dev holds only null, zero, full, random, urandom and tty"); err != nil {
				return err
			}
		}
	}
	if len(l.Sysctl) > 0 {
		var refused []string
		for k, v := range l.Sysctl {
			switch k {
			case "net.ipv4.ip_unprivileged_port_start":
				// Docker sets it (0) on every container: a root
				// without CAP_NET_BIND_SERVICE may then bind port 80.
				// Per network namespace; set only in a new one.
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || n > 65536 {
					return refuse("linux.sysctl "+k, strconv.Quote(v), "a port number 0-65536")
				}
				if _, joined := c.Join["network"]; joined {
					c.Notes = append(c.Notes, "linux.sysctl "+k+" not set: the network namespace is the pod's")
				} else {
					c.UnprivilegedPortStart = &n
				}
			case "net.ipv4.ping_group_range":
				// Docker sets it on every container too; ICMP echo
				// sockets for every group is not Moat's to grant.
				c.Notes = append(c.Notes, "linux.sysctl "+k+" = "+v+" not set: Moat's containers keep the kernel's default (no ICMP echo sockets)")
			default:
				refused = append(refused, k)
			}
		}
		slices.Sort(refused)
		if len(refused) > 0 {
			if err := privileged("linux.sysctl", strings.Join(refused, ","), "Moat sets no sysctl for containers but net.ipv4.ip_unprivileged_port_start"); err != nil {
				return err
			}
		}
	}
	if len(l.UIDMappings)+len(l.GIDMappings) > 0 {
		c.Notes = append(c.Notes, "linux.uidMappings/gidMappings replaced: Moat maps each container's ids to a host range of its own")
	}
	if len(l.Seccomp) == 0 || string(l.Seccomp) == "null" {
		c.Notes = append(c.Notes, "linux.seccomp absent: Moat's seccomp policy applies regardless")
	} else {
		c.Notes = append(c.Notes, "linux.seccomp replaced by Moat's seccomp policy")
	}
	if r := l.Resources; r != nil {
		if m := r.Memory; m != nil && m.Limit != nil && *m.Limit > 0 {
			c.Limits.MemoryBytes = *m.Limit
		}
		if p := r.Pids; p != nil && p.Limit > 0 {
			if p.Limit > 1<<22 {
				return refuse("linux.resources.pids.limit", strconv.FormatInt(p.Limit, 10), "at most 4194304 (the kernel's pid_max)")
			}
			c.Limits.Pids = int(p.Limit)
		}
		if cpu := r.CPU; cpu != nil {
			if cpu.Quota != nil && *cpu.Quota > 0 {
				period := uint64(100000)
				if cpu.Period != nil && *cpu.Period > 0 {
					period = *cpu.Period
				}
				c.Limits.CPUs = float64(*cpu.Quota) / float64(period)
				if c.Limits.CPUs < 0.01 {
					return refuse("linux.resources.cpu.quota", fmt.Sprintf("%d per %d", *cpu.Quota, period), "at least 0.01 CPU (1000 per 100000)")
				}
			}
			if cpu.Shares != nil || cpu.Cpus != "" || cpu.Mems != "" {
				c.Notes = append(c.Notes, "linux.resources.cpu shares/cpus/mems not applied: Moat limits CPU by quota only")
			}
		}
	}
	return nil
}
