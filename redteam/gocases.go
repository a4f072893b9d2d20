package redteam

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/engine"
)

// registered holds the cases written in Go: those that need more than one
// program and a table of checks (several sandboxes at once, races,
// host-wide state). Each file of them adds its cases with register, in a
// function goCases calls once: not in init functions, which every moat
// process (moat run too) would pay for at start.
var (
	registered   []Case
	registerOnce sync.Once
)

func register(c Case) { registered = append(registered, c) }

func goCases() []Case {
	registerOnce.Do(func() {
		registerConcurrencyCases()
		registerEgressCases()
		registerEgressLogCases()
		registerGuardCases()
		registerSecretCases()
		registerCanaryCases()
		registerFSCases()
		registerHostWideCases()
		registerHostIdentityCase()
		registerKernelCases()
		registerNetCases()
		registerTerminalCases()
	})
	return append([]Case(nil), registered...)
}

func registerConcurrencyCases() {
	register(Case{
		ID: "covert-concurrent-runs", Category: "exfiltration", Severity: "high",
		Threat: "two concurrent runs pass data through shared /tmp, /dev/shm, an abstract unix socket or SysV IPC",
		Why:    "each run has its own /tmp, IPC, network and PID namespace; a token planted by one never reaches the other's output",
		custom: covertChannels,
	})
}

// covertChannels runs a sender that plants a token everywhere two
// processes on one kernel might share, and concurrently a receiver that
// looks everywhere. The receiver's output (what would leave its sandbox)
// must not contain the token.
func covertChannels(ctx context.Context, r *runner) (string, string, int) {
	token := secret()
	sender := `
import os, socket, time, sys
tok = sys.argv[1]
for p in ["/tmp/moat-covert", "/dev/shm/moat-covert", "/workspace/moat-covert"]:
    try:
        open(p, "w").write(tok)
    except OSError:
        pass
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0moat-covert")
s.listen(4)
s.settimeout(4)
try:
    while True:
        c, _ = s.accept(); c.sendall(tok.encode()); c.close()
except OSError:
    pass
`
	receiver := `
import os, socket, time, glob
time.sleep(0.5)
for _ in range(20):
    for p in glob.glob("/tmp/*") + glob.glob("/dev/shm/*") + glob.glob("/workspace/*"):
        try:
            print("file", p, open(p).read())
        except OSError:
            pass
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0moat-covert"); print("socket", s.recv(100))
    except OSError as e:
        pass
    try:
        print("proc", [open(f"/proc/{p}/cmdline").read() for p in os.listdir("/proc") if p.isdigit()])
    except OSError:
        pass
    time.sleep(0.1)
`
	m := r.defaults()
	m.Tier = r.tier // Default() is valid; the tier is the one under attack
	var wg sync.WaitGroup
	var recvOut string
	var errs []string
	var mu sync.Mutex
	run := func(argv []string, keep bool) {
		defer wg.Done()
		res, err := r.exec(ctx, &engine.Request{Manifest: m, Argv: argv})
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err.Error())
			return
		}
		if keep {
			recvOut = decode(res.Stdout) + decode(res.Stderr)
		}
	}
	wg.Add(2)
	go run([]string{"python3", "-c", sender, token}, false)
	go run([]string{"python3", "-c", receiver}, true)
	wg.Wait()
	if len(errs) > 0 {
		return Error, "run: " + strings.Join(errs, "; "), 2
	}
	if strings.Contains(recvOut, token) {
		return Escaped, "the receiving run read the sending run's token", 2
	}
	return Contained, "the receiver saw none of the sender's files, sockets or processes", 2
}

// residue is the host-side check after the whole suite: nothing of any run
// is left on the machine.
func (r *runner) residue() Verdict {
	v := Verdict{Case: "host-residue", Category: "residue", Severity: "high", Tier: r.label, Runs: 1}
	// Other moats may be running on this host, under other homes whose
	// runs this engine cannot see: what belongs to a live run of theirs
	// ends with it. Only what persists across 10 s counts.
	left := r.leftovers()
	for i := 0; i < 5 && len(left) > 0; i++ {
		time.Sleep(2 * time.Second)
		now := map[string]bool{}
		for _, l := range r.leftovers() {
			now[l] = true
		}
		var still []string
		for _, l := range left {
			if now[l] {
				still = append(still, l)
			}
		}
		left = still
	}
	if len(left) > 0 {
		v.Verdict, v.Evidence = Escaped, fmt.Sprintf("left on the host after the suite: %s", strings.Join(left, "; "))
		return v
	}
	v.Verdict, v.Evidence = Contained, "no moat cgroup, init process, mount, network namespace, run directory or temp file left"
	return v
}

// leftovers lists what of any run is on the host now and is not a live
// run's of this engine's home.
func (r *runner) leftovers() []string {
	var left []string
	// Runs that hold their lock are alive (another moat on this host, or a
	// parallel test): what they own is not residue.
	live := r.e.LiveRuns()
	for _, pat := range []string{"/sys/fs/cgroup/*/moat/*", "/sys/fs/cgroup/moat/*"} {
		ms, _ := filepath.Glob(pat)
		for _, p := range ms {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() && !live[filepath.Base(p)] {
				left = append(left, "cgroup "+p)
			}
		}
	}
	if len(live) == 0 {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && bytes.HasPrefix(b, []byte("moat-init\x00")) {
				left = append(left, "process "+filepath.Base(filepath.Dir(p)))
			}
		}
	}
	// gVisor's runtime processes (runsc, its Sentry, stubs and gofer) name
	// their run's state directory below this home in their command line.
	runsDir := []byte(filepath.Join(r.e.Home(), "runs") + "/")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.HasPrefix(b, []byte("runsc")) {
			continue
		}
		if i := bytes.Index(b, runsDir); i >= 0 {
			id, _, _ := strings.Cut(string(b[i+len(runsDir):]), "/")
			if !live[id] {
				left = append(left, "runtime process "+filepath.Base(filepath.Dir(p))+" of run "+id)
			}
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if !strings.Contains(line, "moat-redteam") && !strings.Contains(line, "/runs/") {
				continue
			}
			// A mount below a live run's directory (a gVisor run of
			// another moat or test package on this host, under any
			// home) is that run's, not residue: its lock is held.
			if f := strings.Fields(line); len(f) > 4 {
				if dir, ok := runDirOf(f[4]); ok && engine.RunAlive(dir) {
					continue
				}
			}
			left = append(left, "mount "+line)
		}
	}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil && len(bytes.TrimSpace(out)) > 0 {
		left = append(left, "network namespaces: "+strings.TrimSpace(string(out)))
	}
	if runs, err := os.ReadDir(filepath.Join(r.e.Home(), "runs")); err == nil {
		for _, d := range runs {
			if !live[strings.TrimPrefix(d.Name(), ".new-")] {
				left = append(left, "run directory "+d.Name())
			}
		}
	}
	tmp, _ := filepath.Glob(filepath.Join(os.TempDir(), "moat-redteam-*"))
	for _, p := range tmp {
		left = append(left, "temp "+p)
	}
	return left
}

// runDirOf returns the run directory (".../runs/<id>") a path lies in.
func runDirOf(p string) (string, bool) {
	i := strings.Index(p, "/runs/")
	if i < 0 {
		return "", false
	}
	id, _, _ := strings.Cut(p[i+len("/runs/"):], "/")
	if id == "" {
		return "", false
	}
	return p[:i+len("/runs/")] + id, true
}
