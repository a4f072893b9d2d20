// Package cgroup creates, limits, measures and destroys the cgroup of one
// run, on cgroup v1 (including the hybrid layout) and cgroup v2.
//
// Each run gets moat/<id>: one directory per needed v1 hierarchy (memory,
// pids, cpu, cpuacct, freezer) or one v2 directory. Limits are memory
// without swap, a pids.max and a CFS CPU quota; Stats reports CPU time, peak
// memory and how often the memory and pids limits were hit, including OOM
// kills. Destroy leaves nothing behind, and Orphans/Remove clean up after a
// moat that was itself SIGKILLed.
//
// This package must never set release_agent or notify_on_release (the
// CVE-2022-0492 escape runs a host binary through release_agent), never
// adopt a cgroup it did not create, and never kill a process that is not in
// a moat/<id> cgroup. The sandboxed program never sees cgroupfs; only the
// host side of moat uses this package.
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/runid"
)

// Version is the cgroup version a Host uses.
type Version int

// The cgroup versions.
const (
	V1 Version = 1
	V2 Version = 2
)

func (v Version) String() string {
	switch v {
	case V1:
		return "cgroup v1"
	case V2:
		return "cgroup v2"
	}
	return fmt.Sprintf("cgroup version %d", int(v))
}

// parentName is the directory under which every run's cgroup lives.
const parentName = "moat"

// supervisorName is the v2 leaf that moat moves itself into when the cgroup
// it must use as parent also holds moat's own process; see prepareV2.
// It sits beside parentName, so it is never listed as an orphan.
const supervisorName = "moat-supervisor"

// v1Controllers are the v1 hierarchies a run needs, in the order its
// directories are created. freezer comes first so that a process that is in
// any moat cgroup is in the freezer one too (Add writes in this order).
var v1Controllers = []string{"freezer", "memory", "pids", "cpu", "cpuacct"}

// v2Controllers are the v2 controllers enabled for moat/ and moat/<id>.
var v2Controllers = []string{"memory", "pids", "cpu"}

// MissingError says which cgroup controllers the host lacks. The run must be
// refused (fail closed) unless the caller explicitly accepts a weaker tier.
type MissingError struct {
	Version     Version
	Controllers []string
	// Where is the file or mount table that was looked at.
	Where string
}

func (e *MissingError) Error() string {
	if e.Version == V1 {
		return fmt.Sprintf("cgroup v1 %s controller not mounted (looked in %s)",
			strings.Join(e.Controllers, ", "), e.Where)
	}
	return fmt.Sprintf("cgroup v2 %s controller not available in %s; enable it in the parent's cgroup.subtree_control or delegate it to moat",
		strings.Join(e.Controllers, ", "), e.Where)
}

// Host is the cgroup layout of this machine as seen by moat. Create it with
// Detect. It is safe for concurrent use.
type Host struct {
	// Version is the cgroup version runs are created on. A hybrid host
	// (v1 controllers plus an empty cgroup2 at /sys/fs/cgroup/unified) is V1.
	Version Version

	// v1 maps each controller in v1Controllers to its hierarchy's mount
	// point. Co-mounted controllers (cpu,cpuacct) share one.
	v1 map[string]string
	// v1Parents are the distinct <mountpoint>/moat directories, in
	// v1Controllers order.
	v1Parents []string
	// memsw is true when v1 swap accounting (memory.memsw.*) exists.
	memsw bool

	// v2Base is the cgroup2 directory moat/ is created in: the mount root,
	// or moat's own cgroup when the root is not writable (delegation).
	v2Base string
	// v2Parent is v2Base/moat.
	v2Parent string

	fs fsOps
}

// Detect inspects this host: which cgroup version is in use, where the
// hierarchies are mounted (from /proc/self/mountinfo, never assumed), and
// whether every needed controller is available. It creates nothing.
// A missing controller is a *MissingError.
func Detect() (*Host, error) {
	return detect("/proc/self/mountinfo", "/proc/self/cgroup", realFS)
}

