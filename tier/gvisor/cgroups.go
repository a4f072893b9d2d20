package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
)

// cgroupRoot is where runsc looks for cgroup hierarchies: it builds every
// path as /sys/fs/cgroup/<controller>/<cgroupsPath> (v1) or
// /sys/fs/cgroup/<cgroupsPath> (v2), never from the mount table.
const cgroupRoot = "/sys/fs/cgroup"

const cgroup2Magic = 0x63677270 // CGROUP2_SUPER_MAGIC

// runscV1Controllers are the v1 hierarchies runsc puts the sandbox in
// (runsc/cgroup's controllers table). Those Moat also uses (freezer,
// memory, pids, cpu, cpuacct) already hold moat/<id> when runsc starts, so
// runsc uses them as they are and applies none of the bundle's resources
// to them; in the others it creates moat/<id> itself, and removes it again
// when the container is deleted.
var runscV1Controllers = []string{
	"blkio", "cpu", "cpuacct", "cpuset", "devices", "freezer", "hugetlb",
	"memory", "net_cls", "net_prio", "perf_event", "pids", "rdma", "systemd",
}

// moatV1Controllers are the hierarchies package cgroup creates runs in.
var moatV1Controllers = []string{"freezer", "memory", "pids", "cpu", "cpuacct"}

// cgroupsPath is linux.cgroupsPath for the run's cgroup: a path runsc
// resolves to exactly the directories Moat created and limited, checked
// here, so that the sandbox, the gofer and every stub process start inside
// the run's cgroup (runsc joins it before it forks them) and Stats, Kill
// and Destroy see them all.
func cgroupsPath(host *cgroup.Host, cg *cgroup.Cgroup) (string, error) {
	return cgroupsPathAt(cgroupRoot, host.Version, cg.ID(), cg.Dirs())
}

// cgroupsPathAt is cgroupsPath for a cgroupfs at root (tests use a fake
// one). On v2 the run's cgroup is one directory of the unified hierarchy,
// wherever package cgroup put it (below moat's own cgroup when moat runs
// in a container or a systemd unit): runsc takes its path relative to
// root. On v1 runsc builds root/<controller>/moat/<id> for each
// controller, which must be the run's own directories.
func cgroupsPathAt(root string, v cgroup.Version, id string, dirs []string) (string, error) {
	if len(dirs) == 0 {
		return "", errors.New("the run's cgroup has no directories")
	}
	if v == cgroup.V2 {
		rel, err := filepath.Rel(root, dirs[0])
		// Never the root cgroup itself (rel "."): runsc would run the
		// sandbox unconfined there.
		if err != nil || !filepath.IsLocal(rel) || rel == "." {
			return "", fmt.Errorf("the run's cgroup %s is not below %s, where runsc looks for it", dirs[0], root)
		}
		return "/" + rel, nil
	}
	p := "/moat/" + id
	for _, ctl := range moatV1Controllers {
		want := filepath.Join(root, ctl, p)
		fi, err := os.Stat(want)
		if err != nil {
			return "", fmt.Errorf("runsc would use %s for the %s controller, which is not the run's cgroup: %w", want, ctl, err)
		}
		if !slices.ContainsFunc(dirs, func(d string) bool {
			di, err := os.Stat(d)
			return err == nil && os.SameFile(di, fi)
		}) {
			return "", fmt.Errorf("runsc would use %s for the %s controller, which is not the run's cgroup (%v)", want, ctl, dirs)
		}
	}
	return p, nil
}

// checkUnified checks that root is a cgroup2 mount: runsc assumes the
// unified hierarchy is mounted at /sys/fs/cgroup when it is the only one.
func checkUnified(root string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(root, &sfs); err != nil {
		return fmt.Errorf("runsc expects cgroup v2 mounted at %s: %w", root, err)
	}
	if sfs.Type != cgroup2Magic {
		return fmt.Errorf("runsc expects cgroup v2 mounted at %s, which is another file system (type %#x)", root, sfs.Type)
	}
	return nil
}

// foreignDirs are the run's directories in the v1 hierarchies only runsc
// uses (none on v2: there runsc uses the run's one directory as it is, and
// creates nothing).
func foreignDirs(root string, v cgroup.Version, id string) []string {
	if v != cgroup.V1 {
		return nil
	}
	var dirs []string
	for _, ctl := range runscV1Controllers {
		if !slices.Contains(moatV1Controllers, ctl) {
			dirs = append(dirs, filepath.Join(root, ctl, "moat", id))
		}
	}
	return dirs
}

// removeForeign removes run id's directories in the hierarchies only runsc
// uses. runsc removes them itself when it deletes the container; this is
// for a runsc that was killed first. rmdir never kills anything: a cgroup
// that still holds a task is busy and stays.
func removeForeign(root string, v cgroup.Version, id string) error {
	var errs []error
	for _, d := range foreignDirs(root, v, id) {
		if err := unix.Rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// pruneForeign removes, in the hierarchies only runsc uses, the moat/<id>
// directories whose run's own cgroup is gone (a runsc killed before it
// deleted its container, then collected by the engine's GC or by Destroy),
// and the moat/ parents once they are empty, so an idle host keeps no
// trace of Moat there either. It runs only while no run on this host, of
// any tier or moat process, holds its cgroup (cgroup.Host.IfIdle): a
// runsc creating its moat/<id> runs inside such a run, and must not lose
// its parent between its mkdirs.
func (g *GVisor) pruneForeign() {
	g.cg.IfIdle(func() { pruneForeignAt(cgroupRoot, g.cg.Version) })
}

func pruneForeignAt(root string, v cgroup.Version) {
	if v != cgroup.V1 {
		return
	}
	for _, ctl := range runscV1Controllers {
		if slices.Contains(moatV1Controllers, ctl) {
			continue
		}
		parent := filepath.Join(root, ctl, "moat")
		ents, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range ents {
			// The run's own cgroup is created before runsc runs and
			// removed after it ended: without it, this one is an orphan.
			if e.IsDir() && validID(e.Name()) && !exists(filepath.Join(root, "freezer", "moat", e.Name())) {
				unix.Rmdir(filepath.Join(parent, e.Name()))
			}
		}
		unix.Rmdir(parent) // EBUSY while another run (another moat) uses it
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
