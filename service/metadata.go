package service

import (
	"context"
	"strings"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/workspace"
)

// MetadataSetter is implemented by a Session that keeps file metadata
// (engine.Session: the file's user xattrs). A backend without it refuses
// metadata rather than drop it.
type MetadataSetter interface {
	SetMetadata(path string, md map[string]string) error
}

// SetMetadata sets md as the metadata of file or directory path of key's
// sandbox id (keys not in md are kept) and describes the entry as it now
// is, metadata included.
func (s *Service) SetMetadata(ctx context.Context, key audit.Key, id, path string, md map[string]string) (engine.FileInfo, error) {
	sb, e := s.file(key, id, path, true)
	if e != nil {
		return engine.FileInfo{}, e
	}
	ms, ok := sb.sess.(MetadataSetter)
	if !ok {
		return engine.FileInfo{}, InvalidField("metadata", "is not supported by this server's sandboxes (its backend keeps no file metadata); write the file without metadata")
	}
	if err := ms.SetMetadata(path, md); err != nil {
		return engine.FileInfo{}, fileError(err, "file", path)
	}
	fi, err := sb.sess.Stat(path)
	if err != nil {
		return engine.FileInfo{}, fileError(err, "file", path)
	}
	return fi, nil
}

// CheckFileMetadata refuses metadata no file can carry (workspace.CheckMetadata's
// rules), so that a front door can refuse it before anything is written.
func CheckFileMetadata(md map[string]string) *Error {
	if err := workspace.CheckMetadata(md); err != nil {
		return InvalidField("metadata", "%s", strings.TrimPrefix(err.Error(), workspace.ErrBadPath.Error()+": "))
	}
	return nil
}
