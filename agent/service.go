package agent

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// Services is what a runtime driver offers for hosted apps (APP-1): one long-running
// service per sandbox, its status, and TCP connections to a port inside the sandbox (whose
// network namespace the host cannot reach directly). It is optional: the agent finds it by
// type assertion on its Runtime, and without it the service and port endpoints answer 501
// unsupported.
type Services interface {
	// Serve starts req.Cmd detached as the sandbox's service and returns at once. Errors:
	// invalid_request, service_running, sandbox_not_found.
	Serve(ctx context.Context, id string, req berth.ServiceRequest) error
	// ServiceStatus reports the latest run of the service. Errors: sandbox_not_found.
	ServiceStatus(ctx context.Context, id string) (berth.ServiceStatus, error)
	// Dial connects to 127.0.0.1:port inside the sandbox; ctx bounds only the dial. Errors:
	// app_unreachable, service_exited, unsupported, sandbox_not_found.
	Dial(ctx context.Context, id string, port int) (net.Conn, error)
}

// services returns the runtime's Services, or unsupported.
func (a *Agent) services() (Services, error) {
	if s, ok := a.rawRT().(Services); ok {
		return aliasServices{Services: s, ids: a.warm.ids}, nil
	}
	return nil, berth.Errorf(berth.EUnsupported, "agent %s: its runtime cannot run app services", a.cfg.ID)
}

func (a *Agent) handleServe(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req berth.ServiceRequest
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		a.writeError(w, r, err)
		return
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		a.writeError(w, r, berth.Errorf(berth.EInvalidRequest, "cmd must not be empty"))
		return
	}
	svc, err := a.heldServices(id)
	if err == nil {
		err = svc.Serve(r.Context(), id, req)
	}
	if err != nil {
		a.writeError(w, r, a.runtimeErr(id, "start its service", err))
		return
	}
	a.log.Info("service started", "sandbox", id, "cmd", req.Cmd[0]) // not its arguments: they may hold secrets
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) handleServiceStatus(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	svc, err := a.heldServices(id)
	var st berth.ServiceStatus
	if err == nil {
		st, err = svc.ServiceStatus(r.Context(), id)
	}
	if err != nil {
		a.writeError(w, r, a.runtimeErr(id, "report its service", err))
		return
	}
	httpjson.WriteJSON(w, http.StatusOK, st)
}

// heldServices checks that the agent holds id and its runtime runs services.
func (a *Agent) heldServices(id string) (Services, error) {
	if err := a.held(id); err != nil {
		return nil, err
	}
	return a.services()
}

// appRoute splits an escaped request path /internal/sandboxes/{id}/port/{port}[/{rest}] into
// the sandbox id (unescaped), the port as written and the escaped path to ask the app for
// ("/" when there is no rest). The path is taken as the client sent it, never cleaned: a
// proxy must not rewrite an app's "//" or "..".
func appRoute(escaped string) (id, port, rest string, ok bool) {
	parts := strings.SplitN(escaped, "/", 7) // "", internal, sandboxes, id, port, N, rest
	if len(parts) < 6 || parts[0] != "" || parts[1] != "internal" || parts[2] != "sandboxes" || parts[4] != "port" {
		return "", "", "", false
	}
	id, err := url.PathUnescape(parts[3])
	if err != nil || id == "" {
		return "", "", "", false
	}
	rest = "/"
	if len(parts) == 7 {
		rest += parts[6]
	}
	return id, parts[5], rest, true
}

