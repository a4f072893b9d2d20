package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/internal/runid"
)

// Run directories, and who may remove them.
//
// Every run of a home has runs/<id>, with a file "lock" that the moat
// process running it holds (flock LOCK_EX) for the run's whole life. A
// moat killed mid-run loses its locks with its file descriptors, which is
// how GC, run by any moat process of the same home (at every start and by
// `moat gc`), tells a dead run from a live one of another process.
//
// A run directory passes through two moments in which that test would be
// wrong: just made, before its lock is taken, and being removed, after its
// lock file is gone. The directory runs/ is itself a lock (flock on the
// directory) that keeps GC out of both:
//
//	claim    LOCK_SH(runs/) { mkdir runs/<id>; create lock; LOCK_EX|LOCK_NB(lock) }
//	release  remove what the run left but its lock;
//	         LOCK_SH(runs/) { unlink lock; rmdir runs/<id> }; close lock
//	abandon  close lock: the directory stays, dead, for GC (a sandbox that
//	         could not be destroyed: its cgroup is still there)
//	GC       LOCK_EX(runs/) { for each runs/<id>: open or create its lock;
//	                          LOCK_EX|LOCK_NB: taken, the run is dead and
//	                          the lock stays held; refused, it is alive }
//	         then for each dead run, its lock held: remove its cgroup and
//	         mounts, then its files as release does
//
// Under LOCK_EX, every run directory is either locked by its live run or
// dead; a directory without a lock file is one whose moat died inside a
// LOCK_SH section. A dead run whose lock one GC holds looks alive to every
// other, so no two GCs collect the same run, and no GC ever takes the
// cgroup of a live run. The cgroup of a run is created after its claim and
// removed before its release (the tiers' Prepare and Destroy), so it is
// never without a live or dead run directory. docs/RATIONALE.md has why.

// runLock is the file in a run directory that its run holds.
const runLock = "lock"

// legacyClaimPrefix named run directories being claimed before the
// runs/ lock existed; GC still collects what such a moat left.
const legacyClaimPrefix = ".new-"

// lockRuns takes the runs/ lock of this home (unix.LOCK_SH or LOCK_EX)
// and returns its release.
func (e *Engine) lockRuns(how int) (unlock func(), err error) {
	dir := filepath.Join(e.opts.Home, "runs")
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, how)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// claim makes run id's directory and holds its lock until release.
// release(true) ends the run cleanly: the directory goes. release(false)
// only lets the lock go, for a run whose sandbox could not be destroyed
// (a cgroup still busy): its directory stays, so the next GC finds a dead
// run and removes what it left.
func (e *Engine) claim(id string) (release func(clean bool), err error) {
	dir := filepath.Join(e.opts.Home, "runs", id)
	unlock, err := e.lockRuns(unix.LOCK_SH)
	if err != nil {
		return nil, fmt.Errorf("claim run %s: %w", id, err)
	}
	defer unlock()
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create run directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, runLock), os.O_CREATE|os.O_EXCL|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err == nil {
		// Nobody else can hold it: the file is new, and GC waits for
		// LOCK_SH to end. NB all the same, never to wait under the lock.
		if err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("lock run %s: %w", id, err)
	}
	return func(clean bool) {
		if clean {
			e.removeRun(dir)
		}
		f.Close()
	}, nil
}

// removeRun removes a run directory whose lock the caller holds: what is
// in it first, then, under LOCK_SH of runs/, the lock file and the
// directory, so that GC never sees the directory without its lock.
func (e *Engine) removeRun(dir string) error {
	var errs []error
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	for _, ent := range ents {
		if ent.Name() != runLock {
			if err := os.RemoveAll(filepath.Join(dir, ent.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	unlock, err := e.lockRuns(unix.LOCK_SH)
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(filepath.Join(dir, runLock)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// deadRun is a run directory GC found dead, with its lock held.
type deadRun struct {
	id, dir string
	lock    *os.File
}

// deadRuns returns the dead runs of this home, each with its lock held
// so that no other GC takes it too. The caller closes each lock.
func (e *Engine) deadRuns() ([]deadRun, error) {
	runs := filepath.Join(e.opts.Home, "runs")
	// Most starts find runs/ empty: no need to stop anyone's claims.
	if ents, err := os.ReadDir(runs); err != nil || len(ents) == 0 {
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		return nil, err
	}
	unlock, err := e.lockRuns(unix.LOCK_EX)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	defer unlock()
	ents, err := os.ReadDir(runs)
	if err != nil {
		return nil, fmt.Errorf("gc: %w", err)
	}
	var dead []deadRun
	var errs []error
	for _, ent := range ents {
		id := strings.TrimPrefix(ent.Name(), legacyClaimPrefix)
		if !ent.IsDir() || runid.Check(id) != nil {
			continue
		}
		dir := filepath.Join(runs, ent.Name())
		// A missing lock file is a moat that died inside a LOCK_SH
		// section: create it, to hold it like any other.
		f, err := os.OpenFile(filepath.Join(dir, runLock), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
		if err != nil {
			errs = append(errs, fmt.Errorf("gc: run %s: %w", id, err))
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close() // alive, or another GC is collecting it
			continue
		}
		dead = append(dead, deadRun{id: id, dir: dir, lock: f})
	}
	return dead, errors.Join(errs...)
}

// RunAlive reports whether dir, a run directory (runs/<id>) under any
// home, belongs to a live run: one whose lock is held. It holds that
// home's runs/ lock exclusively while it looks, so it never mistakes a run
// being claimed or removed for a dead one, and never makes a claim fail.
// (/proc/locks cannot say this: it is read 4 KiB at a time, each read a
// new walk of a list that changes in between, so a busy host's live locks
// go missing from it.)
func RunAlive(dir string) bool {
	fd, err := unix.Open(filepath.Dir(dir), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return false
	}
	return lockHeld(filepath.Join(dir, runLock))
}

// lockHeld says whether some process holds the lock file at path. The
// caller holds the runs/ lock exclusively: no claim is waiting to take it.
func lockHeld(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	return unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) != nil
}
