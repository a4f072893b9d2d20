package gvisor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/moat-sandbox/moat/guest/gvinit/gvwire"
	"github.com/moat-sandbox/moat/tier"
)

// The subset of the OCI runtime specification (config.json) Moat writes.
// Every field runsc reads is set explicitly: what is left out gets runsc's
// defaults, which are not Moat's (capabilities, rlimits, a sysfs).
type ociSpec struct {
	OCIVersion string     `json:"ociVersion"`
	Root       ociRoot    `json:"root"`
	Process    ociProcess `json:"process"`
	Hostname   string     `json:"hostname"`
	Mounts     []ociMount `json:"mounts"`
	Linux      ociLinux   `json:"linux"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociProcess struct {
	Terminal        bool     `json:"terminal"`
	User            ociUser  `json:"user"`
	Args            []string `json:"args"`
	Env             []string `json:"env"`
	Cwd             string   `json:"cwd"`
	Capabilities    ociCaps  `json:"capabilities"`
	Rlimits         []rlimit `json:"rlimits"`
	NoNewPrivileges bool     `json:"noNewPrivileges"`
}

type ociUser struct {
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	AdditionalGids []uint32 `json:"additionalGids"`
}

// ociCaps are the program's capability sets inside the Sentry; Moat's are
// all empty (never nil: a missing set means runsc's default).
type ociCaps struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

type rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options"`
}

type ociLinux struct {
	Namespaces  []ociNamespace `json:"namespaces"`
	Resources   ociResources   `json:"resources"`
	CgroupsPath string         `json:"cgroupsPath"`
}

type ociNamespace struct {
	Type string `json:"type"`
}

