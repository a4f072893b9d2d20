package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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
