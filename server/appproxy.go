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
	s.serveApp(w, r, name, strings.TrimPrefix(r.URL.EscapedPath(), "/apps/"+name))
}

// appHost returns the app a request's Host names under AppsDomain, if any.
func (s *Server) appHost(r *http.Request) (string, bool) {
	if s.cfg.AppsDomain == "" {
		return "", false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	name, ok := strings.CutSuffix(strings.ToLower(host), "."+strings.ToLower(s.cfg.AppsDomain))
	return name, ok && berth.ValidAppName(name)
}

// serveApp answers one request for app name, forwarding path (escaped, starting with "/")
// and the query to it.
func (s *Server) serveApp(w http.ResponseWriter, r *http.Request, name, path string) {
	fail := func(err error) { s.writeError(w, r, err) }
	if p, err := url.PathUnescape(path); err != nil || slices.Contains(strings.Split(p, "/"), "..") {
		// The path is appended to the agent's route to the app: it must not climb out of it.
		fail(berth.Errorf(berth.EInvalidRequest, "path %q is not a clean path", path))
		return
	}
	deadline := time.Now().Add(s.cfg.AppWakeTimeout)
	for woken := false; ; {
		a, err := s.store.App(r.Context(), name)
		switch {
		case errors.Is(err, berth.ErrNotFound):
			fail(berth.Errorf(berth.EAppNotFound, "no app %q", name))
			return
		case err != nil:
			fail(&berth.Error{Code: berth.EUnavailable, Message: "read app: " + err.Error(), RetryAfter: time.Second})
			return
		case a.Desired == berth.DesireStopped:
			fail(berth.Errorf(berth.EAppStopped, "app %q is stopped by its owner (berth apps start %s)", name, name))
			return
		case a.SandboxID != "":
			// Also while a new version deploys, waits for capacity or failed: the old serves.
			s.touchApp(r.Context(), name, a)
			s.proxyApp(w, r, a, path)
			return
		case a.State == berth.AppError:
			fail(berth.Errorf(berth.EAppError, "app %q is in error: %s", name, a.Reason))
			return
		case a.State == berth.AppWaitingCapacity:
			// APP-2: waiting is not failing; say when to come back.
			wait := max(time.Until(a.RetryAt), time.Second)
			fail(&berth.Error{Code: cmp.Or(a.RetryCode, berth.ENoCapacity), RetryAfter: wait,
				Message: "app " + name + " is waiting for capacity: " + a.Reason})
			return
		case a.Desired == berth.DesireHibernated && !woken:
			woken = true
			_, err := s.mutateApp(r.Context(), name, "request/"+s.cfg.ReplicaID, func(a *berth.App) error {
				if a.Desired != berth.DesireHibernated {
					return errSuperseded
				}
				a.Desired, a.State = berth.DesireRunning, berth.AppWaking
				a.Reason = "woken by a request to " + path
				resetStart(a)
				return nil
			})
			if err != nil && !errors.Is(err, errSuperseded) {
				fail(&berth.Error{Code: berth.EUnavailable, Message: "wake app: " + err.Error(), RetryAfter: time.Second})
				return
			}
			s.touchApp(r.Context(), name, a)
			s.kickApps()
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

// proxyApp forwards the request to the app's port inside its serving sandbox, through the
// sandbox's agent (which alone can reach into the sandbox's network namespace).
func (s *Server) proxyApp(w http.ResponseWriter, r *http.Request, a berth.App, path string) {
	addr, err := s.agentAddress(r.Context(), a.AgentID)
	if err != nil {
		s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 2 * time.Second, Message: "app host unknown: " + err.Error()})
		return
	}
	target, err := url.Parse(addr)
	if err != nil {
		s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 2 * time.Second, Message: "app host address: " + err.Error()})
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
			pr.Out.Header.Set(berth.HeaderNodeToken, s.cfg.NodeToken)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			// The host does not answer: its lease will tell whether the app moves.
			s.writeError(w, r, &berth.Error{Code: berth.EUnavailable, RetryAfter: 5 * time.Second,
				Message: "app " + a.Name + "'s host does not answer: " + err.Error()})
		},
	}
	rp.ServeHTTP(w, r)
}

// touchApp notes a request for idle hibernation: here at once, in the store at most every
// quarter of the app's idle time (at least 1 s apart), so other replicas see it too.
func (s *Server) touchApp(ctx context.Context, name string, a berth.App) {
	now := s.cfg.Clock()
	s.appSeen.Store(name, now)
	if a.IdleSeconds <= 0 {
		return
	}
	every := max(time.Duration(a.IdleSeconds)*time.Second/4, time.Second)
	if v, ok := s.appFlushed.Load(name); ok && now.Sub(v.(time.Time)) < every {
		return
	}
	s.appFlushed.Store(name, now)
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = s.mutateApp(ctx, name, "request/"+s.cfg.ReplicaID, func(a *berth.App) error {
			if !now.After(a.LastActive) {
				return errSuperseded
			}
			a.LastActive = now
			return nil
		})
	}()
}
