package e2b

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/moat-sandbox/moat/server/e2b/envdpb/filesystem"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/moat-sandbox/moat/service"
)

// filesystem.Filesystem and REST /files over the sandbox's workspace. The
// session resolves every path beneath /workspace without following links.

type filesystemService struct{}

var _ filesystemconnect.FilesystemHandler = filesystemService{}

func entryOf(fi service.FileInfo) *pb.EntryInfo {
	mode, _ := strconv.ParseUint(fi.Mode, 8, 32)
	e := &pb.EntryInfo{Name: fi.Name, Path: e2bPath(fi.Path), Size: fi.Size, Mode: uint32(mode),
		Permissions: fs.FileMode(mode).String(), Owner: "user", Group: "user", ModifiedTime: timestamppb.New(fi.ModTime), Metadata: fi.Metadata}
	switch fi.Type {
	case "file":
		e.Type = pb.FileType_FILE_TYPE_FILE
	case "dir":
		e.Type = pb.FileType_FILE_TYPE_DIRECTORY
		e.Permissions = "d" + e.Permissions[1:]
	case "symlink":
		e.Type = pb.FileType_FILE_TYPE_SYMLINK
		t := fi.Target
		e.SymlinkTarget = &t
	}
	return e
}

// fsError maps the service's error about path p onto a Connect error in
// envd's words. The session's cause (a *service.Error wraps it) decides:
// a missing or existing path, a destroyed sandbox; the rest is an invalid
// argument with the service's message, or the cause's.
func fsError(err error, p string) *connect.Error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return rpcErr(connect.CodeNotFound, "path '%s' does not exist", p)
	case errors.Is(err, fs.ErrExist):
		return rpcErr(connect.CodeAlreadyExists, "path '%s' already exists", p)
	case errors.Is(err, service.ErrSessionClosed):
		return rpcErr(connect.CodeUnavailable, "the sandbox was destroyed")
	}
	var se *service.Error
	if errors.As(err, &se) {
		switch {
		case se.Kind == service.NotFound:
			return rpcErr(connect.CodeNotFound, "path '%s' does not exist", p)
		case se.Err != nil:
			err = se.Err
		default:
			return rpcErr(kindOf(se).code, "%s", se.Message)
		}
	}
	return rpcErr(connect.CodeInvalidArgument, "%s: %v", p, err)
}

func (filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	c := callOf(ctx)
	p, e := workspacePath("path", req.Msg.GetPath())
	if e != nil {
		return nil, e
	}
	fi, err := c.svc.Stat(ctx, c.key, c.b.id, p)
	if err != nil {
		return nil, fsError(err, req.Msg.GetPath())
	}
	return connect.NewResponse(&pb.StatResponse{Entry: entryOf(fi)}), nil
}

func (filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	c, shown := callOf(ctx), req.Msg.GetPath()
	p, e := workspacePath("path", shown)
	if e != nil {
		return nil, e
	}
	if p == "." {
		return nil, rpcErr(connect.CodeAlreadyExists, "directory '%s' already exists", shown)
	}
	if _, err := c.svc.Stat(ctx, c.key, c.b.id, p); err == nil {
		return nil, rpcErr(connect.CodeAlreadyExists, "directory '%s' already exists", shown)
	}
	if err := c.svc.MakeDir(ctx, c.key, c.b.id, p); err != nil {
		return nil, fsError(err, shown)
	}
	fi, err := c.svc.Stat(ctx, c.key, c.b.id, p)
	if err != nil {
		return nil, fsError(err, shown)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: entryOf(fi)}), nil
}

func (filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	c := callOf(ctx)
	from, e := workspacePath("source", req.Msg.GetSource())
	if e != nil {
		return nil, e
	}
	to, e := workspacePath("destination", req.Msg.GetDestination())
	if e != nil {
		return nil, e
	}
	if from == "." || to == "." {
		return nil, rpcErr(connect.CodeInvalidArgument, "the workspace itself cannot be moved or replaced")
	}
	if err := c.svc.Rename(ctx, c.key, c.b.id, from, to); err != nil {
		return nil, fsError(err, req.Msg.GetSource())
	}
	fi, err := c.svc.Stat(ctx, c.key, c.b.id, to)
	if err != nil {
		return nil, fsError(err, req.Msg.GetDestination())
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: entryOf(fi)}), nil
}

