package microvm

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/tier/microvm/jail"
)

// TestQEMUJail: the jailed QEMU's command line names only jail paths and
// descriptors, and its mounts, devices and descriptors follow the
// configuration. No QEMU runs; the files are stand-ins.
func TestQEMUJail(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.ext4")
	os.WriteFile(disk, []byte("disk"), 0o600)
	q := &QEMU{Binary: "/usr/bin/qemu-system-x86_64", files: []jail.Mount{{Source: "/usr/bin/qemu-system-x86_64", Target: "/usr/bin/qemu-system-x86_64", Exec: true}}, libDirs: []string{"/lib/x86_64-linux-gnu"}}
	base := func() *VMConfig {
		run := filepath.Join(dir, "vmm")
		return &VMConfig{Kernel: "/k/vmlinuz", Initramfs: "/c/initramfs.cpio", Cmdline: "console=ttyS0", RootDisk: disk, RunDir: run,
			Socket: filepath.Join(run, "agent.sock"), MemoryMiB: 704, VCPUs: 2, Accel: "tcg"}
	}
	snap, _ := os.Open(disk)
	defer snap.Close()
	tests := []struct {
		name     string
		adjust   func(*VMConfig)
		args     []string // must appear, in order, as neighbours
		noArgs   []string // must not appear
		devices  []string
		fds      [3]bool // disk, incoming, console present
		errorHas string
	}{
		{name: "tcg boot", adjust: func(*VMConfig) {},
			args:    []string{"-accel tcg,tb-size=64", "-kernel /vm/vmlinuz", "-initrd /vm/initramfs", "-add-fd fd=3,set=3", "-drive id=root,file=/dev/fdset/3,format=raw,if=none,readonly=on", "-serial none", "-m 704M", "-smp 2", "-cpu qemu64"},
			noArgs:  []string{"-incoming", "-qmp", "-mem-prealloc", dir},
			devices: []string{"/dev/null", "/dev/zero", "/dev/urandom"}, fds: [3]bool{true, false, false}},
		{name: "restore with QMP", adjust: func(c *VMConfig) { c.QMP = filepath.Join(c.RunDir, "qmp.sock"); c.Incoming = snap },
			args:    []string{"-qmp unix:/run/vm/qmp.sock,server=on,wait=off", "-incoming defer", "-chardev socket,id=agent,path=/run/vm/agent.sock,server=on,wait=off"},
			devices: []string{"/dev/null", "/dev/zero", "/dev/urandom"}, fds: [3]bool{true, true, false}},
		{name: "console to a descriptor", adjust: func(c *VMConfig) { c.Console = filepath.Join(dir, "x.console") },
			args:    []string{"-add-fd fd=5,set=5", "-serial file:/dev/fdset/5"},
			devices: []string{"/dev/null", "/dev/zero", "/dev/urandom"}, fds: [3]bool{true, false, true}},
		{name: "all RAM touched", adjust: func(c *VMConfig) { c.Prealloc = true }, args: []string{"-mem-prealloc"},
			devices: []string{"/dev/null", "/dev/zero", "/dev/urandom"}, fds: [3]bool{true, false, false}},
		{name: "socket outside the run directory", adjust: func(c *VMConfig) { c.QMP = "/tmp/qmp.sock" }, errorHas: "not in the VMM's run directory"},
		{name: "missing disk", adjust: func(c *VMConfig) { c.RootDisk = filepath.Join(dir, "none") }, errorHas: "open the image disk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base()
			tc.adjust(cfg)
			spec, err := q.Jail(cfg)
			if tc.errorHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errorHas) {
					t.Fatalf("Jail: %v, want %q", err, tc.errorHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				for _, f := range spec.Files {
					if f != nil && f != snap {
						f.Close()
					}
				}
			}()
			line := " " + strings.Join(spec.Args, " ") + " "
			for _, a := range tc.args {
				if !strings.Contains(line, " "+a+" ") {
					t.Errorf("args lack %q: %s", a, line)
				}
			}
			for _, a := range tc.noArgs {
				if strings.Contains(line, a) {
					t.Errorf("args hold %q: %s", a, line)
				}
			}
			if spec.Path != q.Binary || spec.Args[0] != q.Binary {
				t.Errorf("program %s argv0 %s", spec.Path, spec.Args[0])
			}
			var devs []string
			for _, d := range spec.Devices {
				devs = append(devs, d.Path)
			}
			if !slices.Equal(devs, tc.devices) {
				t.Errorf("devices %v, want %v", devs, tc.devices)
			}
			for i, want := range tc.fds {
				if (spec.Files[i] != nil) != want {
					t.Errorf("descriptor %d present %v, want %v", 3+i, spec.Files[i] != nil, want)
				}
			}
			var writable []string
			for _, m := range spec.Mounts {
				if m.Writable {
					writable = append(writable, m.Source+"->"+m.Target)
				}
				if m.Target == jailKernel && m.Source != cfg.Kernel || m.Target == jailInitramfs && m.Source != cfg.Initramfs {
					t.Errorf("mount %+v", m)
				}
			}
			if want := []string{cfg.RunDir + "->" + jailRunDir}; !slices.Equal(writable, want) {
				t.Errorf("writable mounts %v, want %v", writable, want)
			}
			if len(spec.Env) != 1 || spec.Env[0] != "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu" {
				t.Errorf("env %v", spec.Env)
			}
		})
	}
}

