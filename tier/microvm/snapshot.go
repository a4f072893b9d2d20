package microvm

// Snapshots: a VM booted up to the agent's hello (the agent blocked
// reading its request) is paused and its whole state migrated into a
// file; later VMs with the same devices load that file instead of
// booting. QEMU 7.2 has no file: migration and -sandbox spawn=deny rules
// out exec:, so Moat hands QEMU the file itself: on save through QMP
// getfd (SCM_RIGHTS) and "migrate fd:NAME", on restore as the VMM's fd 3
// and "migrate-incoming fd:3".

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/cgroup"
	"github.com/moat-sandbox/moat/guest/vmagent/vmwire"
	"golang.org/x/sys/unix"
)

// snapshotFormat changes whenever what a snapshot holds or how it is
// restored changes: older snapshots then no longer match any key.
const snapshotFormat = "moat-microvm-snapshot-1"

// snapMeta describes a snapshot file; it is written after the file.
type snapMeta struct {
	Key    string `json:"key"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Kernel string `json:"kernel"` // the agent's hello at snapshot time
}

// fileID identifies one version of a file (a rebuilt file has a new inode).
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func idOf(fi os.FileInfo) fileID {
	st := fi.Sys().(*syscall.Stat_t)
	return fileID{uint64(st.Dev), st.Ino, fi.Size(), fi.ModTime().UnixNano()}
}

// digestCached is the sha256 of path, hashed once per file version.
func (m *MicroVM) digestCached(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	id := idOf(fi)
	m.mu.Lock()
	d, ok := m.digests[path]
	m.mu.Unlock()
	if ok && d.id == id {
		return d.sum, nil
	}
	sum, err := fileDigest(path)
	if err != nil {
		return "", err
	}
	m.mu.Lock()
	m.digests[path] = digestEntry{id, sum}
	m.mu.Unlock()
	return sum, nil
}

type digestEntry struct {
	id  fileID
	sum string
}

// snapshotKey is what a snapshot of cfg depends on: the snapshot format,
// the QEMU binary, the kernel, the initramfs (and so the agent build),
// this version of the image disk, and the whole QEMU command line with
// per-run paths blanked (memory, vCPUs, accelerator, kernel command line,
// devices). It is "" with a reason when cfg cannot be snapshotted.
func (m *MicroVM) snapshotKey(cfg *VMConfig) (string, string) {
	q, ok := m.vmm.(*QEMU)
	if !ok {
		return "", "the VMM is not QEMU"
	}
	if m.opts.NoSnapshot {
		return "", "snapshots are off (Options.NoSnapshot or MOAT_MICROVM_SNAPSHOT=off)"
	}
	if cfg.Console != "" {
		return "", "a serial console is being recorded"
	}
	h := sha256.New()
	fmt.Fprintln(h, snapshotFormat)
	for _, p := range []string{q.Binary, cfg.Kernel, cfg.Initramfs} {
		d, err := m.digestCached(p)
		if err != nil {
			return "", err.Error()
		}
		fmt.Fprintln(h, d)
	}
	// The image disk is read-only and content-addressed by the image
	// digest, but the guest's page cache must match this very file: a
	// rebuilt disk (new inode) is a new snapshot.
	fi, err := os.Stat(cfg.RootDisk)
	if err != nil {
		return "", err.Error()
	}
	fmt.Fprintf(h, "%s %+v\n", filepath.Base(cfg.RootDisk), idOf(fi))
	c := *cfg
	c.Kernel, c.Initramfs, c.RootDisk, c.RunDir, c.Socket, c.QMP, c.Incoming = "K", "I", "D", "R", "R/S", "R/Q", nil
	// The egress port's path is per run like the agent's; whether there is
	// one is not (it is a device of the VM): a VM with the port is a
	// different snapshot from one without.
	if c.Egress != "" {
		c.Egress = "R/E"
	}
	c.EgressProxy = ""
	fmt.Fprintln(h, strings.Join(q.Args(&c), "\x00"))
	return hex.EncodeToString(h.Sum(nil))[:32], ""
}

func (m *MicroVM) snapshotPaths(key string) (file, meta string) {
	dir := filepath.Join(m.cache, "snapshots")
	return filepath.Join(dir, key+".vm"), filepath.Join(dir, key+".json")
}

// openSnapshot opens the snapshot for key, checked: root-only, the size
// and sha256 its metadata records (hashed once per file version).
func (m *MicroVM) openSnapshot(key string) (*os.File, *snapMeta, error) {
	file, metaPath := m.snapshotPaths(key)
	b, err := os.ReadFile(metaPath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, os.ErrNotExist
	}
	if err != nil {
		return nil, nil, err
	}
	var meta snapMeta
	if err := json.Unmarshal(b, &meta); err != nil || meta.Key != key || len(meta.SHA256) != 64 {
		return nil, nil, fmt.Errorf("snapshot metadata %s is invalid", metaPath)
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != 0 || fi.Mode().Perm()&0o077 != 0 || !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("snapshot %s is not a root-only (0600) regular file", file)
	}
	if fi.Size() != meta.Size {
		f.Close()
		return nil, nil, fmt.Errorf("snapshot %s is %d bytes, its metadata says %d", file, fi.Size(), meta.Size)
	}
	id := idOf(fi)
	m.mu.Lock()
	ok := m.verified[key] == id
	m.mu.Unlock()
	if !ok {
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			f.Close()
			return nil, nil, err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != meta.SHA256 {
			f.Close()
			return nil, nil, fmt.Errorf("snapshot %s has sha256 %s, its metadata says %s", file, got, meta.SHA256)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return nil, nil, err
		}
		m.mu.Lock()
		m.verified[key] = id
		m.mu.Unlock()
	}
	return f, &meta, nil
}

// dropSnapshot removes a snapshot that failed, so the next cold boot
// makes a new one.
func (m *MicroVM) dropSnapshot(key string) {
	file, meta := m.snapshotPaths(key)
	os.Remove(meta)
	os.Remove(file)
	m.mu.Lock()
	delete(m.verified, key)
	m.mu.Unlock()
}

// restore starts a VM from the snapshot f (which it closes) in cgroup cg
// and returns once the guest runs with the host connected to the agent's
// port. track is told the VM as soon as its VMM runs (false: give up).
func (m *MicroVM) restore(ctx context.Context, cfg *VMConfig, cg *cgroup.Cgroup, f *os.File, track func(*vm) bool) (*vm, error) {
	cfg.Incoming = f
	v, err := m.startVMM(cfg, cg)
	f.Close()
	if err != nil {
		return nil, err
	}
	if !track(v) {
		return nil, errors.New("the sandbox was destroyed")
	}
	fail := func(err error) (*vm, error) {
		select {
		case <-v.exited:
			err = fmt.Errorf("%w; VMM: %s", err, v.stderr.String())
		case <-time.After(100 * time.Millisecond):
		}
		v.kill()
		return nil, err
	}
	// The agent's port is connected before the state loads, so the guest
	// never sees its host side close (its blocked read would end).
	if err := v.connect(); err != nil {
		return fail(err)
	}
	q, err := dialQMP(ctx, cfg.QMP, v.exited)
	if err != nil {
		return fail(err)
	}
	defer q.close()
	if _, err := q.cmd("migrate-incoming", map[string]string{"uri": "fd:" + strconv.Itoa(incomingFD)}, nil); err != nil {
		return fail(err)
	}
	// The snapshot was taken of a paused VM, so the loaded VM is paused
	// too ("inmigrate" while loading): it is resumed once.
	resumed := false
	for {
		r, err := q.cmd("query-status", nil, nil)
		if err != nil {
			return fail(err)
		}
		var st struct{ Status string }
		json.Unmarshal(r, &st)
		switch st.Status {
		case "running":
			return v, nil
		case "inmigrate":
		case "paused":
			if resumed {
				return fail(errors.New("restored VM stays paused after cont"))
			}
			if _, err := q.cmd("cont", nil, nil); err != nil {
				return fail(err)
			}
			resumed = true
			continue
		default:
			return fail(fmt.Errorf("restored VM is %q, not running", st.Status))
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("restore: %w", ctx.Err()))
		case <-v.exited:
			return fail(errors.New("the VMM exited while loading the snapshot"))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// errPaused is a failed save that also left the VM paused.
var errPaused = errors.New("the VM could not be resumed")

// save pauses v (booted from cfg, its agent waiting for a request),
// migrates its state into the snapshot for key and resumes it.
func (m *MicroVM) save(ctx context.Context, v *vm, cfg *VMConfig, key string, h *vmwire.Hello) (err error) {
	q, err := dialQMP(ctx, cfg.QMP, v.exited)
	if err != nil {
		return err
	}
	defer q.close()
	if _, err := q.cmd("stop", nil, nil); err != nil {
		return err
	}
	resumed := false
	defer func() {
		if resumed {
			return
		}
		if _, cerr := q.cmd("cont", nil, nil); cerr != nil {
			err = fmt.Errorf("%w (%w: %v)", err, errPaused, cerr)
		}
	}()
	file, metaPath := m.snapshotPaths(key)
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".tmp-snap-*") // 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := q.cmd("getfd", map[string]string{"fdname": "snapshot"}, tmp); err != nil {
		return err
	}
	if _, err := q.cmd("migrate", map[string]string{"uri": "fd:snapshot"}, nil); err != nil {
		return err
	}
	for done := false; !done; {
		r, err := q.cmd("query-migrate", nil, nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string
			ErrorDesc string `json:"error-desc"`
		}
		json.Unmarshal(r, &st)
		switch st.Status {
		case "completed":
			done = true
			continue
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", st.Status, st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("snapshot: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	sum := sha256.New()
	size, err := io.Copy(sum, tmp)
	if err != nil {
		return err
	}
	meta, _ := json.Marshal(snapMeta{Key: key, SHA256: hex.EncodeToString(sum.Sum(nil)), Size: size, Kernel: h.Kernel})
	if err := os.Rename(tmp.Name(), file); err != nil {
		return err
	}
	if err := writeAtomic(metaPath, meta); err != nil {
		return err
	}
	os.Chmod(metaPath, 0o600)
	pruneSnapshots(filepath.Dir(file), maxSnapshots)
	// The source VM goes on to serve its own request.
	resumed = true
	if _, err := q.cmd("cont", nil, nil); err != nil {
		return fmt.Errorf("%w: %v", errPaused, err)
	}
	return nil
}

// maxSnapshots is how many configurations keep a snapshot (each is
// about the guest's used memory: ~90 MiB at the default limits).
const maxSnapshots = 4

// pruneSnapshots deletes all but the newest keep snapshots in dir.
func pruneSnapshots(dir string, keep int) {
	for _, p := range beyondNewest(filepath.Join(dir, "*.vm"), keep) {
		os.Remove(strings.TrimSuffix(p, ".vm") + ".json")
		os.Remove(p)
	}
}

// beyondNewest lists the files matching pattern other than the keep most
// recently modified.
func beyondNewest(pattern string, keep int) []string {
	files, _ := filepath.Glob(pattern)
	type file struct {
		path string
		t    time.Time
	}
	var all []file
	for _, f := range files {
		if fi, err := os.Stat(f); err == nil {
			all = append(all, file{f, fi.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].t.After(all[j].t) })
	var old []string
	for i := keep; i < len(all); i++ {
		old = append(old, all[i].path)
	}
	return old
}

// qmp is a minimal client of QEMU's machine protocol.
type qmp struct {
	c *net.UnixConn
	r *bufio.Reader
}

func dialQMP(ctx context.Context, path string, exited <-chan struct{}) (*qmp, error) {
	var c net.Conn
	var err error
	for i := 0; i < 500; i++ {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		select {
		case <-exited:
			return nil, errors.New("VMM exited")
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err != nil {
		return nil, fmt.Errorf("connect to QMP: %w", err)
	}
	q := &qmp{c: c.(*net.UnixConn), r: bufio.NewReaderSize(c, 64<<10)}
	q.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := q.r.ReadBytes('\n'); err != nil { // the greeting
		q.close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if _, err := q.cmd("qmp_capabilities", nil, nil); err != nil {
		q.close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) close() { q.c.Close() }

// cmd runs one command, passing fd along when set, and returns its
// "return" value; events in between are skipped.
func (q *qmp) cmd(name string, args any, fd *os.File) (json.RawMessage, error) {
	msg := map[string]any{"execute": name}
	if args != nil {
		msg["arguments"] = args
	}
	b, _ := json.Marshal(msg)
	q.c.SetDeadline(time.Now().Add(30 * time.Second))
	var err error
	if fd != nil {
		_, _, err = q.c.WriteMsgUnix(b, unix.UnixRights(int(fd.Fd())), nil)
	} else {
		_, err = q.c.Write(b)
	}
	if err != nil {
		return nil, fmt.Errorf("QMP %s: %w", name, err)
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", name, err)
		}
		var resp struct {
			Return json.RawMessage
			Error  *struct{ Class, Desc string }
			Event  string
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("QMP %s: %w", name, err)
		}
		if resp.Event != "" {
			continue
		}
		if resp.Error != nil {
			return nil, fmt.Errorf("QMP %s: %s: %s", name, resp.Error.Class, sanitize([]byte(resp.Error.Desc)))
		}
		return resp.Return, nil
	}
}
