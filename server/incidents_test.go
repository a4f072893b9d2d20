package server

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/incident"
	"github.com/moat-sandbox/moat/internal/strictjson"
)

// incidentsFake is an in-memory IncidentStore.
type incidentsFake struct{ list []incident.Summary }

func (f *incidentsFake) List() ([]incident.Summary, error) { return f.list, nil }
func (f *incidentsFake) Keep(ev *incident.Evidence) (incident.Summary, error) {
	return incident.Summary{}, errors.New("incidentsFake keeps nothing")
}
func (f *incidentsFake) Get(id string) (incident.Summary, error) {
	if err := incident.CheckID(id); err != nil {
		return incident.Summary{}, err
	}
	for _, s := range f.list {
		if s.ID == id {
			return s, nil
		}
	}
	return incident.Summary{}, fmt.Errorf("%w: %s", incident.ErrNotFound, id)
}

func TestIncidentRoutes(t *testing.T) {
	const id = "20261204T212400Z-0a1b2c3d"
	store := &incidentsFake{list: []incident.Summary{{ID: id, Time: time.Now().UTC(), RunID: "r1", Key: "ka", Reasons: []string{"canary"}, Tier: "native",
		Commands: [][]string{{"sh"}}, Files: []string{"summary.json"}}}}
	withStore := newEnv(t, func(c *Config) { c.Incidents = store })
	without := newEnv(t, nil)
	tests := []struct {
		name      string
		e         *env
		token     string
		path      string
		want      int
		wantCode  string
		wantKept  bool
		wantCount int
	}{
		{"tenant may not list", withStore, tokenA, "/v1/incidents", http.StatusForbidden, CodeForbidden, false, 0},
		{"tenant may not read", withStore, tokenA, "/v1/incidents/" + id, http.StatusForbidden, CodeForbidden, false, 0},
		{"no key", withStore, "", "/v1/incidents", http.StatusUnauthorized, CodeUnauthenticated, false, 0},
		{"admin lists", withStore, tokenAdmin, "/v1/incidents", http.StatusOK, "", true, 1},
		{"admin reads", withStore, tokenAdmin, "/v1/incidents/" + id, http.StatusOK, "", false, 0},
		{"unknown id", withStore, tokenAdmin, "/v1/incidents/20261204T212400Z-ffffffff", http.StatusNotFound, CodeNotFound, false, 0},
		{"not an id", withStore, tokenAdmin, "/v1/incidents/..%2f..%2fetc", http.StatusNotFound, CodeNotFound, false, 0},
		{"no store: empty list", without, tokenAdmin, "/v1/incidents", http.StatusOK, "", false, 0},
		{"no store: 404", without, tokenAdmin, "/v1/incidents/" + id, http.StatusNotFound, CodeNotFound, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.e.do(req{method: "GET", path: tc.path, token: tc.token})
			if r.StatusCode != tc.want {
				t.Fatalf("GET %s: %d %s, want %d", tc.path, r.StatusCode, r.body, tc.want)
			}
			switch {
			case tc.wantCode != "":
				if got := r.errBody(t).Code; got != tc.wantCode {
					t.Errorf("code %q, want %q", got, tc.wantCode)
				}
			case tc.path == "/v1/incidents":
				var l IncidentList
				r.decode(t, &l)
				if l.Kept != tc.wantKept || len(l.Incidents) != tc.wantCount || l.Incidents == nil {
					t.Errorf("list %+v, want kept %v and %d", l, tc.wantKept, tc.wantCount)
				}
			default:
				var s incident.Summary
				r.decode(t, &s)
				if s.ID != id || s.RunID != "r1" {
					t.Errorf("summary %+v", s)
				}
			}
		})
	}
}

// TestOpenAPIIncident: the inline schema of GET /v1/incidents/{id} lists
// exactly incident.Summary's JSON fields.
func TestOpenAPIIncident(t *testing.T) {
	raw, err := yaml.Marshal(loadOpenAPI(t).Paths["/v1/incidents/{id}"]["get"])
	if err != nil {
		t.Fatal(err)
	}
	var op struct {
		Responses map[string]struct {
			Content map[string]struct {
				Schema apiSchema `yaml:"schema"`
			} `yaml:"content"`
		} `yaml:"responses"`
	}
	if err := yaml.Unmarshal(raw, &op); err != nil {
		t.Fatal(err)
	}
	s := op.Responses["200"].Content["application/json"].Schema
	fields, _ := strictjson.Fields(reflect.TypeFor[incident.Summary]())
	var want, got []string
	for f := range fields {
		want = append(want, f)
	}
	for p := range s.Properties {
		got = append(got, p)
	}
	sort.Strings(want)
	sort.Strings(got)
	if !slices.Equal(want, got) {
		t.Errorf("GET /v1/incidents/{id} documents %v; incident.Summary has %v", got, want)
	}
}
