package server

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// routeAppsHost is the route label of a request for an app by its host name
// (<app>.<AppsDomain>), which no mux pattern serves.
const routeAppsHost = "apps host"

// httpMetrics counts every request by route and status code and times it by route (issue 15,
// MET-5):
//
//	berth_http_requests_total{route, code}          counter
//	berth_http_request_duration_seconds{route}      histogram, seconds
//
// route is the pattern of mux that serves the request ("GET /v1/sandboxes/{id}"), "/" for a
// path no route takes (answered 404) and "apps host" for a request to an app by host name:
// never the raw path, so the series stay bounded whatever clients send. It wraps the whole
// handler, so a panic the recoverer turns into a 500 is counted as one.
func (s *Server) httpMetrics(mux *http.ServeMux, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := routeAppsHost
		if _, ok := s.appHost(r); !ok {
			_, route = mux.Handler(r)
		}
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			code := sw.code
			if code == 0 {
				code = http.StatusOK // nothing written: net/http answers 200
			}
			s.metrics.httpRequests.WithLabelValues(route, strconv.Itoa(code)).Inc()
			s.metrics.httpSeconds.WithLabelValues(route).Observe(time.Since(start).Seconds())
		}()
		next.ServeHTTP(sw, r)
	})
}

// newHTTPMetrics builds the two HTTP series; newMetrics registers them.
func newHTTPMetrics() (*prometheus.CounterVec, *prometheus.HistogramVec) {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_http_requests_total",
			Help: "HTTP requests by route (the mux pattern, never the raw path) and status code.",
		}, []string{"route", "code"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_http_request_duration_seconds",
			Help:    "HTTP request duration by route (the mux pattern), seconds, until the handler returns.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2.5, 12), // 1 ms … ~24 min
		}, []string{"route"})
}

// statusWriter remembers the first status code written. Unwrap lets
// http.ResponseController reach the connection (flush, hijack for upgrades, deadlines).
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps streaming answers streaming for handlers that assert http.Flusher.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		if w.code == 0 {
			w.code = http.StatusOK
		}
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
