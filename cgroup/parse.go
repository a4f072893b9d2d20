package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// mount is one cgroup or cgroup2 line of /proc/self/mountinfo.
type mount struct {
	// root is the path inside the cgroup filesystem that is mounted (field 4);
	// not "/" inside a cgroup namespace or for a bind mount of a subtree.
	root string
	// point is where it is mounted (field 5), unescaped.
	point string
	// fstype is "cgroup" (v1) or "cgroup2".
	fstype string
	// controllers are the v1 controllers of the hierarchy, from the super
	// options ("rw,cpu,cpuacct" -> cpu, cpuacct). Named hierarchies such as
	// name=systemd carry no controller and are left out. Empty for cgroup2.
	controllers []string
}

// parseMountinfo returns the cgroup and cgroup2 mounts in a
// /proc/self/mountinfo text, in file order. Other filesystems are skipped.
// The format is documented in proc(5):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
func parseMountinfo(data []byte) ([]mount, error) {
	var mounts []mount
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			return nil, fmt.Errorf("mountinfo line %d: no \" - \" separator: %q", n, line)
		}
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if len(f) < 6 || len(g) < 3 {
			return nil, fmt.Errorf("mountinfo line %d: too few fields: %q", n, line)
		}
		fstype := g[0]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		m := mount{root: unescapeMount(f[3]), point: unescapeMount(f[4]), fstype: fstype}
		if fstype == "cgroup" {
			for _, opt := range strings.Split(g[2], ",") {
				if isV1Controller(opt) {
					m.controllers = append(m.controllers, opt)
				}
			}
		}
		mounts = append(mounts, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mountinfo: %w", err)
	}
	return mounts, nil
}

// isV1Controller reports whether a cgroup v1 super option names a
// controller rather than a mount flag or a named hierarchy.
func isV1Controller(opt string) bool {
	switch opt {
	case "rw", "ro", "noprefix", "clone_children", "xattr", "cpuset_v2_mode", "favordynmods", "none":
		return false
	}
	return opt != "" && !strings.Contains(opt, "=")
}

// unescapeMount undoes the octal escaping the kernel applies to space, tab,
// newline and backslash in mountinfo paths (\040, \011, \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// procCgroup is one line of /proc/<pid>/cgroup: "hierarchy-ID:controllers:path".
type procCgroup struct {
	hierarchy   int
	controllers []string // empty for the v2 line "0::/path"
	path        string
}

// parseProcCgroup parses /proc/self/cgroup (see cgroups(7)).
func parseProcCgroup(data []byte) ([]procCgroup, error) {
	var out []procCgroup
	for n, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		// The path is last and may itself contain ':', so split at most twice.
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			return nil, fmt.Errorf("/proc/self/cgroup line %d: want id:controllers:path, got %q", n+1, line)
		}
		id, err := strconv.Atoi(parts[0])
		if err != nil {
			return nil, fmt.Errorf("/proc/self/cgroup line %d: hierarchy id %q: %w", n+1, parts[0], err)
		}
		pc := procCgroup{hierarchy: id, path: parts[2]}
		if parts[1] != "" {
			pc.controllers = strings.Split(parts[1], ",")
		}
		out = append(out, pc)
	}
	return out, nil
}

// InRun returns nil when data, the contents of a process's
// /proc/<pid>/cgroup, puts it in run id's cgroup (moat/<id>, below any
// parent) in every hierarchy a run uses: each of v1Controllers' on v1, the
// unified one on v2. Otherwise the error says where the process is. Checks
// from outside (the red team, the tiers' tests) use it to prove a process
// of a run cannot be anywhere else.
func InRun(data []byte, id string) error {
	lines, err := parseProcCgroup(data)
	if err != nil {
		return err
	}
	v1 := slices.ContainsFunc(lines, func(l procCgroup) bool { return slices.Contains(l.controllers, "memory") })
	seen := 0
	for _, l := range lines {
		ours := l.hierarchy == 0 && len(l.controllers) == 0 && !v1
		for _, c := range l.controllers {
			ours = ours || slices.Contains(v1Controllers, c)
		}
		if !ours {
			continue
		}
		seen++
		if !strings.HasSuffix(l.path, "/moat/"+id) {
			return fmt.Errorf("outside the run's cgroup moat/%s (%d:%s:%s)", id, l.hierarchy, strings.Join(l.controllers, ","), l.path)
		}
	}
	if seen == 0 {
		return fmt.Errorf("in none of Moat's cgroup hierarchies (%q)", strings.TrimSpace(string(data)))
	}
	return nil
}

// parseKeyed parses a flat-keyed cgroup file ("key value" per line), as used
// by memory.oom_control, pids.events, memory.events and cpu.stat. Lines
// that are not "key integer" are ignored so that new kernel fields never
// break parsing.
func parseKeyed(data []byte) map[string]int64 {
	out := make(map[string]int64)
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		out[k] = n
	}
	return out
}

// parseInt parses a single-value cgroup file such as cpuacct.usage or
// memory.peak. "max" (v2 for "no limit") is reported as -1.
func parseInt(data []byte) (int64, error) {
	s := strings.TrimSpace(string(data))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

// parsePids parses cgroup.procs: one decimal pid per line.
func parsePids(data []byte) ([]int, error) {
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		p, err := strconv.Atoi(f)
		if err != nil || p <= 0 {
			return nil, fmt.Errorf("cgroup.procs: bad pid %q", f)
		}
		pids = append(pids, p)
	}
	return pids, nil
}

// parseControllers parses cgroup.controllers or cgroup.subtree_control
// ("cpu io memory pids"). A leading '+' is tolerated.
func parseControllers(data []byte) map[string]bool {
	out := make(map[string]bool)
	for _, f := range strings.Fields(string(data)) {
		out[strings.TrimPrefix(f, "+")] = true
	}
	return out
}
