package server

import (
	"mime"
	"net/http"

	"github.com/moat-sandbox/moat/engine"
)

// The files of a sandbox's workspace. Paths are checked here as strictly
// as uploads (checkPath) and resolved again by the engine beneath
// /workspace without following links.

// lookupFile finds the caller's sandbox {id} and the file ?path= names in
// it (see filePath).
func (s *Server) lookupFile(r *http.Request, root bool) (*sandbox, string, *Error) {
	sb, e := s.lookup(r)
	if e != nil {
		return nil, "", e
	}
	p, e := filePath(r, root)
	if e != nil {
		return nil, "", e
	}
	return sb, p, nil
}

// filePath reads ?path=. root allows the workspace itself ("" or "."),
// which only a listing may name.
func filePath(r *http.Request, root bool) (string, *Error) {
	p := r.URL.Query().Get("path")
	if root && (p == "" || p == ".") {
		return ".", nil
	}
	if p == "" {
		return "", invalid("path", "is missing: give ?path= a path relative to /workspace")
	}
	if e := checkPath("path", p); e != nil {
		return "", e
	}
	return p, nil
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	sb, p, e := s.lookupFile(r, false)
	if e != nil {
		return e
	}
	mode, e := parseMode("mode", r.URL.Query().Get("mode"))
	if e != nil {
		return e
	}
	if r.ContentLength > s.cfg.MaxBodyBytes {
		// Refused before reading: with "Expect: 100-continue" the client
		// never sends the body.
		return tooLarge("", "the upload is %d bytes, over the %d-byte limit (--max-body)", r.ContentLength, s.cfg.MaxBodyBytes)
	}
	// Streamed, not buffered: the body goes to the workspace as it comes.
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	if _, err := sb.sess.WriteFile(p, body, mode); err != nil {
		if e := bodyError(err, s.cfg.MaxBodyBytes); e.Status == http.StatusRequestEntityTooLarge {
			return e
		}
		return requestError(err, "file "+quote(p), "path")
	}
	fi, err := sb.sess.Stat(p)
	if err != nil {
		return requestError(err, "file "+quote(p), "path")
	}
	return writeJSON(w, http.StatusCreated, fi)
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	sb, p, e := s.lookupFile(r, true)
	if e != nil {
		return e
	}
	fi, err := sb.sess.Stat(p)
	if err != nil {
		return requestError(err, "file "+quote(p), "path")
	}
	switch fi.Type {
	case "dir":
		entries, err := sb.sess.ReadDir(p)
		if err != nil {
			return requestError(err, "directory "+quote(p), "path")
		}
		if entries == nil {
			entries = []engine.FileInfo{}
		}
		return writeJSON(w, http.StatusOK, DirListing{Path: p, Entries: entries})
	case "file":
	case "symlink":
		return invalid("path", "%s is a symbolic link (to %s); links in the workspace are never followed", quote(p), quote(fi.Target))
	default:
		return invalid("path", "%s is not a regular file or a directory", quote(p))
	}
	f, info, err := sb.sess.Open(p)
	if err != nil {
		return requestError(err, "file "+quote(p), "path")
	}
	defer f.Close()
	h := w.Header()
	// Whatever the sandbox wrote is served as opaque bytes: a browser must
	// never render it as HTML in the API's origin.
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": info.Name}))
	h.Set("X-Moat-File-Mode", info.Mode)
	http.ServeContent(w, r, "", info.ModTime, f)
	return nil
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	sb, p, e := s.lookupFile(r, false)
	if e != nil {
		return e
	}
	if err := sb.sess.Remove(p); err != nil {
		return requestError(err, "file "+quote(p), "path")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
