// Package nswire is the wire protocol between the native tier's host side
// (tier/native) and its init inside the sandbox (guest/nsinit): the file
// descriptors init is given, the frames the host sends (Setup, Start,
// Command, Signal, session Requests) and the Status messages init sends
// back, with their bounds. The setup protocol itself is drawn in package
// nsinit's documentation.
//
// It holds types and framing only, so that the host can speak to init
// without importing init's code, which may only ever run as init.
package nswire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/seccomp"
)

// Arg is the hidden argv[1] under which the moat binary runs as init.
const Arg = "__nsinit"

// File descriptors the host passes to init (beyond stdin, stdout, stderr,
// which are the program's).
const (
	ConfigFD    = 3 // read end: frames Setup, Start, Command, then Signal frames until EOF
	StatusFD    = 4 // write end: newline-separated JSON Status messages
	WorkspaceFD = 5 // a detached tmpfs mount (fsmount) to attach at /workspace
	// EgressFD, present only with an egress grant, is an O_PATH descriptor
	// of the host's egress proxy socket. Init connects to it through
	// /proc/self/fd/6: no host path is reachable or mounted inside.
	EgressFD = 6
	// SessionFD, present only in session mode, is a SOCK_SEQPACKET socket:
	// the host sends one Request per message (an exec carries the
	// command's stdin, stdout and stderr as SCM_RIGHTS), until it closes.
	SessionFD = 7
	// CgroupFD is the first of the run's cgroup v1 "tasks" files, opened
	// by the host for writing (Setup.CgroupFDs says how many follow):
	// init moves itself in (cgroup.Join). Absent on cgroup v2, where init
	// is born in its cgroup (CLONE_INTO_CGROUP).
	CgroupFD = 8
)

// MaxRequestBytes bounds one session Request message.
const MaxRequestBytes = 1 << 20

// Session requests (Request.Op).
const (
	OpExec   = "exec"
	OpSignal = "signal"
	// OpResize sets the window size of a command started with a TTY.
	OpResize = "resize"
)

