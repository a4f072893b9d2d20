package tier

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// DrainGrace is how long a session command's output may keep flowing
// after the command exited, from background processes that inherited its
// pipes, before the host stops reading (DrainAfterExit).
const DrainGrace = 200 * time.Millisecond

// maxDrain bounds DrainAfterExit while the pipes keep holding unread
// output: a background process that writes without end cannot hold a
// command's result longer.
const maxDrain = 3 * time.Second

// DrainAfterExit waits, after a session command exited, for the copiers
// of its output pipes (drained is closed when they are done). A
// background process that inherited the pipes may keep them open for
// ever, so reading stops when grace passes with the copiers unfinished,
// by closing outputs (the read ends) so that they return; but not while
// a pipe still holds output not yet read: that is what the command wrote
// before it exited, and a copier a loaded host has not scheduled yet
// would lose it (a session's `echo` came back empty under CI's load).
// Then the wait goes on, a grace at a time, for at most maxDrain.
func DrainAfterExit(drained <-chan struct{}, outputs []*os.File, grace time.Duration) {
	limit := time.Now().Add(maxDrain)
	t := time.NewTimer(grace)
	defer t.Stop()
	for {
		select {
		case <-drained:
			return
		case <-t.C:
		}
		if time.Now().Before(limit) && unread(outputs) {
			t.Reset(grace)
			continue
		}
		for _, f := range outputs {
			f.Close()
		}
		<-drained
		return
	}
}

// unread reports whether a pipe of outputs holds bytes not read yet
// (FIONREAD, which x/sys/unix names TIOCINQ). Through SyscallConn: Fd would put the file into blocking
// mode under the copier reading it.
func unread(outputs []*os.File) bool {
	for _, f := range outputs {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		n := 0
		rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
		if n > 0 {
			return true
		}
	}
	return false
}
