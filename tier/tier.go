// Package tier defines the interface every isolation tier implements, in
// Moat's own types. Callers (the engine) never branch on which tier they
// hold; they check Capabilities before starting and read one Outcome after.
//
// This package holds no mechanism: each tier lives in its own sub-package
// (native, gvisor, microvm, wasm).
package tier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/result"
)

// Tier prepares sandboxes of one isolation kind.
type Tier interface {
	// Name is the tier's name as written in manifests ("native").
	Name() string
	// Capabilities reports what this tier can enforce on this host.
	Capabilities() Capabilities
	// Prepare builds a sandbox up to the point where only the command is
	// missing. The sandbox is used once and must be destroyed.
	Prepare(ctx context.Context, spec *Spec) (Sandbox, error)
}

// Sandbox is one prepared, single-use sandbox.
type Sandbox interface {
	// Workspace returns where the host reaches the sandbox's /workspace,
	// valid until Destroy. Everything below it is hostile: open it only
	// with symlink-safe resolution (os.Root).
	Workspace() Workspace
	// Exec runs the command to completion (or until ctx ends, which kills
	// the whole sandbox) and reports the outcome. The returned error is for
	// Moat's own failures only; the program's fate is in Outcome.
	Exec(ctx context.Context, cmd *Command) (*Outcome, error)
	// Destroy kills everything left and removes every trace of the
	// sandbox. It is safe to call more than once.
	Destroy() error
}

// Workspace is the host's view of a sandbox's /workspace.
type Workspace struct {
	// Dir is a host path to the directory (possibly /proc/self/fd/N).
	Dir string
	// UID and GID are the host ids that files copied in must be owned by
	// to belong to the sandbox's user.
	UID, GID int
}

// Readier is implemented by sandboxes whose Prepare returns before the
// sandbox is completely set up (the rest happens while the caller copies
// inputs in). WaitReady blocks until it is; warm pools call it before
// offering a sandbox.
type Readier interface {
	WaitReady(ctx context.Context) error
}

// ProcessLister is implemented by sandboxes whose processes are host
// processes: it lists their host pids while the sandbox lives.
type ProcessLister interface {
	Procs() ([]int, error)
}

// RuntimeLister is implemented by sandboxes whose program runs inside a
// user-space kernel, so that the program's processes are not host
// processes: RuntimeProcs lists the host pids of the runtime's processes
// that stand between the program and the host kernel (for gVisor: every
// host process in the sandbox's cgroup, the Sentry, its systrap stubs and
// the gofer) while the sandbox lives.
type RuntimeLister interface {
	RuntimeProcs() ([]int, error)
}

// Spec is what a tier needs to build a sandbox. Sizes are in bytes.
type Spec struct {
	ID        string
	ImageRoot string // host path of the read-only image root filesystem
	ImageEnv  []string
	// ImageDigest is the image's content digest ("sha256:<hex>"), for
	// tiers that cache a converted image (the microvm tier's disk).
	ImageDigest string
	Limits      Limits
	// AllowMissing names protections the manifest accepts going without.
	AllowMissing []string
	// EgressSocket, when set, is the host path of the egress proxy's Unix
	// socket: the sandbox's only way out. The tier makes it reachable from
	// inside as an HTTP proxy on 127.0.0.1:EgressPort.
	EgressSocket string
	// TrustPEM, when set, is a CA certificate (PEM) the sandbox must
	// trust for the run: the egress proxy's run CA, which signs for the
	// hosts secrets are bound to (egress.Proxy.TrustPEM). A tier with
	// Capabilities.TrustStore installs the image's CA bundle plus this at
	// TrustFile and over TrustBundle when the image has it; the engine
	// refuses a run that needs it on any other tier.
	TrustPEM []byte
	// StateDir is the run's private directory on the host (mode 0700,
	// owned by root) for whatever the tier must keep as files (an OCI
	// bundle, a runtime's state, a mount point). The engine removes it
	// after Destroy, and its GC lazily unmounts anything mounted below a
	// dead run's StateDir before removing it.
	StateDir string
	// Session prepares a sandbox that runs many commands: the returned
	// Sandbox implements Sessioner, and Exec is not used.
	Session bool
	// Build makes the sandbox an image build step's (Capabilities.
	// BuildSteps; nil for every run). Tiers without that capability
	// refuse a Spec that has it (CheckNoBuild).
	Build *BuildSpec
}

// BuildSpec is what makes a sandbox an image build step's: its root is
// ImageRoot itself, read-write, and the tier owns making the files the
// step writes come out owned by the ids they have inside.
type BuildSpec struct {
	// AsRoot runs the program as uid 0 of its user namespace, keeping
	// only the capabilities a package manager needs to install files
	// (never host root); false: the sandbox user, as in a run.
	AsRoot bool
}

// CheckNoBuild is the refusal of a tier that cannot run build steps
// (Capabilities.BuildSteps false): a Spec with Build set is an error
// naming the tier, never a read-only or silently different sandbox.
func CheckNoBuild(tierName string, spec *Spec) error {
	if spec != nil && spec.Build != nil {
		return fmt.Errorf("%w: the %s tier cannot run image build steps (a writable image root); only the native tier can", ErrUnavailable, tierName)
	}
	return nil
}

// TrustFile is where a sandbox given Spec.TrustPEM finds the image's CA
// bundle plus the run CA, read-only; TrustEnv points the usual clients
// there. TrustBundle is the Debian-style system bundle, replaced by the
// same file when the image has it, for clients that read only that.
const (
	TrustFile   = "/tmp/.moat-run-ca.pem"
	TrustBundle = "/etc/ssl/certs/ca-certificates.crt"
)

