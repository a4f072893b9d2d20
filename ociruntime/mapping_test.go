package ociruntime

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

// baseSpec is what containerd's CRI plugin writes for an ordinary
// container of a pod (trimmed): a new pid and mount namespace, the pod's
// network, IPC and UTS namespaces joined, the engine's default
// capabilities, its /etc files bound from its state directory.
const baseSpec = `{
  "ociVersion": "1.0.2-dev",
  "process": {
    "user": {"uid": 0, "gid": 0, "additionalGids": [0, 10]},
    "args": ["python3", "-c", "print(1)"],
    "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
    "cwd": "/work",
    "capabilities": {
      "bounding": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_NET_RAW", "CAP_KILL"],
      "effective": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_NET_RAW", "CAP_KILL"],
      "permitted": ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_NET_RAW", "CAP_KILL"]
    },
    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}],
    "noNewPrivileges": true,
    "oomScoreAdj": 1000
  },
  "root": {"path": "rootfs"},
  "hostname": "pod1",
  "mounts": [
    {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
    {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
    {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["ro"]},
    {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup", "options": ["ro"]},
    {"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/hosts", "options": ["rbind", "rprivate", "rw"]},
    {"destination": "/etc/resolv.conf", "type": "bind", "source": "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/resolv.conf", "options": ["rbind", "rprivate", "ro"]},
    {"destination": "/dev/shm", "type": "bind", "source": "/run/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/shm", "options": ["rbind", "rprivate", "rw"]},
    {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "size=1m", "mode=755"]}
  ],
  "annotations": {"io.kubernetes.cri.container-type": "container"},
  "linux": {
    "resources": {
      "memory": {"limit": 268435456},
      "cpu": {"shares": 2, "quota": 50000, "period": 100000},
      "pids": {"limit": 64}
    },
    "cgroupsPath": "/kubepods/besteffort/podx/abc",
    "namespaces": [
      {"type": "pid"},
      {"type": "ipc", "path": "/proc/42/ns/ipc"},
      {"type": "uts", "path": "/proc/42/ns/uts"},
      {"type": "mount"},
      {"type": "network", "path": "/proc/42/ns/net"}
    ],
    "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
    "maskedPaths": ["/proc/kcore"]
  }
}`

// specWith returns baseSpec changed by edit (on its generic JSON form).
func specWith(t *testing.T, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(baseSpec), &m); err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(m)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func obj(m map[string]any, path ...string) map[string]any {
	for _, p := range path {
		m = m[p].(map[string]any)
	}
	return m
}

func TestMapBase(t *testing.T) {
	s, err := ParseSpec([]byte(baseSpec))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Map(s, "/bundles/x", nil)
	if err != nil {
		t.Fatalf("Map(base) = %v", err)
	}
	oom := 1000
	want := &Container{
		RootFS: "/bundles/x/rootfs", RootBytes: DefaultRootBytes, TmpBytes: DefaultTmpBytes,
		Hostname: "pod1", UID: 0, GID: 0,
		Argv:    []string{"python3", "-c", "print(1)"},
		Env:     []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Cwd:     "/work",
		Rlimits: []nswire.Rlimit{{Resource: unix.RLIMIT_NOFILE, Soft: 1048576, Hard: 1048576}},
		Limits:  cgroup.Limits{MemoryBytes: 256 << 20, Pids: 64, CPUs: 0.5},
		Join:    map[string]string{"network": "/proc/42/ns/net", "ipc": "/proc/42/ns/ipc", "uts": "/proc/42/ns/uts"},
		Mounts: []ContainerMount{
			{Dest: "/etc/hosts", Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/hosts", Recursive: true},
			{Dest: "/etc/resolv.conf", Type: "bind", Source: "/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/resolv.conf", ReadOnly: true, Recursive: true},
			{Dest: "/run", Type: "tmpfs", Data: "size=1048576,mode=755"},
		},
		OOMScoreAdj: &oom,
	}
	c.Notes = nil
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Map(base) =\n%+v\nwant\n%+v", c, want)
	}
}

var yes, no = true, false

