package e2b

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/engine"
)

// filesystem.Filesystem and REST /files over the sandbox's workspace. The
// session resolves every path beneath /workspace without following links.

type entryInfo struct {
	Name          string  `json:"name"`
	Type          string  `json:"type"`
	Path          string  `json:"path"`
	Size          string  `json:"size"`
	Mode          uint32  `json:"mode"`
	Permissions   string  `json:"permissions"`
	Owner         string  `json:"owner"`
	Group         string  `json:"group"`
	ModifiedTime  string  `json:"modifiedTime"`
	SymlinkTarget *string `json:"symlinkTarget,omitempty"`
}

func entryOf(fi engine.FileInfo) entryInfo {
	mode, _ := strconv.ParseUint(fi.Mode, 8, 32)
	e := entryInfo{Name: fi.Name, Path: e2bPath(fi.Path), Size: strconv.FormatInt(fi.Size, 10), Mode: uint32(mode),
		Permissions: fs.FileMode(mode).String(), Owner: "user", Group: "user", ModifiedTime: fi.ModTime.UTC().Format(time.RFC3339Nano)}
	switch fi.Type {
	case "file":
		e.Type = "FILE_TYPE_FILE"
	case "dir":
		e.Type = "FILE_TYPE_DIRECTORY"
		e.Permissions = "d" + e.Permissions[1:]
	case "symlink":
		e.Type = "FILE_TYPE_SYMLINK"
		t := fi.Target
		e.SymlinkTarget = &t
	default:
		e.Type = "FILE_TYPE_UNSPECIFIED"
	}
	return e
}

// fsError maps a session error onto a Connect error.
func fsError(err error, p string) *rpcError {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rpcErr("not_found", "path '%s' does not exist", p)
	case errors.Is(err, fs.ErrExist):
		return rpcErr("already_exists", "path '%s' already exists", p)
	case errors.Is(err, engine.ErrSessionClosed):
		return rpcErr("unavailable", "the sandbox was destroyed")
	}
	return rpcErr("invalid_argument", "%s: %v", p, err)
}

