package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/moat-sandbox/moat/incident"
)

// The incident routes: the evidence bundles the engine keeps of flagged
// runs (package incident), for admin keys only: a bundle holds another
// key's commands, output and workspace files.

// IncidentStore is the store of incident bundles (*incident.Store).
type IncidentStore interface {
	List() ([]incident.Summary, error)
	Get(id string) (incident.Summary, error)
	Keep(ev *incident.Evidence) (incident.Summary, error)
}

// IncidentList is GET /v1/incidents: newest first.
type IncidentList struct {
	// Kept is false when the server keeps no bundles (--no-incidents).
	Kept      bool               `json:"kept"`
	Incidents []incident.Summary `json:"incidents"`
}

func (s *Server) adminOnly(r *http.Request, what string) error {
	if k := keyOf(r); !k.Admin {
		return forbidden("%s shows every key's flagged runs and needs an admin key; key %s is a tenant's (moat keys create --admin)", what, k.ID)
	}
	return nil
}

func (s *Server) listIncidents(w http.ResponseWriter, r *http.Request) error {
	if err := s.adminOnly(r, "GET /v1/incidents"); err != nil {
		return err
	}
	if s.cfg.Incidents == nil {
		return writeJSON(w, http.StatusOK, IncidentList{Incidents: []incident.Summary{}})
	}
	list, err := s.cfg.Incidents.List()
	if err != nil {
		return internal(err)
	}
	return writeJSON(w, http.StatusOK, IncidentList{Kept: true, Incidents: list})
}

func (s *Server) getIncident(w http.ResponseWriter, r *http.Request) error {
	if err := s.adminOnly(r, "GET /v1/incidents/{id}"); err != nil {
		return err
	}
	id := r.PathValue("id")
	if s.cfg.Incidents == nil {
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no incident %q: this server keeps no incident bundles (--no-incidents)", id)}
	}
	sum, err := s.cfg.Incidents.Get(id)
	if errors.Is(err, incident.ErrNotFound) {
		return &Error{Status: http.StatusNotFound, Code: CodeNotFound, Message: err.Error()}
	}
	if err != nil {
		return internal(err)
	}
	return writeJSON(w, http.StatusOK, sum)
}
