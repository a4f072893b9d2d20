// Package kernel reports what this host's kernel offers the sandbox tiers:
// user namespaces, cgroup version and controllers, the Landlock ABI,
// seccomp filtering, and the new mount API. It only reads; it must never
// change host state.
package kernel

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// Feature is one probed kernel facility.
type Feature struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Report is the result of Probe.
type Report struct {
	Release  string    `json:"release"`
	Features []Feature `json:"features"`
}

// Probe inspects the running kernel. It never fails: what it cannot read
// is reported as not available, with the reason.
func Probe() Report {
	var uts unix.Utsname
	unix.Uname(&uts)
	r := Report{Release: unix.ByteSliceToString(uts.Release[:])}
	r.Features = append(r.Features, userNamespaces(), cgroups(), landlock(), seccomp(), mountAPI())
	return r
}

func userNamespaces() Feature {
	f := Feature{Name: "user namespaces"}
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		f.Detail = "cannot read /proc/sys/user/max_user_namespaces: " + err.Error()
		return f
	}
	n := strings.TrimSpace(string(b))
	if n == "0" {
		f.Detail = "disabled (user.max_user_namespaces = 0)"
		return f
	}
	if b, err := os.ReadFile("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); err == nil && strings.TrimSpace(string(b)) == "1" {
		f.OK, f.Detail = true, "max "+n+"; AppArmor restricts unprivileged user namespaces (root is unaffected)"
		return f
	}
	f.OK, f.Detail = true, "max "+n
	return f
}

func cgroups() Feature {
	f := Feature{Name: "cgroups"}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		f.Detail = err.Error()
		return f
	}
	var v1 []string
	v2 := ""
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, " - ", 2)
		if len(parts) != 2 {
			continue
		}
		fields := strings.Fields(parts[1])
		pre := strings.Fields(parts[0])
		if len(fields) < 3 || len(pre) < 5 {
			continue
		}
		switch fields[0] {
		case "cgroup2":
			v2 = pre[4]
		case "cgroup":
			for _, o := range strings.Split(fields[2], ",") {
				switch o {
				case "memory", "pids", "cpu", "cpuacct", "freezer":
					v1 = append(v1, o)
				}
			}
		}
	}
	ctrl := ""
	if v2 != "" {
		if c, err := os.ReadFile(v2 + "/cgroup.controllers"); err == nil {
			ctrl = strings.TrimSpace(string(c))
		}
	}
	switch {
	case len(v1) > 0:
		f.OK, f.Detail = true, fmt.Sprintf("v1 (hybrid) controllers: %s", strings.Join(v1, " "))
		if v2 != "" {
			f.Detail += fmt.Sprintf("; v2 at %s with controllers [%s]", v2, ctrl)
		}
	case v2 != "" && ctrl != "":
		f.OK, f.Detail = true, fmt.Sprintf("v2 (unified) at %s, controllers: %s", v2, ctrl)
	default:
		f.Detail = "no usable cgroup controllers found"
	}
	return f
}

func landlock() Feature {
	f := Feature{Name: "landlock"}
	v, _, e := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, 1) // LANDLOCK_CREATE_RULESET_VERSION
	switch e {
	case 0:
		f.OK, f.Detail = true, fmt.Sprintf("ABI %d", v)
	case unix.EOPNOTSUPP:
		f.Detail = "built in but disabled (add landlock to the lsm= boot parameter)"
	case unix.ENOSYS:
		f.Detail = "not built into this kernel"
	default:
		f.Detail = e.Error()
	}
	return f
}

func seccomp() Feature {
	f := Feature{Name: "seccomp"}
	// PR_GET_SECCOMP fails with EINVAL when the kernel has no seccomp.
	if _, err := unix.PrctlRetInt(unix.PR_GET_SECCOMP, 0, 0, 0, 0); err != nil {
		f.Detail = "not available: " + err.Error()
		return f
	}
	b, _ := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	f.OK, f.Detail = true, "filter mode; actions: "+strings.TrimSpace(string(b))
	return f
}

func mountAPI() Feature {
	f := Feature{Name: "mount API"}
	fd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	switch {
	case err == unix.EPERM:
		f.OK, f.Detail = true, "present (fsopen needs root to probe further)"
		return f
	case err != nil:
		f.Detail = "fsopen: " + err.Error() + " (needs Linux 5.2+; the native tier's workspace uses it)"
		return f
	}
	unix.Close(fd)
	f.OK, f.Detail = true, "fsopen/fsmount/move_mount"
	return f
}
