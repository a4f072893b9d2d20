package jail

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/seccomp"
)

// probeEnv makes this test binary, exec'd inside a jail, report what it
// sees there (probe) instead of running tests.
const probeEnv = "MOAT_JAIL_PROBE"

func TestMain(m *testing.M) {
	if IsJailer() {
		Main()
	}
	if os.Getenv(probeEnv) != "" {
		os.Exit(probe())
	}
	os.Exit(m.Run())
}

// probeReport is what a jailed program finds about itself.
type probeReport struct {
	PID, UID, GID, EUID, EGID int
	Groups                    []int
	Caps                      [2]unix.CapUserData
	Bounding                  int // capabilities left in the bounding set
	NoNewPrivs, PdeathSig     int
	Core, NoFile              uint64
	Hostname                  string
	Files                     []string // every path below /
	FDs                       []int    // open descriptors
	WriteRoot, WriteRun       string   // "" or the error
	Mknod                     string
	Seccomp                   int    // PR_GET_SECCOMP: 2 is filter mode
	Keyctl, BPF               string // what the filter answers them
}

func probe() int {
	var r probeReport
	r.PID, r.UID, r.GID, r.EUID, r.EGID = os.Getpid(), os.Getuid(), os.Getgid(), os.Geteuid(), os.Getegid()
	r.Groups, _ = os.Getgroups()
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	unix.Capget(&hdr, &r.Caps[0])
	for c := 0; c < 64; c++ {
		on, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0)
		if err != nil {
			break
		}
		r.Bounding += on
	}
	r.NoNewPrivs, _ = unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	var sig int32
	unix.Prctl(unix.PR_GET_PDEATHSIG, uintptr(unsafe.Pointer(&sig)), 0, 0, 0)
	r.PdeathSig = int(sig)
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_CORE, &lim)
	r.Core = lim.Max
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	r.NoFile = lim.Max
	r.Hostname, _ = os.Hostname()
	filepath.WalkDir("/", func(p string, d os.DirEntry, err error) error {
		if err == nil && p != "/" {
			r.Files = append(r.Files, p)
		}
		return nil
	})
	for fd := 0; fd < 256; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			r.FDs = append(r.FDs, fd)
		}
	}
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	r.WriteRoot = errText(os.WriteFile("/escape", []byte("x"), 0o644))
	r.WriteRun = errText(os.WriteFile("/run/w/ok", []byte("x"), 0o644))
	r.Mknod = errText(unix.Mknod("/run/w/null", unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	r.Seccomp, _ = unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0)
	// Unfiltered, an unprivileged process may look up its session keyring
	// (keyctl succeeds) and gets EPERM from bpf only for want of a
	// capability; the filter refuses both before the kernel looks.
	_, err := unix.KeyctlInt(unix.KEYCTL_GET_KEYRING_ID, unix.KEY_SPEC_SESSION_KEYRING, 1, 0, 0)
	r.Keyctl = errText(err)
	_, _, errno := unix.Syscall(unix.SYS_BPF, 0, 0, 0)
	r.BPF = errText(errnoErr(errno))
	json.NewEncoder(os.Stderr).Encode(&r)
	return 0
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// filter is the native tier's policy, which the microvm tier gives the
// jail for QEMU.
func filter(t *testing.T) seccomp.Program {
	t.Helper()
	f, err := seccomp.Default().Compile()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the jail makes namespaces, mounts and changes credentials")
	}
}

