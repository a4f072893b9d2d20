package redteam

import "fmt"

// The wasm tier's own expectations. A WebAssembly guest (CPython-WASI or
// QuickJS) runs inside moat's process and reaches the host only through the
// WASI preview 1 imports wazero implements: files under the workspace (its
// / and /workspace, through os.Root), the read-only runtime library, stdio,
// clocks and random numbers. It has no shell, no processes, no signals, no
// sockets, no ctypes and no raw system calls. So:
//
//   - a case whose command is not a guest (sh, a Linux program) never runs
//     there and is reported not-applicable by the runner (runner.exec);
//   - a case whose attack can be written in Python runs a Python variant
//     of the same attack, judged by the same host-side checks;
//   - host_procs, on this tier, is the host's evidence that the guest
//     stayed code in moat's process: moat has no child process while it
//     runs (procWatch.moatChildren);
//   - a case that attacks something the tier does not have (a Linux
//     system call, the egress proxy, host processes' descriptor tables) is
//     not applicable, with the reason.
//
// Kept here, in Go, rather than in every YAML file: one place says how the
// tier is judged. applyTierTable refuses an entry for a case that already
// has one, or for a case that does not exist.

const (
	wasmSyscall = "the attack issues Linux system calls through ctypes (libc.syscall and friends); the CPython-WASI guest has no ctypes and no system-call instruction: its only way out is the WASI preview 1 imports wazero implements, which the file, network, output and resource cases attack on this tier"
	wasmAllow   = "the wasm tier refuses network.mode allowlist before preparing anything (a WebAssembly guest has no sockets here), so the egress proxy this case attacks is never started for it; the no-network cases (net-*, supply-*, rt-metadata-service) run on the tier instead"
	wasmNoSock  = "socket() does not exist for the guest (WASI preview 1 cannot create sockets; CPython-WASI raises before the program can report each attempt), so the program's own report is replaced by the host's evidence: no host process appeared while the guest ran in moat's process"
)

