package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/netfail"
)

// agentCaller calls agents' internal API (agent.Handler) with the node token. Transport
// failures become unavailable errors so the scheduler moves on to the next host (PLC-7).
// Each call is bounded by its own deadline, not one client-wide timeout: an exec may run for
// its timeout_s (up to an hour), a create must not hold a placement for a minute.
type agentCaller struct {
	http    *http.Client
	token   string
	timeout time.Duration // creates, deletes, drains and file calls
}

// agentDialTimeout bounds connecting to an agent (C28): a host that does not accept within it
// is unreachable, whatever the call's own deadline.
const agentDialTimeout = 10 * time.Second

func newAgentCaller(token string, timeout time.Duration, tlsCfg *tls.Config, requireTLS bool) *agentCaller {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil // agents are reached directly, never through a proxy from the environment
	agentDial(t, tlsCfg, requireTLS)
	return &agentCaller{http: &http.Client{Transport: t}, token: token, timeout: timeout}
}

// errPlainAgent is the dial error of an http:// agent address on a replica that calls agents
// over TLS only (Config.RequireAgentTLS).
var errPlainAgent = errors.New("this replica calls agents over TLS only, and the agent's address is http://")

// agentDial sets how t reaches agents (C28, issue 15 point 2): a bounded dial, TLS with
// tlsCfg for https:// addresses, and — when requireTLS — no connection at all for an http://
// one, whatever the address came from (a heartbeat, or a row written before the replica
// served TLS), so the call's token and tenants' files never leave in clear. The refusal is a
// dial error: the host is unreachable (the next host is tried), not failing (PLC-9).
func agentDial(t *http.Transport, tlsCfg *tls.Config, requireTLS bool) {
	d := &net.Dialer{Timeout: agentDialTimeout, KeepAlive: 30 * time.Second}
	t.TLSClientConfig = tlsCfg
	t.TLSHandshakeTimeout = agentDialTimeout
	t.DialContext = d.DialContext
	if requireTLS {
		t.DialContext = func(_ context.Context, network, addr string) (net.Conn, error) {
			return nil, &net.OpError{Op: "dial", Net: network, Err: errPlainAgent}
		}
		t.DialTLSContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			cfg := &tls.Config{MinVersion: tls.VersionTLS12}
			if tlsCfg != nil {
				cfg = tlsCfg.Clone()
			}
			if cfg.ServerName == "" {
				cfg.ServerName, _, _ = net.SplitHostPort(addr)
			}
			cfg.NextProtos = []string{"http/1.1"}
			return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
		}
	}
}

// agentAt is an agent the server calls: its id and the base URL of its internal API.
type agentAt struct{ ID, URL string }

// authorize sets the agent-call token of a request to the agent at (AGT-5, issue 15).
func (c *agentCaller) authorize(req *http.Request, at agentAt) {
	req.Header.Set(berth.HeaderAgentCall, berth.AgentCallToken(c.token, at.ID, at.URL))
}

func (c *agentCaller) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

func (c *agentCaller) create(ctx context.Context, at agentAt, ac berth.AgentCreate) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodPost, at, "/internal/sandboxes", nil, ac, http.StatusCreated)
	return err
}

// checkpoint has the agent checkpoint sandbox id into the snapshot store as image and stop it
// (PAUSE-1); timeout bounds the checkpoint and the upload.
func (c *agentCaller) checkpoint(ctx context.Context, at agentAt, id, image string, timeout time.Duration) (berth.CheckpointResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var res berth.CheckpointResult
	b, err := c.do(ctx, http.MethodPost, at, "/internal/sandboxes/"+url.PathEscape(id)+"/checkpoint", nil,
		berth.CheckpointRequest{Image: image}, http.StatusOK)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, unreachableBy(err, "agent answered checkpoint with bad JSON") // it may have checkpointed: the answer is lost
	}
	return res, nil
}

func (c *agentCaller) delete(ctx context.Context, at agentAt, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodDelete, at, "/internal/sandboxes/"+url.PathEscape(id), nil, nil, http.StatusNoContent)
	return err
}

// deleteStale stops the agent's copy cp only while it is that boot's incarnation (AGT-6,
// berth.HeldSandbox.Incarnation): DELETE …?boot=B&incarnation=N. The agent answers 409
// conflict for a copy booked or re-confirmed there since, or when it is another boot now,
// which is returned as such: that copy is not stale, and stays.
func (c *agentCaller) deleteStale(ctx context.Context, at agentAt, cp berth.HeldCopy) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	q := url.Values{"boot": {cp.Boot}, "incarnation": {strconv.FormatInt(cp.Incarnation, 10)}}
	_, err := c.do(ctx, http.MethodDelete, at, "/internal/sandboxes/"+url.PathEscape(cp.ID), q, nil, http.StatusNoContent)
	return err
}

