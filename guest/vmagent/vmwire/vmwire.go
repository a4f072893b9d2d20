// Package vmwire is the wire protocol between the microvm tier's host
// side (tier/microvm) and its guest agent (guest/vmagent): the frames on
// the agent's virtio-serial port and the yamux configuration of the egress
// port. It holds types and framing only, so that the host can speak to
// the agent without importing the agent, which runs only as a VM's init.
package vmwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/moat-sandbox/moat/seccomp"
)

// The channel between host and guest is one virtio-serial port carrying
// frames: a type byte, a big-endian uint32 length, then that many bytes.
//
//	guest                                host
//	  boot, load modules, mount image
//	  Hello --------------------------->   (sandbox ready)
//	  <--------------------------- Request
//	  <----------------- Workspace* WorkspaceEnd
//	  <------------------------- Stdin* StdinEnd
//	  run the command
//	  Stdout* Stderr* ----------------->   (capped by the host)
//	  Tar* TarEnd ---------------------->  (workspace after the run)
//	  Result --------------------------->
//	  wait for the host to kill the VMM    (power off a minute later)
//
// The host treats every frame from the guest as hostile: MaxFrame bounds
// one frame, and the host bounds the sum of each kind.
//
// With an egress grant (Request.EgressPort) the VM has a second port,
// EgressPortName, that carries yamux streams and nothing else (egress.go);
// the frames above never travel on it.
const (
	FrameHello        byte = 'H' // guest: JSON Hello
	FrameRequest      byte = 'R' // host: JSON Request
	FrameWorkspace    byte = 'W' // host: a piece of the workspace tar
	FrameWorkspaceEnd byte = 'w'
	FrameStdin        byte = 'I' // host: a piece of stdin
	FrameStdinEnd     byte = 'i'
	FrameStdout       byte = 'O'
	FrameStderr       byte = 'E'
	FrameTar          byte = 'T' // guest: a piece of the workspace tar after the run
	FrameTarEnd       byte = 't'
	FrameResult       byte = 'X' // guest: JSON Result
	FrameFail         byte = 'F' // guest: the agent failed; payload is the message
)

// MaxFrame is the largest payload either side accepts.
const MaxFrame = 256 << 10

// ErrFrameTooLarge is returned for a frame over MaxFrame.
var ErrFrameTooLarge = errors.New("frame larger than the protocol allows")

// Hello is the guest's first message.
type Hello struct {
	Kernel string `json:"kernel"` // uname release of the guest kernel
}

// Request is the command and its limits.
type Request struct {
	Argv           []string `json:"argv"`
	Env            []string `json:"env"`
	Dir            string   `json:"dir"`
	UID            int      `json:"uid"`
	MemoryBytes    int64    `json:"memory_bytes"`
	Pids           int      `json:"pids"`
	CPUTime        int64    `json:"cpu_time_ns"`
	OpenFiles      int      `json:"open_files"`
	FileSizeBytes  int64    `json:"file_size_bytes"`
	WorkspaceBytes int64    `json:"workspace_bytes"`
	WorkspaceFiles int      `json:"workspace_files"`
	TmpBytes       int64    `json:"tmp_bytes"`
	// Timeout is the wall-clock bound of the command (ns); the agent kills
	// the command's cgroup at it and still reports its counters. The host
	// kills the whole VM a grace period later regardless.
	Timeout int64 `json:"timeout_ns"`
	// Entropy is fresh randomness from the host. A VM restored from a
	// snapshot starts with the same kernel RNG state as every other clone:
	// the agent mixes this into the kernel's pool and forces a reseed
	// before it starts the command.
	Entropy []byte `json:"entropy,omitempty"`
	// Time is the host's wall clock (Unix ns) when it sent the request;
	// the agent sets the guest's clock to it (a restored guest's clock is
	// the snapshot's).
	Time int64 `json:"time_ns,omitempty"`
	// Seccomp is the compiled filter the command runs under (package
	// seccomp: the native tier's policy), installed right before its
	// exec. The guest kernel is this tier's boundary; the filter keeps
	// what the command may ask of it to what any Moat program may (no
	// keyrings, io_uring, bpf, ptrace, netlink, user namespaces, 32-bit
	// entry). The agent refuses to run a command without it.
	Seccomp seccomp.Program `json:"seccomp"`
	// AllowNoLandlock: the manifest accepts running without Landlock
	// (security.allow_missing: [landlock]) if the guest kernel lacks it.
	// Otherwise such a kernel fails the run; Moat's own guest kernel has
	// it (Debian's cloud kernel: ABI 2 in 6.1).
	AllowNoLandlock bool `json:"allow_no_landlock,omitempty"`
	// Landlock is set by the agent for its exec helper alone (whether to
	// restrict the command); the host's value is ignored.
	Landlock bool `json:"landlock,omitempty"`
	// EgressPort, when non-zero, grants egress: the agent brings the
	// loopback interface up and relays connections to 127.0.0.1:EgressPort
	// over the egress port (see egress.go). Without it the guest's
	// loopback stays down and the egress port, if any, unused.
	EgressPort int `json:"egress_port,omitempty"`
	// TrustPEM, when set, is the egress proxy's run CA (it terminates
	// TLS for secret-bound hosts): the agent writes the image's CA bundle
	// plus this to TrustFile, read-only, and binds it over TrustBundle
	// when the image has one (tier.TrustFile, tier.TrustBundle).
	TrustPEM    []byte `json:"trust_pem,omitempty"`
	TrustFile   string `json:"trust_file,omitempty"`
	TrustBundle string `json:"trust_bundle,omitempty"`
}

// Result is what the agent observed.
type Result struct {
	ExitCode   int   `json:"exit_code"`
	Signal     int   `json:"signal"`
	CPU        int64 `json:"cpu_ns"`
	PeakMemory int64 `json:"peak_memory"`
	OOMKills   int   `json:"oom_kills"`
	TimedOut   bool  `json:"timed_out"`
	PidsMax    int   `json:"pids_max"`
	// WorkspaceFull is "disk" or "files" when the workspace ran out.
	WorkspaceFull string `json:"workspace_full,omitempty"`
	Error         string `json:"error,omitempty"`
	// Degraded names protections the command ran without, each one the
	// request accepted ("landlock").
	Degraded []string `json:"degraded,omitempty"`
}

// CPUDuration is the result's CPU time.
func (r *Result) CPUDuration() time.Duration { return time.Duration(r.CPU) }

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return ErrFrameTooLarge
	}
	buf := make([]byte, 5+len(payload))
	buf[0] = typ
	binary.BigEndian.PutUint32(buf[1:5], uint32(len(payload)))
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// ReadFrame reads one frame, refusing one over MaxFrame before reading its
// payload.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: type %q, %d bytes", ErrFrameTooLarge, hdr[0], n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, fmt.Errorf("frame %q: %w", hdr[0], err)
	}
	return hdr[0], payload, nil
}

// FrameWriter turns a byte stream into frames of one type.
type FrameWriter struct {
	W   func(typ byte, p []byte) error
	Typ byte
}

func (f *FrameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), MaxFrame)
		if err := f.W(f.Typ, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}
