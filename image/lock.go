package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// errLocked means another process holds the lock.
var errLocked = errors.New("locked by another moat process")

// lockNonBlocking takes an exclusive flock on path (creating it) or fails
// with errLocked. Closing the returned file releases the lock once no
// child process that inherited it remains. flock rather than a pid file: the kernel drops the lock
// when the holder dies, so a killed build never wedges the store.
func lockNonBlocking(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s: %w", path, errLocked)
		}
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	// A refused import of a new name removes its lock file before it
	// releases it: a lock taken on that unlinked file would be no lock
	// at all for whoever creates the path next. Only the file at path
	// counts.
	held, err1 := f.Stat()
	now, err2 := os.Stat(path)
	if err1 != nil || err2 != nil || !os.SameFile(held, now) {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, errLocked)
	}
	return f, nil
}

// lockWait takes the lock at path, waiting while another process holds it
// and telling progress once that it waits. It polls instead of blocking in
// flock(2) because a blocked flock cannot be interrupted by ctx.
func lockWait(ctx context.Context, path string, progress io.Writer) (*os.File, error) {
	told := false
	for {
		f, err := lockNonBlocking(path)
		if err == nil {
			return f, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			// The directory went with a refused import that held the
			// lock before us: make it again and retry.
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, fmt.Errorf("lock %s: %w", path, err)
			}
			continue
		}
		if !errors.Is(err, errLocked) {
			return nil, err
		}
		if !told {
			fmt.Fprintf(progress, "waiting for another build holding %s\n", path)
			told = true
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for lock %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