// exec runs req in sandbox id on its agent. A 200 whose body is not an exec result
// (berth.ParseExecResult: null, {}, an exit_code that is a string…) is errUnreachable, so
// execLost makes it outcome_unknown: the exec was sent and may have run, and such a body read
// as an ExecResult said exit code 0.
func (c *agentCaller) exec(ctx context.Context, at agentAt, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	b, err := c.do(ctx, http.MethodPost, at, "/internal/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, http.StatusOK)
	if err != nil {
		return berth.ExecResult{}, err
	}
	res, err := berth.ParseExecResult(b)
	if err != nil {
		return res, unreachableBy(err, "agent answered exec with a body that is not an exec result") // it ran: the answer is lost
	}
	return res, nil
}

// fileTimeout bounds one file transfer between server and agent: long enough for the
// largest file on a slow link, short enough that a stuck agent frees the request.
const fileTimeout = 10 * time.Minute

// writeFile streams body (size bytes, -1 when unknown) into path in sandbox id (ISO-3): the
// server holds one buffer of it at a time, never the whole file.
func (c *agentCaller) writeFile(ctx context.Context, at agentAt, id, path string, body io.Reader, size int64) error {
	ctx, cancel := context.WithTimeout(ctx, fileTimeout)
	defer cancel()
	if at.URL == "" {
		return berth.Errorf(berth.EUnavailable, "agent has no address yet")
	}
	u := at.URL + "/internal/sandboxes/" + url.PathEscape(id) + "/files?" + url.Values{"path": {path}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		return berth.Wrap(berth.EUnavailable, err, "agent address %q", at.URL)
	}
	forwardRequestID(req)
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	c.authorize(req, at)
	resp, err := c.http.Do(req)
	if err != nil {
		return unreachableBy(err, "agent unreachable")
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNoContent {
		return nil
	}
	return agentError(resp)
}

// readFile opens path in sandbox id and returns the agent's stream of it and its size.
func (c *agentCaller) readFile(ctx context.Context, at agentAt, id, path string) (io.ReadCloser, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, fileTimeout)
	if at.URL == "" {
		cancel()
		return nil, 0, berth.Errorf(berth.EUnavailable, "agent has no address yet")
	}
	u := at.URL + "/internal/sandboxes/" + url.PathEscape(id) + "/files?" + url.Values{"path": {path}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		cancel()
		return nil, 0, berth.Wrap(berth.EUnavailable, err, "agent address %q", at.URL)
	}
	forwardRequestID(req)
	c.authorize(req, at)
	resp, err := c.http.Do(req)
	if err != nil {
		cancel()
		return nil, 0, unreachableBy(err, "agent unreachable")
	}
	if resp.StatusCode != http.StatusOK {
		defer cancel()
		defer resp.Body.Close()
		return nil, 0, agentError(resp)
	}
	return cancelCloser{resp.Body, cancel}, resp.ContentLength, nil
}

// cancelCloser ends a request's context when its body is closed.
type cancelCloser struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelCloser) Close() error { err := c.ReadCloser.Close(); c.cancel(); return err }

// errUnreachable marks an agent call that got no (whole) answer, or an answer that is not
// the agent's: what it did on the agent is unknown. ErrorCode still reads it as unavailable.
var errUnreachable = errors.New("no answer from the agent")

// errNotSent marks an agent call of which nothing reached the agent (netfail.NothingSent:
// the connection could not be made, or its TLS handshake failed): the agent did nothing, so
// an exec so answered ran nothing (execLost).
var errNotSent = errors.New("nothing was sent to the agent")

// errNotConnected marks an agent call whose connection could not be made at all (a dial
// failure, netfail.NotConnected); it is also errNotSent. A host that is down is the leases'
// business (LIF-2), not a create failure of a reachable host (PLC-9) — unlike one that
// answers but fails its TLS handshake, which counts toward its quarantine.
var errNotConnected = errors.New("could not connect to the agent")

// unreachable returns an unavailable error that is also errUnreachable.
func unreachable(format string, args ...any) error {
	return fmt.Errorf("%w: %w", errUnreachable, berth.Errorf(berth.EUnavailable, format, args...))
}

// unreachableBy is unreachable with cause kept as the error's Cause (for the logs; a
// client's body says only what format says: no agent address or dial text, issue 15).
func unreachableBy(cause error, format string, args ...any) error {
	return fmt.Errorf("%w: %w", errUnreachable, berth.Wrap(berth.EUnavailable, cause, format, args...))
}

// agentError decodes an agent's API-2 error answer; the agent's own 401 (it refused this
// replica's call token) and anything not an API-2 error are unavailable.
func agentError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return agentErrorBody(b, resp.Status)
}

// agentErrorBody is agentError on a body already read.
func agentErrorBody(b []byte, status string) error {
	if eb, ok := berth.ParseErrorBody(b); ok {
		if eb.Error.Code == berth.EUnauthorized {
			// The agent refused this replica, not the caller: never the caller's 401 (an SDK
			// would blame its own key). A host that keeps refusing counts toward quarantine
			// like any failing host (PLC-9). An agent refuses a replica only so; its 403
			// forbidden is the sandbox's own answer (a file its permissions or root keep
			// out), the caller's to read, never retried.
			return berth.Wrap(berth.EUnavailable, fmt.Errorf("agent answered %s: %s", eb.Error.Code, eb.Error.Message),
				"the agent refused this replica's call (its node token or announced address differs)")
		}
		return &berth.Error{Code: eb.Error.Code, Message: eb.Error.Message}
	}
	// Not the agent's answer — a proxy's page, a crash's text, an error cut past what is read
	// — so what the call did is unknown (errUnreachable): an exec answered so may have run
	// (found by an attack: a 502 page after the command ran was a retryable 503).
	return unreachable("agent answered %s", status)
}

