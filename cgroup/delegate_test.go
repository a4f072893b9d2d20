package cgroup

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIsDelegated reads the xattrs systemd sets on a delegated cgroup from
// a real file system (t.TempDir()), as isDelegated reads them from
// cgroupfs.
func TestIsDelegated(t *testing.T) {
	tests := []struct {
		name  string
		attrs map[string]string
		want  bool
	}{
		{name: "no xattr", want: false},
		{name: "trusted.delegate=1 (systemd 251 on)", attrs: map[string]string{"trusted.delegate": "1"}, want: true},
		{name: "user.delegate=1 (systemd 252 on)", attrs: map[string]string{"user.delegate": "1"}, want: true},
		{name: "trusted.delegate=0", attrs: map[string]string{"trusted.delegate": "0"}, want: false},
		{name: "another xattr", attrs: map[string]string{"user.moat": "1"}, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for k, v := range tc.attrs {
				err := unix.Setxattr(dir, k, []byte(v), 0)
				if errors.Is(err, unix.EPERM) && os.Geteuid() != 0 {
					t.Skipf("needs root: setting %s: %v", k, err)
				}
				if errors.Is(err, unix.ENOTSUP) {
					t.Skipf("the file system of %s has no %s xattrs: %v", dir, k, err)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if got := isDelegated(dir); got != tc.want {
				t.Errorf("isDelegated = %v, want %v", got, tc.want)
			}
		})
	}
	if isDelegated("/nonexistent/moat-cgroup") {
		t.Error("isDelegated of a missing directory = true")
	}
}