func (c *envdCall) filesystem(w http.ResponseWriter, r *http.Request, method string) {
	if method == "WatchDir" {
		c.watchDir(w, r)
		return
	}
	var req struct {
		Path        string `json:"path"`
		Depth       uint32 `json:"depth"`
		Source      string `json:"source"`
		Destination string `json:"destination"`
	}
	if e := readUnary(r, &req); e != nil {
		writeUnaryError(w, e)
		return
	}
	reply := func(v any, e *rpcError) {
		if e != nil {
			writeUnaryError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
	switch method {
	case "Stat":
		p, e := workspacePath("path", req.Path)
		if e != nil {
			reply(nil, e)
			return
		}
		fi, err := c.sess.Stat(p)
		if err != nil {
			reply(nil, fsError(err, req.Path))
			return
		}
		reply(map[string]any{"entry": entryOf(fi)}, nil)
	case "MakeDir":
		p, e := workspacePath("path", req.Path)
		if e != nil {
			reply(nil, e)
			return
		}
		if p == "." {
			reply(nil, rpcErr("already_exists", "directory '%s' already exists", req.Path))
			return
		}
		if _, err := c.sess.Stat(p); err == nil {
			reply(nil, rpcErr("already_exists", "directory '%s' already exists", req.Path))
			return
		}
		if err := c.sess.MakeDir(p); err != nil {
			reply(nil, fsError(err, req.Path))
			return
		}
		fi, err := c.sess.Stat(p)
		if err != nil {
			reply(nil, fsError(err, req.Path))
			return
		}
		reply(map[string]any{"entry": entryOf(fi)}, nil)
	case "Move":
		from, e := workspacePath("source", req.Source)
		if e != nil {
			reply(nil, e)
			return
		}
		to, e := workspacePath("destination", req.Destination)
		if e != nil {
			reply(nil, e)
			return
		}
		if from == "." || to == "." {
			reply(nil, rpcErr("invalid_argument", "the workspace itself cannot be moved or replaced"))
			return
		}
		if err := c.sess.Rename(from, to); err != nil {
			reply(nil, fsError(err, req.Source))
			return
		}
		fi, err := c.sess.Stat(to)
		if err != nil {
			reply(nil, fsError(err, req.Destination))
			return
		}
		reply(map[string]any{"entry": entryOf(fi)}, nil)
	case "ListDir":
		p, e := workspacePath("path", req.Path)
		if e != nil {
			reply(nil, e)
			return
		}
		depth := max(int(req.Depth), 1)
		entries := []entryInfo{}
		if e := c.listDir(p, req.Path, depth, &entries); e != nil {
			reply(nil, e)
			return
		}
		reply(map[string]any{"entries": entries}, nil)
	case "Remove":
		p, e := workspacePath("path", req.Path)
		if e != nil {
			reply(nil, e)
			return
		}
		if p == "." {
			reply(nil, rpcErr("permission_denied", "the workspace itself cannot be removed"))
			return
		}
		if err := c.sess.Remove(p); err != nil {
			reply(nil, fsError(err, req.Path))
			return
		}
		reply(struct{}{}, nil)
	default:
		reply(nil, rpcErr("unimplemented", "filesystem.Filesystem/%s is not a method Moat serves", method))
	}
}

// maxListed bounds a recursive listing.
const maxListed = 10000

func (c *envdCall) listDir(p, shown string, depth int, out *[]entryInfo) *rpcError {
	fi, err := c.sess.Stat(p)
	if err != nil {
		return fsError(err, shown)
	}
	if fi.Type != "dir" {
		return rpcErr("invalid_argument", "path '%s' is not a directory", shown)
	}
	list, err := c.sess.ReadDir(p)
	if err != nil {
		return fsError(err, shown)
	}
	for _, f := range list {
		if len(*out) >= maxListed {
			return rpcErr("resource_exhausted", "more than %d entries under '%s'; list with a smaller depth", maxListed, shown)
		}
		*out = append(*out, entryOf(f))
		if f.Type == "dir" && depth > 1 {
			if e := c.listDir(f.Path, e2bPath(f.Path), depth-1, out); e != nil {
				return e
			}
		}
	}
	return nil
}

// watchDir polls the directory (the session's files live on the host
// side, where no inotify of the guest reaches) and reports what changed
// between two looks: create, write, remove.
func (c *envdCall) watchDir(w http.ResponseWriter, r *http.Request) {
	st := newStream(w)
	var req struct {
		Path               string `json:"path"`
		Recursive          bool   `json:"recursive"`
		IncludeEntry       bool   `json:"includeEntry"`
		AllowNetworkMounts bool   `json:"allowNetworkMounts"`
	}
	if e := readStreamRequest(r, &req); e != nil {
		st.end(e)
		return
	}
	p, e := workspacePath("path", req.Path)
	if e != nil {
		st.end(e)
		return
	}
	depth := 1
	if req.Recursive {
		depth = 32
	}
	snap := func() (map[string]engine.FileInfo, *rpcError) {
		var list []entryInfo
		if e := c.listDir(p, req.Path, depth, &list); e != nil {
			return nil, e
		}
		m := make(map[string]engine.FileInfo, len(list))
		for _, en := range list {
			m[en.Path] = engine.FileInfo{Size: mustInt(en.Size), Type: en.Type, Mode: en.ModifiedTime}
		}
		return m, nil
	}
	prev, e := snap()
	if e != nil {
		st.end(e)
		return
	}
	if st.send(map[string]any{"start": struct{}{}}) != nil {
		return
	}
	base := e2bPath(p)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-keep.C:
			if st.send(map[string]any{"keepalive": struct{}{}}) != nil {
				return
			}
		case <-tick.C:
			cur, e := snap()
			if e != nil {
				st.end(e)
				return
			}
			send := func(p, typ string) bool {
				name := strings.TrimPrefix(strings.TrimPrefix(p, base), "/")
				return st.send(map[string]any{"filesystem": map[string]any{"name": name, "type": typ}}) == nil
			}
			for p, fi := range cur {
				old, ok := prev[p]
				switch {
				case !ok:
					if !send(p, "EVENT_TYPE_CREATE") {
						return
					}
				case old != fi && fi.Type == "FILE_TYPE_FILE":
					if !send(p, "EVENT_TYPE_WRITE") {
						return
					}
				}
			}
			for p := range prev {
				if _, ok := cur[p]; !ok && !send(p, "EVENT_TYPE_REMOVE") {
					return
				}
			}
			prev = cur
		}
	}
}

