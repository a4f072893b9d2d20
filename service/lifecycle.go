package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/manifest"
)

// The lifecycle of a sandbox beyond create and delete: pause and resume,
// snapshots, fork. All of them rest on one thing, a stored copy of a
// workspace (a *snapshot): pause stores one and destroys the sandbox,
// resume makes a new sandbox under the same id from it, a snapshot is one
// kept under its own id, fork makes one and creates sandboxes from it.
//
// The copy is of the filesystem only: regular files with their permission
// bits and metadata (user extended attributes), read through the session's own file calls (which resolve beneath
// /workspace without following links). Memory, processes, symlinks and
// empty directories are not kept. On the host the copy is a directory of
// numbered blobs under Config.SnapshotDir; no name chosen inside the
// sandbox is ever a host path, and the index (paths, modes) stays in
// memory, so a server restart forgets every snapshot (New removes what a
// crash left).

// MaxForks bounds the sandboxes one fork request may create: the key's
// sandbox quota bounds them too, this bounds the work one request does.
const MaxForks = 64

// snapshotNameRE is a snapshot name: a letter or digit, then letters,
// digits, ".", "_", ":", "-"; at most 128 bytes.
var snapshotNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`)

// Snapshot describes a stored copy of a sandbox's workspace.
type Snapshot struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandbox_id"` // the sandbox it was copied from
	Names     []string  `json:"names"`
	Image     string    `json:"image"`
	Files     int       `json:"files"`
	Bytes     int64     `json:"bytes"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ForkResult is one sandbox of a fork: Sandbox, or the Err that kept it
// from starting.
type ForkResult struct {
	Sandbox Sandbox
	Err     error
}

// storedFile is one regular file of a snapshot: blob is its file name
// under the snapshot's directory.
type storedFile struct {
	path string
	mode fs.FileMode
	size int64
	blob string
	// metadata is the file's user extended attributes (E2B's file
	// metadata), restored with the file.
	metadata map[string]string
}

// snapshot is a stored workspace copy. Listed ones (kind snapshot) hold
// one of the key's sandbox slots; a paused sandbox's is held by the
// sandbox, a fork's lives only for the request.
type snapshot struct {
	id        string
	key       string
	sandboxID string
	name      string // "" when unnamed
	manifest  *manifest.Manifest
	dir       string
	files     []storedFile
	bytes     int64
	created   time.Time
	expires   time.Time      // guarded by Service.mu
	release   func()         // the key's slot, nil when the snapshot holds none
	audited   bool           // it has an audit record to finish
	removed   sync.Once      // remove runs once
	readers   sync.WaitGroup // sandboxes being created from it
	listed    bool
}

func (sn *snapshot) view() Snapshot {
	v := Snapshot{ID: sn.id, SandboxID: sn.sandboxID, Names: []string{}, Image: sn.manifest.Image,
		Files: len(sn.files), Bytes: sn.bytes, CreatedAt: sn.created, ExpiresAt: sn.expires}
	if sn.name != "" {
		v.Names = append(v.Names, sn.name)
	}
	return v
}

// clearSnapshotDir removes what a previous server left in SnapshotDir
// (the index was in its memory: the blobs are unusable) and makes the
// directory, readable by root only.
func (s *Service) clearSnapshotDir() error {
	d := s.cfg.SnapshotDir
	if d == "" {
		return nil
	}
	if err := os.RemoveAll(d); err != nil {
		return fmt.Errorf("remove the snapshots a previous server left in %s: %w", d, err)
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("snapshot directory %s: %w", d, err)
	}
	return nil
}

func (s *Service) needSnapshots() *Error {
	if s.cfg.SnapshotDir == "" {
		return unavailable("this server keeps no snapshots (Config.SnapshotDir is unset): pause, resume, snapshots and fork are off")
	}
	return nil
}

// capture copies sb's workspace into a new snapshot directory. The
// sandbox keeps running meanwhile: a file written during the copy may be
// in it in either state (E2B's filesystem-only snapshots have the same
// crash-consistency). The copy is bounded by the sandbox's own workspace
// limits, re-checked here because the files are read as they are now.
func (s *Service) capture(sb *sandbox, kind string) (_ *snapshot, err error) {
	id := kind + "-" + NewID(8)
	dir := filepath.Join(s.cfg.SnapshotDir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot directory: %w", err)
	}
	sn := &snapshot{id: id, key: sb.key, sandboxID: sb.id, manifest: sb.manifest, dir: dir, created: time.Now().UTC()}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	maxFiles := max(sb.manifest.Workspace.Files, 1)
	maxBytes := int64(sb.manifest.Workspace.Size)
	var walk func(dir string, depth int) error
	walk = func(dir string, depth int) error {
		if depth > 64 {
			return fmt.Errorf("%w: %s is nested deeper than 64 directories; a snapshot keeps at most that", engine.ErrUsage, dir)
		}
		entries, err := sb.sess.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("read %s: %w", dir, err)
		}
		for _, e := range entries {
			p := e.Name
			if dir != "." {
				p = path.Join(dir, e.Name)
			}
			if CheckPath("path", p) != nil {
				continue // a name the files API could not write back
			}
			switch e.Type {
			case "dir":
				if err := walk(p, depth+1); err != nil {
					return err
				}
			case "file":
				if len(sn.files) >= maxFiles {
					return fmt.Errorf("%w: the workspace has more than %d files (workspace.files)", engine.ErrUsage, maxFiles)
				}
				if err := s.store(sb, sn, p, maxBytes); err != nil {
					return err
				}
			}
			// Symlinks and other types are not kept (see above).
		}
		return nil
	}
	if err := walk(".", 0); err != nil {
		return nil, err
	}
	return sn, nil
}

// store copies one workspace file into sn as blob n, at most up to the
// bytes left of maxBytes.
func (s *Service) store(sb *sandbox, sn *snapshot, p string, maxBytes int64) error {
	f, info, err := sb.sess.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed since it was listed
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", p, err)
	}
	defer f.Close()
	blob := strconv.Itoa(len(sn.files))
	out, err := os.OpenFile(filepath.Join(sn.dir, blob), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	left := maxBytes - sn.bytes
	n, err := io.Copy(out, io.LimitReader(f, left+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	if n > left {
		return fmt.Errorf("%w: the workspace holds more than %d bytes (workspace.size)", engine.ErrUsage, maxBytes)
	}
	mode, perr := strconv.ParseUint(info.Mode, 8, 32)
	if perr != nil {
		mode = 0o644
	}
	sn.files = append(sn.files, storedFile{path: p, mode: fs.FileMode(mode) & 0o777, size: n, blob: blob, metadata: info.Metadata})
	sn.bytes += n
	return nil
}

// open returns the files of sn for a new sandbox; close closes them.
func (sn *snapshot) open() (files []engine.File, close func(), err error) {
	var opened []*os.File
	close = func() {
		for _, f := range opened {
			f.Close()
		}
	}
	for _, sf := range sn.files {
		f, err := os.Open(filepath.Join(sn.dir, sf.blob))
		if err != nil {
			close()
			return nil, nil, fmt.Errorf("snapshot %s: %w", sn.id, err)
		}
		opened = append(opened, f)
		files = append(files, engine.File{Path: sf.path, Mode: sf.mode, Data: f, Metadata: sf.metadata})
	}
	return files, close, nil
}

// begin opens sn's audit record (kind snapshot).
func (s *Service) beginSnapshot(sn *snapshot) error {
	rec := auditRecord(sn.id, audit.KindSnapshot, sn.key, sn.sandboxID, sn.manifest, nil)
	if err := s.cfg.Auditor.Begin(rec); err != nil {
		return fmt.Errorf("audit: begin snapshot %s: %w", sn.id, err)
	}
	sn.audited = true
	return nil
}

// remove deletes sn's directory, finishes its record and frees its slot;
// it waits for the sandboxes being created from it. Safe to call more
// than once.
func (s *Service) remove(sn *snapshot, reason string) {
	sn.removed.Do(func() {
		sn.readers.Wait()
		if err := os.RemoveAll(sn.dir); err != nil {
			s.log.Error("remove snapshot", "snapshot", sn.id, "err", err)
		}
		if sn.audited {
			if err := s.cfg.Auditor.Finish(sn.id, nil, nil); err != nil {
				s.log.Error("audit: finish snapshot", "snapshot", sn.id, "err", err)
			}
		}
		if sn.release != nil {
			sn.release()
		}
		s.log.Info("snapshot removed", "snapshot", sn.id, "sandbox", sn.sandboxID, "reason", reason)
	})
}

// PauseSandbox pauses key's running sandbox id: its workspace is stored,
// its processes are killed and the sandbox is destroyed, but its id, its
// metadata and its slot of the key's quota are kept until it is resumed
// or deleted, or until Config.SnapshotTTL passes. Pausing a paused
// sandbox is a Conflict.
func (s *Service) PauseSandbox(ctx context.Context, key audit.Key, id string) (Sandbox, error) {
	if e := s.needSnapshots(); e != nil {
		return Sandbox{}, e
	}
	sb, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	return s.pause(sb, reasonPaused)
}

// pause pauses sb (PauseSandbox); reason is why its processes end.
func (s *Service) pause(sb *sandbox, reason string) (Sandbox, error) {
	// In flight until paused: Shutdown then finds it paused and deletes it.
	leave, e := s.enter()
	if e != nil {
		return Sandbox{}, e
	}
	defer leave()
	s.mu.Lock()
	if sb.state != StateRunning {
		st := sb.state
		s.mu.Unlock()
		return Sandbox{}, conflict("sandbox %s is %s, not running: only a running sandbox can be paused", sb.id, st)
	}
	sb.state = StatePausing
	s.mu.Unlock()

	sn, err := s.capture(sb, "pause")
	if err == nil {
		err = s.beginSnapshot(sn)
		if err != nil {
			os.RemoveAll(sn.dir)
		}
	}
	if err != nil {
		s.mu.Lock()
		sb.state = StateRunning
		s.mu.Unlock()
		return Sandbox{}, backendError(fmt.Errorf("pause sandbox %s: %w", sb.id, err), "")
	}
	// The sandbox's processes end here: a filesystem-only pause.
	if err := s.closeSession(sb, reason); err != nil {
		s.mu.Lock()
		sb.state = StateDeleting
		s.mu.Unlock()
		s.remove(sn, "pause failed")
		s.tasks.Add(1)
		go func() {
			defer s.tasks.Done()
			s.finishDestroy(sb, "pause failed")
		}()
		return Sandbox{}, InternalError(fmt.Errorf("pause sandbox %s: destroy: %w", sb.id, err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb.state = StatePaused
	sb.paused = sn
	sb.expires = time.Now().UTC().Add(s.cfg.SnapshotTTL)
	sn.expires = sb.expires
	s.log.Info("sandbox paused", "sandbox", sb.id, "key", sb.key, "reason", reason, "files", len(sn.files), "bytes", sn.bytes)
	return s.viewLocked(sb), nil
}

// ResumeSandbox resumes key's paused sandbox id: a new sandbox with the
// paused one's manifest and files, under the same id, living ttl (0: the
// DefaultTTL). Resuming a sandbox that is not paused is a Conflict.
func (s *Service) ResumeSandbox(ctx context.Context, key audit.Key, id string, ttl time.Duration) (Sandbox, error) {
	if e := s.needSnapshots(); e != nil {
		return Sandbox{}, e
	}
	ttl = cmp.Or(ttl, s.cfg.DefaultTTL)
	if e := s.checkTTL(ttl); e != nil {
		return Sandbox{}, e
	}
	old, e := s.lookup(key, id)
	if e != nil {
		return Sandbox{}, e
	}
	// In flight until resumed: Shutdown then finds it running or paused.
	leave, e := s.enter()
	if e != nil {
		return Sandbox{}, e
	}
	defer leave()
	if e := s.checkCPU(key); e != nil {
		return Sandbox{}, e
	}
	s.mu.Lock()
	if old.state != StatePaused {
		st := old.state
		s.mu.Unlock()
		return Sandbox{}, conflict("sandbox %s is %s, not paused: only a paused sandbox can be resumed", old.id, st)
	}
	old.state = StateResuming
	sn := old.paused
	s.mu.Unlock()
	back := func() {
		s.mu.Lock()
		old.state = StatePaused
		s.mu.Unlock()
	}

	files, closeFiles, err := sn.open()
	if err != nil {
		back()
		return Sandbox{}, InternalError(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	sess, err := guard("backend", "a session", func() (Session, error) {
		return s.cfg.Backend.NewSession(ctx, &engine.SessionRequest{Manifest: old.manifest, Files: files})
	})
	closeFiles()
	if err != nil {
		back()
		return Sandbox{}, backendError(err, "sandbox")
	}
	old.mu.Lock()
	seq := old.seq
	old.mu.Unlock()
	info := sess.Info()
	// A new *sandbox, not old with a new session: callers that looked old
	// up before see a closed session (a Conflict), never a torn one.
	sb := &sandbox{
		fx: old.fx, remembered: old.remembered,
		id: old.id, key: old.key, sess: sess, info: info, manifest: old.manifest, metadata: old.metadata,
		created: old.created, release: old.release, untrack: old.untrack, seq: seq,
		state: StateRunning, expires: time.Now().UTC().Add(ttl), autoPause: old.autoPause,
	}
	s.mu.Lock()
	if s.sandboxes[id] != old {
		// Cannot happen (a resuming sandbox is neither deleted nor
		// reaped); refuse rather than register a second one.
		s.mu.Unlock()
		sess.Close()
		return Sandbox{}, InternalError(fmt.Errorf("resume sandbox %s: it left the registry while resuming", id))
	}
	s.sandboxes[id] = sb
	old.paused = nil
	view := s.viewLocked(sb)
	s.mu.Unlock()
	s.remove(sn, "resumed")
	s.log.Info("sandbox resumed", "sandbox", id, "key", key.ID, "tier", info.Tier, "ttl", ttl.String())
	return view, nil
}

// CreateSnapshot stores a copy of key's running sandbox id's workspace as
// a snapshot, named name when it is not "" (unique among the key's
// snapshots). It holds one of the key's sandbox slots until deleted or
// expired (Config.SnapshotTTL).
func (s *Service) CreateSnapshot(ctx context.Context, key audit.Key, id, name string) (Snapshot, error) {
	if e := s.needSnapshots(); e != nil {
		return Snapshot{}, e
	}
	if name != "" && !snapshotNameRE.MatchString(name) {
		return Snapshot{}, InvalidField("name", "%s is not a snapshot name: a letter or digit, then letters, digits, '.', '_', ':' or '-', at most 128 bytes", Quote(name))
	}
	sb, e := s.lookup(key, id)
	if e != nil {
		return Snapshot{}, e
	}
	if name != "" {
		if _, e := s.findSnapshot(key, name); e == nil {
			return Snapshot{}, conflict("the key already has a snapshot named %s: delete it or choose another name", Quote(name))
		}
	}
	s.mu.Lock()
	running := sb.state == StateRunning
	s.mu.Unlock()
	if !running {
		return Snapshot{}, conflict("sandbox %s is not running: resume it before taking a snapshot", sb.id)
	}
	leave, release, e := s.admit(key)
	if e != nil {
		return Snapshot{}, e
	}
	defer leave()
	sn, err := s.capture(sb, "snap")
	if err != nil {
		release()
		return Snapshot{}, backendError(fmt.Errorf("snapshot sandbox %s: %w", sb.id, err), "")
	}
	sn.name, sn.release, sn.listed = name, release, true
	sn.expires = sn.created.Add(s.cfg.SnapshotTTL)
	if err := s.beginSnapshot(sn); err != nil {
		s.remove(sn, "audit failed")
		return Snapshot{}, InternalError(err)
	}
	s.mu.Lock()
	if name != "" && s.namedLocked(key.ID, name) != nil {
		s.mu.Unlock()
		s.remove(sn, "name taken meanwhile")
		return Snapshot{}, conflict("the key already has a snapshot named %s: delete it or choose another name", Quote(name))
	}
	s.snapshots[sn.id] = sn
	v := sn.view()
	s.mu.Unlock()
	s.log.Info("snapshot created", "snapshot", sn.id, "sandbox", sb.id, "key", key.ID, "files", len(sn.files), "bytes", sn.bytes)
	return v, nil
}

func (s *Service) namedLocked(keyID, name string) *snapshot {
	for _, sn := range s.snapshots {
		if sn.key == keyID && sn.name == name {
			return sn
		}
	}
	return nil
}

// findSnapshot is key's snapshot whose id or name is ref. Another key's is
// as absent as an unknown one.
func (s *Service) findSnapshot(key audit.Key, ref string) (*snapshot, *Error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if key.ID == "" {
		return nil, notFound("snapshot " + Quote(ref))
	}
	if sn := s.snapshots[ref]; sn != nil && sn.key == key.ID {
		return sn, nil
	}
	if sn := s.namedLocked(key.ID, ref); sn != nil {
		return sn, nil
	}
	return nil, notFound("snapshot " + Quote(ref))
}

// GetSnapshot describes key's snapshot ref (its id or name).
func (s *Service) GetSnapshot(ctx context.Context, key audit.Key, ref string) (Snapshot, error) {
	sn, e := s.findSnapshot(key, ref)
	if e != nil {
		return Snapshot{}, e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return sn.view(), nil
}

// ListSnapshots is key's snapshots, oldest first: those of sandboxID
// when it is not "", named name when it is not "".
func (s *Service) ListSnapshots(ctx context.Context, key audit.Key, sandboxID, name string) ([]Snapshot, error) {
	s.mu.Lock()
	list := []Snapshot{}
	for _, sn := range s.snapshots {
		if key.ID == "" || sn.key != key.ID || (sandboxID != "" && sn.sandboxID != sandboxID) || (name != "" && sn.name != name) {
			continue
		}
		list = append(list, sn.view())
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b Snapshot) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return list, nil
}

// DeleteSnapshot removes key's snapshot ref (its id or name) and its
// files, and frees its slot.
func (s *Service) DeleteSnapshot(ctx context.Context, key audit.Key, ref string) error {
	sn, e := s.findSnapshot(key, ref)
	if e != nil {
		return e
	}
	s.mu.Lock()
	if s.snapshots[sn.id] != sn {
		s.mu.Unlock()
		return notFound("snapshot " + Quote(ref))
	}
	delete(s.snapshots, sn.id)
	s.mu.Unlock()
	s.remove(sn, "deleted by its key")
	return nil
}

// ForkSandbox creates count sandboxes (1..MaxForks) from one copy of key's
// running sandbox id's workspace, each living ttl (0: the DefaultTTL).
// The request fails as a whole only before any fork is attempted (a bad
// count, an unknown sandbox); each fork then succeeds or fails on its own
// (the key's quota may stop the later ones).
func (s *Service) ForkSandbox(ctx context.Context, key audit.Key, id string, count int, ttl time.Duration) ([]ForkResult, error) {
	if e := s.needSnapshots(); e != nil {
		return nil, e
	}
	if count < 1 || count > MaxForks {
		return nil, InvalidField("count", "%d is not a number of forks from 1 to %d", count, MaxForks)
	}
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	s.mu.Lock()
	running := sb.state == StateRunning
	s.mu.Unlock()
	if !running {
		return nil, conflict("sandbox %s is not running: resume it before forking it", sb.id)
	}
	leave, e := s.enter()
	if e != nil {
		return nil, e
	}
	defer leave()
	sn, err := s.capture(sb, "fork")
	if err != nil {
		return nil, backendError(fmt.Errorf("fork sandbox %s: %w", sb.id, err), "")
	}
	defer s.remove(sn, "forked")
	out := make([]ForkResult, count)
	for i := range out {
		v, err := s.createFrom(ctx, key, sn, SandboxArgs{Manifest: sb.manifest, TTL: ttl, Metadata: sb.metadata})
		out[i] = ForkResult{Sandbox: v, Err: err}
	}
	return out, nil
}

// createFrom creates a sandbox starting with sn's files.
func (s *Service) createFrom(ctx context.Context, key audit.Key, sn *snapshot, args SandboxArgs) (Sandbox, error) {
	files, closeFiles, err := sn.open()
	if err != nil {
		return Sandbox{}, InternalError(err)
	}
	defer closeFiles()
	args.Files = append(files, args.Files...)
	return s.CreateSandbox(ctx, key, args)
}

// snapshotArgs resolves args.Snapshot for CreateSandbox: the snapshot's
// manifest when args has none, its files first. done must be called once
// the sandbox is created (or not).
func (s *Service) snapshotArgs(key audit.Key, args *SandboxArgs) (done func(), e *Error) {
	if e := s.needSnapshots(); e != nil {
		return nil, e
	}
	sn, e := s.findSnapshot(key, args.Snapshot)
	if e != nil {
		return nil, e
	}
	s.mu.Lock()
	if s.snapshots[sn.id] != sn {
		s.mu.Unlock()
		return nil, notFound("snapshot " + Quote(args.Snapshot))
	}
	sn.readers.Add(1) // remove waits until the files are copied
	s.mu.Unlock()
	if args.Manifest == nil {
		args.Manifest = sn.manifest
	} else if args.Manifest.Image != sn.manifest.Image {
		sn.readers.Done()
		return nil, InvalidField("image", "%s differs from snapshot %s's image %s: a sandbox from a snapshot runs the snapshot's image", Quote(args.Manifest.Image), sn.id, Quote(sn.manifest.Image))
	}
	files, closeFiles, err := sn.open()
	if err != nil {
		sn.readers.Done()
		return nil, InternalError(err)
	}
	args.Files = append(files, args.Files...)
	return func() { closeFiles(); sn.readers.Done() }, nil
}

// expireSnapshots removes the snapshots whose TTL has passed.
func (s *Service) expireSnapshots(now time.Time) {
	s.mu.Lock()
	var expired []*snapshot
	for id, sn := range s.snapshots {
		if now.After(sn.expires) {
			expired = append(expired, sn)
			delete(s.snapshots, id)
		}
	}
	s.mu.Unlock()
	for _, sn := range expired {
		s.goSafe("snapshot expiry", func() { s.remove(sn, "ttl expired") })
	}
}

// dropSnapshots removes every snapshot (Shutdown: the index is in memory,
// the files would be unusable).
func (s *Service) dropSnapshots() {
	s.mu.Lock()
	all := make([]*snapshot, 0, len(s.snapshots))
	for id, sn := range s.snapshots {
		all = append(all, sn)
		delete(s.snapshots, id)
	}
	s.mu.Unlock()
	for _, sn := range all {
		s.remove(sn, "server shutting down")
	}
}
