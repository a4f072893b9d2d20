package microvm

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseOnExec: a descriptor this process holds without close-on-exec
// does not reach a child started after closeOnExec (the VMM).
func TestCloseOnExec(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], 0); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	listFDs := func() string {
		out, err := exec.Command("/bin/sh", "-c", "ls /proc/$$/fd").Output()
		if err != nil {
			t.Fatal(err)
		}
		return " " + strings.Join(strings.Fields(string(out)), " ") + " "
	}
	fd := " " + strconv.Itoa(p[1]) + " "
	if !strings.Contains(listFDs(), fd) {
		t.Fatalf("the check cannot fail: a child does not inherit fd %d even without closeOnExec", p[1])
	}
	if err := closeOnExec(); err != nil {
		t.Fatal(err)
	}
	if got := listFDs(); strings.Contains(got, fd) {
		t.Errorf("a child still inherits fd %d after closeOnExec: it has%s", p[1], got)
	}
	if flags, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("fd %d flags %#x, %v: want FD_CLOEXEC", p[1], flags, err)
	}
}
