// Package gvisor is the gVisor isolation tier: the untrusted program runs
// on gVisor's Sentry, a Linux kernel written in Go that implements the
// system calls in user space, so the program never reaches the host
// kernel's system call table. The Sentry and its file proxy (the gofer)
// are in turn confined by gVisor's own seccomp filters, namespaces and
// chroot, and by the run's cgroup.
//
// Moat drives runsc, gVisor's OCI runtime, as a child process: it writes
// an OCI bundle and keeps runsc's state directory under the run's private
// Spec.StateDir, mounts the workspace tmpfs there, and boots the sandbox
// (`runsc run`) with Moat's guest as its init (package gvinit, the moat
// binary bound in read-only). Every command, a one-shot run's as well as a
// session's, is then started by `runsc exec`, so a warm pool holds booted
// sandboxes that wait only for the command. The program gets the same
// image, inputs, limits and structured result as on the native tier:
//
//   - memory, CPU and pids: the run's cgroup (package cgroup), which runsc
//     is pointed at (linux.cgroupsPath) and joins before it forks the
//     Sentry and the gofer; its counters give CPU time, peak memory, OOM
//     kills and pids-limit hits, all of gVisor's own use included (the
//     Sentry and the gofer take ~20-50 MiB and ~20 host tasks; the pids
//     limit allows 64 more tasks for that);
//   - open files, file size, CPU time, tasks: rlimits the Sentry enforces,
//     set on each command by the guest (runsc exec sets none);
//   - workspace size and files: a host tmpfs, bound into the sandbox;
//   - /tmp: a tmpfs of the Sentry's, sized (its inodes are bounded by
//     memory only: gVisor's tmpfs has no nr_inodes);
//   - network none: the Sentry's own stack with loopback only; an
//     allowlist: the same, plus the egress proxy's host socket bound into
//     the sandbox (runsc --host-uds=open) and the guest's relay from
//     127.0.0.1:tier.EgressPort to it. Never runsc's host network.
//
// Not provided: the native tier's seccomp and Landlock layers, which
// gVisor replaces. The Sentry and the gofer run as host root (in an
// identity-mapped user namespace) with few capabilities, chrooted and
// seccomp-confined: that is gVisor's model, in which the Sentry's seccomp
// filter is the boundary.
//
// This package must never run untrusted code itself, never signal a
// process it did not start (it signals only its own runsc children, and
// kills through the run's own cgroup), and never leave a runsc process, a
// state directory, a mount or a cgroup behind.
package gvisor

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/tier"
)

// Name is the tier's manifest name.
const Name = "gvisor"

// DefaultRunsc is where scripts/setup installs the pinned runsc.
const DefaultRunsc = "/usr/local/lib/moat/runsc"

// The program's ids inside the sandbox. gVisor's Sentry writes workspace
// files with them, so they are also the host owner of the workspace.
const (
	SandboxUID = 1000
	SandboxGID = 1000
)

// platform is how gVisor intercepts the program's system calls. systrap
// (seccomp traps answered through shared memory) needs no hardware
// virtualisation; it is runsc's default, named explicitly so that a runsc
// with another default cannot change the tier silently.
const platform = "systrap"

// minRelease is the oldest gVisor accepted, as YYYYMMDD. Debian's runsc
// (0.0~20221219) starts, but every stat in the sandbox fails with EINVAL on
// this generation of kernels.
const minRelease = "20240101"

// goidLayoutFixed is the first gVisor (YYYYMMDD) assumed to know the
// goroutine layout of Go 1.25 and later. gVisor's pkg/goid reads g.goid at
// a fixed offset written for Go 1.23/1.24 (160); Go 1.25 removed
// gobuf.ret, moving goid to 152, so a runsc built with a newer Go reads
// g.schedlink instead and its Sentry panics at random ("running on
// goroutine 0"): measured here, 20 of 20 runs of a shell script failed with
// gVisor 20250205 built with go1.26.8, none with go1.24.13.
const goidLayoutFixed = "20250801"

var _ tier.Tier = (*GVisor)(nil)

