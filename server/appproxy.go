package server

import (
	"cmp"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
)

// Requests for apps (APP-1): /apps/{name}/{path...} on the server, or any path with Host
// {name}.<AppsDomain>. They carry the app's own traffic, so Berth does not authenticate them
// (the app does, if it wants to); the Berth key is never needed or forwarded by Berth.
//
//   - running (or deploying/waiting_capacity with the old version still serving): proxied to
//     the serving sandbox's port through its agent.
//   - hibernated: woken (desired running, event "hibernated → waking") and the request held
//     until the app serves, it is refused capacity, or AppWakeTimeout passes
//     (503 app_wake_timeout with Retry-After).
//   - waiting_capacity without a serving sandbox: 503 with the refusal's code and Retry-After
//     until the reconciler's next try.
//   - stopped: 409 app_stopped (requests do not start a stopped app); error: 502 app_error
//     with the reason; unknown: 404 app_not_found.

// appRoute serves /apps/{name}/{path...}.
func (s *Server) appRoute(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !strings.HasPrefix(r.URL.Path, "/apps/"+name+"/") {
		// /apps/web → /apps/web/ so the app's relative links resolve.
		u := *r.URL
		u.Path = "/apps/" + name + "/"
		http.Redirect(w, r, u.String(), http.StatusPermanentRedirect)
		return
	}
	// A path-routed app shares the API's origin, and so the dashboard's (/ui keeps an operator's
	// key in that origin's sessionStorage): its documents are given an opaque origin of their
	// own, and it may not install a service worker there, so tenant code served here can reach
	// neither the key nor the dashboard's requests. An app that needs an origin of its own
	// (cookies, storage, workers, same-origin fetches) is reached under --apps-domain.
	if r.Header.Get("Service-Worker") != "" {
		s.writeError(w, r, berth.Errorf(berth.EForbidden,
			"service workers are not allowed under /apps/ (it shares the API's origin); reach the app under the apps domain"))
		return
	}
	w.Header().Set("Content-Security-Policy", pathAppSandbox)
	s.serveApp(w, r, name, strings.TrimPrefix(r.URL.EscapedPath(), "/apps/"+name), true)
}

// maxAppURLBytes bounds the path and query of a request to an app: 16 KiB, twice what common
// proxies (nginx's default large_client_header_buffers) take.
const maxAppURLBytes = 16 << 10

