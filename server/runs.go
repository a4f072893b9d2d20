package server

import (
	"bytes"
	"net/http"

	"github.com/moat-sandbox/moat/service"
)

// createRun serves POST /v1/runs: one program in a fresh sandbox, answered
// with its result. A client that goes away cancels its run: nobody could
// learn its id.
func (s *Server) createRun(w http.ResponseWriter, r *http.Request) error {
	spec, e := readRun(w, r, s.cfg.MaxBodyBytes, s.cfg.MaxFiles)
	if e != nil {
		return e
	}
	args := service.RunArgs{Manifest: spec.manifest, Argv: spec.argv, Files: engineFiles(spec.files)}
	if len(spec.stdin) > 0 {
		args.Stdin = bytes.NewReader(spec.stdin)
	}
	resp, err := s.svc.Run(r.Context(), keyOf(r), args)
	if held, werr := writeHeld(w, err); held {
		return werr
	}
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, resp)
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) error {
	resp, err := s.svc.GetRun(r.Context(), keyOf(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, resp)
}
