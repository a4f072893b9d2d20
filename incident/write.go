package incident

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/result"
)

// Bundle files and directory modes: read-only to their owner (root for
// moat serve), nothing to anyone else. A bundle is evidence: nothing
// writes it after Keep, and nothing executes it.
const (
	fileMode = 0o400
	dirMode  = 0o500
)

// workspaceEntry is one diff entry in workspace.json: its sandbox path
// (data only, never a host path), what happened to it, and where its
// content is in the bundle (workspace/N) or why it is not.
type workspaceEntry struct {
	Path     string        `json:"path"`
	Change   result.Change `json:"change"`
	Size     int64         `json:"size"`
	Stored   string        `json:"stored,omitempty"`
	Omitted  string        `json:"omitted,omitempty"`
	Encoding string        `json:"encoding,omitempty"`
}

// Keep writes ev's bundle and returns its summary. The bundle appears
// whole or not at all: it is written under a temporary name and renamed.
// Older bundles are pruned first so that the store stays within the
// policy with the new one in it.
func (s *Store) Keep(ev *Evidence) (Summary, error) {
	if ev == nil || ev.Result == nil {
		return Summary{}, errors.New("keep incident: no result")
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", err)
	}
	now := s.now().UTC()
	sum := Summary{
		ID: newID(now), Time: now, RunID: ev.Result.ID, Key: ev.Key,
		Reasons: Reasons(ev.Result), Tier: ev.Result.Tier,
		Commands: ev.Commands, Exposure: ExposureOf(ev.Manifest, ev.Result),
	}
	if ev.RunID != "" {
		sum.RunID = ev.RunID
	}
	if sum.Commands == nil {
		sum.Commands = [][]string{}
	}
	tmp, err := os.MkdirTemp(s.dir, ".tmp-")
	if err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", err)
	}
	done := false
	defer func() {
		if !done {
			removeBundle(tmp)
		}
	}()
	w := &writer{dir: tmp}
	m := any(ev.Manifest)
	if ev.Manifest == nil {
		m = map[string]string{"note": "not available"}
	}
	w.json("manifest.json", m)
	w.json("commands.json", sum.Commands)
	w.json("result.json", ev.Result)
	w.json("network.json", map[string]any{"attempts": ev.Result.Network, "summary": ev.Result.NetworkSummary, "secrets_used": ev.Result.SecretsUsed})
	procs := map[string]any{"processes": ev.Procs}
	if ev.Procs == nil {
		procs = map[string]any{"processes": []Process{}, "note": cmpOr(ev.ProcsNote, "not available")}
	}
	w.json("processes.json", procs)
	if ev.Audit != nil {
		w.raw("audit.json", ev.Audit)
	} else {
		w.json("audit.json", map[string]string{"note": "not available: no audit log (the local moat run keeps none)"})
	}
	w.workspace(ev.WorkspaceDir, ev.Result.Files, s.pol.MaxBundleBytes)
	if w.err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", w.err)
	}
	sum.Files = append(w.files, "summary.json")
	sum.Bytes = w.bytes
	// The summary counts itself approximately: its own size is small and
	// bounded by the fields above.
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return Summary{}, err
	}
	sum.Bytes += int64(len(b)) + 32
	w.json("summary.json", sum)
	if w.err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", w.err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.prune(sum.Bytes); err != nil {
		return Summary{}, fmt.Errorf("keep incident: prune: %w", err)
	}
	if err := os.Chmod(filepath.Join(tmp, "workspace"), dirMode); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Summary{}, fmt.Errorf("keep incident: %w", err)
	}
	if err := os.Chmod(tmp, dirMode); err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, sum.ID)); err != nil {
		return Summary{}, fmt.Errorf("keep incident: %w", err)
	}
	done = true
	return sum, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// writer writes a bundle's files, keeping the first error.
type writer struct {
	dir   string
	files []string
	bytes int64
	err   error
}

func (w *writer) json(name string, v any) {
	if w.err != nil {
		return
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		w.err = fmt.Errorf("%s: %w", name, err)
		return
	}
	w.raw(name, append(b, '\n'))
}

func (w *writer) raw(name string, b []byte) {
	if w.err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(w.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, fileMode)
	if err != nil {
		w.err = err
		return
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		w.err = fmt.Errorf("%s: %w", name, err)
		return
	}
	w.files = append(w.files, name)
	w.bytes += int64(len(b))
}

// workspace copies the added and modified regular files of the diff from
// wsDir into workspace/N, within what the bundle's cap leaves, and writes
// workspace.json. wsDir is hostile ground: it is opened as an os.Root, so
// no path (or symlink inside it) resolves outside it, and only regular
// files are read, each bounded.
func (w *writer) workspace(wsDir string, files []result.FileChange, capBytes int64) {
	if w.err != nil {
		return
	}
	entries := []workspaceEntry{}
	var root *os.Root
	note := ""
	if wsDir == "" {
		note = "not available: the workspace was gone when the run ended"
	} else if r, err := os.OpenRoot(wsDir); err != nil {
		note = "not available: " + err.Error()
	} else {
		root = r
		defer root.Close()
	}
	// The JSON files come first: reserve room for workspace.json (about
	// 256 bytes an entry) and summary.json.
	budget := capBytes - w.bytes - int64(256*len(files)) - 4096
	n := 0
	for _, f := range files {
		e := workspaceEntry{Path: f.Path, Change: f.Change, Size: f.Size}
		if !utf8.ValidString(f.Path) {
			// As the result writes it: JSON cannot hold the bytes.
			e.Path, e.Encoding = base64.StdEncoding.EncodeToString([]byte(f.Path)), result.EncodingBase64
		}
		switch {
		case f.Change == result.Deleted:
		case f.Type != "" && f.Type != "file":
			e.Omitted = "not a regular file (" + f.Type + "): recorded, never copied"
		case root == nil:
			e.Omitted = note
		case f.Size > budget:
			e.Omitted = fmt.Sprintf("over the bundle's cap (%d bytes left of %d)", max(budget, 0), capBytes)
		default:
			n++
			name := fmt.Sprintf("workspace/%d", n)
			got, err := w.copyFile(root, f.Path, name, budget)
			if err != nil {
				e.Omitted = "not copied: " + err.Error()
				n--
				break
			}
			e.Stored = name
			budget -= got
		}
		entries = append(entries, e)
	}
	w.json("workspace.json", map[string]any{"entries": entries, "note": note})
}

// copyFile copies the regular file at path in root to the bundle's name,
// at most limit bytes.
func (w *writer) copyFile(root *os.Root, path, name string, limit int64) (int64, error) {
	src, err := root.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	if fi.Size() > limit {
		return 0, fmt.Errorf("grew past the bundle's cap to %d bytes", fi.Size())
	}
	if err := os.Mkdir(filepath.Join(w.dir, "workspace"), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return 0, err
	}
	dst, err := os.OpenFile(filepath.Join(w.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, fileMode)
	if err != nil {
		return 0, err
	}
	got, err := io.Copy(dst, io.LimitReader(src, limit))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(filepath.Join(w.dir, name))
		return 0, err
	}
	w.files = append(w.files, name)
	w.bytes += got
	return got, nil
}
