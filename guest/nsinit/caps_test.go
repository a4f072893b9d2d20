package nsinit

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/guest/nsinit/nswire"
)

func TestCheckKeepCaps(t *testing.T) {
	tests := []struct {
		name string
		uid  int
		keep []int
		ok   bool
	}{
		{"a run keeps nothing", 1000, nil, true},
		{"a build step's root keeps the build set", 0, nswire.BuildCaps, true},
		{"a build step's root may keep nothing", 0, nil, true},
		{"the sandbox user keeps nothing", 1000, []int{unix.CAP_CHOWN}, false},
		{"never CAP_SYS_ADMIN", 0, []int{unix.CAP_SYS_ADMIN}, false},
		{"never CAP_NET_ADMIN", 0, []int{unix.CAP_NET_ADMIN}, false},
		{"never CAP_MKNOD", 0, []int{unix.CAP_MKNOD}, false},
		{"never CAP_SETFCAP", 0, []int{unix.CAP_CHOWN, unix.CAP_SETFCAP}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkKeepCaps(tc.uid, tc.keep); (err == nil) != tc.ok {
				t.Errorf("checkKeepCaps(%d, %v) = %v, want ok %v", tc.uid, tc.keep, err, tc.ok)
			}
		})
	}
}

func TestCapSets(t *testing.T) {
	tests := []struct {
		name string
		keep []int
		want [2]uint32
	}{
		{"none", nil, [2]uint32{0, 0}},
		// CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6,
		// SETUID 7: what a build step's /proc/self/status shows (CapEff fb).
		{"build set", nswire.BuildCaps, [2]uint32{0xfb, 0}},
		{"a high capability goes to the second word", []int{unix.CAP_CHECKPOINT_RESTORE}, [2]uint32{0, 1 << (unix.CAP_CHECKPOINT_RESTORE - 32)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := capSets(tc.keep)
			for i := range d {
				if d[i].Permitted != tc.want[i] || d[i].Effective != tc.want[i] || d[i].Inheritable != 0 {
					t.Errorf("word %d = %+v, want permitted=effective=%#x, inheritable 0", i, d[i], tc.want[i])
				}
			}
		})
	}
}

func TestRootAttr(t *testing.T) {
	tests := []struct {
		name     string
		writable bool
		want     uint64
	}{
		{"an image is read-only", false, unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV},
		{"a build tree stays nosuid and nodev", true, unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := rootAttr(tc.writable); got != tc.want {
				t.Errorf("rootAttr(%v) = %#x, want %#x", tc.writable, got, tc.want)
			}
		})
	}
}