var wasmTable = map[string]TierExpect{
	// Linux system calls.
	"priv-bpf":                    {Reason: wasmSyscall, NotApplicable: true},
	"priv-credentials":            {Reason: wasmSyscall, NotApplicable: true},
	"priv-hostname-setns":         {Reason: wasmSyscall, NotApplicable: true},
	"priv-keyrings":               {Reason: wasmSyscall, NotApplicable: true},
	"priv-kernel-sockets":         {Reason: wasmSyscall, NotApplicable: true},
	"priv-mount-tmpfs":            {Reason: wasmSyscall, NotApplicable: true},
	"priv-new-mount-api":          {Reason: wasmSyscall, NotApplicable: true},
	"priv-perf-event":             {Reason: wasmSyscall, NotApplicable: true},
	"priv-personality":            {Reason: wasmSyscall, NotApplicable: true},
	"priv-pivot-chroot":           {Reason: wasmSyscall, NotApplicable: true},
	"priv-raw-hardware":           {Reason: wasmSyscall, NotApplicable: true},
	"priv-unshare-user":           {Reason: wasmSyscall, NotApplicable: true},
	"priv-userfaultfd":            {Reason: wasmSyscall, NotApplicable: true},
	"proc-cgroupfs-release-agent": {Reason: wasmSyscall, NotApplicable: true},
	"sc-io-uring":                 {Reason: wasmSyscall, NotApplicable: true},
	"sc-ptrace-family":            {Reason: wasmSyscall, NotApplicable: true},
	"sc-x32-abi":                  {Reason: wasmSyscall, NotApplicable: true},
	"sc-syscall-sweep":            {Reason: "the sweep compares the seccomp filter installed on the program with the native tier's policy table; a WebAssembly guest makes no system call at all, so there is no filter to compare: its imports are WASI preview 1 only, fixed by the module and wazero", NotApplicable: true},
	"sc-int80-getpid":             {Reason: "the attack jumps to x86 machine code on an mmap'd page; a WebAssembly guest can neither map nor jump to native code (wazero compiles only the validated module, and linear memory is data, never executable), and has no ctypes to try", NotApplicable: true},
	"sc-int80-thread":             {Reason: "the attack jumps to x86 machine code from a thread; a WebAssembly guest has neither threads (CPython-WASI is built without them) nor a way to run native code it wrote (linear memory is data, never executable)", NotApplicable: true},
	"fs-mknod":                    {Reason: "device nodes: WASI preview 1 has no mknod (CPython-WASI's os has no mknod or makedev), so the guest cannot even ask; the tier's file system serves only regular files, directories and symlinks inside the workspace", NotApplicable: true},
	"fs-setuid-no-gain":           {Reason: "setuid bits gain nothing without exec and uids: WASI has neither (CPython-WASI's os has no setuid, getuid or exec*), and the guest runs as no host user at all, inside moat's process", NotApplicable: true},
	"det-host-pid":                {Reason: "the attack signals the host moat by pid; WASI has no signals and no pids (CPython-WASI has no os.kill or os.getppid), and there is no /proc for the guest to find one", NotApplicable: true},
	"proc-host-pids-invisible":    {Reason: "the attack reads and signals host processes by pid; the guest's / is the workspace (no /proc: the read fails with ENOENT) and WASI has no signals (no os.kill), so the kill half cannot be expressed; fs-host-canary-file's wasm variant reads host paths through /proc and .. instead", NotApplicable: true},
	"proc-init-environ-mem":       {Reason: "the attack reads its parent's environ and memory through /proc; the guest has no parent process, no pids (no os.getppid) and no /proc; fs-host-env-canary's wasm variant looks for moat's environment in the guest's instead", NotApplicable: true},
	"proc-thread-status":          {Reason: "the attack reads its own threads' capabilities from /proc; the guest has no threads, no capabilities and no /proc (its / is the workspace), so there is nothing to read; host_procs shows that no host process appeared", NotApplicable: true},
	"res-zip-bomb":                {Reason: "the CPython-WASI guest is built without zlib, so it can neither build nor inflate a deflate archive; the workspace size bound the case aims at is attacked on this tier by res-disk-bomb's Python variant and res-inode-bomb", NotApplicable: true},

	// The egress proxy.
	"net-egress-address-grant-ports": {Reason: wasmAllow, NotApplicable: true},
	"net-egress-bypass-proxy":        {Reason: wasmAllow, NotApplicable: true},
	"net-egress-conn-flood":          {Reason: wasmAllow, NotApplicable: true},
	"net-egress-exfil-budget":        {Reason: wasmAllow, NotApplicable: true},
	"hostwide-inotify-budget":        {Reason: "the guest has no inotify (WASI preview 1 has no file notification, and CPython-WASI no ctypes to call inotify_init1); it runs in moat's process, whose own kernel books are moat's", NotApplicable: true},
	"hostwide-sigpending-budget":     {Reason: "WASI has no signals (CPython-WASI has no os.kill or pthread_sigmask), so the guest cannot queue one", NotApplicable: true},
	"hostwide-aio-pool":              {Reason: wasmSyscall, NotApplicable: true},
	"covert-pipe-buffers":            {Reason: "WASI preview 1 has no pipes (CPython-WASI has no os.pipe) and no fcntl to size one", NotApplicable: true},
	"covert-fds-in-flight":           {Reason: wasmNoSock, NotApplicable: true},
	"det-host-identity":              {Reason: "the guest's / is the workspace: there is no /proc to read the host's boot command line, build string, boot id or disk statistics from (fs-host-canary-file's wasm variant walks the guest's whole tree)", NotApplicable: true},
	"net-egress-log-flood":           {Reason: wasmAllow, NotApplicable: true},
	"net-egress-dns-names":           {Reason: wasmAllow, NotApplicable: true},
	"net-egress-dns":                 {Reason: wasmAllow, NotApplicable: true},
	"net-egress-ip-literal":          {Reason: wasmAllow, NotApplicable: true},
	"net-egress-fronting":            {Reason: wasmAllow, NotApplicable: true},
	"net-egress-ech":                 {Reason: wasmAllow, NotApplicable: true},
	"net-egress-metadata":            {Reason: wasmAllow, NotApplicable: true},
	"net-egress-name-to-loopback":    {Reason: wasmAllow, NotApplicable: true},
	"net-egress-matcher-tricks":      {Reason: wasmAllow, NotApplicable: true},
	"net-egress-slowloris":           {Reason: wasmAllow, NotApplicable: true},
	"supply-allowlisted-index":       {Reason: wasmAllow, NotApplicable: true},

	// Host processes' descriptors, roots and limits (Go cases that read
	// the sandbox processes' /proc from the host).
	"priv-inherited-fds":     {Reason: "the case reads the sandbox processes' descriptor tables from the host's /proc; the guest is not a process but code in moat's own, and sees only the descriptors wazero gives it (stdio and the two preopens), never moat's", NotApplicable: true},
	"rt-leaked-host-fd":      {Reason: "the case reads the sandbox processes' descriptor tables from the host's /proc; the guest is not a process, and its descriptor numbers index wazero's own table (stdio and the preopens), not moat's, so a descriptor moat inherited is not addressable from the guest", NotApplicable: true},
	"rt-cwd-in-root":         {Reason: "the case compares the sandbox processes' cwd and root, read from the host's /proc, with the image; the guest is no host process: its root and working directory are the workspace preopen, which the file cases' wasm runs attack", NotApplicable: true},
	"rt-init-exe-overwrite":  {Reason: "the case attacks moat-init through /proc/1/exe and hashes its binary; the wasm tier has no init and the guest has no /proc (its / is the workspace), and it cannot open moat's executable outside the workspace", NotApplicable: true},
	"res-daemon-outlives":    {Reason: "the attack leaves a background process behind; WASI has no fork, exec or spawn (CPython-WASI raises 'wasi does not support processes'), and every wasm host_procs case checks that no host process appears while a guest runs", NotApplicable: true},
	"res-fd-exhaustion":      {Reason: "the case raises RLIMIT_NOFILE and counts host processes' descriptors; the guest has no rlimits and no process; its opens go through the tier's file system, which refuses past resources.open_files itself", NotApplicable: true},
	"net-inbound-listener":   {Reason: "the attack listens for a connection from the host; WASI preview 1 cannot create or bind a socket (CPython-WASI raises on socket()), and wazero is given no socket host functions, so no listener can exist", NotApplicable: true},
	"rt-host-unix-sockets":   {Reason: "the attack connects to host unix sockets; the guest cannot create a socket at all (WASI preview 1, no sock_open), and its / is the workspace, where no host socket path exists", NotApplicable: true},
	"exfil-terminal-escapes": {Reason: "the case runs a shell program through the moat CLI to check how the terminal renders its output; the wasm tier runs no shell, and the rendering is the CLI's, the same for every tier", NotApplicable: true},

	// Same attack, judged by the host.
	"net-dns-getaddrinfo":   {Reason: wasmNoSock, Expect: &Expect{HostProcs: true, MaxDurationMS: 15000}},
	"net-icmp-sockets":      {Reason: wasmNoSock, Expect: &Expect{HostProcs: true}},
	"net-no-route-off-host": {Reason: wasmNoSock, Expect: &Expect{HostProcs: true, MaxDurationMS: 10000}},
	"rt-metadata-service":   {Reason: wasmNoSock + "; the host listener on 127.0.0.1 must accept nothing", Expect: &Expect{NoConnections: true, HostProcs: true}},
	"fs-write-outside-workspace": {Reason: "the guest's / is the workspace itself (wasi-libc resolves relative paths against /, so / is mapped to /workspace), so a file created at / lands in the run's own workspace; every other directory must still be refused, and no host process may appear",
		Expect: &Expect{Denied: []string{"/etc", "/var", "/root", "/home", "/usr/local", "/opt", "/var/tmp", "/run", "/srv", "/mnt", "/workspace/../etc", "mkdir /etc"}, HostProcs: true}},
	"res-cpu-sigxcpu": {Reason: "the guest is one thread in moat's process with no rlimits or signals, so the CPU-time limit is enforced as a wall-clock limit at cpu_time (CPU time never exceeds wall time for one thread): the spin must end as a timeout at about 1 s",
		Expect: &Expect{Termination: []string{"timeout"}, MaxDurationMS: 2500}},
	"res-thread-bomb": {Reason: "CPython-WASI has no threads (start() raises at once), so the pids limit is never reached and no pids violation is recorded; contained if the run ends normally within its timeout and no host process or thread-bearing child appeared",
		Expect: &Expect{Termination: []string{"exited"}, MaxDurationMS: 4500, HostProcs: true}},

	// Python variants of shell attacks.
	"fs-host-canary-file": {Reason: "the wasm tier runs no shell: the same reads in Python (the host path, through /proc/*/root, through .. from the workspace, through a symlink the guest makes, and a walk of the guest's whole /), judged by the same canary checks",
		Python: wasmCanaryFile, Expect: &Expect{OutputLacks: []string{"{canary}"}, CanaryIntact: true, HostProcs: true}},
	"fs-host-env-canary": {Reason: "the wasm tier runs no shell: the same search in Python (the guest's whole environment, /proc/self/environ and /proc/1/environ), judged by the same canary check",
		Python: wasmEnvCanary, Expect: &Expect{OutputLacks: []string{"{canary}"}, HostProcs: true}},
	"exfil-host-secret-sweep": {Reason: "the wasm tier runs no shell: the same sweep in Python (every file the guest can reach from /, /tmp, /proc, /run read in full for the canary), judged by the same canary checks",
		Python: wasmSweep, Expect: &Expect{OutputLacks: []string{"{canary}"}, CanaryIntact: true, HostProcs: true}},
	"net-raw-connect-ignores-proxy": {Reason: "the wasm tier runs no shell: the case's Python part alone, with the proxy variables set from Python, judged by the same host listener",
		Python: wasmRawConnect, Expect: &Expect{NoConnections: true, HostProcs: true}},
	"io-absolute-and-dotdot-names": {Reason: "the wasm tier runs no shell: the same links (to .., to the output's parent, to the sentinel, to /) and odd names made in Python through WASI's path_symlink, judged by the same copy-out checks",
		Python: wasmDotdot, Expect: &Expect{CopyOutSafe: true, Termination: []string{"exited"}}},
	"res-disk-bomb": {Reason: "the wasm tier runs no shell: the same fill in Python (1 MiB files until a write fails), against the tier's own workspace quota, judged by the same disk violation and bounds",
		Python: wasmDiskBomb, Expect: &Expect{Violations: []string{"disk"}, Termination: []string{"disk-limit"}, DiffBounded: 20, MaxDurationMS: 4500}},
}

