package server

import (
	"net/http"
	"net/http/pprof"
)

// pprofRoutes serves the Go profiler on the admin side only (issue 15): every route needs an
// admin key, a tenant key gets 403 forbidden and no key 401, like any admin call.
//
//	GET /debug/pprof/                  the profile index (HTML)
//	GET /debug/pprof/{profile}         heap, goroutine, allocs, block, mutex, threadcreate
//	GET /debug/pprof/profile?seconds=  CPU profile (default 30 s)
//	GET /debug/pprof/trace?seconds=    execution trace
//	GET /debug/pprof/cmdline, GET|POST /debug/pprof/symbol
//
// A CPU profile or trace longer than the http.Server's WriteTimeout is refused by pprof
// itself; ask for fewer seconds.
func (s *Server) pprofRoutes(mux *routeMux, admin func(apiFunc) http.HandlerFunc) {
	serve := func(h http.HandlerFunc) http.HandlerFunc {
		return admin(func(w http.ResponseWriter, r *http.Request, _ principal) error {
			h(w, r)
			return nil
		})
	}
	mux.HandleFunc("GET /debug/pprof/", serve(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/cmdline", serve(pprof.Cmdline))
	mux.HandleFunc("GET /debug/pprof/profile", serve(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/symbol", serve(pprof.Symbol))
	mux.HandleFunc("POST /debug/pprof/symbol", serve(pprof.Symbol))
	mux.HandleFunc("GET /debug/pprof/trace", serve(pprof.Trace))
}
