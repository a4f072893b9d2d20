package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/runid"
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
// and the moat/ parents once no gVisor sandbox on the host needs them, so
// an idle host keeps no trace of Moat there either.
func (g *GVisor) pruneForeign() { pruneForeignAt(cgroupRoot, g.cg.Version) }

func pruneForeignAt(root string, v cgroup.Version) {
	if v != cgroup.V1 {
		return
	}
	for _, ctl := range foreignControllers() {
		parent := filepath.Join(root, ctl, "moat")
		ents, err := os.ReadDir(parent)
		if err != nil {
			continue
		}
		for _, e := range ents {
			// The run's own cgroup is created before runsc runs and
			// removed after it ended: without it, this one is an orphan
			// (or one its Destroy is about to remove: rmdir never
			// removes a cgroup that holds a task).
			if e.IsDir() && runid.Check(e.Name()) == nil && !exists(filepath.Join(root, "freezer", "moat", e.Name())) {
				unix.Rmdir(filepath.Join(parent, e.Name()))
			}
		}
	}
	// The parents go only while no sandbox holds the lock: a runsc
	// making its moat/<id> must not lose the parent between its mkdirs.
	fd, err := openForeignLock(root)
	if err != nil || fd < 0 {
		return
	}
	defer unix.Close(fd)
	if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
		return
	}
	for _, ctl := range foreignControllers() {
		unix.Rmdir(filepath.Join(root, ctl, "moat")) // ENOTEMPTY while a killed run's directory is still busy
	}
}

// foreignControllers are the v1 hierarchies only runsc makes moat/<id> in.
func foreignControllers() []string {
	var ctls []string
	for _, ctl := range runscV1Controllers {
		if !slices.Contains(moatV1Controllers, ctl) {
			ctls = append(ctls, ctl)
		}
	}
	return ctls
}

// openForeignLock opens the lock of the moat/ parents in the hierarchies
// only runsc uses: the root of the first of them this host has, the same
// for every moat process. A gVisor sandbox holds it shared (holdForeign)
// from before runsc runs until its Destroy has removed its directories
// there; pruning the parents takes it exclusively, without waiting. It is
// -1 where the host has none of those hierarchies.
func openForeignLock(root string) (int, error) {
	for _, ctl := range foreignControllers() {
		fd, err := unix.Open(filepath.Join(root, ctl), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("lock the cgroup parents runsc uses: %w", err)
		}
	}
	return -1, nil
}

// holdForeign takes the lock of openForeignLock shared, on v1; it returns
// -1 where there is nothing to hold.
func holdForeign(root string, v cgroup.Version) (int, error) {
	if v != cgroup.V1 {
		return -1, nil
	}
	fd, err := openForeignLock(root)
	if err != nil || fd < 0 {
		return -1, err
	}
	for {
		err = unix.Flock(fd, unix.LOCK_SH)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("lock the cgroup parents runsc uses: %w", err)
	}
	return fd, nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
