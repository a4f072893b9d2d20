package image

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// removeTree deletes dir after making sure nothing is mounted beneath it.
//
// mmdebstrap bind-mounts the host's /dev, /proc and /sys into the tree while
// it runs. If it is killed before unmounting, os.RemoveAll would walk into
// those mounts and delete host device nodes or fail half-way on /proc. So we
// first detach every mount under dir (deepest first) and refuse to delete if
// any remains.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	mounts, err := mountsUnder(abs)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	for _, m := range mounts {
		// MNT_DETACH: the mount may still be busy with a dying child of
		// mmdebstrap; lazily detaching it is enough to make it unreachable
		// from the tree we are about to delete.
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("remove %s: unmount leftover %s: %w", dir, m, err)
		}
	}
	if mounts, err = mountsUnder(abs); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if len(mounts) > 0 {
		return fmt.Errorf("remove %s: still mounted beneath it: %s; unmount them and retry", dir, strings.Join(mounts, ", "))
	}
	// A build process killed a moment ago may still finish one last
	// syscall and create an entry while RemoveAll runs ("directory not
	// empty"); a retry after a short pause gets it.
	for attempt := 0; ; attempt++ {
		err = os.RemoveAll(abs)
		if err == nil {
			return nil
		}
		if attempt == 2 {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with space, tab, newline and
		// backslash octal-escaped (proc(5)).
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			c := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(c)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
