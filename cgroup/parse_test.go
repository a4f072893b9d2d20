package cgroup

import (
	"reflect"
	"strings"
	"testing"
)

// Mountinfo of this project's CI host: cgroup v1 hybrid with cpu and cpuacct
// as separate hierarchies and an empty cgroup2 at /sys/fs/cgroup/unified.
const mountinfoHybrid = `22 1 0:21 / / rw,relatime - overlay overlay rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`

// A systemd host with the classic co-mounted cpu,cpuacct and net_cls,net_prio.
const mountinfoComounted = `25 18 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
31 25 0:28 / /sys/fs/cgroup/net_cls,net_prio rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,net_cls,net_prio
32 25 0:29 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
33 25 0:30 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,pids
34 25 0:31 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:18 - cgroup cgroup rw,freezer
`

// A pure v2 host, and a container whose cgroup2 mount is a subtree.
const mountinfoV2 = `24 18 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
const mountinfoV2Container = `710 700 0:26 /docker/abc /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup ro
`

func TestParseMountinfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []mount
	}{
		{
			name: "hybrid separate cpu and cpuacct",
			in:   mountinfoHybrid,
			want: []mount{
				{"/", "/sys/fs/cgroup/cpu", "cgroup", []string{"cpu"}},
				{"/", "/sys/fs/cgroup/cpuacct", "cgroup", []string{"cpuacct"}},
				{"/", "/sys/fs/cgroup/cpuset", "cgroup", []string{"cpuset"}},
				{"/", "/sys/fs/cgroup/memory", "cgroup", []string{"memory"}},
				{"/", "/sys/fs/cgroup/devices", "cgroup", []string{"devices"}},
				{"/", "/sys/fs/cgroup/freezer", "cgroup", []string{"freezer"}},
				{"/", "/sys/fs/cgroup/blkio", "cgroup", []string{"blkio"}},
				{"/", "/sys/fs/cgroup/pids", "cgroup", []string{"pids"}},
				{"/", "/sys/fs/cgroup/systemd", "cgroup", nil},
				{"/", "/sys/fs/cgroup/unified", "cgroup2", nil},
			},
		},
		{
			name: "co-mounted with xattr and named hierarchy",
			in:   mountinfoComounted,
			want: []mount{
				{"/", "/sys/fs/cgroup/unified", "cgroup2", nil},
				{"/", "/sys/fs/cgroup/systemd", "cgroup", nil},
				{"/", "/sys/fs/cgroup/cpu,cpuacct", "cgroup", []string{"cpu", "cpuacct"}},
				{"/", "/sys/fs/cgroup/net_cls,net_prio", "cgroup", []string{"net_cls", "net_prio"}},
				{"/", "/sys/fs/cgroup/memory", "cgroup", []string{"memory"}},
				{"/", "/sys/fs/cgroup/pids", "cgroup", []string{"pids"}},
				{"/", "/sys/fs/cgroup/freezer", "cgroup", []string{"freezer"}},
			},
		},
		{
			name: "pure v2",
			in:   mountinfoV2,
			want: []mount{{"/", "/sys/fs/cgroup", "cgroup2", nil}},
		},
		{
			name: "v2 subtree in a container",
			in:   mountinfoV2Container,
			want: []mount{{"/docker/abc", "/sys/fs/cgroup", "cgroup2", nil}},
		},
		{
			name: "escaped space in mount point",
			in:   `50 1 0:40 / /mnt/my\040cgroups rw - cgroup2 none rw` + "\n",
			want: []mount{{"/", "/mnt/my cgroups", "cgroup2", nil}},
		},
		{
			name: "no cgroups",
			in:   "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n",
			want: nil,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMountinfo([]byte(tc.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseMountinfoErrors(t *testing.T) {
	for _, in := range []string{
		"22 1 0:21 / / rw,relatime cgroup2 cgroup2 rw",     // no separator
		"22 1 / / - cgroup2 cgroup2 rw",                    // too few fields before
		"22 1 0:21 / /sys/fs/cgroup rw,relatime - cgroup2", // too few after
	} {
		if _, err := parseMountinfo([]byte(in)); err == nil {
			t.Errorf("parseMountinfo(%q): no error", in)
		}
	}
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []procCgroup
		wantErr bool
	}{
		{
			name: "hybrid",
			in:   "9:name=systemd:/\n4:memory:/process_api/811c\n2:cpu,cpuacct:/\n0::/\n",
			want: []procCgroup{
				{9, []string{"name=systemd"}, "/"},
				{4, []string{"memory"}, "/process_api/811c"},
				{2, []string{"cpu", "cpuacct"}, "/"},
				{0, nil, "/"},
			},
		},
		{
			name: "v2 delegated unit",
			in:   "0::/system.slice/moat.service\n",
			want: []procCgroup{{0, nil, "/system.slice/moat.service"}},
		},
		{
			name: "colon in path",
			in:   "0::/a:b\n",
			want: []procCgroup{{0, nil, "/a:b"}},
		},
		{name: "garbage", in: "nonsense\n", wantErr: true},
		{name: "bad id", in: "x::/\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcCgroup([]byte(tc.in))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseKeyed(t *testing.T) {
	tests := []struct {
		name string
		in   string
		key  string
		want int64
	}{
		{"v1 oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill", 3},
		{"v1 pids.events", "max 17\n", "max", 17},
		{"v2 pids.events", "max 5\n", "max", 5},
		{"v2 memory.events", "low 0\nhigh 0\nmax 412\noom 2\noom_kill 1\noom_group_kill 1\n", "oom_kill", 1},
		{"v2 memory.events max", "low 0\nhigh 0\nmax 412\noom 2\noom_kill 1\n", "max", 412},
		{"v2 cpu.stat", "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n", "usage_usec", 1234567},
		{"missing key", "max 1\n", "oom_kill", 0},
		{"junk lines ignored", "garbage\nmax x\n\nmax 2\n", "max", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseKeyed([]byte(tc.in))[tc.key]; got != tc.want {
				t.Errorf("%s = %d, want %d", tc.key, got, tc.want)
			}
		})
	}
}

func TestParseInt(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"33554432\n", 33554432, false},
		{"max\n", -1, false},
		{"9223372036854771712\n", 9223372036854771712, false},
		{"", 0, true},
		{"12 34", 0, true},
	}
	for _, tc := range tests {
		got, err := parseInt([]byte(tc.in))
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseInt(%q) = %d, %v; want %d, err %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestParsePids(t *testing.T) {
	got, err := parsePids([]byte("12\n7\n"))
	if err != nil || !reflect.DeepEqual(got, []int{12, 7}) {
		t.Errorf("parsePids = %v, %v", got, err)
	}
	if got, err := parsePids(nil); err != nil || got != nil {
		t.Errorf("parsePids(empty) = %v, %v", got, err)
	}
	for _, in := range []string{"0\n", "-1\n", "abc\n"} {
		if _, err := parsePids([]byte(in)); err == nil {
			t.Errorf("parsePids(%q): no error", in)
		}
	}
}

func TestParseControllers(t *testing.T) {
	got := parseControllers([]byte("cpuset cpu io memory +pids\n"))
	for _, c := range []string{"cpuset", "cpu", "io", "memory", "pids"} {
		if !got[c] {
			t.Errorf("%s missing from %v", c, got)
		}
	}
}

func FuzzParseMountinfo(f *testing.F) {
	for _, s := range []string{mountinfoHybrid, mountinfoComounted, mountinfoV2, mountinfoV2Container, `1 2 0:1 / /a\04 rw - cgroup2 x rw`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		mounts, err := parseMountinfo(data)
		if err != nil {
			return
		}
		for _, m := range mounts {
			if m.fstype != "cgroup" && m.fstype != "cgroup2" {
				t.Fatalf("non-cgroup mount returned: %+v", m)
			}
		}
	})
}

func FuzzParseKeyed(f *testing.F) {
	f.Add([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"))
	f.Add([]byte("max 5\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		parseKeyed(data)
		parsePids(data)
		parseInt(data)
		parseProcCgroup(data)
	})
}

func TestInRun(t *testing.T) {
	const v1 = "12:pids:/moat/r1\n11:memory:/moat/r1\n10:cpu,cpuacct:/moat/r1\n9:freezer:/moat/r1\n5:devices:/\n0::/\n"
	for _, tc := range []struct {
		name, data, want string // want "" = inside
	}{
		{"v1, every hierarchy", v1, ""},
		{"v2", "0::/moat/r1\n", ""},
		{"v2 below a delegated parent", "0::/system.slice/moat.service/moat/r1\n", ""},
		{"v1, one hierarchy elsewhere", strings.Replace(v1, "9:freezer:/moat/r1", "9:freezer:/", 1), "outside the run's cgroup moat/r1 (9:freezer:/)"},
		{"another run", "0::/moat/r2\n", "outside the run's cgroup moat/r1"},
		{"a run whose id ends like this one's", "0::/moat/xr1\n", "outside the run's cgroup moat/r1"},
		{"no hierarchy of Moat's", "5:devices:/\n", "in none of Moat's cgroup hierarchies"},
		{"not /proc/PID/cgroup", "garbage", "want id:controllers:path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := InRun([]byte(tc.data), "r1")
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("InRun = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPeakWithin(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name        string
		peak, limit int64
		want        bool
	}{
		{"under", 10 * mib, 64 * mib, true},
		{"at the limit", 64 * mib, 64 * mib, true},
		{"one forced page over (seen on gVisor at 96 MiB)", 96*mib + 4096, 96 * mib, true},
		{"the whole slack over", 64*mib + ForcedChargeSlack, 64 * mib, true},
		{"a byte past the slack", 64*mib + ForcedChargeSlack + 1, 64 * mib, false},
		{"unenforced", 200 * mib, 64 * mib, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PeakWithin(tc.peak, tc.limit); got != tc.want {
				t.Errorf("PeakWithin(%d, %d) = %v, want %v", tc.peak, tc.limit, got, tc.want)
			}
		})
	}
}