func TestMapRefusals(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(m map[string]any)
		policy *Policy
		field  string // RefusalError.Field; "" = accepted
		value  string // part of RefusalError.Value
	}{
		{name: "base accepted"},
		{
			name: "host bind refused",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/data", "type": "bind", "source": "/etc", "options": []any{"rbind"}}}
			},
			field: "mounts[0].source", value: "/etc",
		},
		{
			name: "host bind allowed by policy",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/data", "type": "bind", "source": "/srv/data/x", "options": []any{"rbind"}}}
			},
			policy: &Policy{BindSources: []string{"/srv/data"}},
		},
		{
			name: "policy prefix is a directory, not a string prefix",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/data", "type": "bind", "source": "/srv/database", "options": []any{"rbind"}}}
			},
			policy: &Policy{BindSources: []string{"/srv/data"}},
			field:  "mounts[0].source", value: "/srv/database",
		},
		{
			name: "engine state dir only for the engine's files",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/data", "type": "bind", "source": "/var/lib/containerd/x", "options": []any{"rbind"}}}
			},
			field: "mounts[0].source", value: "/var/lib/containerd/x",
		},
		{
			name: "engine file from outside the state dirs",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/etc/hosts", "type": "bind", "source": "/etc/hosts"}}
			},
			field: "mounts[0].source", value: "/etc/hosts",
		},
		{
			name: "dotdot in source",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/etc/hosts", "type": "bind", "source": "/var/lib/docker/containers/../../../etc/shadow"}}
			},
			field: "mounts[0].source",
		},
		{
			name: "host file into /dev",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/dev/kmsg", "type": "bind", "source": "/dev/kmsg"}}
			},
			field: "mounts[0]", value: "/dev/kmsg",
		},
		{
			name: "proc elsewhere",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/hostproc", "type": "proc", "source": "proc"}}
			},
			field: "mounts[0]", value: "proc",
		},
		{
			name: "unknown fs type",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/mnt", "type": "ext4", "source": "/dev/vda"}}
			},
			field: "mounts[0].type", value: "ext4",
		},
		{
			name: "tmpfs too large",
			edit: func(m map[string]any) {
				m["mounts"] = []any{map[string]any{"destination": "/big", "type": "tmpfs", "options": []any{"size=100g"}}}
			},
			field: "mounts[0].options",
		},
		{
			name:  "extra capability",
			edit:  func(m map[string]any) { obj(m, "process", "capabilities")["bounding"] = []any{"CAP_SYS_ADMIN"} },
			field: "process.capabilities", value: "CAP_SYS_ADMIN",
		},
		{
			name:   "extra capability accepted, not granted",
			edit:   func(m map[string]any) { obj(m, "process", "capabilities")["effective"] = []any{"CAP_SYS_ADMIN"} },
			policy: &Policy{AcceptPrivileged: true},
		},
		{
			name: "host network (no network namespace)",
			edit: func(m map[string]any) {
				obj(m, "linux")["namespaces"] = []any{map[string]any{"type": "pid"}, map[string]any{"type": "mount"}, map[string]any{"type": "ipc"}, map[string]any{"type": "uts"}}
			},
			field: "linux.namespaces", value: "no network namespace",
		},
		{
			name: "host pid namespace",
			edit: func(m map[string]any) {
				obj(m, "linux")["namespaces"] = []any{map[string]any{"type": "network"}, map[string]any{"type": "mount"}, map[string]any{"type": "ipc"}, map[string]any{"type": "uts"}}
			},
			field: "linux.namespaces", value: "no pid namespace",
		},
		{
			name: "join a pid namespace",
			edit: func(m map[string]any) {
				obj(m, "linux")["namespaces"].([]any)[0].(map[string]any)["path"] = "/proc/42/ns/pid"
			},
			field: "linux.namespaces[0].path", value: "/proc/42/ns/pid",
		},
		{
			name:  "relative namespace path",
			edit:  func(m map[string]any) { obj(m, "linux")["namespaces"].([]any)[4].(map[string]any)["path"] = "ns/net" },
			field: "linux.namespaces[4].path",
		},
		{
			name: "device",
			edit: func(m map[string]any) {
				obj(m, "linux")["devices"] = []any{map[string]any{"path": "/dev/kvm", "type": "c", "major": 10, "minor": 232}}
			},
			field: "linux.devices[0]", value: "/dev/kvm",
		},
		{
			name: "default device",
			edit: func(m map[string]any) {
				obj(m, "linux")["devices"] = []any{map[string]any{"path": "/dev/null", "type": "c", "major": 1, "minor": 3}}
			},
		},
		{
			name: "docker's two sysctls",
			edit: func(m map[string]any) {
				obj(m, "linux")["sysctl"] = map[string]any{"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ping_group_range": "0 2147483647"}
			},
		},
		{
			name: "docker's port sysctl, bad value",
			edit: func(m map[string]any) {
				obj(m, "linux")["sysctl"] = map[string]any{"net.ipv4.ip_unprivileged_port_start": "-1"}
			},
			field: "linux.sysctl net.ipv4.ip_unprivileged_port_start",
		},
		{
			name: "sysctl beside docker's",
			edit: func(m map[string]any) {
				obj(m, "linux")["sysctl"] = map[string]any{"net.ipv4.ip_unprivileged_port_start": "0", "net.core.somaxconn": "1"}
			},
			field: "linux.sysctl", value: "net.core.somaxconn",
		},
		{
			name:  "sysctl",
			edit:  func(m map[string]any) { obj(m, "linux")["sysctl"] = map[string]any{"kernel.shm_rmid_forced": "1"} },
			field: "linux.sysctl", value: "kernel.shm_rmid_forced",
		},
		{
			name: "hooks refused by the policy",
			edit: func(m map[string]any) {
				m["hooks"] = map[string]any{"prestart": []any{map[string]any{"path": "/usr/bin/evil"}}}
			},
			policy: &Policy{Hooks: &no},
			field:  "hooks", value: "/usr/bin/evil",
		},
		{
			name: "hooks run by default (they are the engine's)",
			edit: func(m map[string]any) {
				m["hooks"] = map[string]any{"prestart": []any{map[string]any{"path": "/usr/bin/setkey"}}}
			},
		},
		{
			name: "hooks: true",
			edit: func(m map[string]any) {
				m["hooks"] = map[string]any{"prestart": []any{map[string]any{"path": "/usr/bin/setkey"}}}
			},
			policy: &Policy{Hooks: &yes},
		},
		{
			name: "terminal accepted (the console socket is create's to check)",
			edit: func(m map[string]any) { obj(m, "process")["terminal"] = true },
		},
		{
			name:  "no args",
			edit:  func(m map[string]any) { obj(m, "process")["args"] = []any{} },
			field: "process.args",
		},
		{
			name:  "relative cwd",
			edit:  func(m map[string]any) { obj(m, "process")["cwd"] = "work" },
			field: "process.cwd",
		},
		{
			name:  "uid outside the namespace's range",
			edit:  func(m map[string]any) { obj(m, "process", "user")["uid"] = 70000 },
			field: "process.user", value: "70000",
		},
		{
			name: "unknown rlimit",
			edit: func(m map[string]any) {
				obj(m, "process")["rlimits"] = []any{map[string]any{"type": "RLIMIT_BOGUS", "hard": 1, "soft": 1}}
			},
			field: "process.rlimits",
		},
		{
			name: "soft above hard",
			edit: func(m map[string]any) {
				obj(m, "process")["rlimits"] = []any{map[string]any{"type": "RLIMIT_NOFILE", "hard": 1, "soft": 2}}
			},
			field: "process.rlimits",
		},
		{
			name:  "no root",
			edit:  func(m map[string]any) { delete(m, "root") },
			field: "root.path",
		},
		{
			name:  "no process",
			edit:  func(m map[string]any) { delete(m, "process") },
			field: "process",
		},
		{
			name:  "no linux section",
			edit:  func(m map[string]any) { delete(m, "linux") },
			field: "linux",
		},
		{
			name:  "cpu quota below the kernel's minimum",
			edit:  func(m map[string]any) { obj(m, "linux", "resources", "cpu")["quota"] = 100 },
			field: "linux.resources.cpu.quota",
		},
		{
			name:  "mount over /",
			edit:  func(m map[string]any) { m["mounts"] = []any{map[string]any{"destination": "/", "type": "tmpfs"}} },
			field: "mounts[0].destination",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec(specWith(t, tc.edit))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Map(s, "/bundle", tc.policy)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Map = %v, want accepted", err)
				}
				return
			}
			var re *RefusalError
			if !errors.As(err, &re) {
				t.Fatalf("Map = %v, want a refusal of %s", err, tc.field)
			}
			if re.Field != tc.field || !strings.Contains(re.Value, tc.value) || re.Fix == "" {
				t.Errorf("refusal = {%q %q %q}, want field %q, value containing %q and a fix", re.Field, re.Value, re.Fix, tc.field, tc.value)
			}
		})
	}
}

