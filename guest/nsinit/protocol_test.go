package nsinit

import (
	"bytes"
	"encoding/binary"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	in := Command{Argv: []string{"python3", "-c", "print(1)"}, Env: []string{"A=b"}, Dir: "/workspace"}
	if err := WriteFrame(&buf, &in); err != nil {
		t.Fatal(err)
	}
	var out Command
	if err := ReadFrame(&buf, &out); err != nil {
		t.Fatal(err)
	}
	if out.Dir != in.Dir || len(out.Argv) != 3 || out.Env[0] != "A=b" {
		t.Errorf("round trip = %+v, want %+v", out, in)
	}
}

func TestReadFrameRejectsOversize(t *testing.T) {
	hdr := binary.LittleEndian.AppendUint32(nil, MaxConfigBytes+1)
	var c Command
	if err := ReadFrame(bytes.NewReader(hdr), &c); err == nil {
		t.Error("an oversized frame was accepted")
	}
}

// FuzzReadFrame: init reads frames from the host; a corrupted frame must
// fail cleanly, never panic or allocate past the bound.
func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	WriteFrame(&buf, &Setup{Root: "/img", Hostname: "moat"})
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Setup
		ReadFrame(bytes.NewReader(b), &s)
	})
}

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
		if err := WriteFrame(&frames, &Signal{Signal: sig}); err != nil {
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
