package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth"
)

// CreateSandbox asks for a sandbox (POST /v1/sandboxes, 201). It generates one random
// Idempotency-Key (128 bits, hex) for the call and sends it, with the first attempt's time,
// on every attempt, so a retry after a lost answer returns the first outcome instead of a
// second sandbox (API-4, SDK-3). Refusals come back as *berth.Error (e.g. tenant_over_quota,
// template_not_found); retryable ones (no_capacity, no_healthy_agents,
// host_starts_saturated, 502/503/504) are retried until the deadline, after which it returns
// *CapacityUnavailable (SDK-1, SDK-2).
func (c *Client) CreateSandbox(ctx context.Context, req berth.CreateRequest) (berth.Sandbox, error) {
	return c.CreateSandboxWithKey(ctx, req, "")
}

// CreateSandboxWithKey is CreateSandbox with the caller's own Idempotency-Key, for callers
// that must survive their own restart without creating twice; "" generates one.
func (c *Client) CreateSandboxWithKey(ctx context.Context, req berth.CreateRequest, idempotencyKey string) (berth.Sandbox, error) {
	if idempotencyKey == "" {
		idempotencyKey = newIdempotencyKey()
	}
	r, err := jsonRequest(http.MethodPost, "/v1/sandboxes", req, true)
	if err != nil {
		return berth.Sandbox{}, err
	}
	r.idempotencyKey = idempotencyKey
	var sb berth.Sandbox
	return sb, c.call(ctx, r, &sb)
}

// Sandbox returns one sandbox (GET /v1/sandboxes/{id}); sandbox_not_found if there is none
// visible to the key.
func (c *Client) Sandbox(ctx context.Context, id string) (berth.Sandbox, error) {
	var sb berth.Sandbox
	r := request{method: http.MethodGet, path: sandboxPath(id), idempotent: true}
	return sb, c.call(ctx, r, &sb)
}

// Sandboxes lists the sandboxes visible to the key (GET /v1/sandboxes?state=), only those in
// state when it is not "".
func (c *Client) Sandboxes(ctx context.Context, state berth.SandboxState) ([]berth.Sandbox, error) {
	r := request{method: http.MethodGet, path: "/v1/sandboxes", idempotent: true}
	if state != "" {
		r.query = url.Values{"state": {string(state)}}
	}
	var out struct {
		Sandboxes []berth.Sandbox `json:"sandboxes"`
	}
	err := c.call(ctx, r, &out)
	return out.Sandboxes, err
}

// DeleteSandbox stops and removes a sandbox (DELETE /v1/sandboxes/{id}, 204). The server
// treats it as idempotent, so it is retried like a GET.
func (c *Client) DeleteSandbox(ctx context.Context, id string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: sandboxPath(id), idempotent: true}, nil)
}

// PauseSandbox checkpoints a running sandbox — processes, memory, /tmp — and stops it, freeing
// its host (POST /v1/sandboxes/{id}/pause, PAUSE-1); it returns the sandbox, paused. Pausing a
// paused sandbox is harmless, so the call is retried like a GET (a 503 means the checkpoint
// failed and the sandbox runs on). Errors: conflict (not running, or its runtime cannot
// checkpoint), sandbox_not_found.
func (c *Client) PauseSandbox(ctx context.Context, id string) (berth.Sandbox, error) {
	var sb berth.Sandbox
	r := request{method: http.MethodPost, path: sandboxPath(id) + "/pause", idempotent: true}
	return sb, c.call(ctx, r, &sb)
}

// ResumeSandbox places a paused sandbox again, like a create, and restores it there with its
// processes and memory as they were (POST /v1/sandboxes/{id}/resume, PAUSE-1); it returns the
// running sandbox. Refusals (no_capacity…) are retried until the deadline, after which it
// returns *CapacityUnavailable: park it as waiting, not failed (SDK-1, SDK-2). Resuming a
// running sandbox returns it. Errors: conflict (not paused), sandbox_not_found.
func (c *Client) ResumeSandbox(ctx context.Context, id string) (berth.Sandbox, error) {
	var sb berth.Sandbox
	r := request{method: http.MethodPost, path: sandboxPath(id) + "/resume", idempotent: true}
	return sb, c.call(ctx, r, &sb)
}

// Exec runs a command in a sandbox and returns its exit code and captured output (POST
// /v1/sandboxes/{id}/exec). It is resent only on 429 rate_limited, which the server answers
// before running anything; any other failure returns as it came: running a command twice is
// not harmless. An outcome_unknown *berth.Error means the command may have run: the server's
// 504 (the exec reached the sandbox's host, its answer was lost), or no answer of Berth's
// after the request was sent (the connection broke or timed out, or a proxy answered
// 502/503/504 with its own page), or a 2xx whose body is not an exec result
// (berth.ParseExecResult: an empty body, null, {}, an exit_code that is not an integer),
// which is never read as exit code 0. A non-zero exit code is a result, not an error.
func (c *Client) Exec(ctx context.Context, id string, req berth.ExecRequest) (berth.ExecResult, error) {
	r, err := jsonRequest(http.MethodPost, sandboxPath(id)+"/exec", req, false)
	if err != nil {
		return berth.ExecResult{}, err
	}
	r.runsTwice = true
	resp, err := c.do(ctx, r)
	if err != nil {
		return berth.ExecResult{}, err
	}
	res, err := berth.ParseExecResult(resp.body)
	if err != nil {
		why := fmt.Sprintf("the answer (HTTP %d) is not an exec result", resp.status)
		return berth.ExecResult{}, outcomeUnknown(fmt.Errorf("berth: %s %s: %s: %w", r.method, r.path, why, err), why)
	}
	return res, nil
}

// WriteFile writes data to the absolute path inside a sandbox (PUT
// /v1/sandboxes/{id}/files?path=, raw bytes, 204), replacing the file. It is retried: writing
// the same bytes twice leaves the same file.
func (c *Client) WriteFile(ctx context.Context, id, path string, data []byte) error {
	if data == nil {
		data = []byte{}
	}
	r := request{
		method: http.MethodPut, path: sandboxPath(id) + "/files",
		query: url.Values{"path": {path}}, body: data,
		contentType: "application/octet-stream", idempotent: true,
	}
	return c.call(ctx, r, nil)
}

// ReadFile returns the content of the absolute path inside a sandbox (GET
// /v1/sandboxes/{id}/files?path=, raw bytes).
func (c *Client) ReadFile(ctx context.Context, id, path string) ([]byte, error) {
	r := request{
		method: http.MethodGet, path: sandboxPath(id) + "/files",
		query: url.Values{"path": {path}}, idempotent: true,
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	return resp.body, nil
}

// call runs r and decodes a JSON answer into out (nil: the body is ignored).
func (c *Client) call(ctx context.Context, r request, out any) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return decodeJSON(r, resp, out)
}

func sandboxPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) }