// GVisor prepares gVisor sandboxes.
type GVisor struct {
	runsc   string
	version string
	guest   string
	cg      *cgroup.Host
	caps    tier.Capabilities
}

// Options configure the tier. The zero value is ready to use.
type Options struct {
	// Runsc is the path of gVisor's runsc. Default: $MOAT_RUNSC, else
	// DefaultRunsc, else runsc on PATH.
	Runsc string
	// Guest is the moat binary that runs inside the sandbox as its init
	// and at the start of every command (package gvinit): statically
	// linked, dispatching gvwire.Arg. Default: the running executable.
	Guest string
}

// New checks that this host can run the tier and returns it. The error
// says what is missing and how to fix it, and wraps tier.ErrUnavailable.
func New(opts Options) (*GVisor, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("%w: the gvisor tier needs root: runsc creates the sandbox's namespaces and cgroup (run moat as root, e.g. with sudo)", tier.ErrUnavailable)
	}
	path, err := findRunsc(opts.Runsc)
	if err != nil {
		return nil, err
	}
	version, err := runscVersion(path)
	if err != nil {
		return nil, err
	}
	guest, err := findGuest(opts.Guest)
	if err != nil {
		return nil, err
	}
	cg, err := cgroup.Detect()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
	}
	if cg.Version == cgroup.V2 {
		if err := checkUnified(cgroupRoot); err != nil {
			return nil, fmt.Errorf("%w: %v", tier.ErrUnavailable, err)
		}
	}
	g := &GVisor{runsc: path, version: version, guest: guest, cg: cg, caps: tier.Capabilities{
		MemoryLimit:   true,
		PidsLimit:     true,
		CPULimit:      true,
		NetworkNone:   true,
		NetworkEgress: true,
		WorkspaceCap:  true,
		Sessions:      true,
		TrustStore:    true,
		Missing: []string{
			"seccomp, landlock: the native tier's filters are not used; the program's system calls go to gVisor's Sentry, itself confined by gVisor's seccomp filter",
		},
	}}
	// Collect what runs killed earlier left in the cgroup hierarchies only
	// runsc uses (the engine's GC knows Moat's own).
	g.pruneForeign()
	return g, nil
}

// Name implements tier.Tier.
func (g *GVisor) Name() string { return Name }

// Capabilities implements tier.Tier.
func (g *GVisor) Capabilities() tier.Capabilities { return g.caps }

// Version names the gVisor that runs the programs and its platform, e.g.
// "gvisor.dev/gvisor v0.0.0-20250205023644-9414b50a5633 (systrap)".
func (g *GVisor) Version() string { return g.version }

// Runsc is the path of the runsc binary the tier runs.
func (g *GVisor) Runsc() string { return g.runsc }

// findRunsc resolves Options.Runsc, $MOAT_RUNSC, DefaultRunsc and PATH, in
// that order, and checks that the binary is safe to run as root.
func findRunsc(p string) (string, error) {
	const fix = "run scripts/setup, which builds gVisor's runsc from the Go module proxy and installs it at " + DefaultRunsc
	from := "Options.Runsc"
	if p == "" {
		p, from = os.Getenv("MOAT_RUNSC"), "$MOAT_RUNSC"
	}
	if p == "" {
		if _, err := os.Stat(DefaultRunsc); err == nil {
			p, from = DefaultRunsc, "the default location"
		} else if lp, err := exec.LookPath("runsc"); err == nil {
			p, from = lp, "PATH"
		} else {
			return "", fmt.Errorf("%w: runsc not found ($MOAT_RUNSC unset, nothing at %s or on PATH): %s", tier.ErrUnavailable, DefaultRunsc, fix)
		}
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%w: runsc %s (from %s): %v", tier.ErrUnavailable, p, from, err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return "", fmt.Errorf("%w: runsc %s (from %s): %v; %s", tier.ErrUnavailable, abs, from, err, fix)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%w: runsc %s (from %s) is not an executable file; %s", tier.ErrUnavailable, abs, from, fix)
	}
	// Moat runs it as root: whoever can replace it owns the host.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Uid != 0 || fi.Mode().Perm()&0o022 != 0) {
		return "", fmt.Errorf("%w: runsc %s (from %s) is owned by uid %d with mode %04o: it runs as root, so it must be owned by root and writable by nobody else (fix: chown root:root %s && chmod 0755 %s)", tier.ErrUnavailable, abs, from, st.Uid, fi.Mode().Perm(), abs, abs)
	}
	return abs, nil
}

