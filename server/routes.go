package server

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Body limits: JSON requests 1 MiB, heartbeats 8 MiB (they list every held sandbox),
// files 64 MiB.
const (
	maxJSONBytes      = berth.MaxJSONBodyBytes
	maxHeartbeatBytes = 8 << 20
	maxFileBytes      = 64 << 20
)

type ctxKey int

const requestIDKey ctxKey = 0

// apiFunc is a handler that returns its error; api() writes it as an API-2 body.
type apiFunc func(w http.ResponseWriter, r *http.Request, p principal) error

func (s *Server) routes() http.Handler {
	h, _ := s.routeTable()
	return h
}

// routeTable builds the server's handler and returns it with every pattern registered on its
// mux, in order (routeMux; server/openapi_test.go holds them against api/openapi.yaml).
func (s *Server) routeTable() (http.Handler, []string) {
	mux := newRouteMux()
	tenant := func(f apiFunc) http.HandlerFunc { return s.api(f, false) }
	admin := func(f apiFunc) http.HandlerFunc { return s.api(f, true) }

	mux.HandleFunc("POST /v1/sandboxes", tenant(s.createSandbox))
	mux.HandleFunc("GET /v1/sandboxes", tenant(s.listSandboxes))
	mux.HandleFunc("GET /v1/sandboxes/{id}", tenant(s.getSandbox))
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", tenant(s.deleteSandbox))
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", tenant(s.execSandbox))
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", tenant(s.pauseSandbox))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", tenant(s.resumeSandbox))
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", tenant(s.writeFile))
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", tenant(s.readFile))

	mux.HandleFunc("GET /v1/templates", tenant(s.listTemplates))
	mux.HandleFunc("PUT /v1/templates/{name}", admin(s.putTemplate))
	mux.HandleFunc("GET /v1/agents", admin(s.listAgents))
	mux.HandleFunc("POST /v1/agents/{id}/drain", admin(s.drainAgent))
	mux.HandleFunc("POST /v1/agents/{id}/undrain", admin(s.undrainAgent))
	mux.HandleFunc("GET /v1/agents/{id}/drain", admin(s.drainStatus))
	mux.HandleFunc("POST /v1/agents/heartbeat", s.heartbeat)
	mux.HandleFunc("POST /v1/agents/join", s.joinAgent)
	mux.HandleFunc("GET /v1/agents/credentials", admin(s.listAgentCredentials))
	mux.HandleFunc("POST /v1/agents/{id}/revoke", admin(s.revokeAgent))
	mux.HandleFunc("POST /v1/agents/{id}/evacuate", s.evacuate)
	mux.HandleFunc("GET /v1/events", tenant(s.listEvents))
	mux.HandleFunc("GET /v1/reservations", admin(s.listReservations))
	mux.HandleFunc("POST /v1/tenants", admin(s.createTenant))
	mux.HandleFunc("POST /v1/tenants/{name}/keys", admin(s.createAPIKey))
	mux.HandleFunc("PUT /v1/tenants/{name}/quota", admin(s.putQuota))
	mux.HandleFunc("GET /v1/tenants/{name}/quota", admin(s.getQuota))

	s.appRoutes(mux, tenant)
	s.pprofRoutes(mux, admin)
	s.uiRoutes(mux, admin) // the web dashboard at /ui/ and its GET /v1/refusals (ui.go, issue 17)

	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET /v1/openapi.yaml", serveOpenAPI)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.cfg.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", noRoute(mux.ServeMux))
	return s.httpMetrics(mux.ServeMux, s.recoverer(s.appsByHost(mux.ServeMux))), mux.patterns
}

// routeMethods are the methods a route of the API may take, in the order an Allow header
// lists them.
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// noRoute answers a request no pattern of mux took: 405 method_not_allowed with an Allow
// header when its path is a route for other methods (RFC 9110 §15.5.6), else 404 not_found.
func noRoute(mux *http.ServeMux) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var allow []string
		for _, m := range routeMethods {
			probe := *r // a shallow copy: the mux reads only the method, host and path
			probe.Method = m
			if _, pattern := mux.Handler(&probe); pattern != "" && pattern != "/" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			httpjson.WriteError(w, requestID(r.Context()), berth.Errorf(berth.EMethodNotAllowed,
				"%s %s: this route takes %s", r.Method, r.URL.Path, strings.Join(allow, ", ")))
			return
		}
		httpjson.WriteError(w, requestID(r.Context()), berth.Errorf(berth.ENotFound, "no route for %s %s", r.Method, r.URL.Path))
	}
}