func mustInt(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// restError answers /files in envd's REST form.
func restError(w http.ResponseWriter, status int, format string, a ...any) {
	writeJSON(w, status, apiError{status, fmt.Sprintf(format, a...)})
}

func restStatus(e *rpcError) int {
	switch e.Code {
	case "not_found":
		return http.StatusNotFound
	case "permission_denied":
		return http.StatusForbidden
	case "resource_exhausted":
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusBadRequest
}

// download is GET /files?path=: the file's bytes, with Range (Moat's
// handler serves it) and gzip when the client accepts it and asked for
// the whole file.
func (c *envdCall) download(w http.ResponseWriter, r *http.Request) {
	p, e := workspacePath("path", r.URL.Query().Get("path"))
	if e != nil {
		restError(w, restStatus(e), "%s", e.Message)
		return
	}
	fi, err := c.sess.Stat(p)
	if err != nil {
		e := fsError(err, r.URL.Query().Get("path"))
		restError(w, restStatus(e), "%s", e.Message)
		return
	}
	if fi.Type != "file" {
		restError(w, http.StatusBadRequest, "path '%s' is a %s, not a file", r.URL.Query().Get("path"), fi.Type)
		return
	}
	req := httptest.NewRequestWithContext(r.Context(), http.MethodGet, "/v1/sandboxes/"+url.PathEscape(c.b.id)+"/files?path="+url.QueryEscape(p), nil)
	for _, h := range []string{"Range", "If-Range", "If-None-Match", "If-Modified-Since"} {
		if v := r.Header.Get(h); v != "" {
			req.Header.Set(h, v)
		}
	}
	out := w
	if r.Header.Get("Range") == "" && acceptsGzip(r) {
		w.Header().Set("Content-Encoding", "gzip")
		w.Header().Add("Vary", "Accept-Encoding")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = &gzipWriter{ResponseWriter: w, gz: gz}
	}
	c.h.cfg.API.ServeAs(c.key, out, req)
}

func acceptsGzip(r *http.Request) bool {
	for part := range strings.SplitSeq(r.Header.Get("Accept-Encoding"), ",") {
		if name, _, _ := strings.Cut(strings.TrimSpace(part), ";"); name == "gzip" {
			return true
		}
	}
	return false
}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (g *gzipWriter) WriteHeader(code int) {
	g.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(code)
}
func (g *gzipWriter) Write(b []byte) (int, error) { return g.gz.Write(b) }

type writtenEntry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// upload is POST /files: an octet-stream body (gzip if Content-Encoding
// says so) to ?path=, or multipart/form-data whose "file" parts are named
// by their file names (or ?path= for one part).
func (c *envdCall) upload(w http.ResponseWriter, r *http.Request) {
	qpath := r.URL.Query().Get("path")
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var body io.Reader = r.Body
	switch r.Header.Get("Content-Encoding") {
	case "", "identity":
	case "gzip":
		gz, err := gzip.NewReader(r.Body)
		if err != nil {
			restError(w, http.StatusBadRequest, "the body is not gzip: %v", err)
			return
		}
		defer gz.Close()
		body = gz
	default:
		restError(w, http.StatusBadRequest, "Content-Encoding %q: send identity or gzip", r.Header.Get("Content-Encoding"))
		return
	}
	var written []writtenEntry
	put := func(name string, data io.Reader) bool {
		p, e := workspacePath("path", name)
		if e != nil {
			restError(w, restStatus(e), "%s", e.Message)
			return false
		}
		if p == "." {
			restError(w, http.StatusBadRequest, "path '%s' is the workspace directory, not a file", name)
			return false
		}
		req := httptest.NewRequestWithContext(r.Context(), http.MethodPut, "/v1/sandboxes/"+url.PathEscape(c.b.id)+"/files?path="+url.QueryEscape(p), data)
		req.Header.Set("Content-Type", "application/octet-stream")
		rec := httptest.NewRecorder()
		c.h.cfg.API.ServeAs(c.key, rec, req)
		if rec.Code != http.StatusCreated {
			status := rec.Code
			if status == http.StatusNotFound {
				status = http.StatusBadRequest
			}
			restError(w, status, "write '%s': %s", name, moatMessage(rec.Body.Bytes()))
			return false
		}
		written = append(written, writtenEntry{Name: path.Base(e2bPath(p)), Type: "file", Path: e2bPath(p)})
		return true
	}
	switch ct {
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		parts := 0
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				restError(w, http.StatusBadRequest, "read multipart body: %v", err)
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			parts++
			// Not part.FileName(): it keeps only the base name, and the
			// SDKs name each part by its path.
			_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			name := dp["filename"]
			if qpath != "" && (name == "" || parts == 1) {
				name = qpath
			}
			if name == "" {
				restError(w, http.StatusBadRequest, "a file part has no file name and there is no ?path=")
				return
			}
			ok := put(name, part)
			part.Close()
			if !ok {
				return
			}
		}
		if parts == 0 {
			restError(w, http.StatusBadRequest, "the multipart body has no \"file\" part")
			return
		}
	case "application/octet-stream", "":
		if qpath == "" {
			restError(w, http.StatusBadRequest, "path is missing: give ?path= the file's path")
			return
		}
		if !put(qpath, body) {
			return
		}
	default:
		restError(w, http.StatusBadRequest, "Content-Type %q: send multipart/form-data or application/octet-stream", ct)
		return
	}
	writeJSON(w, http.StatusOK, written)
}