func (c *agentCaller) drain(ctx context.Context, at agentAt, draining bool, reason string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	if draining {
		_, err := c.do(ctx, http.MethodPost, at, "/internal/drain", url.Values{"reason": {reason}}, nil, http.StatusAccepted)
		return err
	}
	_, err := c.do(ctx, http.MethodPost, at, "/internal/undrain", nil, nil, http.StatusOK)
	return err
}

// do sends one request. body is JSON-encoded unless it is []byte (sent raw). An answer with
// another status is decoded as an API-2 error body; anything else is unavailable.
func (c *agentCaller) do(ctx context.Context, method string, at agentAt, path string, q url.Values, body any, want int) ([]byte, error) {
	if at.URL == "" {
		return nil, berth.Errorf(berth.EUnavailable, "agent has no address yet")
	}
	u := at.URL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var rd io.Reader
	ctype := ""
	switch b := body.(type) {
	case nil:
	case []byte:
		rd, ctype = bytes.NewReader(b), "application/octet-stream"
	default:
		// Without HTML escaping: a caller's '<' stays one byte on its way to the agent instead
		// of six (\u003c), so a forwarded exec is at most 3× what the API took (an invalid
		// UTF-8 byte becomes U+FFFD, three bytes; agent.maxForwardedExecBytes).
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(b); err != nil {
			return nil, fmt.Errorf("encode agent request: %w", err)
		}
		rd, ctype = &buf, "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, berth.Wrap(berth.EUnavailable, err, "agent address %q", at.URL)
	}
	forwardRequestID(req)
	if deadline, ok := ctx.Deadline(); ok {
		req.Header.Set(berth.HeaderTimeout, strconv.FormatInt(max(time.Until(deadline).Milliseconds(), 1), 10))
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	c.authorize(req, at)
	resp, err := c.http.Do(req)
	if err != nil {
		switch {
		case netfail.NotConnected(err):
			return nil, fmt.Errorf("%w: %w: %w", errNotConnected, errNotSent, unreachableBy(err, "agent unreachable"))
		case netfail.NothingSent(err):
			return nil, fmt.Errorf("%w: %w", errNotSent, unreachableBy(err, "agent unreachable"))
		}
		return nil, unreachableBy(err, "agent unreachable")
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 80<<20))
	if err != nil {
		return nil, unreachableBy(err, "agent answer cut")
	}
	if resp.StatusCode == want {
		return b, nil
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return nil, agentError(resp)
}

// serve starts a sandbox's service: the long-running command of an app (APP-1).
func (c *agentCaller) serve(ctx context.Context, at agentAt, id string, req berth.ServiceRequest) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodPost, at, "/internal/sandboxes/"+url.PathEscape(id)+"/service", nil, req, http.StatusNoContent)
	return err
}

// serviceStatus reads whether a sandbox's service runs, its exit code and output tail.
func (c *agentCaller) serviceStatus(ctx context.Context, at agentAt, id string) (berth.ServiceStatus, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var st berth.ServiceStatus
	b, err := c.do(ctx, http.MethodGet, at, "/internal/sandboxes/"+url.PathEscape(id)+"/service", nil, nil, http.StatusOK)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, berth.Wrap(berth.EUnavailable, err, "agent answered service status with bad JSON")
	}
	return st, nil
}

// portPath is the agent's route to port inside sandbox id (APP-1); the request's path follows.
func portPath(id string, port int) string {
	return "/internal/sandboxes/" + url.PathEscape(id) + "/port/" + strconv.Itoa(port)
}

// probe sends GET / to the app on port inside sandbox id: nil when the app answered at all
// (any status: something listens), else the agent's error (app_unreachable while nothing
// listens yet, service_exited once the command has ended).
func (c *agentCaller) probe(ctx context.Context, at agentAt, id string, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, at.URL+portPath(id, port)+"/", nil)
	if err != nil {
		return berth.Wrap(berth.EUnavailable, err, "agent address %q", at.URL)
	}
	forwardRequestID(req)
	c.authorize(req, at)
	resp, err := c.http.Do(req)
	if err != nil {
		return unreachableBy(err, "agent unreachable")
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusNotImplemented ||
		resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized {
		if _, ok := berth.ParseErrorBody(b); ok {
			return agentErrorBody(b, resp.Status)
		}
	}
	return nil
}

// forwardRequestID sends the request id of the API call req serves (if any) to the agent,
// which answers errors with it (X-Request-Id), so an error proxied on keeps its id.
func forwardRequestID(req *http.Request) {
	if id := requestID(req.Context()); id != "" {
		req.Header.Set(berth.HeaderRequestID, id)
	}
}