const wasmCanaryFile = `import os, time
for p in ["{canary_path}", "/proc/1/root{canary_path}", "/proc/self/root{canary_path}",
          "/workspace/../..{canary_path}", "../../../..{canary_path}", "/workspace/" + "../" * 12 + "{canary_path}"]:
    try:
        print(p, "read:", open(p).read())
    except OSError as e:
        print(p, "denied", e.errno)
for i, t in enumerate(["{canary_path}", "../../../../../..{canary_path}", "/proc/self/root{canary_path}"]):
    try:
        os.symlink(t, "/workspace/l%d" % i)
        print("via link", t, open("/workspace/l%d" % i).read())
    except OSError as e:
        print("link", t, "denied", e.errno)
for d, _, fs in os.walk("/"):
    for f in fs:
        if f == "secret.txt":
            try:
                print(os.path.join(d, f), open(os.path.join(d, f)).read())
            except OSError as e:
                print(os.path.join(d, f), "denied", e.errno)
t = time.time()
while time.time() - t < 0.2:  # CPython-WASI cannot sleep: stay alive for the host's samples
    pass
`

const wasmEnvCanary = `import os, time
for k, v in os.environ.items():
    print(k + "=" + v)
for p in ["/proc/self/environ", "/proc/1/environ"]:
    try:
        print(open(p, "rb").read().replace(b"\0", b"\n").decode("latin-1"))
    except OSError as e:
        print(p, "denied", e.errno)
t = time.time()
while time.time() - t < 0.2:  # CPython-WASI cannot sleep: stay alive for the host's samples
    pass
`

