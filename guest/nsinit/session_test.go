package nsinit

import (
	"bufio"
	"encoding/json"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
	"golang.org/x/sys/unix"
)

// TestExecLeavesDescriptorsToServe: a session command's descriptors
// belong to serve, which closes them after exec returns; exec must not
// close them again later. It did, through the GC cleanup of an os.File
// wrapped around stderr: by then the number was the read end of the
// egress relay's pooled splice pipe, and every later egress connection
// of the session was closed unread. Here the numbers are reused by new
// pipes, as they would be in init, and must survive any number of GCs.
func TestExecLeavesDescriptorsToServe(t *testing.T) {
	tests := []struct {
		name     string
		argv     []string
		exit     int
		stderr   string
		notFound bool
	}{
		{"command not found", []string{"moat-no-such-command"}, 127, "moat: moat-no-such-command: command not found", true},
		{"not executable", []string{"/"}, 126, "moat: /: is a directory", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			statusR, statusW := pipe(t)
			s := &server{st: &reporter{w: statusW}, pids: map[int]int{}, procs: map[int]int{}, forked: map[int]time.Time{}}
			// The command's stdio as init gets it over SCM_RIGHTS:
			// duplicates of the host's pipe ends (stdin's read end,
			// stdout's and stderr's write ends); the test keeps stderr's
			// read end.
			inR, _ := rawPipe(t)
			_, outW := rawPipe(t)
			stderrR, errW := rawPipe(t)
			var sent []int
			for _, fd := range []int{inR, outW, errW} {
				d, err := unix.Dup(fd)
				if err != nil {
					t.Fatal(err)
				}
				sent = append(sent, d)
			}
			s.exec(&nswire.Request{Op: nswire.OpExec, Proc: 1, Argv: tc.argv, Env: []string{"PATH=/moat-no-such-dir"}, Dir: "/"}, sent)
			// What serve does after exec returns.
			for _, fd := range sent {
				unix.Close(fd)
			}
			stderr := readAll(t, stderrR)
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr %q, want %q", stderr, tc.stderr)
			}
			statusW.Close()
			var got []nswire.Status
			sc := bufio.NewScanner(statusR)
			for sc.Scan() {
				var st nswire.Status
				if err := json.Unmarshal(sc.Bytes(), &st); err != nil {
					t.Fatalf("status %q: %v", sc.Text(), err)
				}
				got = append(got, st)
			}
			if len(got) != 2 || !got[0].Started || !got[1].Exited || got[1].Exit != tc.exit || got[1].NotFound != tc.notFound {
				t.Errorf("statuses %+v, want started, then exited %d (not found %v)", got, tc.exit, tc.notFound)
			}

			// The numbers serve closed are taken by new descriptors
			// (the kernel hands out the lowest free ones); no cleanup
			// of exec's may close them.
			var reused []int
			for len(reused) < 6 {
				r, w := rawPipe(t)
				reused = append(reused, r, w)
			}
			for range 5 {
				runtime.GC()
				time.Sleep(10 * time.Millisecond)
			}
			for _, fd := range reused {
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
					t.Errorf("fd %d, opened after exec returned, was closed behind its owner's back: %v (exec's descriptors were %v)", fd, err, sent)
				}
			}
		})
	}
}

func pipe(t *testing.T) (*os.File, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// rawPipe is a pipe as bare descriptors (no os.File, no cleanup of its
// own), closed when the test ends if still open.
func rawPipe(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

// readAll reads what is in the pipe fd now (its writers may stay open).
func readAll(t *testing.T, fd int) string {
	t.Helper()
	var out []byte
	buf := make([]byte, 4096)
	for {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(p, 100); n <= 0 {
			return string(out)
		}
		n, err := unix.Read(fd, buf)
		if n <= 0 || err != nil {
			return string(out)
		}
		out = append(out, buf[:n]...)
	}
}
