package engine

import (
	"bytes"
	"io/fs"
	"os"
	"strconv"
	"time"
)

// Metrics is what a live session's sandbox uses now, with its limits: the
// points of E2B's getMetrics (CPU, memory, disk over time), which the
// service samples.
type Metrics struct {
	// CPU is the CPU time used so far (Session.CPU); a rate needs two.
	CPU time.Duration
	// CPUs is the manifest's resources.cpus.
	CPUs float64
	// MemoryBytes is the resident memory of the sandbox's host processes
	// (their runtime's on user-space-kernel tiers); MemoryLimit the
	// manifest's resources.memory.
	MemoryBytes, MemoryLimit int64
	// DiskBytes is the size of the workspace's regular files, counted up
	// to WorkspaceFiles entries; DiskLimit the manifest's
	// resources.workspace_bytes.
	DiskBytes, DiskLimit int64
}

// Metrics samples the sandbox's usage now. A tier that cannot list its
// processes reports no CPU or memory (errNoProcs is not an error here:
// disk and the limits are still known).
func (s *Session) Metrics() (Metrics, error) {
	if err := s.open(); err != nil {
		return Metrics{}, err
	}
	m := Metrics{CPUs: s.m.Resources.CPUs, MemoryLimit: int64(s.m.Resources.Memory), DiskLimit: s.p.lim.WorkspaceBytes}
	if pids, err := s.procs(); err == nil {
		m.CPU = ProcsCPU(pids)
		m.MemoryBytes = ProcsRSS(pids)
	}
	m.DiskBytes = diskBytes(s.p.sb.Workspace().Dir, s.p.lim.WorkspaceFiles)
	return m, nil
}

// ProcsRSS is the resident memory of the host processes pids
// (/proc/<pid>/statm), in bytes: an estimate (pages two processes share
// count twice), as ProcsCPU is. A pid that is gone counts nothing.
func ProcsRSS(pids []int) int64 {
	page := int64(os.Getpagesize())
	var sum int64
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
		if err != nil {
			continue
		}
		f := bytes.Fields(b)
		if len(f) < 2 {
			continue
		}
		if n, err := strconv.ParseInt(string(f[1]), 10, 64); err == nil && n > 0 {
			sum += n * page
		}
	}
	return sum
}

// diskBytes sums the sizes of the regular files under dir, a workspace
// the sandbox writes to: links are never followed (WalkDir lstats), and
// at most maxEntries entries are looked at, so a sandbox that made
// millions of files costs a bounded walk (and reads as what was counted).
func diskBytes(dir string, maxEntries int) int64 {
	if maxEntries <= 0 {
		maxEntries = 10000
	}
	// Through os.Root: the workspace's own path may be a link the host
	// made (WalkDir would not descend it), and nothing below may lead
	// out of it.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0
	}
	defer root.Close()
	var sum int64
	n := 0
	fs.WalkDir(root.FS(), ".", func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // gone meanwhile, or unreadable: not counted
		}
		if n++; n > maxEntries {
			return fs.SkipAll
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				sum += fi.Size()
			}
		}
		return nil
	})
	return sum
}
