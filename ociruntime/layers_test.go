package ociruntime

import (
	"reflect"
	"strings"
	"testing"
)

func TestOverlayLayers(t *testing.T) {
	tests := []struct {
		name string
		opts string
		want []string
		err  string
	}{
		{"containerd snapshot", "rw,lowerdir=/s/3/fs:/s/2/fs:/s/1/fs,upperdir=/s/4/fs,workdir=/s/4/work,index=off", []string{"/s/4/fs", "/s/3/fs", "/s/2/fs", "/s/1/fs"}, ""},
		{"read-only, no upper", "ro,lowerdir=/a:/b", []string{"/a", "/b"}, ""},
		{"escaped space", `rw,lowerdir=/my\040dir,upperdir=/u,workdir=/w`, []string{"/u", "/my dir"}, ""},
		{"docker's relative short links", "rw,lowerdir=l/ABC:l/DEF,upperdir=/var/lib/docker/overlay2/x/diff,workdir=/w", nil, "not a clean absolute path"},
		{"no lowerdir", "rw,upperdir=/u,workdir=/w", nil, "no lowerdir"},
		{"too many", "lowerdir=" + strings.Repeat("/l:", 200), nil, "at most"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := overlayLayers(tc.opts)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("overlayLayers = %v, %v; want error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("overlayLayers = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestMountAt(t *testing.T) {
	mi := `22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:50 / /b/rootfs rw,relatime - overlay overlay rw,lowerdir=/l1,upperdir=/u,workdir=/w
91 90 0:51 / /b/rootfs rw,relatime - overlay overlay rw,lowerdir=/top,upperdir=/u2,workdir=/w2
92 22 254:0 /x /my\040root rw - ext4 /dev/vda rw
`
	tests := []struct {
		name, dir, fstype, opts string
		found                   bool
	}{
		{"topmost of a stack", "/b/rootfs", "overlay", "rw,lowerdir=/top,upperdir=/u2,workdir=/w2", true},
		{"escaped mount point", "/my root", "ext4", "rw", true},
		{"plain directory", "/b", "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fstype, opts, found := mountAt([]byte(mi), tc.dir)
			if fstype != tc.fstype || opts != tc.opts || found != tc.found {
				t.Errorf("mountAt(%q) = %q, %q, %v; want %q, %q, %v", tc.dir, fstype, opts, found, tc.fstype, tc.opts, tc.found)
			}
		})
	}
}