func detect(mountinfoPath, procCgroupPath string, fs fsOps) (*Host, error) {
	mi, err := os.ReadFile(mountinfoPath)
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: %w", err)
	}
	mounts, err := parseMountinfo(mi)
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: %w", err)
	}
	h := &Host{fs: fs}

	// Any v1 hierarchy holding one of our controllers makes this a v1
	// (or hybrid) host: a controller is active in one hierarchy only, so
	// those controllers cannot also be on cgroup2.
	v1 := map[string]string{}
	var unified *mount
	for i := range mounts {
		m := &mounts[i]
		if m.fstype == "cgroup2" {
			if unified == nil {
				unified = m
			}
			continue
		}
		for _, c := range m.controllers {
			// The first mount of a hierarchy wins; later ones are bind
			// mounts of the same hierarchy (or of a subtree of it).
			if _, seen := v1[c]; !seen && slices.Contains(v1Controllers, c) {
				v1[c] = m.point
			}
		}
	}
	if len(v1) > 0 {
		var missing []string
		for _, c := range v1Controllers {
			if _, ok := v1[c]; !ok {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return nil, &MissingError{Version: V1, Controllers: missing, Where: mountinfoPath}
		}
		h.Version = V1
		h.v1 = v1
		for _, c := range v1Controllers {
			p := filepath.Join(v1[c], parentName)
			if !slices.Contains(h.v1Parents, p) {
				h.v1Parents = append(h.v1Parents, p)
			}
		}
		// The root of the memory hierarchy has memory.memsw.limit_in_bytes
		// only when swap accounting is compiled in and enabled.
		h.memsw = exists(filepath.Join(v1["memory"], "memory.memsw.limit_in_bytes"))
		return h, nil
	}
	if unified == nil {
		return nil, fmt.Errorf("detect cgroups: no cgroup v1 controllers and no cgroup2 mount in %s", mountinfoPath)
	}

	h.Version = V2
	base, err := v2Base(unified, procCgroupPath, fs)
	if err != nil {
		return nil, err
	}
	ctl, err := readFile(filepath.Join(base, "cgroup.controllers"))
	if err != nil {
		return nil, fmt.Errorf("detect cgroups: %w", err)
	}
	have := parseControllers(ctl)
	var missing []string
	for _, c := range v2Controllers {
		if !have[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, &MissingError{Version: V2, Controllers: missing, Where: filepath.Join(base, "cgroup.controllers")}
	}
	h.v2Base = base
	h.v2Parent = filepath.Join(base, parentName)
	return h, nil
}

// v2Base picks the directory moat/ goes in: the cgroup2 mount root if we may
// write it (root on the host, or inside a private cgroup namespace), else
// the cgroup moat itself runs in (a delegated subtree, e.g. a systemd unit
// with Delegate=yes).
func v2Base(m *mount, procCgroupPath string, fs fsOps) (string, error) {
	if fs.writable(m.point) {
		return m.point, nil
	}
	data, err := os.ReadFile(procCgroupPath)
	if err != nil {
		return "", fmt.Errorf("detect cgroups: %w", err)
	}
	lines, err := parseProcCgroup(data)
	if err != nil {
		return "", fmt.Errorf("detect cgroups: %w", err)
	}
	own, ok := "", false
	for _, l := range lines {
		if l.hierarchy == 0 && len(l.controllers) == 0 {
			own, ok = l.path, true
		}
	}
	if !ok {
		return "", fmt.Errorf("detect cgroups: no cgroup v2 line (0::/path) in %s", procCgroupPath)
	}
	dir, err := cgroupDir(m, own)
	if err != nil {
		return "", err
	}
	if !fs.writable(dir) {
		return "", fmt.Errorf("detect cgroups: cgroup v2 root %s and moat's own cgroup %s are not writable; run moat as root or delegate a subtree to it", m.point, dir)
	}
	return dir, nil
}

// cgroupDir maps a cgroup path from /proc/self/cgroup to a directory under
// the mount m. The path is relative to the hierarchy root, and m may mount
// only a subtree of it (m.root), e.g. inside a cgroup namespace created
// after the mount.
func cgroupDir(m *mount, cgPath string) (string, error) {
	rel, err := filepath.Rel(m.root, cgPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("detect cgroups: own cgroup %s is outside the cgroup2 mount at %s (mount root %s)", cgPath, m.point, m.root)
	}
	return filepath.Join(m.point, rel), nil
}

// prepare makes the moat/ parents (and, on v2, enables the controllers
// for moat/ and its children). Only missing pieces are written. It runs
// for every Create, under the parents lock (holdParents): the parents may
// have been pruned, and made again by another moat process that has not
// enabled the controllers yet, since this process last looked, so a
// remembered "prepared" would be wrong.
func (h *Host) prepare() error {
	if h.Version == V1 {
		return h.prepareV1()
	}
	return h.prepareV2()
}

func (h *Host) prepareV1() error {
	for _, p := range h.v1Parents {
		if err := h.mkdirExist(p); err != nil {
			return err
		}
	}
	return nil
}

func (h *Host) prepareV2() error {
	// Controllers must be enabled top-down: base's subtree_control makes
	// them available in moat/, moat/'s makes them available in moat/<id>.
	if err := h.enableControllers(h.v2Base, true); err != nil {
		return err
	}
	if err := h.mkdirExist(h.v2Parent); err != nil {
		return err
	}
	// moat/ never holds a process, so no internal-process conflict here.
	return h.enableControllers(h.v2Parent, false)
}

// enableControllers writes the missing v2Controllers into dir's
// cgroup.subtree_control. When dir is moat's own cgroup (delegation, or the
// root of a cgroup namespace) the kernel's no-internal-process rule refuses
// with EBUSY while moat's process sits in dir; then, if mayMoveSelf, moat
// moves itself into the leaf dir/moat-supervisor and retries. Processes
// that are not moat's own are never moved.
func (h *Host) enableControllers(dir string, mayMoveSelf bool) error {
	sc := filepath.Join(dir, "cgroup.subtree_control")
	data, err := readFile(sc)
	if err != nil {
		return fmt.Errorf("prepare cgroup parent: %w", err)
	}
	have := parseControllers(data)
	var add []string
	for _, c := range v2Controllers {
		if !have[c] {
			add = append(add, "+"+c)
		}
	}
	if len(add) == 0 {
		return nil
	}
	val := strings.Join(add, " ")
	err = writeFile(sc, val)
	if errors.Is(err, unix.EBUSY) && mayMoveSelf {
		leaf := filepath.Join(dir, supervisorName)
		if err := h.mkdirExist(leaf); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(leaf, "cgroup.procs"), fmt.Sprint(os.Getpid())); err != nil {
			return fmt.Errorf("prepare cgroup parent: move moat into %s: %w", leaf, err)
		}
		err = writeFile(sc, val)
	}
	if err != nil {
		return fmt.Errorf("prepare cgroup parent: enable %s in %s: %w", val, sc, err)
	}
	return nil
}