type ociResources struct {
	Memory ociMemory `json:"memory"`
	CPU    ociCPU    `json:"cpu"`
	Pids   ociPids   `json:"pids"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
	Swap  int64 `json:"swap"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

// cfsPeriodUs is the CFS period the cgroup package uses.
const cfsPeriodUs = 100000

// Where the guest (package gvinit) and the egress proxy's socket appear in
// the sandbox: on the Sentry's /dev tmpfs, since the image root is
// read-only and has no place of Moat's own.
const (
	guestPath = "/dev/.moat/guest"
	// initUID is init's user and group in the Sentry: "nobody", which
	// owns nothing and is not the program's (SandboxUID).
	initUID    = 65534
	egressPath = "/dev/.moat/egress.sock"
)

// bundleSpec is the sandbox's shape: its init is the guest (gvinit), and
// commands are started in it later (runsc exec).
func bundleSpec(spec *tier.Spec, guest, workspace, tmp, cgroupsPath string, hostPids int) *ociSpec {
	lim := spec.Limits
	empty := []string{}
	return &ociSpec{
		OCIVersion: "1.0.2",
		// The image is shared by every run and never written: read-only,
		// which also keeps runsc from putting an overlay (and its
		// filestore file) on it.
		Root:     ociRoot{Path: spec.ImageRoot, Readonly: true},
		Hostname: "moat",
		Process: ociProcess{
			Args: initArgs(spec),
			// Init needs nothing from the environment.
			Env: []string{"PATH=/usr/bin:/bin"},
			// Init is not the program's user: the program can neither
			// signal it (ending the sandbox) nor trace or read it.
			User:         ociUser{UID: initUID, GID: initUID, AdditionalGids: []uint32{}},
			Cwd:          "/",
			Capabilities: ociCaps{Bounding: empty, Effective: empty, Inheritable: empty, Permitted: empty, Ambient: empty},
			// init's (and its relay's); the Sentry enforces them itself, per
			// task, like Linux. Commands get theirs from the guest.
			Rlimits: []rlimit{
				// No core dumps: they would land in the workspace.
				{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
				{Type: "RLIMIT_NOFILE", Soft: uint64(lim.OpenFiles), Hard: uint64(lim.OpenFiles)},
				{Type: "RLIMIT_FSIZE", Soft: uint64(lim.FileSizeBytes), Hard: uint64(lim.FileSizeBytes)},
				// No RLIMIT_NPROC for init: the program's tasks count
				// against the same user's total, and an init that cannot
				// create its next thread dies, taking the sandbox with it.
				// The program's own limit is in commandRlimits.
				// No RLIMIT_CPU for init: it lives as long as the sandbox
				// (a session's), and each command gets its own (see
				// commandRlimits).
			},
			NoNewPrivileges: true,
		},
		Mounts: []ociMount{
			// The Sentry's own procfs: the sandbox's processes only, no
			// host kernel state behind it.
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			// gVisor's own /dev (null, zero, full, random, urandom, tty,
			// pts, shm): no host device is reachable.
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "noexec", "mode=755"}},
			// runsc mounts a sysfs when the bundle has none; an empty,
			// read-only tmpfs keeps /sys empty as on the native tier.
			{Destination: "/sys", Type: "tmpfs", Source: "tmpfs", Options: []string{"ro", "nosuid", "noexec", "nodev", "size=4096", "mode=0555"}},
			// A host tmpfs Moat made for this run (size and inodes
			// bounded by the host kernel), not the Sentry's: that one
			// lets the program create device nodes.
			{Destination: "/tmp", Type: "bind", Source: tmp, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			// /dev/shm is the same directory, as on the native tier (a
			// symlink to /tmp there): POSIX semaphores and shared memory
			// (Python's multiprocessing) need a /dev/shm the program can
			// write, and gVisor's own is root's, mode 0755. One tmpfs
			// keeps one size limit for both.
			{Destination: "/dev/shm", Type: "bind", Source: tmp, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			// The host tmpfs Moat made for this run: its size and inode
			// limits are the host kernel's.
			{Destination: "/workspace", Type: "bind", Source: workspace, Options: []string{"rbind", "rw", "nosuid", "nodev"}},
			// The guest: the moat binary, read-only (the gofer opens it
			// for reading only, and the Sentry refuses writes to a
			// read-only mount).
			{Destination: guestPath, Type: "bind", Source: guest, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		},
		Linux: ociLinux{
			// No user namespace: the Sentry's credentials are its own
			// (the program is uid 1000 of the Sentry's kernel); no cgroup
			// namespace: the Sentry's cgroupfs is virtual.
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
			// runsc applies these only to cgroups it creates itself; the
			// run's cgroup already holds the same limits (package cgroup).
			// The Sentry also sizes its memory from the cgroup's limit.
			Resources: ociResources{
				Memory: ociMemory{Limit: lim.MemoryBytes, Swap: lim.MemoryBytes},
				CPU:    ociCPU{Quota: int64(lim.CPUs * cfsPeriodUs), Period: cfsPeriodUs},
				Pids:   ociPids{Limit: int64(hostPids)},
			},
			CgroupsPath: cgroupsPath,
		},
	}
}

// initArgs is the sandbox's first process: the guest's init, relaying to
// the egress proxy when the run has a grant.
func initArgs(spec *tier.Spec) []string {
	args := gvwire.InitArgs(guestPath)
	if spec.EgressSocket != "" {
		args = append(args, egressPath, strconv.Itoa(tier.EgressPort))
	}
	return args
}

// egressMount binds the host's egress proxy socket into the sandbox, the
// only host socket it can reach (runsc --host-uds=open lets the Sentry
// connect to host sockets in gofer mounts; see docs/THREATS.md).
func egressMount(socket string) ociMount {
	return ociMount{Destination: egressPath, Type: "bind", Source: socket, Options: []string{"bind", "nosuid", "nodev", "noexec"}}
}

// commandRlimits are the run's limits on each command, which the guest
// applies (runsc exec does not) before it execs the program.
//
// nproc bounds the program's tasks (processes and threads of uid 1000) in
// the Sentry, with the same allowance as the host cgroup's pids limit
// (hostPids). Each of the program's processes also costs the host at least
// one task (its systrap stub) beside gVisor's own, so process bombs meet
// the host limit first, where it is seen and reported; threads cost the
// host nothing while they wait in the Sentry, and a thread bomb meets this
// limit (EAGAIN), as on the native tier, where it is the same backstop.
func commandRlimits(lim tier.Limits, hostPids int) map[string]uint64 {
	return map[string]uint64{
		"core":   0,
		"nofile": uint64(lim.OpenFiles),
		"fsize":  uint64(lim.FileSizeBytes),
		"nproc":  uint64(hostPids),
		"cpu":    cpuSeconds(lim),
	}
}

// cpuSeconds is RLIMIT_CPU for the CPU-time limit: whole seconds, rounded
// up, as on the native tier.
func cpuSeconds(lim tier.Limits) uint64 {
	return uint64((lim.CPUTime + 1e9 - 1) / 1e9)
}

// writeBundle writes config.json atomically (runsc may read it at any
// time once it runs; nothing else does before then).
func writeBundle(dir string, s *ociSpec) error {
	b, err := json.MarshalIndent(s, "", "\t")
	if err != nil {
		return fmt.Errorf("encode OCI bundle: %w", err)
	}
	tmp := filepath.Join(dir, ".config.json")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write OCI bundle: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("write OCI bundle: %w", err)
	}
	return nil
}