// pathAppSandbox is the Content-Security-Policy of every answer through /apps/{name}/: a
// document it loads runs sandboxed, without allow-same-origin, so in an opaque origin —
// scripts, forms, popups and downloads work, the API origin's storage, cookies and windows
// (the dashboard's) are out of its reach. An app's own policy still applies beside it.
const pathAppSandbox = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// appHost returns the app a request's Host names under AppsDomain, if any. The comparison
// ignores case and one trailing dot on either side: "hello.apps.example." is the same
// fully-qualified name as "hello.apps.example" (RFC 1034 §3.1), and went to the API.
func (s *Server) appHost(r *http.Request) (string, bool) {
	if s.cfg.AppsDomain == "" {
		return "", false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	domain := strings.TrimSuffix(strings.ToLower(s.cfg.AppsDomain), ".")
	name, ok := strings.CutSuffix(host, "."+domain)
	return name, ok && berth.ValidAppName(name)
}

// serveApp answers one request for app name, forwarding path (escaped, starting with "/")
// and the query to it. A hibernated app is woken and the request held until it serves, at
// most AppWakeTimeout (then 504 wake_timeout). sharedOrigin says the request came through
// /apps/{name}/, the API's own origin: the app's Service-Worker-Allowed and Clear-Site-Data
// are then dropped.
func (s *Server) serveApp(w http.ResponseWriter, r *http.Request, name, path string, sharedOrigin bool) {
	fail := func(err error) { s.writeError(w, r, err) }
	if !berth.ValidAppName(name) {
		// No app has such a name; and one with a NUL byte was a 500 on PostgreSQL.
		fail(berth.Errorf(berth.EAppNotFound, "no app %q", strings.ToValidUTF8(name, "?")))
		return
	}
	if len(path)+len(r.URL.RawQuery) > maxAppURLBytes {
		// Past what the agent's listener reads, the call failed as if the host were down: a
		// retryable 503 for the caller's own request (found by an attack).
		fail(berth.Errorf(berth.EInvalidRequest, "the path and query are over %d bytes", maxAppURLBytes))
		return
	}
	if p, err := url.PathUnescape(path); err != nil || slices.Contains(strings.Split(p, "/"), "..") {
		// The path is appended to the agent's route to the app: it must not climb out of it.
		fail(berth.Errorf(berth.EInvalidRequest, "path %q is not a clean path", path))
		return
	}
	deadline := time.Now().Add(s.cfg.AppWakeTimeout)
	for woken := false; ; {
		a, err := s.store.App(r.Context(), name)
		serve, err := appVerdict(a, err, name)
		switch {
		case err != nil:
			fail(err)
			return
		case serve:
			// The app is active until the answer (a stream, an upgraded connection) ends.
			done := s.appRequestOpen(r.Context(), name, a)
			defer done()
			s.proxyApp(w, r, a, path, sharedOrigin)
			return
		case a.Desired == berth.DesireHibernated && !woken:
			woken = true
			if err := s.wakeForRequest(r.Context(), name, path, a.IdleSeconds); err != nil {
				fail(err)
				return
			}
		}
		if time.Now().After(deadline) {
			fail(&berth.Error{Code: berth.EWakeTimeout, RetryAfter: 5 * time.Second,
				Message: "app " + name + " is " + string(a.State) + " and did not serve within " + s.cfg.AppWakeTimeout.String()})
			return
		}
		// Taken only by a request that waits (never for an unknown name); a write between the
		// read above and here is caught by the 100 ms poll.
		changed := s.appWatch(name)
		select {
		case <-r.Context().Done():
			return
		case <-changed: // this replica wrote the app (e.g. switched it to a new sandbox)
		case <-time.After(100 * time.Millisecond): // another replica may have
		}
	}
}

// appVerdict judges app name, as read (a, err), for a request: serve it now (it has a
// sandbox: also while a new version deploys, waits for capacity or failed, the old one
// serves), refuse it with the returned error (app_not_found, unavailable, app_stopped,
// app_error, or waiting_capacity's code with Retry-After: APP-2), or neither (wait for it).
func appVerdict(a berth.App, err error, name string) (bool, error) {
	switch {
	case errors.Is(err, berth.ErrNotFound):
		return false, berth.Errorf(berth.EAppNotFound, "no app %q", name)
	case err != nil:
		return false, berth.Fault(err, "read app")
	case a.Desired == berth.DesireStopped:
		return false, berth.Errorf(berth.EAppStopped, "app %q is stopped by its owner (berth apps start %s)", name, name)
	case a.SandboxID != "":
		return true, nil
	case a.State == berth.AppError:
		// Requests to an app need no key: its reason (which may quote its command's output)
		// is for its owner only, through GET /v1/apps/{name} (issue 15, point 6).
		return false, berth.Errorf(berth.EAppError, "app %q is in error; its owner sees why (berth apps get %s)", name, name)
	case a.State == berth.AppWaitingCapacity:
		// APP-2: waiting is not failing; say when to come back.
		wait := max(time.Until(a.RetryAt), time.Second)
		return false, &berth.Error{Code: cmp.Or(a.RetryCode, berth.ENoCapacity), RetryAfter: wait,
			Message: "app " + name + " is waiting for capacity: " + a.Reason}
	}
	return false, nil
}

// wakeForRequest sets hibernated app name's desired state to running (waking) because of a
// request to path, marks it active (its idle clock, idleSeconds) and kicks the reconciler.
// Errors: unavailable when the store fails; an app no longer hibernated is left as it is.
func (s *Server) wakeForRequest(ctx context.Context, name, path string, idleSeconds int64) error {
	_, err := s.mutateApp(ctx, name, "request/"+s.cfg.ReplicaID, func(a *berth.App) error {
		if a.Desired != berth.DesireHibernated {
			return errSuperseded
		}
		a.Desired, a.State = berth.DesireRunning, berth.AppWaking
		a.Reason = "woken by a request to " + path
		resetStart(a)
		return nil
	})
	if err != nil && !errors.Is(err, errSuperseded) {
		return berth.Fault(err, "wake app")
	}
	s.touchApp(ctx, name, idleSeconds)
	s.kickApps()
	return nil
}

// proxyApp forwards the request to the app's port inside its serving sandbox, through the
// sandbox's agent (which alone can reach into the sandbox's network namespace); with
// sharedOrigin (see serveApp) without the app's Service-Worker-Allowed and Clear-Site-Data.
func (s *Server) proxyApp(w http.ResponseWriter, r *http.Request, a berth.App, path string, sharedOrigin bool) {
	addr, err := s.agentAddress(r.Context(), a.AgentID)
	if err != nil {
		if errors.Is(err, berth.ErrNotFound) { // its agent's row is gone: the lease moves the app
			s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 2 * time.Second, Message: "app host unknown", Cause: err})
			return
		}
		s.writeError(w, r, berth.Fault(err, "app host unknown"))
		return
	}
	target, err := url.Parse(addr.URL)
	if err != nil {
		s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 2 * time.Second, Message: "app host address", Cause: err})
		return
	}
	// Full duplex: the request body stays readable while the answer is written (see the
	// agent's proxy, which needs the same).
	_ = http.NewResponseController(w).EnableFullDuplex()
	rp := &httputil.ReverseProxy{
		Transport: s.appTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = target.Scheme, target.Host
			raw := portPath(a.SandboxID, a.Spec.Port) + path
			p, err := url.PathUnescape(raw)
			if err != nil {
				p = raw
			}
			pr.Out.URL.Path, pr.Out.URL.RawPath = p, raw
			pr.Out.URL.RawQuery = r.URL.RawQuery
			pr.Out.Host = r.Host
			pr.SetXForwarded()
			pr.Out.Header.Set(berth.HeaderAgentCall, berth.AgentCallToken(s.cfg.NodeToken, addr.ID, addr.URL))
			pr.Out.Header.Set(berth.HeaderRequestID, requestID(r.Context())) // the agent's errors keep it
		},
		ModifyResponse: appAnswer(requestID(r.Context()), sharedOrigin),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			// The host does not answer: its lease will tell whether the app moves.
			s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 5 * time.Second,
				Message: "app " + a.Name + "'s host does not answer", Cause: err})
		},
	}
	rp.ServeHTTP(w, r)
}