const wasmSweep = `import os, time
hits = 0
for top in ["/", "/tmp", "/var/tmp", "/dev/shm", "/run", "/proc", "/usr/local/lib"]:
    for d, _, fs in os.walk(top):
        for f in fs:
            try:
                b = open(os.path.join(d, f), "rb").read(1 << 20)
            except OSError:
                continue
            i = b.find(b"moat-canary")
            if i >= 0 and hits < 20:
                hits += 1
                print(os.path.join(d, f), b[i:i + 40].decode("latin-1"))
print("swept, hits:", hits)
t = time.time()
while time.time() - t < 0.2:  # CPython-WASI cannot sleep: stay alive for the host's samples
    pass
`

const wasmRawConnect = `import os, socket, time
os.environ.update(HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="*")
try:
    s = socket.socket()
    s.settimeout(1)
    s.connect(("127.0.0.1", {port}))
    s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
    print("connect sent", s.recv(100))
except (OSError, AttributeError) as e:
    print("refused", e)
t = time.time()
while time.time() - t < 0.2:  # CPython-WASI cannot sleep: stay alive for the host's samples
    pass
`

const wasmDotdot = `import os
os.chdir("/workspace")
for t, n in [("..", "up"), ("{out_parent}", "parent"), ("{out_parent}/sentinel", "sent"), ("/", "root")]:
    try:
        os.symlink(t, n)
    except OSError as e:
        print("symlink", n, "denied", e.errno)
os.makedirs("dir", exist_ok=True)
try:
    os.symlink("../../sentinel", "dir/sent2")
except OSError as e:
    print("symlink dir/sent2 denied", e.errno)
for p in ["parent/escaped", "sent/keep", "{out_parent}/sentinel/keep", "{out_parent}/escaped", "up/escaped", "root/escaped"]:
    try:
        with open(p, "w") as f:
            f.write("pwned\n")
        print("wrote", p)
    except OSError as e:
        print("write", p, "denied", e.errno)
for n in ["...", "-rf", " ..", ".. ", "a\n..", "..\t", "\\..\\..\\escaped"]:
    try:
        with open("dir/" + n, "w") as f:
            f.write("data\n")
    except OSError as e:
        print("name", repr(n), "denied", e.errno)
print(sorted(os.listdir(".")), sorted(os.listdir("dir")))
`

