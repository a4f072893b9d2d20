package nsinit

import (
	"bytes"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

func TestBridgeLimitFitsDescriptorLimit(t *testing.T) {
	for _, nofile := range []uint64{16, 64, 256, 1024, 65536, 1 << 40} {
		n := bridgeLimit(nofile)
		if n < 1 || n > maxBridged || (nofile >= 64 && uint64(n*6+32) > nofile) {
			t.Errorf("bridgeLimit(%d) = %d: outside 1..%d or over the descriptor limit", nofile, n, maxBridged)
		}
	}
}

// TestForwardSignals: init passes on the Forwarded signals the host's
// frames name, to the program's process group, and nothing else: a frame
// naming SIGKILL or SIGSTOP (or no signal at all) does nothing.
func TestForwardSignals(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var frames bytes.Buffer
	for _, sig := range []int{int(unix.SIGKILL), int(unix.SIGSTOP), 0, 99, int(unix.SIGTERM)} {
		if err := nswire.WriteFrame(&frames, &nswire.Signal{Signal: sig}); err != nil {
			t.Fatal(err)
		}
	}
	forwardSignals(&frames, cmd.Process.Pid) // returns at the end of the frames
	// A forwarded SIGSTOP would hold SIGTERM pending: end it (as killed
	// by SIGKILL, a failure) rather than hang.
	watchdog := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
	defer watchdog.Stop()
	err := cmd.Wait()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != unix.SIGTERM {
		t.Fatalf("sleep ended with %v, want killed by SIGTERM alone", err)
	}
}
