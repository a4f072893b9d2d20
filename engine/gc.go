package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/internal/idshift"
	"github.com/moat-sandbox/moat/tier"
)

// GCReport lists what GC removed.
type GCReport struct {
	Runs    []string `json:"runs"`    // run directories of dead runs
	Cgroups []string `json:"cgroups"` // cgroups of dead runs
	Images  []string `json:"images"`  // abandoned image build directories
}

// GC removes what runs of this engine's home that died without cleaning up
// (moat killed with SIGKILL, a host crash) left behind. A run is dead when
// nobody holds its lock; live runs are never touched, whichever process
// runs them, and neither are runs of other homes (their own GC collects
// them): claim.go has the protocol. Processes, mounts and network
// namespaces of a dead run die with its init or its jailed VMM
// (parent-death signal, PID namespace teardown); what can outlive it is
// its cgroup and its run directory (with a VMM's sockets). The cgroup goes
// first, so a GC interrupted in between leaves the directory for the next
// one to find.
func (e *Engine) GC() (GCReport, error) {
	var rep GCReport
	dead, err := e.deadRuns()
	errs := []error{err}
	if len(dead) > 0 {
		e.collect(dead, &rep, &errs)
	}
	if removed, err := e.images.GC(); err != nil {
		errs = append(errs, err)
	} else {
		rep.Images = removed
	}
	return rep, errors.Join(errs...)
}

// collect removes what the dead runs left and lets their locks go.
func (e *Engine) collect(dead []deadRun, rep *GCReport, errs *[]error) {
	// Every tier that confines a run in a cgroup (native, gvisor, and the
	// microvm tier's VMM) names it moat/<run id>, so one host's orphans
	// are every tier's. The view of a tier this engine has built is used
	// when there is one (tier.OrphanCollector); otherwise the host's
	// cgroups directly: GC does not start tiers to find out.
	cg := e.orphanCollector()
	if cg == nil {
		cg, _ = cgroup.Detect()
	}
	orphans := map[string]bool{}
	if cg != nil {
		ids, err := cg.Orphans()
		if err != nil {
			*errs = append(*errs, err)
		}
		for _, id := range ids {
			orphans[id] = true
		}
	}
	for _, d := range dead {
		func() {
			defer d.lock.Close()
			if cg != nil && orphans[d.id] {
				if err := cg.Remove(d.id); err != nil {
					*errs = append(*errs, fmt.Errorf("remove cgroup of run %s: %w", d.id, err))
					return
				}
				rep.Cgroups = append(rep.Cgroups, d.id)
			}
			// A tier that needs a host mount (gVisor's workspace) keeps
			// it below the run's directory; a killed moat leaves it
			// mounted.
			if err := unmountBelow(d.dir); err != nil {
				*errs = append(*errs, fmt.Errorf("unmount what run %s left: %w", d.id, err))
				return
			}
			// A build step's tree whose moat died is still owned by the
			// run's id range: its processes are gone (the cgroup above,
			// init's parent-death signal), so it can be put back.
			if root, err := idshift.Restore(d.dir); err != nil {
				*errs = append(*errs, fmt.Errorf("give build tree %s of run %s back its ids: %w", root, d.id, err))
				return
			}
			if err := e.removeRun(d.dir); err != nil {
				*errs = append(*errs, fmt.Errorf("remove run %s: %w", d.id, err))
				return
			}
			rep.Runs = append(rep.Runs, d.id)
		}()
	}
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

// LiveRuns returns the ids of this home's runs that are alive right now
// (RunAlive).
func (e *Engine) LiveRuns() map[string]bool {
	live := map[string]bool{}
	unlock, err := e.lockRuns(unix.LOCK_EX)
	if err != nil {
		return live
	}
	defer unlock()
	runs, _ := os.ReadDir(filepath.Join(e.opts.Home, "runs"))
	for _, r := range runs {
		if lockHeld(filepath.Join(e.opts.Home, "runs", r.Name(), runLock)) {
			live[strings.TrimPrefix(r.Name(), legacyClaimPrefix)] = true
		}
	}
	return live
}

// orphanCollector returns the cgroups of the first tier, by name, that
// this engine has built and that collects orphans, or nil.
func (e *Engine) orphanCollector() *cgroup.Host {
	e.mu.Lock()
	defer e.mu.Unlock()
	names := make([]string, 0, len(e.tiers))
	for n := range e.tiers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if oc, ok := e.tiers[n].(tier.OrphanCollector); ok {
			return oc.Cgroups()
		}
	}
	return nil
}
