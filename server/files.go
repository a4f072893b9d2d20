package server

import (
	"errors"
	"mime"
	"net/http"

	"github.com/moat-sandbox/moat/service"
)

// The files of a sandbox's workspace: ?path= is checked by the service
// (service.CheckPath) and resolved again by the engine beneath /workspace
// without following links.

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
	return p, nil
}

// fileRequest finds the caller's sandbox {id} before ?path= is read, so
// that an unknown sandbox is answered as such whatever the path.
func (s *Server) fileRequest(r *http.Request, root bool) (string, error) {
	if _, err := s.svc.GetSandbox(r.Context(), keyOf(r), r.PathValue("id")); err != nil {
		return "", err
	}
	p, e := filePath(r, root)
	if e != nil {
		return "", e
	}
	if p != "." {
		if e := service.CheckPath("path", p); e != nil {
			return "", e
		}
	}
	return p, nil
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.fileRequest(r, false)
	if err != nil {
		return err
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
	fi, err := s.svc.WriteFile(r.Context(), keyOf(r), r.PathValue("id"), p, body, mode)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return bodyError(mbe, s.cfg.MaxBodyBytes)
		}
		return err
	}
	return writeJSON(w, http.StatusCreated, fi)
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.fileRequest(r, true)
	if err != nil {
		return err
	}
	key, id := keyOf(r), r.PathValue("id")
	fi, err := s.svc.Stat(r.Context(), key, id, p)
	if err != nil {
		return err
	}
	switch fi.Type {
	case "dir":
		entries, err := s.svc.ListDir(r.Context(), key, id, p)
		if err != nil {
			return err
		}
		return writeJSON(w, http.StatusOK, DirListing{Path: p, Entries: entries})
	case "file":
	case "symlink":
		return invalid("path", "%s is a symbolic link (to %s); links in the workspace are never followed", quote(p), quote(fi.Target))
	default:
		return invalid("path", "%s is not a regular file or a directory", quote(p))
	}
	f, info, err := s.svc.OpenFile(r.Context(), key, id, p)
	if err != nil {
		return err
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
	p, err := s.fileRequest(r, false)
	if err != nil {
		return err
	}
	if err := s.svc.Remove(r.Context(), keyOf(r), r.PathValue("id"), p); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
