package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth"
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

func newAgentCaller(token string, timeout time.Duration) *agentCaller {
	return &agentCaller{http: &http.Client{}, token: token, timeout: timeout}
}

func (c *agentCaller) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.timeout)
}

func (c *agentCaller) create(ctx context.Context, addr string, ac berth.AgentCreate) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodPost, addr, "/internal/sandboxes", nil, ac, http.StatusCreated)
	return err
}

func (c *agentCaller) delete(ctx context.Context, addr, id string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodDelete, addr, "/internal/sandboxes/"+url.PathEscape(id), nil, nil, http.StatusNoContent)
	return err
}

func (c *agentCaller) exec(ctx context.Context, addr, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	var res berth.ExecResult
	b, err := c.do(ctx, http.MethodPost, addr, "/internal/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, http.StatusOK)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, berth.Errorf(berth.EUnavailable, "agent answered exec with bad JSON: %v", err)
	}
	return res, nil
}

func (c *agentCaller) writeFile(ctx context.Context, addr, id, path string, data []byte) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	q := url.Values{"path": {path}}
	_, err := c.do(ctx, http.MethodPut, addr, "/internal/sandboxes/"+url.PathEscape(id)+"/files", q, data, http.StatusNoContent)
	return err
}

func (c *agentCaller) readFile(ctx context.Context, addr, id, path string) ([]byte, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	q := url.Values{"path": {path}}
	return c.do(ctx, http.MethodGet, addr, "/internal/sandboxes/"+url.PathEscape(id)+"/files", q, nil, http.StatusOK)
}

func (c *agentCaller) drain(ctx context.Context, addr string, draining bool, reason string) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	if draining {
		_, err := c.do(ctx, http.MethodPost, addr, "/internal/drain", url.Values{"reason": {reason}}, nil, http.StatusAccepted)
		return err
	}
	_, err := c.do(ctx, http.MethodPost, addr, "/internal/undrain", nil, nil, http.StatusOK)
	return err
}

// do sends one request. body is JSON-encoded unless it is []byte (sent raw). An answer with
// another status is decoded as an API-2 error body; anything else is unavailable.
func (c *agentCaller) do(ctx context.Context, method, addr, path string, q url.Values, body any, want int) ([]byte, error) {
	if addr == "" {
		return nil, berth.Errorf(berth.EUnavailable, "agent has no address yet")
	}
	u := addr + path
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
		buf, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("encode agent request: %w", err)
		}
		rd, ctype = bytes.NewReader(buf), "application/json"
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, berth.Errorf(berth.EUnavailable, "agent address %q: %v", addr, err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set(berth.HeaderNodeToken, c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, berth.Errorf(berth.EUnavailable, "agent unreachable: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 80<<20))
	if err != nil {
		return nil, berth.Errorf(berth.EUnavailable, "agent answer cut: %v", err)
	}
	if resp.StatusCode == want {
		return b, nil
	}
	var eb berth.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return nil, &berth.Error{Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return nil, berth.Errorf(berth.EUnavailable, "agent answered %s", resp.Status)
}

// serve starts a sandbox's service: the long-running command of an app (APP-1).
func (c *agentCaller) serve(ctx context.Context, addr, id string, req berth.ServiceRequest) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	_, err := c.do(ctx, http.MethodPost, addr, "/internal/sandboxes/"+url.PathEscape(id)+"/service", nil, req, http.StatusNoContent)
	return err
}

// serviceStatus reads whether a sandbox's service runs, its exit code and output tail.
func (c *agentCaller) serviceStatus(ctx context.Context, addr, id string) (berth.ServiceStatus, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var st berth.ServiceStatus
	b, err := c.do(ctx, http.MethodGet, addr, "/internal/sandboxes/"+url.PathEscape(id)+"/service", nil, nil, http.StatusOK)
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, berth.Errorf(berth.EUnavailable, "agent answered service status with bad JSON: %v", err)
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
func (c *agentCaller) probe(ctx context.Context, addr, id string, port int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr+portPath(id, port)+"/", nil)
	if err != nil {
		return berth.Errorf(berth.EUnavailable, "agent address %q: %v", addr, err)
	}
	req.Header.Set(berth.HeaderNodeToken, c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return berth.Errorf(berth.EUnavailable, "agent unreachable: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusNotImplemented ||
		resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusUnauthorized {
		var eb berth.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			return &berth.Error{Code: eb.Error.Code, Message: eb.Error.Message}
		}
	}
	return nil
}
