package server

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/service"
)

// The code interpreter's routes: decode, call the service, encode; a
// cell's events are framed here as Server-Sent Events.

// decodeCell reads a CellRequest, checked against the sandbox's manifest.
func decodeCell(data []byte, m *manifest.Manifest) (service.CellArgs, *Error) {
	var req CellRequest
	if e := decodeStrict(data, &req); e != nil {
		return service.CellArgs{}, e
	}
	args := service.CellArgs{Code: req.Code, Language: req.Language, Context: req.Context}
	if req.Timeout != "" {
		d, err := time.ParseDuration(req.Timeout)
		if err != nil {
			return args, invalid("timeout", "%s is not a duration such as \"30s\"", quote(req.Timeout))
		}
		if d <= 0 {
			return args, invalid("timeout", "%s is not positive", quote(req.Timeout))
		}
		args.Timeout = d
	}
	if e := service.CheckCell(&args, m.Resources.Timeout.D()); e != nil {
		return args, httpError(e)
	}
	return args, nil
}

func (s *Server) runCell(w http.ResponseWriter, r *http.Request) error {
	key, id := keyOf(r), r.PathValue("id")
	m, data, err := s.sandboxJSON(w, r)
	if err != nil {
		return err
	}
	args, e := decodeCell(data, m)
	if e != nil {
		return e
	}
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		cell, err := s.svc.RunCell(r.Context(), key, id, args)
		if err != nil {
			if errors.Is(err, r.Context().Err()) {
				return nil // the client left; the cell goes on
			}
			return err
		}
		return writeJSON(w, http.StatusOK, cell)
	}
	feed, err := s.svc.StartCell(r.Context(), key, id, args)
	if err != nil {
		return err
	}
	return s.cellEvents(w, r, feed)
}

// cellEvents streams a cell's outputs as events named by their type
// (stdout, stderr, result, display, error), then "end" with the Cell.
func (s *Server) cellEvents(w http.ResponseWriter, r *http.Request, feed *service.CellFeed) error {
	s.streams.Add(1)
	defer s.streams.Add(-1)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	defer rc.SetWriteDeadline(time.Time{})
	var buf bytes.Buffer
	flush := func() bool {
		rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil {
			return false
		}
		buf.Reset()
		return rc.Flush() == nil
	}
	keepalive := time.NewTicker(keepaliveEvery)
	defer keepalive.Stop()
	buf.WriteString(": moat cell stream\n\n")
	after := 0
	for {
		evs, notify := feed.Read(after)
		ended := false
		for _, ev := range evs {
			if ev.Cell != nil {
				writeEvent(&buf, ev.ID, "end", ev.Cell)
				ended = true
				continue
			}
			writeEvent(&buf, ev.ID, ev.Output.Type, ev.Output)
			after = ev.ID
		}
		if !flush() || ended {
			return nil
		}
		select {
		case <-notify:
		case <-keepalive.C:
			buf.WriteString(": keepalive\n\n")
		case <-r.Context().Done():
			return nil
		case <-s.svc.Stopped():
			return nil
		}
	}
}

func (s *Server) getKernel(w http.ResponseWriter, r *http.Request) error {
	k, err := s.svc.GetKernel(r.Context(), keyOf(r), r.PathValue("id"), r.URL.Query().Get("context"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

func (s *Server) interruptKernel(w http.ResponseWriter, r *http.Request) error {
	k, err := s.svc.InterruptKernel(r.Context(), keyOf(r), r.PathValue("id"), r.URL.Query().Get("context"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

func (s *Server) restartKernel(w http.ResponseWriter, r *http.Request) error {
	k, err := s.svc.RestartKernel(r.Context(), keyOf(r), r.PathValue("id"), r.URL.Query().Get("context"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, k)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) error {
	k, err := s.svc.CreateContext(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, k)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) error {
	list, err := s.svc.ListContexts(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, ContextList{Contexts: list})
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) error {
	if err := s.svc.DeleteContext(r.Context(), keyOf(r), r.PathValue("id"), r.PathValue("cid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