// appAnswer is the app proxy's ModifyResponse: it drops the agent's echo of this request's
// id (the app's own X-Request-Id stays) and, with sharedOrigin (see serveApp), the headers
// that would reach past the app's path in the API's origin.
func appAnswer(id string, sharedOrigin bool) func(*http.Response) error {
	return func(resp *http.Response) error {
		if sharedOrigin {
			// No worker scope past the app's path, and no clearing of the origin's
			// storage (the dashboard's key) from an app's answer.
			resp.Header.Del("Service-Worker-Allowed")
			resp.Header.Del("Clear-Site-Data")
		}
		// The agent echoes this request's id; w already has it (the app's own stays).
		vals := resp.Header.Values(berth.HeaderRequestID)
		resp.Header.Del(berth.HeaderRequestID)
		for _, v := range vals {
			if v != id {
				resp.Header.Add(berth.HeaderRequestID, v)
			}
		}
		return nil
	}
}

// appActivity is one app's requests and upgraded connections open on this replica (C25).
type appActivity struct {
	mu      sync.Mutex
	open    int   // requests and upgraded connections open here
	idle    int64 // the app's idle_seconds as this replica last read it
	keeping bool  // keepActive runs for it
}

// activity returns app name's activity record on this replica, making it on first use.
func (s *Server) activity(name string) *appActivity {
	v, _ := s.appOpen.LoadOrStore(name, &appActivity{})
	return v.(*appActivity)
}

