package server

import (
	"net/http"

	"github.com/moat-sandbox/moat/service"
)

// The sandbox routes: decode, call the service, encode.

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	if e := requireJSON(r); e != nil {
		return e
	}
	data, e := readBody(w, r, s.cfg.MaxBodyBytes)
	if e != nil {
		return e
	}
	spec, e := decodeSandbox(data, s.cfg.MaxFiles, s.cfg.DefaultTTL, s.cfg.MaxTTL)
	if e != nil {
		return e
	}
	sb, err := s.svc.CreateSandbox(r.Context(), keyOf(r), service.SandboxArgs{
		Manifest: spec.manifest, TTL: spec.ttl, Files: engineFiles(spec.files), Metadata: spec.metadata,
	})
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusCreated, sb)
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	list, err := s.svc.ListSandboxes(r.Context(), keyOf(r))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, SandboxList{Sandboxes: list})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.svc.GetSandbox(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	sb, err := s.svc.DeleteSandbox(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	key, id := keyOf(r), r.PathValue("id")
	// An unknown sandbox is answered before the body is read.
	if _, err := s.svc.GetSandbox(r.Context(), key, id); err != nil {
		return err
	}
	var req TimeoutRequest
	if e := readJSON(w, r, s.cfg.MaxBodyBytes, &req); e != nil {
		return e
	}
	if req.TTL == "" {
		return invalid("ttl", "is missing; give a duration such as \"5m\"")
	}
	ttl, e := parseTTL(req.TTL, s.cfg.MaxTTL)
	if e != nil {
		return e
	}
	sb, err := s.svc.SetTimeout(r.Context(), key, id, ttl)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, sb)
}
