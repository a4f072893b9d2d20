package gvisor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/moat-sandbox/moat/tier"
)

// maxLogBytes bounds every read of a runsc log.
const maxLogBytes = 64 << 10

// runsc's exit code cannot tell the program's `exit 137` from a SIGKILL,
// nor either from a Sentry that died (it exits 128+signal for a signalled
// program, and the Sentry's own status when the Sentry is gone). `runsc
// run` logs the wait status it got, and says where it got it from, at info
// level: that is what Exec reads.
var (
	exitLine = lazyRegexp(`\] Exiting with status: (\d+)\s*$`)
	// runsc asks the Sentry for the program's status; when that fails it
	// waits for the Sentry's host process instead.
	sentryGone = lazyRegexp(`\] Wait RPC to container "[^"]*" failed`)
)

// runLog is what `runsc run`'s log says about the end.
type runLog struct {
	status      int  // a syscall.WaitStatus
	exited      bool // runsc reported a status
	sandboxDied bool // ...of the Sentry's host process, not of the program
}

func readRunLog(path string) runLog {
	var rl runLog
	b := readTail(path, maxLogBytes)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 4096), maxLogBytes)
	for sc.Scan() {
		line := sc.Text()
		if sentryGone().MatchString(line) {
			rl.sandboxDied = true
		}
		if m := exitLine().FindStringSubmatch(line); m != nil {
			if v, err := strconv.Atoi(m[1]); err == nil && v >= 0 && v <= 0xffff {
				rl.status, rl.exited = v, true
			}
		}
	}
	return rl
}

// observe reads how a command ended from its runsc exec's logs (names
// under logs/).
func (s *sandbox) observe(log, errLog string) tier.Observed {
	var obs tier.Observed
	rl := readRunLog(filepath.Join(s.logs, log))
	switch {
	case rl.exited && !rl.sandboxDied:
		ws := syscall.WaitStatus(rl.status)
		switch {
		case ws.Signaled():
			obs.Exit = &tier.Exit{Signal: int(ws.Signal())}
		case ws.Exited():
			obs.Exit = &tier.Exit{Code: ws.ExitStatus()}
		default:
			obs.Lost = fmt.Sprintf("runsc reported an unexpected wait status %#x", rl.status)
		}
	default:
		// runsc exec could not wait for the command: the Sentry died
		// under it (or runsc was killed at the kill limit).
		msg := runscError(filepath.Join(s.logs, errLog))
		if msg == "" {
			msg = "runsc ended without reporting a status"
		}
		obs.Lost = "runsc: " + msg
		if p := panicLine(filepath.Join(s.logs, "panic.log")); p != "" {
			obs.Lost += ": gVisor's Sentry: " + p
		}
	}
	return obs
}

// runscError is the last fatal error runsc wrote to its --log file.
func runscError(path string) string {
	var msg string
	sc := bufio.NewScanner(bytes.NewReader(readTail(path, maxLogBytes)))
	sc.Buffer(make([]byte, 4096), maxLogBytes)
	for sc.Scan() {
		var e struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil && e.Msg != "" {
			msg = e.Msg
		}
	}
	return clean(msg)
}

// panicLine is the first panic or fatal error in the Sentry's and gofer's
// runtime log. That file is written by the Sentry, which runs the
// program's system calls: it is hostile input, read bounded and cleaned.
func panicLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxLogBytes))
	sc.Buffer(make([]byte, 4096), maxLogBytes)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			return clean(l)
		}
	}
	return ""
}

// readTail reads at most n bytes from the end of path.
func readTail(path string, n int64) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(fi.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return b
}

// clean makes log text fit for an error message: printable, one line,
// bounded.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return ' '
		}
		return r
	}, s)
	if len(s) > 500 {
		s = s[:500] + "..."
	}
	return strings.TrimSpace(s)
}