// probeSpec jails this test binary as the probe, with a writable run
// directory and one descriptor (fd 3).
func probeSpec(t *testing.T) (*Spec, *bytes.Buffer, string) {
	t.Helper()
	self, err := filepath.EvalSymlinks("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run, root := filepath.Join(dir, "run"), filepath.Join(dir, "root")
	for _, d := range []string{run, root} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	null, err := HostDevice("/dev/null", 0o666, false)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	var stderr bytes.Buffer
	return &Spec{
		Path: "/probe", Args: []string{"/probe"}, Env: []string{probeEnv + "=1"},
		Mounts:  []Mount{{Source: self, Target: "/probe", Exec: true}, {Source: run, Target: "/run/w", Writable: true}},
		Devices: []Device{null},
		NoFile:  64,
		Root:    root,
		Files:   []*os.File{f},
		Stderr:  &stderr,
		Seccomp: filter(t),
	}, &stderr, run
}

// TestJailedProgram runs this test binary jailed and checks, from inside,
// everything the jail promises: PID 1 of its own namespace, the uid of its
// pid and the jail's gid with no groups, no capability in any set, the
// bounding set empty, no_new_privs, the parent-death signal still SIGKILL
// after the uid change, the rlimits, only its own files, stdio and fd 3
// open, the root read-only, the run directory writable, no mknod.
func TestJailedProgram(t *testing.T) {
	needRoot(t)
	spec, stderr, run := probeSpec(t)
	cmd, err := Start("/proc/self/exe", spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	werr := cmd.Wait()
	var r probeReport
	if err := json.Unmarshal(stderr.Bytes(), &r); err != nil {
		t.Fatalf("probe: %v (%v): %s", err, werr, stderr.Bytes())
	}
	uid := UIDBase + cmd.Process.Pid
	sort.Strings(r.Files)
	tests := []struct {
		name      string
		got, want any
	}{
		{"PID 1", r.PID, 1},
		{"uid", [3]int{r.UID, r.EUID, 0}, [3]int{uid, uid, 0}},
		{"gid", [2]int{r.GID, r.EGID}, [2]int{GID, GID}},
		{"no groups", len(r.Groups), 0},
		{"no capability", r.Caps, [2]unix.CapUserData{}},
		{"empty bounding set", r.Bounding, 0},
		{"no_new_privs", r.NoNewPrivs, 1},
		{"parent-death signal", r.PdeathSig, int(unix.SIGKILL)},
		{"core", r.Core, uint64(0)},
		{"nofile", r.NoFile, uint64(64)},
		{"hostname", r.Hostname, "moat-vmm"},
		{"files", strings.Join(r.Files, " "), "/dev /dev/null /probe /run /run/w"},
		{"descriptors", fmt.Sprint(r.FDs), "[0 1 2 3]"},
		{"root read-only", strings.Contains(r.WriteRoot, "read-only file system"), true},
		{"run directory writable", r.WriteRun, ""},
		{"no mknod", strings.Contains(r.Mknod, "operation not permitted"), true},
		{"seccomp filter mode", r.Seccomp, 2},
		{"keyctl refused by the filter", r.Keyctl, "operation not permitted"},
		{"bpf refused by the filter", r.BPF, "operation not permitted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if fmt.Sprint(tc.got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	if fi, err := os.Stat(run); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("run directory: %v %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(run, "ok")); err != nil || string(b) != "x" {
		t.Errorf("the file written in the run directory: %q %v", b, err)
	}
}

// TestStartFailsClosed: a jail that cannot be built is an error naming
// what failed, and nothing of it is left running.
func TestStartFailsClosed(t *testing.T) {
	needRoot(t)
	tests := []struct {
		name   string
		adjust func(*Spec)
		want   string
	}{
		{"missing host file", func(s *Spec) { s.Mounts = append(s.Mounts, Mount{Source: "/nonexistent/file", Target: "/x"}) }, "mount /nonexistent/file"},
		{"program not in the jail", func(s *Spec) { s.Path = "/not-there" }, "exec /not-there"},
		{"root is not a directory", func(s *Spec) { s.Root = "/nonexistent-root" }, "mount the jail's root on /nonexistent-root"},
		{"run directory missing (refused by the host side)", func(s *Spec) { s.Mounts[1].Source = "/nonexistent-run" }, "give /nonexistent-run to uid"},
		{"a filter that cannot be installed", func(s *Spec) {
			// A jump past the program's end (BPF_JMP|BPF_JA 5, then
			// RET ALLOW): Install refuses it, so the jail fails closed
			// instead of running the program unfiltered.
			s.Seccomp = seccomp.Program{{Code: 0x05, K: 5}, {Code: 0x06, K: 0x7fff0000}}
		}, "install the seccomp filter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec, _, _ := probeSpec(t)
			tc.adjust(spec)
			cmd, err := Start("/proc/self/exe", spec, nil)
			if err == nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatal("the jail started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name %q", err, tc.want)
			}
			if kids := jailers(); len(kids) > 0 {
				t.Errorf("jailers left running: %v", kids)
			}
		})
	}
}

// jailers lists this process's children that are still jailers.
func jailers() []string {
	var left []string
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, _ := os.ReadFile(p)
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if len(f) > 1 && f[1] == fmt.Sprint(os.Getpid()) && bytes.Contains(cmd, []byte(Arg)) {
			left = append(left, p)
		}
	}
	return left
}

