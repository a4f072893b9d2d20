package nsinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

// ptmx is the multiplexer of the sandbox's own devpts instance (buildDev
// mounts it at /dev/pts): every terminal init opens is of that instance,
// never one of the host's.
const ptmx = "/dev/pts/ptmx"

// ttyDrain bounds how long a terminal's output is still read after its
// command was reaped: what the command wrote last is in the terminal's
// buffer, but a background process that kept the terminal open could
// write forever.
const ttyDrain = 100 * time.Millisecond

// terminal is the master side of a command's terminal, which init holds
// and copies: the host's stdin pipe into it, its output into the host's
// stdout pipe.
type terminal struct {
	master *os.File // non-blocking: its reads have deadlines
	done   chan struct{}
}

// openTerminal opens a new terminal of size ws: the master, and the slave
// as a bare descriptor for the command's stdio. Both are close-on-exec.
func openTerminal(ws nswire.Winsize) (*os.File, int, error) {
	m, err := unix.Open(ptmx, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("open %s: %w", ptmx, err)
	}
	fail := func(what string, err error) (*os.File, int, error) {
		unix.Close(m)
		return nil, -1, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		return fail("unlock the terminal", err)
	}
	if err := unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols}); err != nil {
		return fail("set the window size", err)
	}
	// TIOCGPTPEER opens the slave through the master, not by a path
	// another process could have replaced.
	sl, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(m), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		return fail("open the terminal's slave", errno)
	}
	return os.NewFile(uintptr(m), "ptmx"), int(sl), nil
}

// relay copies the host's input (in) to the terminal and its output to
// the host (out) until the command is reaped (finish), then closes all
// three. in and out are init's own duplicates of the exec's descriptors.
func (t *terminal) relay(in, out *os.File) {
	go func() {
		io.Copy(t.master, in)
		in.Close()
	}()
	go func() {
		defer close(t.done)
		// EIO: every slave descriptor is closed. A deadline: finish.
		io.Copy(out, t.master)
		out.Close()
		t.master.Close()
	}()
}

// finish ends the copying of the output once what is buffered is read
// (bounded by ttyDrain), and waits for it.
func (t *terminal) finish() {
	t.master.SetReadDeadline(time.Now().Add(ttyDrain))
	<-t.done
}

// resize sets the terminal's window size; the kernel sends SIGWINCH to
// its foreground process group.
func (t *terminal) resize(ws nswire.Winsize) error {
	rc, err := t.master.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: ws.Rows, Col: ws.Cols})
	}); err != nil {
		return err
	}
	return ioErr
}

// dupFile duplicates fd, a descriptor serve closes after handle returns,
// as a non-blocking file init owns.
func dupFile(fd int, name string) (*os.File, error) {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(d, true); err != nil {
		unix.Close(d)
		return nil, err
	}
	return os.NewFile(uintptr(d), name), nil
}

// terminals are the session's commands that have a terminal.
type terminals struct {
	mu sync.Mutex
	m  map[int]*terminal // host command number -> terminal
}

func (ts *terminals) get(proc int) *terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.m[proc]
}

func (ts *terminals) put(proc int, t *terminal) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[int]*terminal{}
	}
	ts.m[proc] = t
}

func (ts *terminals) take(proc int) *terminal {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.m[proc]
	delete(ts.m, proc)
	return t
}

// errBadSize refuses a window size of zero rows or columns.
var errBadSize = errors.New("a terminal needs at least one row and one column")
