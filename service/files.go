package service

import (
	"context"
	"io"
	"io/fs"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
)

// The files of a sandbox's workspace. Paths are checked here (CheckPath)
// and resolved again by the session beneath /workspace without following
// links. "." names the workspace itself, which only Stat, ReadDir and
// OpenFile accept.

const (
	// MaxPathLen and MaxNameLen bound a workspace path and each of its
	// components (NAME_MAX).
	MaxPathLen = 1024
	MaxNameLen = 255
)

// CheckPath refuses a workspace path that could name anything outside
// /workspace or that different layers could read differently: it must be
// relative, valid UTF-8 without NUL or control characters, without empty,
// "." or ".." components, and of bounded length. The engine resolves it
// again beneath the workspace without following links; this check is so
// that a bad path is refused before anything is created. field names the
// path in the error.
func CheckPath(field, p string) *Error {
	switch {
	case p == "":
		return InvalidField(field, "is empty; give a path relative to /workspace such as \"main.py\"")
	case len(p) > MaxPathLen:
		return InvalidField(field, "is %d bytes long; at most %d are accepted", len(p), MaxPathLen)
	case !utf8.ValidString(p):
		return InvalidField(field, "%s is not valid UTF-8", Quote(p))
	case strings.IndexByte(p, 0) >= 0:
		return InvalidField(field, "%s contains a NUL byte", Quote(p))
	case strings.HasPrefix(p, "/"):
		return InvalidField(field, "%s is absolute; give a path relative to /workspace such as \"main.py\"", Quote(p))
	}
	for _, r := range p {
		if r < 0x20 || r == 0x7f {
			return InvalidField(field, "%s contains a control character", Quote(p))
		}
	}
	for c := range strings.SplitSeq(p, "/") {
		switch {
		case c == "":
			return InvalidField(field, "%s has an empty component (a doubled or trailing /)", Quote(p))
		case c == "." || c == "..":
			return InvalidField(field, "%s contains %q; paths stay inside /workspace and are written without . or ..", Quote(p), c)
		case len(c) > MaxNameLen:
			return InvalidField(field, "%s has a component of %d bytes; at most %d are accepted", Quote(p), len(c), MaxNameLen)
		}
	}
	return nil
}

// file finds key's sandbox id and checks path (field "path"); root allows
// the workspace itself (".").
func (s *Service) file(key audit.Key, id, path string, root bool) (*sandbox, *Error) {
	sb, e := s.lookup(key, id)
	if e != nil {
		return nil, e
	}
	if root && path == "." {
		return sb, nil
	}
	if e := CheckPath("path", path); e != nil {
		return nil, e
	}
	return sb, nil
}

// fileError classifies a session's error about path; what is "file" or
// "directory".
func fileError(err error, what, path string) *Error {
	return requestError(err, what+" "+Quote(path), "path")
}

// WriteFile writes r to path in key's sandbox id (missing parent
// directories are created) and describes the file written.
func (s *Service) WriteFile(ctx context.Context, key audit.Key, id, path string, r io.Reader, mode fs.FileMode) (engine.FileInfo, error) {
	sb, e := s.file(key, id, path, false)
	if e != nil {
		return engine.FileInfo{}, e
	}
	if _, err := sb.sess.WriteFile(path, r, mode); err != nil {
		return engine.FileInfo{}, fileError(err, "file", path)
	}
	fi, err := sb.sess.Stat(path)
	if err != nil {
		return engine.FileInfo{}, fileError(err, "file", path)
	}
	return fi, nil
}

// OpenFile opens the regular file path of key's sandbox id for reading.
// The caller closes it.
func (s *Service) OpenFile(ctx context.Context, key audit.Key, id, path string) (*os.File, engine.FileInfo, error) {
	sb, e := s.file(key, id, path, true)
	if e != nil {
		return nil, engine.FileInfo{}, e
	}
	f, info, err := sb.sess.Open(path)
	if err != nil {
		return nil, engine.FileInfo{}, fileError(err, "file", path)
	}
	return f, info, nil
}

// Stat describes path of key's sandbox id without following a final
// symlink.
func (s *Service) Stat(ctx context.Context, key audit.Key, id, path string) (engine.FileInfo, error) {
	sb, e := s.file(key, id, path, true)
	if e != nil {
		return engine.FileInfo{}, e
	}
	fi, err := sb.sess.Stat(path)
	if err != nil {
		return engine.FileInfo{}, fileError(err, "file", path)
	}
	return fi, nil
}

// ListDir lists the directory path of key's sandbox id (never nil).
func (s *Service) ListDir(ctx context.Context, key audit.Key, id, path string) ([]engine.FileInfo, error) {
	sb, e := s.file(key, id, path, true)
	if e != nil {
		return nil, e
	}
	entries, err := sb.sess.ReadDir(path)
	if err != nil {
		return nil, fileError(err, "directory", path)
	}
	if entries == nil {
		entries = []engine.FileInfo{}
	}
	return entries, nil
}

// MakeDir creates the directory path (and its parents) in key's sandbox
// id.
func (s *Service) MakeDir(ctx context.Context, key audit.Key, id, path string) error {
	sb, e := s.file(key, id, path, false)
	if e != nil {
		return e
	}
	if err := sb.sess.MakeDir(path); err != nil {
		return fileError(err, "directory", path)
	}
	return nil
}

// Rename moves from to to in key's sandbox id.
func (s *Service) Rename(ctx context.Context, key audit.Key, id, from, to string) error {
	sb, e := s.lookup(key, id)
	if e != nil {
		return e
	}
	if e := CheckPath("source", from); e != nil {
		return e
	}
	if e := CheckPath("destination", to); e != nil {
		return e
	}
	if err := sb.sess.Rename(from, to); err != nil {
		return requestError(err, "file "+Quote(from), "source")
	}
	return nil
}

// Remove removes path of key's sandbox id, a directory recursively.
func (s *Service) Remove(ctx context.Context, key audit.Key, id, path string) error {
	sb, e := s.file(key, id, path, false)
	if e != nil {
		return e
	}
	if err := sb.sess.Remove(path); err != nil {
		return fileError(err, "file", path)
	}
	return nil
}