// appRequestOpen notes a request to app a for idle hibernation (C25): the app is active from
// now until the returned func is called, at the end of the answer — deferred by the caller, so
// an answer cut short (a client gone mid-stream: the proxy panics with ErrAbortHandler) ends
// it too; an upgraded connection (WebSocket) ends when either side closes it. While any is
// open here, keepActive writes the app's last activity to the store every flush period, so
// the replicas that see no request see it is in use; at the end the end is written.
func (s *Server) appRequestOpen(ctx context.Context, name string, a berth.App) (done func()) {
	act := s.activity(name)
	act.mu.Lock()
	act.open++
	act.idle = a.IdleSeconds
	start := !act.keeping
	act.keeping = true
	act.mu.Unlock()
	s.touchApp(ctx, name, a.IdleSeconds)
	if start {
		go s.keepActive(name, act)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			act.mu.Lock()
			act.open--
			idle := act.idle
			act.mu.Unlock()
			s.touchApp(context.WithoutCancel(ctx), name, idle)
		})
	}
}

// keepActive touches app name once a second while a request to it is open on this replica,
// with its idle_seconds as last read (an owner may change it mid-request), and ends with the
// last of them. One per app, not per request.
func (s *Server) keepActive(name string, act *appActivity) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for range t.C {
		act.mu.Lock()
		if act.open == 0 {
			act.keeping = false
			act.mu.Unlock()
			return
		}
		idle := act.idle
		act.mu.Unlock()
		s.touchApp(context.Background(), name, idle)
	}
}

// noteIdle records app name's idle_seconds as just read, for the requests open here.
func (s *Server) noteIdle(name string, idle int64) {
	if v, ok := s.appOpen.Load(name); ok {
		act := v.(*appActivity)
		act.mu.Lock()
		act.idle = idle
		act.mu.Unlock()
	}
}

// appOpenHere reports whether app name has a request or upgraded connection open on this
// replica (C25).
func (s *Server) appOpenHere(name string) bool {
	v, ok := s.appOpen.Load(name)
	if !ok {
		return false
	}
	act := v.(*appActivity)
	act.mu.Lock()
	defer act.mu.Unlock()
	return act.open > 0
}

// appFlushEvery is how often an app with idle_seconds idle has its activity written to the
// store: a quarter of its idle time, at least 1 s. The store's last_active is thus at most
// this far behind any replica's.
func appFlushEvery(idle int64) time.Duration {
	return max(time.Duration(idle)*time.Second/4, time.Second)
}

// touchApp notes activity of app name for idle hibernation: here at once, in the store at
// most once per flush period (appFlushEvery), with a trailing write when the period ends so
// the last activity always reaches the store, and other replicas see it too.
func (s *Server) touchApp(ctx context.Context, name string, idle int64) {
	now := s.cfg.Clock()
	for {
		old, loaded := s.appSeen.LoadOrStore(name, now)
		if !loaded || !now.After(old.(time.Time)) || s.appSeen.CompareAndSwap(name, old, now) {
			break
		}
	}
	if idle <= 0 {
		return
	}
	every := appFlushEvery(idle)
	if v, ok := s.appFlushed.Load(name); ok && now.Sub(v.(time.Time)) < every && !now.Before(v.(time.Time)) {
		if _, pending := s.appFlushing.LoadOrStore(name, true); !pending {
			time.AfterFunc(every-now.Sub(v.(time.Time)), func() {
				s.appFlushing.Delete(name)
				s.appFlushed.Store(name, s.cfg.Clock())
				s.flushActive(ctx, name)
			})
		}
		return
	}
	s.appFlushed.Store(name, now)
	go s.flushActive(ctx, name)
}

// flushActive writes this replica's last activity of app name to its record, unless the
// record already holds a later one.
func (s *Server) flushActive(ctx context.Context, name string) {
	v, ok := s.appSeen.Load(name)
	if !ok {
		return
	}
	seen := v.(time.Time)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := s.mutateApp(ctx, name, "request/"+s.cfg.ReplicaID, func(a *berth.App) error {
		if !seen.After(a.LastActive) {
			return errSuperseded
		}
		a.LastActive = seen
		return nil
	})
	if err != nil && !errors.Is(err, errSuperseded) && !errors.Is(err, berth.ErrNotFound) {
		// Not retried here: while a request is open the keeper writes again within a flush
		// period; a lost trailing write can let another replica judge the app idle up to one
		// flush period early (C25), which the log line makes visible.
		s.log.Warn("app activity not recorded", "app", name, "err", err)
	}
}
