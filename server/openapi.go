package server

import (
	"net/http"

	"github.com/berth-dev/berth/api"
)

// routeMux is the server's http.ServeMux that also remembers every pattern registered on it,
// in order, so a test can hold the routes against the OpenAPI document (issue 17: a route
// added without the document fails server/openapi_test.go). It changes no route's behaviour.
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func newRouteMux() *routeMux { return &routeMux{ServeMux: http.NewServeMux()} }

// HandleFunc registers h for pattern (http.ServeMux syntax) and records the pattern.
func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.HandleFunc(pattern, h)
}

// Handle registers h for pattern (http.ServeMux syntax) and records the pattern.
func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

// serveOpenAPI is GET /v1/openapi.yaml (no key): the OpenAPI 3.1 document of this API as
// built into the binary (api/openapi.yaml), application/yaml.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", api.ContentType)
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(api.OpenAPI)
}