// The package's regular expressions compile on first use: every moat
// process links this tier, and few of them start gVisor.
var (
	pseudoDate  = lazyRegexp(`^v\d+\.\d+\.\d+-(?:0\.)?(\d{8})\d{6}-[0-9a-f]{12}$`)
	releaseDate = lazyRegexp(`release-(\d{8})`)
	goMinor     = lazyRegexp(`^go1\.(\d+)`)
)

func lazyRegexp(pattern string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
}

// runscVersion reads which gVisor the binary is, from its Go build info
// (what `go install` of a pinned version records), else from
// `runsc --version`, and refuses versions known not to work.
func runscVersion(path string) (string, error) {
	const fix = "run scripts/setup to build the pinned gVisor"
	var version, date string
	if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Path == "gvisor.dev/gvisor" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		version = bi.Main.Path + " " + bi.Main.Version
		if m := pseudoDate().FindStringSubmatch(bi.Main.Version); m != nil {
			date = m[1]
		}
		if m := goMinor().FindStringSubmatch(bi.GoVersion); m != nil && date != "" && date < goidLayoutFixed {
			if minor, _ := strconv.Atoi(m[1]); minor >= 25 {
				return "", fmt.Errorf("%w: runsc %s is gVisor %s built with %s, whose goroutine layout that gVisor predates: its Sentry panics at random (\"running on goroutine 0\"); rebuild it with Go 1.24: CGO_ENABLED=0 GOTOOLCHAIN=go1.24.13 go install gvisor.dev/gvisor/runsc@%s", tier.ErrUnavailable, path, bi.Main.Version, bi.GoVersion, bi.Main.Version)
			}
		}
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, path, "--version").Output()
		if err != nil {
			return "", fmt.Errorf("%w: %s --version: %v; %s", tier.ErrUnavailable, path, err, fix)
		}
		first, _, _ := bytes.Cut(out, []byte("\n"))
		version = strings.TrimSpace(string(first))
		if version == "" || len(version) > 200 {
			return "", fmt.Errorf("%w: %s --version printed no version; %s", tier.ErrUnavailable, path, fix)
		}
		if m := releaseDate().FindStringSubmatch(version); m != nil {
			date = m[1]
		}
	}
	if date != "" && date < minRelease {
		return "", fmt.Errorf("%w: runsc %s is %s, older than %s (Debian's runsc from 2022 fails every stat in the sandbox); %s", tier.ErrUnavailable, path, version, minRelease, fix)
	}
	return version + " (" + platform + ")", nil
}

// findGuest resolves Options.Guest and checks that it can run inside the
// sandbox: a regular, statically linked executable (the image's libc is
// not Moat's). The host never runs it.
func findGuest(p string) (string, error) {
	if p == "" || p == "/proc/self/exe" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("%w: the moat binary to run inside the sandbox: %v", tier.ErrUnavailable, err)
		}
		p = exe
	}
	abs, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", fmt.Errorf("%w: the moat binary to run inside the sandbox: %v", tier.ErrUnavailable, err)
	}
	fi, err := os.Stat(abs)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("%w: the moat binary to run inside the sandbox, %s, is not an executable file", tier.ErrUnavailable, abs)
	}
	f, err := elf.Open(abs)
	if err != nil {
		return "", fmt.Errorf("%w: the moat binary to run inside the sandbox, %s: %v", tier.ErrUnavailable, abs, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%w: the moat binary %s is dynamically linked; the gvisor tier runs it inside the sandbox, where the image's libraries are not its own: build it with CGO_ENABLED=0", tier.ErrUnavailable, abs)
		}
	}
	return abs, nil
}
