package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier/native"
)

// GCReport lists what GC removed.
type GCReport struct {
	Runs    []string `json:"runs"`    // run directories of dead runs
	Cgroups []string `json:"cgroups"` // cgroups of dead runs
	Images  []string `json:"images"`  // abandoned image build directories
}

// GC removes what runs of this engine's home that died without cleaning up
// (moat killed with SIGKILL, a host crash) left behind. A run is dead when
// nobody holds its lock; live runs are never touched, and neither are runs
// of other homes (their own GC collects them). Processes, mounts and
// network namespaces of a dead run die with its init or its jailed VMM
// (parent-death signal, PID namespace teardown); what can outlive it is
// its cgroup and its run directory (with a VMM's sockets). The cgroup goes first, so a GC interrupted in between leaves
// the directory for the next one to find.
func (e *Engine) GC() (GCReport, error) {
	var rep GCReport
	var errs []error
	runsDir := filepath.Join(e.opts.Home, "runs")
	entries, err := os.ReadDir(runsDir)
	if err != nil && !os.IsNotExist(err) {
		return rep, fmt.Errorf("gc: %w", err)
	}
	var dead []string // directory names
	for _, ent := range entries {
		dir := filepath.Join(runsDir, ent.Name())
		id, claiming := strings.CutPrefix(ent.Name(), claimPrefix)
		// A run being claimed has its lock file a moment before the lock
		// itself (claim): a fresh claim is alive whatever its lock says,
		// or another moat's GC could take it in between.
		if !validRunID(id) || claiming && fresh(dir) || isAlive(filepath.Join(dir, "lock")) {
			continue
		}
		dead = append(dead, ent.Name())
	}
	if len(dead) == 0 {
		return rep, nil
	}

	// Every tier that confines a run in a cgroup (native, gvisor, and the
	// microvm tier's VMM) names it moat/<run id>, so one host's orphans
	// are every tier's. The native tier's view is used when it is there;
	// otherwise (user namespaces off, say) the host's cgroups directly.
	var cg *cgroup.Host
	if t, err := e.Tier(native.Name); err == nil {
		if n, ok := t.(*native.Native); ok {
			cg = n.Cgroups()
		}
	}
	if cg == nil {
		cg, _ = cgroup.Detect()
	}
	orphans := map[string]bool{}
	if cg != nil {
		ids, err := cg.Orphans()
		if err != nil {
			errs = append(errs, err)
		}
		for _, id := range ids {
			orphans[id] = true
		}
	}
	for _, name := range dead {
		id, _ := strings.CutPrefix(name, claimPrefix)
		if cg != nil && orphans[id] {
			if err := cg.Remove(id); err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup of run %s: %w", id, err))
				continue
			}
			rep.Cgroups = append(rep.Cgroups, id)
		}
		// A tier that needs a host mount (gVisor's workspace) keeps it
		// below the run's directory; a killed moat leaves it mounted.
		if err := unmountBelow(filepath.Join(runsDir, name)); err != nil {
			errs = append(errs, fmt.Errorf("unmount what run %s left: %w", id, err))
			continue
		}
		if err := os.RemoveAll(filepath.Join(runsDir, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		rep.Runs = append(rep.Runs, id)
	}
	if removed, err := e.images.GC(); err != nil {
		errs = append(errs, err)
	} else {
		rep.Images = removed
	}
	return rep, errors.Join(errs...)
}

// unmountBelow lazily unmounts every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		p := unescapeMountinfo(f[4])
		if p == dir || strings.HasPrefix(p, dir+"/") {
			points = append(points, p)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(points)))
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}

// isAlive reports whether some process holds the run's lock.
func isAlive(lock string) bool {
	f, err := os.OpenFile(lock, os.O_RDWR, 0)
	if err != nil {
		// No lock file: either being created right now (the directory
		// exists first) or long gone. Treat a missing file as alive only
		// if its directory is fresh.
		return fresh(filepath.Dir(lock))
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

// fresh says whether dir was modified in the last few seconds: a run
// directory still being set up.
func fresh(dir string) bool {
	fi, err := os.Stat(dir)
	return err == nil && time.Since(fi.ModTime()) < 5*time.Second
}

func validRunID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// LiveRuns returns the ids of this home's runs whose lock is held right
// now. It reads /proc/locks rather than trying the locks, so it never
// disturbs a run that is taking its own lock at that moment.
func (e *Engine) LiveRuns() map[string]bool {
	held := HeldLocks()
	live := map[string]bool{}
	runs, _ := os.ReadDir(filepath.Join(e.opts.Home, "runs"))
	for _, r := range runs {
		if held(filepath.Join(e.opts.Home, "runs", r.Name(), "lock")) {
			id, _ := strings.CutPrefix(r.Name(), claimPrefix)
			live[id] = true
		}
	}
	return live
}

// HeldLocks returns a test of whether a file (a run's lock, under any
// home) is flock-ed by a live process, as /proc/locks says now: it never
// takes the lock itself.
func HeldLocks() func(path string) bool {
	held := map[uint64]bool{}
	if b, err := os.ReadFile("/proc/locks"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) < 6 || f[1] != "FLOCK" {
				continue
			}
			parts := strings.Split(f[5], ":")
			if ino, err := strconv.ParseUint(parts[len(parts)-1], 10, 64); err == nil {
				held[ino] = true
			}
		}
	}
	return func(path string) bool {
		var st unix.Stat_t
		return unix.Stat(path, &st) == nil && held[st.Ino]
	}
}