// appRoutes adds the app API (APP-1) and the requests to apps by path, /apps/{name}/….
func (s *Server) appRoutes(mux *routeMux, tenant func(apiFunc) http.HandlerFunc) {
	mux.HandleFunc("POST /v1/apps", tenant(s.createApp))
	mux.HandleFunc("GET /v1/apps", tenant(s.listApps))
	mux.HandleFunc("GET /v1/apps/{name}", tenant(appNamed(s.getApp)))
	mux.HandleFunc("DELETE /v1/apps/{name}", tenant(appNamed(s.deleteApp)))
	mux.HandleFunc("POST /v1/apps/{name}/deploy", tenant(appNamed(s.deployApp)))
	mux.HandleFunc("POST /v1/apps/{name}/idle", tenant(appNamed(s.setAppIdle)))
	mux.HandleFunc("POST /v1/apps/{name}/hibernate", tenant(appNamed(s.setAppDesired(berth.DesireHibernated, "hibernate"))))
	mux.HandleFunc("POST /v1/apps/{name}/wake", tenant(appNamed(s.setAppDesired(berth.DesireRunning, "wake"))))
	mux.HandleFunc("POST /v1/apps/{name}/start", tenant(appNamed(s.setAppDesired(berth.DesireRunning, "start"))))
	mux.HandleFunc("POST /v1/apps/{name}/stop", tenant(appNamed(s.setAppDesired(berth.DesireStopped, "stop"))))
	mux.HandleFunc("/apps/{name}", s.appRoute)
	mux.HandleFunc("/apps/{name}/{path...}", s.appRoute)
}

// appsByHost routes a request whose Host is <app>.<AppsDomain> to the app, any other to mux;
// without an AppsDomain it is mux.
func (s *Server) appsByHost(mux *http.ServeMux) http.Handler {
	if s.cfg.AppsDomain == "" {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, ok := s.appHost(r); ok {
			s.serveApp(w, r, name, r.URL.EscapedPath(), false)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// recoverer gives every request an id and turns a panic into a logged 500 (a bug, never
// input's fault) instead of a dropped connection.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := newID("req")
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey, id))
		w.Header().Set(berth.HeaderRequestID, id)
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic in handler", "request_id", id, "method", r.Method, "path", r.URL.Path,
					"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				httpjson.WriteError(w, id, berth.Errorf(berth.EInternal, "internal error"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

func (s *Server) api(f apiFunc, adminOnly bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.auth.key(r.Context(), r)
		if err == nil {
			err = requestText(r)
		}
		if err == nil && adminOnly && !p.admin() {
			err = berth.Errorf(berth.EForbidden, "this call needs an admin key")
		}
		if err == nil && !p.admin() {
			err = s.limits.admit(p.Tenant) // issue 15: per-tenant rate, 429 (limits.go)
		}
		if err == nil {
			err = f(w, r, p)
		}
		if err != nil {
			s.writeError(w, r, err)
		}
	}
}

// requestText refuses (invalid_request) an API call whose path or query holds text no store
// can keep: a NUL character, or bytes that are not UTF-8 (a %00 or %ff in a sandbox id, an
// app name, an events filter). PostgreSQL refuses both, so each was a 500 there and a miss on
// SQLite (found by an attack); the answer must not depend on the store. The files API's
// `path` may be any bytes but NUL: a file name need not be UTF-8. A query that does not parse,
// or names a parameter twice, is refused too (httpjson.Query).
func requestText(r *http.Request) error {
	if !storable(r.URL.Path, true) {
		return berth.Errorf(berth.EInvalidRequest, "the request path must be UTF-8 text without a NUL character")
	}
	query, err := httpjson.Query(r.URL.RawQuery) // unparsable or repeated: refused
	if err != nil {
		return err
	}
	for k, vs := range query {
		for _, v := range vs {
			if !storable(k, true) || !storable(v, k != "path") {
				return berth.Errorf(berth.EInvalidRequest, "query parameter %q must be UTF-8 text without a NUL character", strings.ToValidUTF8(k, "?"))
			}
		}
	}
	return nil
}

// storable reports whether s has no NUL character and, when utf8Only, is valid UTF-8.
func storable(s string, utf8Only bool) bool {
	return strings.IndexByte(s, 0) < 0 && (!utf8Only || utf8.ValidString(s))
}

// appNamed answers 404 app_not_found for a /v1/apps/{name}… call whose name no app can have
// (berth.ValidAppName) before f reads the store or claims an Idempotency-Key with it: a
// 4,000-byte name in a keyed deploy was a 500 on PostgreSQL (the claim's key outgrew its
// index; found by an attack).
func appNamed(f apiFunc) apiFunc {
	return func(w http.ResponseWriter, r *http.Request, p principal) error {
		if name := r.PathValue("name"); !berth.ValidAppName(name) {
			return berth.Errorf(berth.EAppNotFound, "no app %q", strings.ToValidUTF8(name, "?"))
		}
		return f(w, r, p)
	}
}

// writeError writes err as an API-2 body (httpjson.WriteError) and logs every 5xx answer
// once, with the request id, method, route and the whole error, cause included (issue 15):
// at error level for a 500 (a bug: its body says only "internal error"), at warn for any
// other 5xx (a dependency failing, capacity).
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	id := requestID(r.Context())
	httpjson.LogError(s.log, w, r, id, err)
	httpjson.WriteError(w, id, err)
}

// readyz answers 200 when the store answers and accepts a write (Ping probes one), else 503
// unavailable (issue 15: a replica whose store is read-only or closed is not ready).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.store.Ping(r.Context()); err != nil {
		s.writeError(w, r, berth.Wrap(berth.EUnavailable, err, "store cannot write"))
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}
