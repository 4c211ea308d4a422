package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/berth-dev/berth"
)

// request is one API call as the retry loop sees it. body is kept as bytes so every attempt
// sends it again from the start.
type request struct {
	method      string
	path        string // escaped, starting with /v1
	query       url.Values
	body        []byte
	contentType string
	// idempotent calls are retried (SDK-1).
	idempotent bool
	// idempotencyKey, when set, is sent with the first-attempt time on every attempt (SDK-3).
	idempotencyKey string
}

// response is a 2xx answer, its body read in full.
type response struct {
	status int
	header http.Header
	body   []byte
}

// jsonRequest returns a request whose body is v encoded as JSON.
func jsonRequest(method, path string, v any, idempotent bool) (request, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return request{}, fmt.Errorf("client: encode %s %s body: %w", method, path, err)
	}
	return request{method: method, path: path, body: b, contentType: "application/json", idempotent: idempotent}, nil
}

// newIdempotencyKey returns 128 random bits in hex (API-4).
func newIdempotencyKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (it aborts the program instead)
	return hex.EncodeToString(b[:])
}

// do sends r, retrying it by the policy of SDK-1 (see the package doc) when r is idempotent.
// It returns the 2xx answer; a *berth.Error for any other answer it does not retry; a
// *CapacityUnavailable when the deadline leaves no room for the next wait; the transport
// error (wrapped) for a failure it does not retry; ctx.Err() (wrapped) when ctx ends.
func (c *Client) do(ctx context.Context, r request) (response, error) {
	start := c.clock.Now()
	deadline := start.Add(c.deadline)
	ctxDeadline, hasCtxDeadline := ctx.Deadline()
	var last *berth.Error
	prevImmediate := false
	for attempt := 0; ; attempt++ {
		resp, err := c.once(ctx, r, start, attempt+1)
		hint, hasHint := time.Duration(0), false
		switch {
		case err != nil && ctx.Err() != nil:
			return response{}, fmt.Errorf("client: %s %s: %w", r.method, r.path, ctx.Err())
		case err != nil:
			if !r.idempotent || !connectionFailure(err) {
				return response{}, fmt.Errorf("client: %s %s: %w", r.method, r.path, err)
			}
			last = &berth.Error{Code: berth.EUnavailable, Message: err.Error()}
		case resp.status >= 200 && resp.status < 300:
			return resp, nil
		default:
			now := c.clock.Now()
			e := decodeError(resp.status, resp.header, resp.body, now)
			if !r.idempotent || !retryableStatus(resp.status) {
				return response{}, e
			}
			last = e
			hint, hasHint = retryAfterHeader(resp.header, now)
		}

		// Honour the server's hint, except a second "at once" in a row (see package doc).
		var wait time.Duration
		immediate := hasHint && hint == 0
		if hasHint && !(immediate && prevImmediate) {
			wait = hint
		} else {
			wait = jitter(Backoff(attempt, c.base, c.cap), c.rand())
			immediate = false
		}
		prevImmediate = immediate

		// Never sleep past the deadline: if the wait would end beyond it, stop now. The
		// context's deadline is exclusive, since the context is already dead at that instant.
		now := c.clock.Now()
		end := now.Add(wait)
		if end.After(deadline) || (hasCtxDeadline && !end.Before(ctxDeadline)) {
			return response{}, &CapacityUnavailable{
				Elapsed: now.Sub(start), Attempts: attempt + 1, LastCode: last.Code, Last: last,
			}
		}
		if c.onRetry != nil {
			c.onRetry(Retry{Attempt: attempt + 1, Wait: wait, Last: last})
		}
		if err := c.clock.Sleep(ctx, wait); err != nil {
			return response{}, fmt.Errorf("client: %s %s: stopped waiting to retry after %s: %w",
				r.method, r.path, last.Code, err)
		}
	}
}

// once sends one attempt of r. first is the time of the call's first attempt.
func (c *Client) once(ctx context.Context, r request, first time.Time, attempt int) (response, error) {
	u := c.baseURL + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, u, body)
	if err != nil {
		return response{}, err
	}
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	if c.userAgent != "" {
		req.Header.Set("User-Agent", c.userAgent)
	}
	req.Header.Set("Accept", "application/json")
	if r.contentType != "" {
		req.Header.Set("Content-Type", r.contentType)
	}
	if r.idempotencyKey != "" {
		req.Header.Set(berth.HeaderIdempotencyKey, r.idempotencyKey)
		req.Header.Set(berth.HeaderFirstAttempt, first.UTC().Format(time.RFC3339Nano))
		req.Header.Set(berth.HeaderAttempt, strconv.Itoa(attempt))
	}
	res, err := c.http.Do(req)
	if err != nil {
		return response{}, err
	}
	defer res.Body.Close()
	var rd io.Reader = res.Body
	if res.StatusCode < 200 || res.StatusCode > 299 {
		rd = io.LimitReader(res.Body, maxErrorBody)
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		return response{}, err
	}
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// decodeJSON decodes a 2xx answer's body into v.
func decodeJSON(r request, resp response, v any) error {
	if err := json.Unmarshal(resp.body, v); err != nil {
		return fmt.Errorf("client: decode %s %s answer (HTTP %d): %w", r.method, r.path, resp.status, err)
	}
	return nil
}