func (filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	c := callOf(ctx)
	p, e := workspacePath("path", req.Msg.GetPath())
	if e != nil {
		return nil, e
	}
	out := &pb.ListDirResponse{Entries: []*pb.EntryInfo{}}
	if e := c.listDir(ctx, p, req.Msg.GetPath(), max(int(req.Msg.GetDepth()), 1), &out.Entries); e != nil {
		return nil, e
	}
	return connect.NewResponse(out), nil
}

func (filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	c := callOf(ctx)
	p, e := workspacePath("path", req.Msg.GetPath())
	if e != nil {
		return nil, e
	}
	if p == "." {
		return nil, rpcErr(connect.CodePermissionDenied, "the workspace itself cannot be removed")
	}
	// E2B's envd removes with os.RemoveAll: a missing path is removed
	// already, and the SDK's files.remove resolves. Only the file being
	// absent is: a sandbox that is gone is still an error.
	if err := c.svc.Remove(ctx, c.key, c.b.id, p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fsError(err, req.Msg.GetPath())
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

// maxListed bounds a recursive listing.
const maxListed = 10000

func (c *envdCall) listDir(ctx context.Context, p, shown string, depth int, out *[]*pb.EntryInfo) *connect.Error {
	fi, err := c.svc.Stat(ctx, c.key, c.b.id, p)
	if err != nil {
		return fsError(err, shown)
	}
	if fi.Type != "dir" {
		return rpcErr(connect.CodeInvalidArgument, "path '%s' is not a directory", shown)
	}
	list, err := c.svc.ListDir(ctx, c.key, c.b.id, p)
	if err != nil {
		return fsError(err, shown)
	}
	for _, f := range list {
		if len(*out) >= maxListed {
			return rpcErr(connect.CodeResourceExhausted, "more than %d entries under '%s'; list with a smaller depth", maxListed, shown)
		}
		*out = append(*out, entryOf(f))
		if f.Type == "dir" && depth > 1 {
			if e := c.listDir(ctx, f.Path, e2bPath(f.Path), depth-1, out); e != nil {
				return e
			}
		}
	}
	return nil
}

// watchState is what a watched entry looked like; entry is how it was
// described (for includeEntry), not compared.
type watchState struct {
	typ   pb.FileType
	size  int64
	mod   time.Time
	entry *pb.EntryInfo
}

// same reports whether a and b look alike (a file unchanged).
func (a watchState) same(b watchState) bool {
	return a.typ == b.typ && a.size == b.size && a.mod.Equal(b.mod)
}

// watchTarget is a watched directory: its workspace path, as the caller
// named it, how deep it is watched, and whether events carry the entry.
type watchTarget struct {
	path, shown  string
	depth        int
	includeEntry bool
}

func newWatchTarget(path string, recursive, includeEntry bool) (watchTarget, *connect.Error) {
	p, e := workspacePath("path", path)
	if e != nil {
		return watchTarget{}, e
	}
	w := watchTarget{path: p, shown: path, depth: 1, includeEntry: includeEntry}
	if recursive {
		w.depth = 32
	}
	return w, nil
}

func (c *envdCall) snapshot(ctx context.Context, w watchTarget) (map[string]watchState, *connect.Error) {
	var list []*pb.EntryInfo
	if e := c.listDir(ctx, w.path, w.shown, w.depth, &list); e != nil {
		return nil, e
	}
	m := make(map[string]watchState, len(list))
	for _, en := range list {
		m[en.Path] = watchState{en.Type, en.Size, en.ModifiedTime.AsTime(), en}
	}
	return m, nil
}

// changes lists what differs between two snapshots of w, in path order:
// created, written (a file's size or time changed), removed. A file that
// appears with content is created and then written, as inotify reports
// it to E2B's envd (IN_CREATE, then IN_MODIFY). With w.includeEntry a
// create or write carries the entry as it is now, a remove as it was
// last seen.
func changes(w watchTarget, prev, cur map[string]watchState) []*pb.FilesystemEvent {
	base := e2bPath(w.path)
	ev := func(p string, typ pb.EventType, st watchState) *pb.FilesystemEvent {
		e := &pb.FilesystemEvent{Name: strings.TrimPrefix(strings.TrimPrefix(p, base), "/"), Type: typ}
		if w.includeEntry {
			e.Entry = st.entry
		}
		return e
	}
	paths := make([]string, 0, len(cur)+len(prev))
	for p := range cur {
		paths = append(paths, p)
	}
	for p := range prev {
		if _, ok := cur[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	var out []*pb.FilesystemEvent
	for _, p := range paths {
		old, had := prev[p]
		now, has := cur[p]
		isFile := now.typ == pb.FileType_FILE_TYPE_FILE
		switch {
		case !has:
			out = append(out, ev(p, pb.EventType_EVENT_TYPE_REMOVE, old))
		case !had:
			out = append(out, ev(p, pb.EventType_EVENT_TYPE_CREATE, now))
			if isFile && now.size > 0 {
				out = append(out, ev(p, pb.EventType_EVENT_TYPE_WRITE, now))
			}
		case !old.same(now) && isFile:
			out = append(out, ev(p, pb.EventType_EVENT_TYPE_WRITE, now))
		}
	}
	return out
}

// WatchDir polls the directory (the session's files live on the host
// side, where no inotify of the guest reaches) and reports what changed
// between two looks, every 100 ms.
func (filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], st *connect.ServerStream[pb.WatchDirResponse]) error {
	c := callOf(ctx)
	w, e := newWatchTarget(req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if e != nil {
		return e
	}
	prev, e := c.snapshot(ctx, w)
	if e != nil {
		return e
	}
	if err := st.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	keep := time.NewTicker(30 * time.Second)
	defer keep.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-keep.C:
			if err := st.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-tick.C:
			cur, e := c.snapshot(ctx, w)
			if e != nil {
				return e
			}
			for _, ev := range changes(w, prev, cur) {
				if err := st.Send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
					return err
				}
			}
			prev = cur
		}
	}
}

// maxWatchers bounds the polling watchers of one sandbox.
const maxWatchers = 16

// pollWatcher is a watcher of CreateWatcher: the changes since the last
// GetWatcherEvents.
type pollWatcher struct {
	target watchTarget
	prev   map[string]watchState
}

func (filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[pb.CreateWatcherRequest]) (*connect.Response[pb.CreateWatcherResponse], error) {
	c := callOf(ctx)
	w, e := newWatchTarget(req.Msg.GetPath(), req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if e != nil {
		return nil, e
	}
	prev, e := c.snapshot(ctx, w)
	if e != nil {
		return nil, e
	}
	id := newToken()[:16]
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if len(c.b.watchers) >= maxWatchers {
		return nil, rpcErr(connect.CodeResourceExhausted, "this sandbox has %d watchers, the limit; remove one with RemoveWatcher", maxWatchers)
	}
	c.b.watchers[id] = &pollWatcher{target: w, prev: prev}
	return connect.NewResponse(&pb.CreateWatcherResponse{WatcherId: id}), nil
}

func (filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[pb.GetWatcherEventsRequest]) (*connect.Response[pb.GetWatcherEventsResponse], error) {
	c := callOf(ctx)
	c.b.mu.Lock()
	w := c.b.watchers[req.Msg.GetWatcherId()]
	c.b.mu.Unlock()
	if w == nil {
		return nil, rpcErr(connect.CodeNotFound, "watcher %q not found", req.Msg.GetWatcherId())
	}
	cur, e := c.snapshot(ctx, w.target)
	if e != nil {
		return nil, e
	}
	c.b.mu.Lock()
	prev := w.prev
	w.prev = cur
	c.b.mu.Unlock()
	out := &pb.GetWatcherEventsResponse{Events: changes(w.target, prev, cur)}
	if out.Events == nil {
		out.Events = []*pb.FilesystemEvent{}
	}
	return connect.NewResponse(out), nil
}

func (filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[pb.RemoveWatcherRequest]) (*connect.Response[pb.RemoveWatcherResponse], error) {
	c := callOf(ctx)
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	if _, ok := c.b.watchers[req.Msg.GetWatcherId()]; !ok {
		return nil, rpcErr(connect.CodeNotFound, "watcher %q not found", req.Msg.GetWatcherId())
	}
	delete(c.b.watchers, req.Msg.GetWatcherId())
	return connect.NewResponse(&pb.RemoveWatcherResponse{}), nil
}

// restError answers /files in envd's REST form.
func restError(w http.ResponseWriter, status int, format string, a ...any) {
	writeJSON(w, status, apiError{status, fmt.Sprintf(format, a...)})
}

func restStatus(e *connect.Error) int {
	switch e.Code() {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
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
		restError(w, restStatus(e), "%s", e.Message())
		return
	}
	fi, err := c.svc.Stat(r.Context(), c.key, c.b.id, p)
	if err != nil {
		e := fsError(err, r.URL.Query().Get("path"))
		restError(w, restStatus(e), "%s", e.Message())
		return
	}
	if fi.Type != "file" {
		restError(w, http.StatusBadRequest, "path '%s' is a %s, not a file", r.URL.Query().Get("path"), fi.Type)
		return
	}
	f, info, err := c.svc.OpenFile(r.Context(), c.key, c.b.id, p)
	if err != nil {
		e := fsError(err, r.URL.Query().Get("path"))
		restError(w, restStatus(e), "%s", e.Message())
		return
	}
	defer f.Close()
	h := w.Header()
	// Whatever the sandbox wrote is served as opaque bytes, as Moat's own
	// API serves it.
	h.Set("Content-Type", "application/octet-stream")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": info.Name}))
	h.Set("X-Moat-File-Mode", info.Mode)
	var out http.ResponseWriter = w
	if r.Header.Get("Range") == "" && acceptsGzip(r) {
		h.Set("Content-Encoding", "gzip")
		h.Add("Vary", "Accept-Encoding")
		gz := gzip.NewWriter(w)
		defer gz.Close()
		out = &gzipWriter{ResponseWriter: w, gz: gz}
	}
	// Range, If-Range, If-None-Match and If-Modified-Since are honoured.
	http.ServeContent(out, r, "", info.ModTime, f)
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
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader prefixes the headers that carry a written file's
// metadata (the SDK's write option metadata, envd 0.6.2).
const metadataHeader = "X-Metadata-"

// uploadMetadata reads the metadata of an upload from its X-Metadata-*
// headers. HTTP does not keep a header name's case (Go canonicalises it,
// HTTP/2 lowercases it), so keys are lowercased: the one spelling every
// transport agrees on.
func uploadMetadata(h http.Header) (map[string]string, *apiError) {
	var md map[string]string
	for name, vals := range h {
		if len(name) <= len(metadataHeader) || !strings.EqualFold(name[:len(metadataHeader)], metadataHeader) {
			continue
		}
		k := strings.ToLower(name[len(metadataHeader):])
		if len(vals) != 1 {
			return nil, &apiError{http.StatusBadRequest, fmt.Sprintf("metadata key %q is given %d times; give each key once", truncate(k, 64), len(vals))}
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = vals[0]
	}
	if e := service.CheckFileMetadata(md); e != nil {
		return nil, &apiError{http.StatusBadRequest, e.Message}
	}
	return md, nil
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
	md, me := uploadMetadata(r.Header)
	if me != nil {
		restError(w, me.Code, "%s", me.Message)
		return
	}
	var written []writtenEntry
	put := func(name string, data io.Reader) bool {
		p, e := workspacePath("path", name)
		if e != nil {
			restError(w, restStatus(e), "%s", e.Message())
			return false
		}
		if p == "." {
			restError(w, http.StatusBadRequest, "path '%s' is the workspace directory, not a file", name)
			return false
		}
		if sp := c.signedPath; sp != nil && *sp != "" {
			// A signed upload URL grants its one path, not the other
			// parts' names.
			if signed, _ := workspacePath("path", *sp); signed != p {
				restError(w, http.StatusForbidden, "the signed URL allows writing '%s' only, not '%s'", *sp, name)
				return false
			}
		}
		// Each file is bounded as one upload to Moat's API is.
		limit := c.h.cfg.MaxBodyBytes
		if _, err := c.svc.WriteFile(r.Context(), c.key, c.b.id, p, http.MaxBytesReader(w, io.NopCloser(data), limit), 0o644); err != nil {
			status := kindOf(err).status
			msg := err.Error()
			var se *service.Error
			if errors.As(err, &se) {
				msg = se.Message
			}
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				status, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over the %d-byte limit (--max-body)", limit)
			}
			if status == http.StatusNotFound {
				status = http.StatusBadRequest
			}
			restError(w, status, "write '%s': %s", name, msg)
			return false
		}
		entry := writtenEntry{Name: path.Base(e2bPath(p)), Type: "file", Path: e2bPath(p)}
		if len(md) > 0 {
			fi, err := c.svc.SetMetadata(r.Context(), c.key, c.b.id, p, md)
			if err != nil {
				e := fsError(err, name)
				restError(w, restStatus(e), "set metadata of '%s': %s", name, e.Message())
				return false
			}
			entry.Metadata = fi.Metadata
		}
		written = append(written, entry)
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