// handleApp reverse-proxies one request to http://127.0.0.1:{port}{rest} inside sandbox id
// (APP-1). The app sees Host 127.0.0.1:{port}, the query unchanged, the caller's headers
// without X-Node-Token, and X-Forwarded-For/-Host/-Proto: the caller's values (the Berth
// server, which knows the real client) when it sent them, with the caller's address appended
// to X-Forwarded-For; else the agent's view. Failures are API-2 bodies: 400 invalid_request
// (port not 1..65535), 404 sandbox_not_found, 501 unsupported, 502 app_unreachable or
// service_exited (the service's exit code and output tail in the message).
func (a *Agent) handleApp(w http.ResponseWriter, r *http.Request, id, portText, rest string) {
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 {
		a.writeError(w, r, berth.Errorf(berth.EInvalidRequest, "port %q is not in 1..65535", portText))
		return
	}
	svc, err := a.heldServices(id)
	if err != nil {
		a.writeError(w, r, err)
		return
	}
	path, err := url.PathUnescape(rest)
	if err != nil {
		a.writeError(w, r, berth.Errorf(berth.EInvalidRequest, "bad path escape in %q", rest))
		return
	}
	// Full duplex: the request body stays readable while the app's answer is written, or
	// Go's HTTP/1 server may close it under the transport still reading its end, which cuts
	// the answer (seen under load with a 1 MiB upload).
	_ = http.NewResponseController(w).EnableFullDuplex()
	p := &httputil.ReverseProxy{
		Transport: a.appTransport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: "http", Host: appHost(id, port), Path: path, RawPath: rest, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.Header.Del(berth.HeaderNodeToken)
			pr.Out.Header.Del(berth.HeaderAgentCall)
			// The proxy drops the caller's X-Forwarded-* before Rewrite. The caller is the
			// Berth server (it holds the node token), so its values are trusted: the chain
			// of X-Forwarded-For gets the caller appended, Host and Proto are kept.
			if v := pr.In.Header.Values("X-Forwarded-For"); len(v) > 0 {
				pr.Out.Header["X-Forwarded-For"] = v
			}
			pr.SetXForwarded()
			for _, h := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
				if v := pr.In.Header.Values(h); len(v) > 0 {
					pr.Out.Header[h] = v
				}
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			a.writeError(w, r, a.upstreamErr(r.Context(), svc, id, port, err))
		},
		ErrorLog: slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	p.ServeHTTP(w, r)
}

// upstreamErr explains why a proxied request got no answer: the runtime's own code (from the
// dial) when it has one; else the sandbox ended (sandbox_not_found), the service exited
// (service_exited) or the app failed to answer (app_unreachable).
func (a *Agent) upstreamErr(ctx context.Context, svc Services, id string, port int, err error) error {
	if code := berth.ErrorCode(err); code != berth.EInternal {
		return err
	}
	if a.held(id) != nil {
		return berth.Errorf(berth.ESandboxNotFound, "sandbox %s ended during the request", id)
	}
	if ctx.Err() == nil {
		if st, serr := svc.ServiceStatus(ctx, id); serr == nil && st.Exited {
			return &berth.Error{Code: berth.EServiceExited, Message: berth.ServiceExitedMessage(st.ExitCode, st.Output)}
		}
	}
	a.log.Info("app did not answer", "sandbox", id, "port", port, "err", err)
	return berth.Errorf(berth.EUpstream, "the app on port %d of sandbox %s did not answer: %v", port, id, err)
}

// appHost names a sandbox's port as the host of an outgoing URL, so the transport's
// connection pool is keyed by sandbox and port (a kept-alive connection to one sandbox's
// app is never reused for another's). The id is hex-encoded: any id makes a valid host.
func appHost(id string, port int) string {
	return net.JoinHostPort(hex.EncodeToString([]byte(id))+".sandbox", strconv.Itoa(port))
}

// newAppTransport returns the transport of app requests: its dials go through the runtime's
// Dial into the sandbox (parsed back from appHost), never through a proxy from the
// environment; bodies pass through untouched (no transparent gzip).
func (a *Agent) newAppTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, portText, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, fmt.Errorf("agent: app address %q: %w", addr, err)
			}
			raw, err := hex.DecodeString(strings.TrimSuffix(host, ".sandbox"))
			if err != nil {
				return nil, fmt.Errorf("agent: app address %q: %w", addr, err)
			}
			port, err := strconv.Atoi(portText)
			if err != nil {
				return nil, fmt.Errorf("agent: app address %q: %w", addr, err)
			}
			svc, err := a.services()
			if err != nil {
				return nil, err
			}
			return svc.Dial(ctx, string(raw), port)
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
}