// TestSpecCheck: what Start refuses before starting anything.
func TestSpecCheck(t *testing.T) {
	ok := func() *Spec {
		return &Spec{Path: "/bin/x", Args: []string{"x"}, Root: "/tmp/r",
			Mounts: []Mount{{Source: "/bin/x", Target: "/bin/x"}}, Devices: []Device{{Path: "/dev/null", Mode: 0o666}},
			Seccomp: filter(t)}
	}
	tests := []struct {
		name   string
		adjust func(*Spec)
		want   string // "" = accepted
	}{
		{"valid", func(*Spec) {}, ""},
		{"relative program", func(s *Spec) { s.Path = "bin/x" }, "program"},
		{"no argv", func(s *Spec) { s.Args = nil }, "argv"},
		{"no seccomp filter", func(s *Spec) { s.Seccomp = nil }, "no seccomp filter"},
		{"relative root", func(s *Spec) { s.Root = "r" }, "root"},
		{"root is /", func(s *Spec) { s.Root = "/" }, "root"},
		{"target with ..", func(s *Spec) { s.Mounts[0].Target = "/a/../../etc" }, "mount target"},
		{"target /", func(s *Spec) { s.Mounts[0].Target = "/" }, "mount target"},
		{"relative source", func(s *Spec) { s.Mounts[0].Source = "x" }, "mount source"},
		{"two mounts on one target", func(s *Spec) { s.Mounts = append(s.Mounts, s.Mounts[0]) }, "two mounts"},
		{"device outside /dev", func(s *Spec) { s.Devices[0].Path = "/run/null" }, "below /dev"},
		{"device below a subdirectory of /dev", func(s *Spec) { s.Devices[0].Path = "/dev/a/null" }, "below /dev"},
		{"device mode with setuid", func(s *Spec) { s.Devices[0].Mode = 0o4666 }, "mode"},
		{"a bind into /dev", func(s *Spec) { s.Mounts = append(s.Mounts, Mount{Source: "/dev/mem", Target: "/dev/mem"}) }, "/dev holds only"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := ok()
			tc.adjust(s)
			err := s.check()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("check() = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestAttrs: the mount attributes of each kind of mount.
func TestAttrs(t *testing.T) {
	const base = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	tests := []struct {
		name string
		m    Mount
		want uint64
	}{
		{"data file", Mount{}, base | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOEXEC},
		{"program code", Mount{Exec: true}, base | unix.MOUNT_ATTR_RDONLY},
		{"run directory", Mount{Writable: true}, base | unix.MOUNT_ATTR_NOEXEC},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := attrs(tc.m); got != tc.want {
				t.Errorf("attrs = %#x, want %#x", got, tc.want)
			}
		})
	}
}

// TestConfigFrame: the config crosses the pipe intact, and a frame over
// the bound is refused on both sides.
func TestConfigFrame(t *testing.T) {
	c := &config{Path: "/p", Args: []string{"/p", "-x"}, Mounts: []Mount{{Source: "/a", Target: "/b", Exec: true}}, UID: UIDBase + 7, NFiles: 2, NoFile: 99}
	var b bytes.Buffer
	if err := writeConfig(&b, c); err != nil {
		t.Fatal(err)
	}
	got, err := readConfig(&b)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(c) {
		t.Fatalf("read %+v %v, wrote %+v", got, err, c)
	}
	big := bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff})
	if _, err := readConfig(big); err == nil {
		t.Error("a 4 GiB frame header was accepted")
	}
	if err := writeConfig(&b, &config{Args: []string{strings.Repeat("x", maxConfig)}}); err == nil {
		t.Error("an oversized config was written")
	}
}

// TestUIDOf: one uid per live pid, inside the jail's range.
func TestUIDOf(t *testing.T) {
	for _, tc := range []struct {
		pid  int
		want int
		ok   bool
	}{{1, UIDBase + 1, true}, {MaxPid, UIDLimit, true}, {0, 0, false}, {MaxPid + 1, 0, false}, {-5, 0, false}} {
		got, err := UIDOf(tc.pid)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("UIDOf(%d) = %d, %v", tc.pid, got, err)
		}
	}
	if UIDLimit >= 1<<31 || UIDBase <= 0x70000000+65536 {
		t.Errorf("the jail's ids %#x..%#x overlap the native tier's or overflow", UIDBase, UIDLimit)
	}
}

// TestProgram: a dynamically linked program's mounts hold itself, its
// interpreter and its libraries (libc at least), each executable, and
// the directories for LD_LIBRARY_PATH.
func TestProgram(t *testing.T) {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Skip("no /bin/sh")
	}
	mounts, dirs, err := Program(sh)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range mounts {
		if !m.Exec || m.Writable {
			t.Errorf("%+v: code must be executable and read-only", m)
		}
		names = append(names, filepath.Base(m.Target))
	}
	joined := strings.Join(names, " ")
	for _, want := range []string{filepath.Base(sh), "libc.so.6", "ld-linux"} {
		if !strings.Contains(joined, want) {
			t.Errorf("mounts %v lack %s", names, want)
		}
	}
	if len(dirs) == 0 {
		t.Error("no library directory")
	}
	if _, _, err := Program("/nonexistent"); err == nil {
		t.Error("a missing program was accepted")
	}
}

// TestLdSoConf: includes are followed, comments and junk ignored.
func TestLdSoConf(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	os.WriteFile(filepath.Join(dir, "ld.so.conf"), []byte("# c\ninclude d/*.conf\n/opt/lib # trailing\nnot-absolute\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "d", "a.conf"), []byte("/usr/local/lib\n"), 0o644)
	got, err := ldSoConf(filepath.Join(dir, "ld.so.conf"), 0)
	if err != nil || strings.Join(got, " ") != "/usr/local/lib /opt/lib" {
		t.Errorf("ldSoConf = %v, %v", got, err)
	}
}