// Request is one message on SessionFD.
type Request struct {
	Op string `json:"op"`
	// Proc is the host's number for the command, echoed in its Status.
	Proc   int      `json:"proc"`
	Argv   []string `json:"argv,omitempty"`
	Env    []string `json:"env,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Signal int      `json:"signal,omitempty"`
	// TTY, on an exec, starts the command on a new terminal of the
	// sandbox's own devpts instance, of this size: its stdin, stdout and
	// stderr are the terminal, and init copies between the terminal and
	// the exec's stdin and stdout (its stderr stays unused). On a resize,
	// the command's new window size.
	TTY *Winsize `json:"tty,omitempty"`
}

// Winsize is a terminal's size in characters.
type Winsize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// MaxConfigBytes bounds the Config message.
const MaxConfigBytes = 4 << 20

// MaxStatusBytes bounds everything init may send back.
const MaxStatusBytes = 64 << 10

// Config is everything init needs, sent by the host over ConfigFD as
// frames: Setup, Start, then (one-shot mode) Command.
type Config struct {
	Setup
	Command
}

// Command is the program to run, the second frame.
type Command struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// Signal, any number of frames after the Command, asks init to forward a
// signal to the program's process group: how the host ends a cancelled run
// gracefully (SIGTERM). A frame rather than a signal to init: init then
// needs no signal handler, whose set-up (two more runtime threads) cost a
// cold start most of a millisecond before the program could be forked,
// and a signal sent before it existed would be lost (PID 1 ignores signals
// it does not handle). Init forwards only Forwarded signals.
type Signal struct {
	Signal int `json:"signal"`
}

// Forwarded are the signals a Signal frame may carry: the usual
// termination and user signals, as a shell's job control would send them.
var Forwarded = []unix.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

// Start is the second frame, sent once init is inside the run's cgroup:
// init confines itself completely and then waits for the Command frame.
type Start struct {
	// Serve, instead of a Command frame, makes init start the commands
	// sent on SessionFD until the host closes it (session mode).
	Serve bool `json:"serve,omitempty"`
}

// Setup is the sandbox's shape, the first frame.
type Setup struct {
	// Root is the host path of the image root filesystem, valid in the
	// mount namespace init starts in (a copy of the host's).
	Root     string `json:"root"`
	Hostname string `json:"hostname"`

	// UID and GID of the program inside the user namespace.
	UID int `json:"uid"`
	GID int `json:"gid"`

	TmpBytes int64 `json:"tmp_bytes"`
	TmpFiles int   `json:"tmp_files"`

	Rlimits Rlimits `json:"rlimits"`

	// Seccomp is the compiled filter (package seccomp), compiled once by
	// the host; init refuses to start the program without it.
	Seccomp seccomp.Program `json:"seccomp"`

	// EgressPort, when non-zero, makes init listen on 127.0.0.1:EgressPort
	// inside the sandbox and bridge every connection to the egress proxy
	// (EgressFD). The program's HTTP_PROXY points there.
	EgressPort int `json:"egress_port,omitempty"`

	// TrustPEM, when set, is the run CA of the egress proxy (it
	// terminates TLS for secret-bound hosts): init writes the image's CA
	// bundle plus this to TrustFile, read-only, and binds it over the
	// image's bundle at TrustBundle when the image has one (the paths
	// are tier.TrustFile and tier.TrustBundle).
	TrustPEM    []byte `json:"trust_pem,omitempty"`
	TrustFile   string `json:"trust_file,omitempty"`
	TrustBundle string `json:"trust_bundle,omitempty"`

	// Landlock requires the Landlock ruleset; when false and the kernel
	// lacks Landlock, init goes on and reports the degradation.
	RequireLandlock bool `json:"require_landlock"`

	// CgroupFDs is how many cgroup v1 "tasks" files the host passed from
	// CgroupFD on: init's main thread moves itself into the run's cgroup
	// through them before anything else.
	CgroupFDs int `json:"cgroup_fds,omitempty"`

	// WritableRoot binds Root read-write (still nosuid, nodev) and lets
	// Landlock allow writes everywhere in it: an image build step, whose
	// root is the image tree being built. The host shifted the tree's
	// ownership into the sandbox's id range first.
	WritableRoot bool `json:"writable_root,omitempty"`

	// KeepCaps are the capabilities (numbers, e.g. unix.CAP_CHOWN) the
	// program keeps, inside its user namespace only, when UID is 0: what a
	// build step's package manager needs to install files. Init refuses
	// any not in BuildCaps, and any at all for another UID.
	KeepCaps []int `json:"keep_caps,omitempty"`

	// OCI, when set, makes init an OCI container's init (package
	// ociruntime): Root is an empty directory where init assembles the
	// container's root, no workspace, and init outlives the process that
	// started it (no parent-death signal); it starts the program only
	// when the start FIFO (OCIStartFD) is written, forwards the signals
	// it receives to the program and exits with the program's status.
	OCI *OCI `json:"oci,omitempty"`
}

// BuildCaps are the only capabilities a Setup may keep (KeepCaps): owning,
// overriding permissions on and changing the ids of files and processes
// in the sandbox's own user namespace, as dpkg, pip and npm do when they
// install as root. Never CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_MKNOD,
// CAP_SETFCAP or anything else that reaches beyond the files.
var BuildCaps = []int{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID,
	unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_KILL,
}

// Rlimits are the backstop limits set on the program.
type Rlimits struct {
	NoFile     uint64 `json:"nofile"`
	FSize      uint64 `json:"fsize"`
	NProc      uint64 `json:"nproc"`
	CPUSeconds uint64 `json:"cpu_seconds"`
}

// Status is one message from init to the host.
type Status struct {
	// Proc, in session mode, names the command this status is about
	// (0: the session itself: Started means ready to serve).
	Proc int `json:"proc,omitempty"`
	// Ready (one-shot mode): confined, waiting for the Command frame.
	Ready   bool `json:"ready,omitempty"`
	Started bool `json:"started,omitempty"`
	// Pid, with Started of a command, is its pid in the sandbox's PID
	// namespace (where init is 1): the number the sandbox's own programs
	// see and can signal (E2B's process ids). 0: not known.
	Pid int `json:"pid,omitempty"`
	// Exited is true when the program ended; Exit or Signal says how.
	Exited bool `json:"exited,omitempty"`
	Exit   int  `json:"exit"`
	Signal int  `json:"signal,omitempty"`
	// DurationNS, with Exited, is how long the program ran, from just
	// before its fork to its reaping, on init's monotonic clock: the
	// host's own clock sees only when the reports arrive, and a loaded
	// host can read the start and the end in one batch.
	DurationNS int64 `json:"duration_ns,omitempty"`
	// NotFound means the command does not exist in the image (exit 127);
	// NotExecutable means it exists but cannot be executed (exit 126).
	NotFound      bool `json:"not_found,omitempty"`
	NotExecutable bool `json:"not_executable,omitempty"`
	// Degraded lists protections not applied (only those the host allowed).
	Degraded []string `json:"degraded,omitempty"`
	// Error is a setup failure; init exits right after sending it.
	Error string `json:"error,omitempty"`
}

// WriteFrame writes one length-prefixed JSON frame.
func WriteFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxConfigBytes {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(b), MaxConfigBytes)
	}
	hdr := binary.LittleEndian.AppendUint32(nil, uint32(len(b)))
	_, err = w.Write(append(hdr, b...))
	return err
}

// ReadFrame reads one frame into v.
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n > MaxConfigBytes {
		return fmt.Errorf("frame of %d bytes exceeds %d", n, MaxConfigBytes)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// File descriptors of OCI mode (Setup.OCI), the runtime that containerd
// and Docker drive (package ociruntime). They replace WorkspaceFD and
// EgressFD, which OCI mode has no use for.
const (
	// OCIFDSocket is a unix socket on which the host sends, once init is
	// started, one message whose SCM_RIGHTS are the detached mounts init
	// attaches: the container's root layers first (OCI.RootLayers), then
	// one per OCIMount of type "bind", in order. Init needs its user namespace to exist
	// before the host can id-map a tree for it, hence a message rather
	// than descriptors inherited at clone.
	OCIFDSocket = 5
	// OCIStartFD is the read end of the container's start FIFO: init
	// starts the program only once `start` writes to it.
	OCIStartFD = 6
	// OCIExecFD, with OCI.Exec, is a listening SOCK_SEQPACKET socket
	// (bound by the host at a root-only path): each connection is one
	// exec, an OpExec Request with the command's stdin, stdout and
	// stderr as SCM_RIGHTS, then OpSignal Requests; init answers with a
	// Started Status and, when the command ends, an Exited one. A
	// connection closed before that kills the command.
	OCIExecFD = 7
)

// OCI is the container's shape in OCI mode: what differs from a Moat run.
type OCI struct {
	// ReadonlyRoot keeps the container's root read-only; otherwise it is
	// writable on a tmpfs overlay whose writes vanish with the container.
	ReadonlyRoot bool `json:"readonly_root"`
	// RootBytes bounds the overlay's tmpfs (the writes to the root).
	RootBytes int64 `json:"root_bytes"`
	// NewNet and NewUTS say init created these namespaces (it brings up
	// loopback, sets the hostname); false: they were joined (a pod's),
	// owned by another user namespace, and init leaves them as they are.
	NewNet bool `json:"new_net"`
	NewUTS bool `json:"new_uts"`
	// Mounts are the spec's mounts Moat honours beyond its own /proc,
	// /dev and /tmp, in order.
	Mounts []OCIMount `json:"mounts,omitempty"`
	// Rlimits replace Moat's backstop limits (Setup.Rlimits).
	Rlimits []Rlimit `json:"rlimits,omitempty"`
	// Exec: OCIExecFD is there; init serves execs while the program runs.
	Exec bool `json:"exec,omitempty"`
	// RootLayers is how many trees on OCIFDSocket make the root, top
	// first (the layers of an engine's overlay rootfs; 0 or 1: the rootfs
	// itself); the bind mounts' follow.
	RootLayers int `json:"root_layers,omitempty"`
	// Terminal, when set, gives the program a new terminal of the
	// container's devpts, of this size, as its stdio and controlling
	// terminal; init sends the terminal's master back on OCIFDSocket
	// (SCM_RIGHTS) before it reports Ready, for the engine's console
	// socket.
	Terminal *Winsize `json:"terminal,omitempty"`
	// UnprivilegedPortStart, when set, is written to the new network
	// namespace's net.ipv4.ip_unprivileged_port_start (Docker asks 0).
	UnprivilegedPortStart *int `json:"unprivileged_port_start,omitempty"`
	// ExitFD, when not 0, is a file of the runtime's state that init
	// writes the program's final Status to (one JSON line) before it
	// exits: the runtime's delete reads it for the container's result,
	// since the exit status itself goes to the engine's shim.
	ExitFD int `json:"exit_fd,omitempty"`
	// EgressFD, when not 0, is an O_PATH descriptor of the socket of
	// the container's egress proxy (the runtime's monitor), which init's
	// listener on 127.0.0.1:Setup.EgressPort relays to, as a Moat run's
	// EgressFD. Only with NewNet: the container's own network namespace.
	EgressFD int `json:"egress_fd,omitempty"`
	// SendUpper makes init send the host, on OCIFDSocket before anything
	// else, a detached copy (open_tree) of its root overlay's upper
	// directory: the container's writes to its root, which the runtime's
	// monitor keeps after init is gone and turns into the result's diff.
	SendUpper bool `json:"send_upper,omitempty"`
}

// OCIMount is one mount of the container.
type OCIMount struct {
	Dest string `json:"dest"`
	// Type is "bind" (a detached tree sent on OCIFDSocket) or "tmpfs".
	Type string `json:"type"`
	// Dir: the bind's source is a directory (the mount point made for a
	// missing destination is a directory, else a file).
	Dir      bool `json:"dir,omitempty"`
	ReadOnly bool `json:"readonly,omitempty"`
	// Data are a tmpfs's options (size=..., mode=...), already checked.
	Data string `json:"data,omitempty"`
}

// Rlimit is one resource limit (unix.RLIMIT_*).
type Rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}