// TestMapNotes checks that what is asked for and not given is said.
func TestMapNotes(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(m map[string]any)
		policy *Policy
		want   string
	}{
		{name: "seccomp replaced", want: "linux.seccomp replaced"},
		{
			name: "in-container hooks not run",
			edit: func(m map[string]any) {
				m["hooks"] = map[string]any{"startContainer": []any{map[string]any{"path": "/bin/x"}}}
			},
			want: "startContainer hooks not run",
		},
		{name: "groups not set", want: "additionalGids"},
		{name: "cpu shares", want: "shares"},
		{name: "shm replaced by Moat's /dev", want: "/dev/shm"},
		{
			name:   "privileged accepted is noted",
			edit:   func(m map[string]any) { obj(m, "process", "capabilities")["effective"] = []any{"CAP_SYS_ADMIN"} },
			policy: &Policy{AcceptPrivileged: true},
			want:   "CAP_SYS_ADMIN not granted",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec(specWith(t, tc.edit))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Map(s, "/bundle", tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(strings.Join(c.Notes, "\n"), tc.want) {
				t.Errorf("notes %q lack %q", c.Notes, tc.want)
			}
		})
	}
}

func TestMapCaps(t *testing.T) {
	tests := []struct {
		name string
		uid  int
		caps []any
		pol  *Policy
		want []int
	}{
		{"by default root keeps none", 0, []any{"CAP_CHOWN", "CAP_NET_RAW", "CAP_SETUID"}, nil, nil},
		{"namespaced_capabilities: root keeps the build caps it asks for", 0, []any{"CAP_CHOWN", "CAP_NET_RAW", "CAP_SETUID"}, &Policy{NamespacedCapabilities: true}, []int{unix.CAP_CHOWN, unix.CAP_SETUID}},
		{"non-root keeps none", 1000, []any{"CAP_CHOWN"}, &Policy{NamespacedCapabilities: true}, nil},
		{"none asked none kept", 0, []any{}, &Policy{NamespacedCapabilities: true}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec(specWith(t, func(m map[string]any) {
				obj(m, "process", "user")["uid"] = tc.uid
				c := obj(m, "process", "capabilities")
				c["effective"], c["permitted"], c["bounding"] = tc.caps, tc.caps, tc.caps
			}))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Map(s, "/b", tc.pol)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.KeepCaps, tc.want) {
				t.Errorf("KeepCaps = %v, want %v", c.KeepCaps, tc.want)
			}
			for _, k := range c.KeepCaps {
				found := false
				for _, b := range nswire.BuildCaps {
					found = found || b == k
				}
				if !found {
					t.Errorf("kept %d, not one of nswire.BuildCaps", k)
				}
			}
		})
	}
}