const wasmDiskBomb = `import sys
chunk = bytes(1 << 20)
i = 0
try:
    while True:
        with open("/workspace/fill%d" % i, "wb") as f:
            f.write(chunk)
        i += 1
except OSError as e:
    print("stopped after", i, "MiB:", e)
sys.exit(1)
`

// forGuests replaces a Go case's shell program by the same attack in
// Python on a tier that runs only its own guests (wasm).
func (r *runner) forGuests(c *Case, python string) {
	if r.guests != nil {
		c.Sh, c.Argv, c.Python = "", nil, python
	}
}

// The Python forms of Go cases' shell attacks (forGuests).
const wasmReadInputs = `import glob
for p in glob.glob("in/*/secret.txt") + glob.glob("in/*/shadow") + glob.glob("in/*/*/*/shadow") + ["in/secret.txt"]:
    try:
        print(open(p).read())
    except OSError as e:
        print(p, "denied", e.errno)
print("ran")
`

const wasmAccountFiles = `import os
for f in ["/etc/shadow", "/etc/gshadow", "/etc/passwd", "/etc/group"]:
    for p in [f, "/proc/1/root" + f, "/proc/self/root" + f, "/workspace/../.." + f, "../../.." + f]:
        try:
            print(open(p).read())
        except OSError as e:
            print(p, "denied", e.errno)
for d, _, fs in os.walk("/"):
    for n in fs:
        try:
            for line in open(os.path.join(d, n), errors="replace"):
                if line.startswith("root:"):
                    print(line)
        except OSError:
            pass
`