// TestCheckJailIDs: a host account or group using the jail's ids makes the
// tier unavailable.
func TestCheckJailIDs(t *testing.T) {
	dir := t.TempDir()
	group := filepath.Join(dir, "group")
	os.WriteFile(group, []byte("root:x:0:\nkvm:x:993:\n"), 0o644)
	tests := []struct {
		name, passwd, group, want string
	}{
		{"ordinary host", "root:x:0:0::/root:/bin/sh\nsvc:x:1000:1000::/home/svc:/bin/sh\n", "root:x:0:\n", ""},
		{"native tier's range is not ours", "x:x:1879048192:0::/:/bin/sh\n", "", ""},
		{"the base uid itself is unused by jails", "x:x:1895825408:0::/:/bin/sh\n", "", ""},
		{"an account in the range", "root:x:0:0::/root:/bin/sh\nodd:x:1895825500:0::/:/bin/sh\n", "", `"odd" has id 1895825500`},
		{"the last uid of the range", "odd:x:1900019712:0::/:/bin/sh\n", "", "odd"},
		{"a group with the jail's gid", "", "vmm:x:1895825408:\n", `"vmm" has id 1895825408`},
		{"malformed lines are skipped", "junk\n::\n", "x\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, g := filepath.Join(dir, "p-"+tc.name), filepath.Join(dir, "g-"+tc.name)
			os.WriteFile(p, []byte(tc.passwd), 0o644)
			os.WriteFile(g, []byte(tc.group), 0o644)
			err := checkJailIDs(p, g)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("checkJailIDs = %v, want %q", err, tc.want)
			}
		})
	}
	if err := checkJailIDs(filepath.Join(dir, "none"), group); err != nil {
		t.Errorf("missing passwd: %v", err)
	}
}

// TestVMMLimits: the VMM's cgroup allows the VM's RAM plus the overhead,
// and threads for QEMU's pool, its vCPUs and the jailer; no CPU limit at
// creation (it is set when the program starts).
func TestVMMLimits(t *testing.T) {
	m := &MicroVM{vmmOverheadMiB: vmmOverheadMiB}
	for _, tc := range []struct {
		ram   int64
		vcpus int
	}{{704, 1}, {256, 2}, {64 + vmOverheadMiB, 4}} {
		l := m.vmmLimits(tc.ram, tc.vcpus)
		if l.MemoryBytes != (tc.ram+vmmOverheadMiB)<<20 || l.Pids != 128+tc.vcpus || l.CPUs != 0 {
			t.Errorf("vmmLimits(%d, %d) = %+v", tc.ram, tc.vcpus, l)
		}
	}
}