func TestMapTerminal(t *testing.T) {
	tests := []struct {
		name string
		edit func(m map[string]any)
		want *nswire.Winsize
	}{
		{"no terminal", nil, nil},
		{"default size", func(m map[string]any) { obj(m, "process")["terminal"] = true }, &nswire.Winsize{Rows: 24, Cols: 80}},
		{"console size", func(m map[string]any) {
			obj(m, "process")["terminal"] = true
			obj(m, "process")["consoleSize"] = map[string]any{"height": 50, "width": 132}
		}, &nswire.Winsize{Rows: 50, Cols: 132}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSpec(specWith(t, tc.edit))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Map(s, "/b", nil)
			if err != nil || !reflect.DeepEqual(c.Terminal, tc.want) {
				t.Errorf("Terminal = %+v, %v; want %+v", c.Terminal, err, tc.want)
			}
		})
	}
}

func TestTmpfsData(t *testing.T) {
	tests := []struct {
		name    string
		opts    []string
		want    string
		ro, err bool
	}{
		{"default size", nil, "size=67108864", false, false},
		{"size and mode", []string{"size=1m", "mode=1777", "nosuid"}, "size=1048576,mode=1777", false, false},
		{"ro", []string{"ro", "size=4k"}, "size=4096", true, false},
		{"unknown option", []string{"huge=always"}, "", false, true},
		{"bad mode", []string{"mode=9"}, "", false, true},
		{"zero size", []string{"size=0"}, "", false, true},
		{"overflow", []string{"size=99999999999999999g"}, "", false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ro, err := tmpfsData(tc.opts)
			if (err != nil) != tc.err || got != tc.want || ro != tc.ro {
				t.Errorf("tmpfsData(%q) = %q, %v, %v; want %q, %v, err %v", tc.opts, got, ro, err, tc.want, tc.ro, tc.err)
			}
		})
	}
}

func TestParsePolicy(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want *Policy
		err  string
	}{
		{"empty", "", &Policy{}, ""},
		{"hooks refused", "hooks: false\n", &Policy{Hooks: &no}, ""},
		{"full", "bind_sources: [/srv/data]\naccept_privileged: true\nhooks: true\nroot_bytes: 1024\n", &Policy{BindSources: []string{"/srv/data"}, AcceptPrivileged: true, Hooks: &yes, RootBytes: 1024}, ""},
		{"typo fails closed", "bind_source: [/srv]\n", nil, "bind_source"},
		{"relative source", "bind_sources: [srv]\n", nil, "clean absolute"},
		{"engine dirs", "engine_state_dirs: [/run/k3s/containerd]\n", &Policy{EngineStateDirs: []string{"/run/k3s/containerd"}}, ""},
		{"relative engine dir", "engine_state_dirs: [run]\n", nil, "engine_state_dirs"},
		{"root as source", "bind_sources: [/]\n", nil, "other than /"},
		{"negative size", "root_bytes: -1\n", nil, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePolicy([]byte(tc.yaml))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParsePolicy = %v, want error with %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(p, tc.want) {
				t.Errorf("ParsePolicy = %+v, %v; want %+v", p, err, tc.want)
			}
		})
	}
}