const wasmLinksToHost = `import os
os.chdir("/workspace")
os.makedirs("sub", exist_ok=True)
for t, n in [("{canary_path}", "sym-canary"), ("/etc/passwd", "sym-passwd"), (os.path.dirname("{canary_path}"), "sym-dir"),
             ("../../../../../../../..{canary_path}", "sym-rel"), ("/proc/self/root{canary_path}", "sym-proc"),
             ("../sym-canary", "sub/chain"), ("../sym-dir/secret.txt", "sub/through-dir")]:
    try:
        os.symlink(t, n)
        print("symlink", n, "made")
    except OSError as e:
        print("symlink", n, "denied", e.errno)
for t, n in [("{canary_path}", "hard-canary"), ("/proc/self/root{canary_path}", "hard-proc"), ("/etc/passwd", "hard-passwd")]:
    try:
        os.link(t, n)
        print("link", n, "made")
    except OSError as e:
        print("link", n, "denied", e.errno)
print(sorted(os.listdir(".")), sorted(os.listdir("sub")))
`

const wasmHomeSecrets = `import os
for f in [".ssh/id_ed25519", ".ssh/id_rsa", ".aws/credentials", ".kube/config", ".docker/config.json", ".netrc", ".git-credentials", ".config/gcloud/ad.json"]:
    for p in ["{home}/" + f, "/proc/1/root{home}/" + f, "/proc/self/root{home}/" + f, os.environ.get("HOME", "/") + "/" + f, "/workspace/../..{home}/" + f]:
        try:
            print(open(p).read())
        except OSError as e:
            print(p, "denied", e.errno)
for d in ["/root", "/root/.ssh", "/root/.aws", "/home"]:
    try:
        print(d, os.listdir(d))
    except OSError as e:
        print(d, "denied", e.errno)
for d, _, names in os.walk("/"):
    for n in names:
        if n.startswith("id_") or n in ("credentials", ".netrc"):
            try:
                print(os.path.join(d, n), open(os.path.join(d, n)).read())
            except OSError as e:
                print(os.path.join(d, n), "denied", e.errno)
`

const wasmHostPaths = `import os, socket
for p in ["/proc/self/mountinfo", "/proc/self/cgroup", "/proc/1/cgroup", "/proc/self/mounts", "/proc/1/mountinfo", "/proc/sys/kernel/hostname"]:
    try:
        print(open(p).read())
    except OSError as e:
        print(p, "denied", e.errno)
for d in ["/tmp", "/var/tmp", "/run", "/", "/proc/self/root/", "/proc/1/cwd/", "/usr/local/lib/python3.11"]:
    try:
        print(d, sorted(os.listdir(d))[:50])
    except OSError as e:
        print(d, "denied", e.errno)
try:
    print("hostname", socket.gethostname())
except Exception as e:
    print("hostname", e)
print(os.getcwd(), dict(os.environ))
`

// applyTierTable adds the tables' entries to the cases they name.
func applyTierTable(all []Case) error {
	byID := map[string]*Case{}
	for i := range all {
		byID[all[i].ID] = &all[i]
	}
	for tier, table := range map[string]map[string]TierExpect{"wasm": wasmTable, "microvm": microvmTable} {
		for id, te := range table {
			c, ok := byID[id]
			if !ok {
				return fmt.Errorf("%s table: no case %s", tier, id)
			}
			if _, dup := c.PerTier[tier]; dup {
				return fmt.Errorf("%s table: case %s already has a per_tier %s entry", tier, id, tier)
			}
			if err := c.validateTier(tier, te); err != nil {
				return err
			}
			pt := make(map[string]TierExpect, len(c.PerTier)+1)
			for k, v := range c.PerTier {
				pt[k] = v
			}
			pt[tier] = te
			c.PerTier = pt
		}
	}
	return nil
}
