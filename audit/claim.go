package audit

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrInUse is returned (wrapped) by Claim when another process holds the
// store's claim: a server is already running on this database.
var ErrInUse = errors.New("in use by another moat serve")

// claimSuffix names the claim's lock file beside the database. It is not
// one of SQLite's own files (-wal, -shm, -journal).
const claimSuffix = ".serve-lock"

// Claim makes this process the one server of the database until Close:
// an exclusive, non-blocking flock on a lock file beside it. A second
// server on the same database gets an error wrapping ErrInUse that names
// the holder's pid, instead of settling the first server's live records
// as dead (FailRunning). Readers and key administration (moat audit, moat
// keys) never claim and keep working beside a server.
//
// The kernel drops the lock when the holder exits, however it exits, so
// a crashed server never blocks the next one. Claiming twice is a no-op.
func (s *Store) Claim() error {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.claim != nil {
		return nil
	}
	lockPath := s.path + claimSuffix
	// O_CLOEXEC (Go's default): a sandbox started by this process must
	// not inherit the lock and keep it after the server died.
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("claim audit database %s: %w", s.path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := describeHolder(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("audit database %s is %w%s: one server per database (and per $MOAT_HOME); stop that server first, or give this one a MOAT_HOME and --db of its own", s.path, ErrInUse, holder)
		}
		return fmt.Errorf("claim audit database %s: lock %s: %w", s.path, lockPath, err)
	}
	// Say who holds it, for the message a second server prints.
	info := fmt.Sprintf("pid %d since %s\n", os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(info), 0)
	}
	s.claim = f
	return nil
}

// describeHolder reads what the holder of the claim wrote into it.
func describeHolder(f *os.File) string {
	b := make([]byte, 128)
	n, _ := f.ReadAt(b, 0)
	line, _, _ := strings.Cut(string(b[:n]), "\n")
	pid, since, ok := strings.Cut(strings.TrimPrefix(line, "pid "), " since ")
	if _, err := strconv.Atoi(pid); err != nil || !ok {
		return ""
	}
	return fmt.Sprintf(" (pid %s, running since %s)", pid, since)
}

// Claimed reports whether this process holds the store's claim.
func (s *Store) Claimed() bool {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	return s.claim != nil
}

// releaseClaim drops the claim (Close).
func (s *Store) releaseClaim() error {
	s.claimMu.Lock()
	defer s.claimMu.Unlock()
	if s.claim == nil {
		return nil
	}
	err := s.claim.Close() // closing the only descriptor drops the flock
	s.claim = nil
	return err
}
