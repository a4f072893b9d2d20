package seccomp

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TSyncError means the kernel refused to apply the filter to every thread
// of the process: thread TID already runs under a seccomp filter that is not
// an ancestor of the caller's (or in strict mode). Nothing was installed.
type TSyncError struct {
	TID int
}

func (e *TSyncError) Error() string {
	return fmt.Sprintf("thread %d could not be synchronised (SECCOMP_FILTER_FLAG_TSYNC): it has a diverging seccomp filter; no thread was filtered", e.TID)
}

// Install sets no_new_privs and applies filter to every thread of the
// calling process, atomically: either all threads run under it afterwards
// or none does and an error says why (a *TSyncError names the thread that
// could not be synchronised). no_new_privs may be set on the calling thread
// even when Install fails; that only removes privileges.
//
// Call it as late as possible before execve: everything the caller does
// afterwards, including the Go runtime's own system calls, is filtered.
func Install(filter []unix.SockFilter) error {
	// Compile only produces x86_64 programs; on another architecture the
	// arch check would kill the process at its next system call.
	if runtime.GOARCH != "amd64" {
		return fmt.Errorf("seccomp filter is for amd64, process is %s", runtime.GOARCH)
	}
	if err := checkFilter(filter); err != nil {
		return fmt.Errorf("invalid seccomp filter: %w", err)
	}

	// prctl and seccomp must run on the same thread: the kernel requires
	// no_new_privs (or CAP_SYS_ADMIN) on the thread that installs a filter.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	// no_new_privs: execve can no longer grant privileges (setuid/setgid
	// bits, file capabilities), so a filtered program cannot exec its way to
	// a process the filter was not written for. TSYNC copies the flag to
	// every thread together with the filter.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}

	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// TSYNC: the Go runtime has many threads and any of them may run the
	// init's code after this returns; a filter on one thread only would be
	// bypassed by the next goroutine scheduled elsewhere. With TSYNC the
	// kernel returns the id of a thread it cannot synchronise instead of
	// installing anything.
	tid, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("seccomp(SECCOMP_SET_MODE_FILTER, TSYNC): %w", errno)
	}
	if tid != 0 {
		return &TSyncError{TID: int(tid)}
	}
	return nil
}
