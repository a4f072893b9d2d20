package server

import (
	_ "embed"
	"net/http"
	"strconv"
)

// openAPIDoc is the API's OpenAPI document, served as it is in the tree
// (server/openapi_test.go checks it against the routes and types).
//
//go:embed openapi.yaml
var openAPIDoc []byte

// openAPI serves the OpenAPI document. It is public, as the health check
// is: it describes the API, which is open source, and tells nothing of
// this server's keys, sandboxes or activity; code generators and API
// explorers fetch it without a key.
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) error {
	// application/yaml is YAML's registered media type (RFC 9512).
	w.Header().Set("Content-Type", "application/yaml; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Length", strconv.Itoa(len(openAPIDoc)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(openAPIDoc)
	}
	return nil
}
