package engines

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// procsUnder returns "PID COMMAND" of every process whose command line
// or executable names a path below dir (the engine, its shims, the
// runtimes and the containers' processes started from its rootfs).
func procsUnder(dir string) []string {
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	var out []string
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		exe, _ := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		args := strings.ReplaceAll(string(bytes.TrimRight(cmdline, "\x00")), "\x00", " ")
		if strings.Contains(args, dir) || strings.HasPrefix(exe, dir+"/") {
			out = append(out, strconv.Itoa(pid)+" "+args)
		}
	}
	return out
}

// mountsUnder returns the mount points at or below dir in this mount
// namespace.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return []string{"cannot read /proc/self/mountinfo: " + err.Error()}
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// SharedNetnsDir makes /run/netns a shared mount point, as containerd
// and ip netns do on first use, before any engine pins a namespace there.
// If it became one only later (bind-mounted onto itself, recursively),
// the namespaces pinned before would stay under the bind, unmountable by
// path: containerd's pod removal then fails with "unlinkat /run/netns/
// cni-…: device or resource busy".
func SharedNetnsDir() error {
	const dir = "/run/netns"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL { // not a mount point yet
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind %s onto itself: %w", dir, err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("make %s shared: %w", dir, err)
	}
	return nil
}

// Netns lists the named network namespaces (/run/netns), where
// containerd 1.6's CRI pins each pod's.
func Netns() map[string]bool {
	ents, _ := os.ReadDir("/run/netns")
	out := map[string]bool{}
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

// CgroupsUnder lists the cgroup directories named parent (a pod cgroup
// parent such as "/moat-engines-1234") in every mounted hierarchy, with
// everything below them.
func CgroupsUnder(parent string) []string {
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, r := range roots {
		d := filepath.Join(r, parent)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			filepath.WalkDir(d, func(p string, de os.DirEntry, err error) error {
				if err == nil && de.IsDir() {
					out = append(out, p)
				}
				return nil
			})
		}
	}
	return out
}

// RemoveCgroupParent removes the (empty) cgroup directories named parent
// that the runtimes created below every hierarchy, deepest first, and
// returns those it could not remove: a cgroup that still has a process
// or a child is residue.
func RemoveCgroupParent(parent string) []string {
	ds := CgroupsUnder(parent)
	var left []string
	for i := len(ds) - 1; i >= 0; i-- {
		if err := os.Remove(ds[i]); err != nil && !os.IsNotExist(err) {
			left = append(left, "cgroup "+ds[i]+": "+err.Error())
		}
	}
	return left
}

// lockedWriter collects an engine's log, bounded at 1 MiB.
type lockedWriter struct{ b *bytes.Buffer }

var logMu sync.Mutex

func (w *lockedWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	if w.b.Len() > 1<<20 {
		return len(p), nil
	}
	return w.b.Write(p)
}

func lockedString(b *bytes.Buffer) string {
	logMu.Lock()
	defer logMu.Unlock()
	return b.String()
}