func TestLoadPolicyMissing(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadPolicy(dir + "/none.yaml"); err == nil {
		t.Error("LoadPolicy(an explicit missing file) = nil error; want failing closed")
	}
}

func TestParseSignal(t *testing.T) {
	tests := []struct {
		in   string
		want unix.Signal
		err  bool
	}{
		{"", unix.SIGTERM, false},
		{"9", unix.SIGKILL, false},
		{"KILL", unix.SIGKILL, false},
		{"SIGTERM", unix.SIGTERM, false},
		{"sigusr1", unix.SIGUSR1, false},
		{"0", 0, true},
		{"65", 0, true},
		{"BOGUS", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseSignal(tc.in)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("ParseSignal(%q) = %v, %v; want %v, err %v", tc.in, got, err, tc.want, tc.err)
			}
		})
	}
}

// FuzzMap feeds config.json bytes to ParseSpec and Map: neither may panic,
// and whatever Map accepts must hold to Moat's rules.
func FuzzMap(f *testing.F) {
	f.Add([]byte(baseSpec))
	f.Add([]byte(`{"process":{"args":["sh"]},"root":{"path":"/r"},"linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"network"},{"type":"ipc"},{"type":"uts"}]}}`))
	f.Add([]byte(`{"mounts":[{"destination":"/x","type":"bind","source":"/var/lib/docker/containers/../../etc"}]}`))
	f.Add([]byte(`{"process":{"args":["a"],"terminal":true,"consoleSize":{"height":0,"width":7}}}`))
	f.Add([]byte(`{"process":{"args":["sh"],"env":["HTTP_PROXY=x"]},"root":{"path":"/r"},"annotations":{"moat.sandbox/egress":"pypi.org, *.pythonhosted.org:443","moat.sandbox/egress-addresses":"10.0.0.1"},"linux":{"namespaces":[{"type":"pid"},{"type":"mount"},{"type":"network","path":"/proc/1/ns/net"},{"type":"ipc"},{"type":"uts"}]}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseSpec(b)
		if err != nil {
			return
		}
		c, err := Map(s, "/bundle", nil)
		if err != nil {
			var re *RefusalError
			if !errors.As(err, &re) {
				t.Fatalf("Map error %v is not a RefusalError", err)
			}
			return
		}
		for _, k := range c.KeepCaps {
			ok := false
			for _, b := range nswire.BuildCaps {
				ok = ok || b == k
			}
			if !ok || c.UID != 0 {
				t.Fatalf("kept capability %d for uid %d", k, c.UID)
			}
		}
		for _, m := range c.Mounts {
			if m.Type == "bind" && !under(m.Source, "/var/lib/containerd") && !under(m.Source, "/run/containerd") &&
				!under(m.Source, "/var/run/containerd") && !under(m.Source, "/var/lib/docker/containers") && !under(m.Source, "/var/lib/kubelet/pods") {
				t.Fatalf("bind of %s accepted without a policy", m.Source)
			}
			if m.Type == "bind" && slices.Contains(strings.Split(m.Source, "/"), "..") {
				t.Fatalf("bind source %q with ..", m.Source)
			}
		}
		if c.Egress != nil {
			// Moat's network: never the pod's, never a private address
			// without the operator's policy (nil here), every rule
			// one the proxy parses.
			if _, joined := c.Join["network"]; joined || len(c.Egress.Addresses) > 0 {
				t.Fatalf("egress %+v with the network joined (%v) or addresses granted", c.Egress, c.Join)
			}
			if _, err := c.Egress.Policy(); err != nil {
				t.Fatalf("egress %+v accepted, but its policy: %v", c.Egress, err)
			}
		}
		if c.UID > maxContainerID || c.GID > maxContainerID || len(c.Argv) == 0 {
			t.Fatalf("accepted uid %d gid %d argv %q", c.UID, c.GID, c.Argv)
		}
		for _, typ := range []string{"pid", "mount", "network", "ipc", "uts"} {
			found := false
			for _, ns := range s.Linux.Namespaces {
				found = found || ns.Type == typ
			}
			if !found {
				t.Fatalf("accepted a spec without a %s namespace", typ)
			}
		}
	})
}