func (h *Host) mkdirExist(p string) error {
	if err := h.fs.mkdir(p); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("prepare cgroup parent: mkdir %s: %w", p, err)
	}
	return nil
}

// Orphans returns the ids of the moat/<id> cgroups that exist on this host,
// sorted. At startup, or from `moat gc`, these are leftovers of a moat that
// died without Destroy (SIGKILL, power loss of the daemon only); pass each
// to Remove. Only call it when no other moat process shares this host's
// cgroups, or it will list that process's live runs too.
func (h *Host) Orphans() ([]string, error) {
	seen := map[string]bool{}
	for _, p := range h.parents() {
		ents, err := os.ReadDir(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list orphan cgroups: %w", err)
		}
		for _, e := range ents {
			// Interface files sit beside the child directories.
			if e.IsDir() && runid.Check(e.Name()) == nil {
				seen[e.Name()] = true
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Remove kills every process in moat/<id> and removes it from every
// hierarchy. It is Destroy for a cgroup this process did not create (an
// orphan); removing an id that does not exist is not an error.
func (h *Host) Remove(id string) error {
	if err := runid.Check(id); err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	err := h.handle(id).Destroy()
	if err == nil {
		err = h.Prune()
	}
	return err
}

// Prune removes the empty moat/ parents, so that an idle host keeps no
// trace of Moat in its cgroup tree, when no run on this host holds its
// cgroup (see holdParents); otherwise it does nothing, and the last run to
// end prunes. Destroy and Remove call it; it is exported for `moat gc` and
// tests.
func (h *Host) Prune() error {
	var errs []error
	h.IfIdle(func() {
		for _, p := range h.parents() {
			err := h.fs.rmdir(p)
			if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.ENOTEMPTY) {
				errs = append(errs, fmt.Errorf("prune %s: %w", p, err))
			}
		}
	})
	return errors.Join(errs...)
}

// The moat/ parents are shared by every moat process on the host, and each
// run's cgroup is made in them. One process pruning the parents while
// another made its cgroup in them made that one fail ("mkdir moat/<id>:
// no such file or directory", or on v2 a moat/ made again without its
// controllers: "open memory.max: no such file or directory"). So the
// parents have a lock: a flock on the directory that holds them (the
// hierarchy's, or on v2 the base's; flock works on cgroupfs directories
// and needs no file of ours anywhere):
//
//	Create   LOCK_SH, held until Destroy: prepare the parents, mkdir moat/<id>
//	Prune    LOCK_EX|LOCK_NB: only when no run holds LOCK_SH, rmdir the parents
//
// A moat killed mid-run loses its LOCK_SH with its descriptors. Waiting
// for LOCK_SH is waiting for a prune: a few rmdirs.

// lockDir is the directory whose flock guards the moat/ parents.
func (h *Host) lockDir() string {
	if h.Version == V1 {
		return filepath.Dir(h.v1Parents[0])
	}
	return h.v2Base
}

// holdParents takes the parents lock shared and returns its descriptor:
// while it is held, no moat process on this host removes the parents.
func (h *Host) holdParents() (int, error) {
	fd, err := unix.Open(h.lockDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("lock the cgroup parents: %w", err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_SH)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("lock the cgroup parents in %s: %w", h.lockDir(), err)
	}
	return fd, nil
}

// IfIdle runs fn, and reports true, only when no run on this host holds
// its cgroup: with the parents lock exclusive, so that no run can start
// making one until fn returns. For work that must not race any run's
// cgroup creation, such as removing shared parents.
func (h *Host) IfIdle(fn func()) bool {
	fd, err := unix.Open(h.lockDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false
	}
	fn()
	return true
}

// Parents returns the moat/ directories runs are created under: one per v1
// hierarchy, or one on v2. For logs and diagnostics.
func (h *Host) Parents() []string {
	return slices.Clone(h.parents())
}

func (h *Host) parents() []string {
	if h.Version == V1 {
		return h.v1Parents
	}
	return []string{h.v2Parent}
}

// Existing returns the cgroup moat/<id> made by another process (an OCI
// container's, made by the runtime's create and ended by its delete), for
// Procs and Kill; nil when it does not exist. Destroy it with Remove.
func (h *Host) Existing(id string) *Cgroup {
	if runid.Check(id) != nil {
		return nil
	}
	c := h.handle(id)
	for _, d := range c.dirs {
		if !exists(d) {
			return nil
		}
	}
	return c
}
