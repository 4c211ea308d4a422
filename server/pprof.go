package server

import (
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync"

	"github.com/berth-dev/berth"
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
// A CPU profile or trace is at most maxProfileSeconds (400 invalid_request beyond: the
// listener has no WriteTimeout for pprof to check, so a trace?seconds=1e9 streamed until the
// request's write deadline cut it, found by an attack), and one runs at a time (409 conflict
// for a second, instead of pprof's plain-text 500).
func (s *Server) pprofRoutes(mux *routeMux, admin func(apiFunc) http.HandlerFunc) {
	serve := func(h http.HandlerFunc) http.HandlerFunc {
		return admin(func(w http.ResponseWriter, r *http.Request, _ principal) error {
			h(w, r)
			return nil
		})
	}
	var running sync.Mutex // one CPU profile or trace at a time
	timed := func(h http.HandlerFunc) http.HandlerFunc {
		return admin(func(w http.ResponseWriter, r *http.Request, _ principal) error {
			if v := r.URL.Query().Get("seconds"); v != "" {
				// Whole seconds: pprof's CPU profile reads anything else as its default 30.
				if n, err := strconv.Atoi(v); err != nil || n < 1 || n > maxProfileSeconds {
					return berth.Errorf(berth.EInvalidRequest, "seconds must be a whole number from 1 to %d", maxProfileSeconds)
				}
			}
			if !running.TryLock() {
				return berth.Errorf(berth.EConflict, "a CPU profile or trace is already running on this replica")
			}
			defer running.Unlock()
			h(w, r)
			return nil
		})
	}
	mux.HandleFunc("GET /debug/pprof/", serve(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/cmdline", serve(pprof.Cmdline))
	mux.HandleFunc("GET /debug/pprof/profile", timed(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/symbol", serve(pprof.Symbol))
	mux.HandleFunc("POST /debug/pprof/symbol", serve(pprof.Symbol))
	mux.HandleFunc("GET /debug/pprof/trace", timed(pprof.Trace))
}

// maxProfileSeconds bounds a CPU profile's or trace's ?seconds= (pprof's default is 30).
const maxProfileSeconds = 120