// TrustEnv are the variables that make OpenSSL, curl, Python's requests
// and pip, Node and npm, and git trust TrustFile.
func TrustEnv() map[string]string {
	env := map[string]string{}
	for _, k := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS", "NPM_CONFIG_CAFILE", "GIT_SSL_CAINFO"} {
		env[k] = TrustFile
	}
	return env
}

// EgressPort is where a sandbox with an egress grant finds the proxy, on
// its own loopback.
const EgressPort = 3128

// Limits are the enforced resource bounds of one run.
type Limits struct {
	CPUs           float64
	MemoryBytes    int64
	Pids           int
	Timeout        time.Duration
	CPUTime        time.Duration
	OpenFiles      int
	FileSizeBytes  int64
	WorkspaceBytes int64
	WorkspaceFiles int
	TmpBytes       int64
}

// Command is what runs inside a prepared sandbox.
type Command struct {
	Argv []string
	Env  []string // complete environment, KEY=VALUE; nothing else is inherited
	Dir  string   // working directory inside the sandbox
	// Stdin, Stdout and Stderr are the host ends. Stdin nil means
	// /dev/null. The tier copies at most what the writers accept; capping
	// is the writers' job (package output).
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Timeout bounds one command of a session (0: Limits.Timeout). A
	// single-use sandbox's Exec always uses Limits.Timeout.
	Timeout time.Duration
	// TTY, for a session command on a tier with Capabilities.Terminals,
	// starts it on a new terminal of the sandbox's own (devpts) of this
	// size: Stdin is typed into the terminal, Stdout receives everything
	// it shows (stdout and stderr, with the terminal's echo and \r\n), and
	// Stderr nothing. The Process then implements Resizer.
	TTY *WindowSize
}

// WindowSize is a terminal's size in characters.
type WindowSize struct {
	Rows uint16
	Cols uint16
}

// Resizer is implemented by a Process started with Command.TTY.
type Resizer interface {
	// Resize sets the terminal's window size (the command gets SIGWINCH).
	Resize(ws WindowSize) error
}

// Sessioner is implemented by sandboxes prepared with Spec.Session: they
// run many commands, one after another or at once, in the same
// namespaces, cgroup and workspace, until Destroy.
type Sessioner interface {
	// Start starts one command; ctx bounds only the start. The command
	// runs until it exits, its timeout passes, it is signalled, or the
	// sandbox is destroyed.
	Start(ctx context.Context, cmd *Command) (Process, error)
}

// Process is one command started in a session sandbox.
type Process interface {
	// Signal sends sig to the command's process group.
	Signal(sig syscall.Signal) error
	// Wait blocks until the command has ended and its output is drained,
	// and reports its outcome. It may be called more than once.
	Wait() (*Outcome, error)
}

// PidReporter is implemented by a Process that knows its pid in the
// sandbox's PID namespace: the number the sandbox's own programs see
// (ps, kill) and can signal, never the sandbox's init. Pid waits until
// the command started (bounded) and is 0 when it is not known.
type PidReporter interface {
	Pid() int
}

// Outcome is what a tier observed about one Exec. The engine turns it into
// a result.Result.
type Outcome struct {
	Termination result.Termination
	ExitCode    int
	Signal      int
	Duration    time.Duration
	CPU         time.Duration
	PeakMemory  int64
	Violations  []result.Violation
	// Degradations lists protections that were not applied (accepted by
	// Spec.AllowMissing).
	Degradations []string
	// Error explains an infra-error termination.
	Error string
	// Runtime names the runtime and its version, when the tier runs the
	// program through one (gVisor's runsc).
	Runtime string
}

// Capabilities declares what a tier can honour on this host.
type Capabilities struct {
	MemoryLimit bool
	PidsLimit   bool
	CPULimit    bool
	NetworkNone bool
	// NetworkEgress: the tier can give the sandbox Moat's egress proxy.
	NetworkEgress bool
	Seccomp       bool
	Landlock      bool
	WorkspaceCap  bool
	// Sessions: the tier prepares sandboxes that run many commands
	// (Spec.Session, Sessioner).
	Sessions bool
	// Terminals: session commands can have a terminal (Command.TTY).
	Terminals bool
	// BuildSteps: the tier runs image build steps (Spec.Build): the
	// image root writable, the program possibly uid 0 of its namespace.
	BuildSteps bool
	// TrustStore: the tier installs Spec.TrustPEM in the sandbox's trust
	// store (TrustFile, TrustBundle), so secrets can be used there.
	TrustStore bool
	// OnlyGuests: the tier runs only its own WebAssembly guests (python3,
	// a JavaScript engine), not Linux programs: no shell, no /proc, no
	// processes, no raw system calls. Conformance cases that need those
	// are not applicable to it.
	OnlyGuests bool
	// Missing explains each protection the tier cannot apply here.
	Missing []string
}

// ErrUnavailable is returned (wrapped) when a tier cannot run on this host.
var ErrUnavailable = errors.New("tier unavailable on this host")

// ErrLeftovers is wrapped into a Prepare error when undoing the failed
// preparation did not remove everything (a cgroup still busy): the engine
// then keeps the run's directory, so GC finds a dead run and removes what
// it left.
var ErrLeftovers = errors.New("the failed sandbox could not be fully removed")
