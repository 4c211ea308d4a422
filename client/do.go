package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/netfail"
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
	// runsTwice marks a call that, sent twice, does its work twice (exec: the command runs
	// again). When it may have reached Berth and no answer of Berth's came back, its error is
	// outcome_unknown, never a retryable one (outcomeUnknown).
	runsTwice bool
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
		return request{}, fmt.Errorf("berth: encode %s %s body: %w", method, path, err)
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
// *CapacityUnavailable when the next wait (the server's Retry-After, or jitter) would end
// past the deadline — at once, without sleeping, when a Retry-After of any size does (C30);
// a *TransportError for a request that got no answer and is not retried; ctx.Err()
// (wrapped) when ctx ends.
func (c *Client) do(ctx context.Context, r request) (response, error) {
	if c.setupErr != nil {
		return response{}, c.setupErr
	}
	start := c.clock.Now()
	deadline := start.Add(c.deadline)
	ctxDeadline, hasCtxDeadline := ctx.Deadline()
	var last *berth.Error
	prevImmediate := false
	for attempt := 0; ; attempt++ {
		resp, err := c.once(ctx, r, start, attempt+1)
		hint, hasHint := time.Duration(0), false
		var noAnswer *TransportError
		switch {
		case err != nil && ctx.Err() != nil:
			return response{}, fmt.Errorf("berth: %s %s: %w", r.method, r.path, ctx.Err())
		case err != nil:
			noAnswer = &TransportError{Method: r.method, Path: r.path, Server: c.baseURL, Err: err}
			var cut *attemptTimeoutError
			if r.runsTwice && !netfail.NothingSent(err) {
				return response{}, outcomeUnknown(noAnswer, noAnswer.Reason())
			}
			if !r.idempotent || !(connectionFailure(err) || errors.As(err, &cut)) {
				return response{}, noAnswer
			}
			last = &berth.Error{Code: berth.EUnavailable,
				Message: fmt.Sprintf("no answer from %s: %s", c.baseURL, noAnswer.Reason())}
		case resp.status >= 200 && resp.status < 300:
			return resp, nil
		default:
			now := c.clock.Now()
			e := decodeError(resp.status, resp.header, resp.body, now)
			// A 429 is retried only as rate_limited (issue 15: a tenant over its request
			// rate, or an exec over a bound of execs in flight, with Retry-After); any other
			// 429 returns at once. The server refuses it before doing anything, so it is
			// retried for any call, idempotent or not.
			rateLimited := resp.status == http.StatusTooManyRequests && e.Code == berth.ERateLimited
			if r.runsTwice && retryableStatus(resp.status) {
				if _, berths := berth.ParseErrorBody(resp.body); !berths {
					// A proxy's 502/503/504 page: whether Berth got the call is unknown.
					return response{}, outcomeUnknown(e, e.Message)
				}
			}
			if !rateLimited && !(r.idempotent && retryableStatus(resp.status)) {
				return response{}, e
			}
			last = e
			hint, hasHint = retryAfterHeader(resp.header, now)
		}

		// Honour the server's hint, except a second "at once" in a row (see package doc).
		var wait time.Duration
		immediate := hasHint && hint == 0
		fromHint := hasHint && !(immediate && prevImmediate)
		if fromHint {
			wait = hint
		} else {
			wait = jitter(Backoff(attempt, c.base, c.cap), c.rand())
			immediate = false
		}
		prevImmediate = immediate

		// Never sleep past the deadline: if the wait would end beyond it, stop now. The
		// context's deadline is exclusive, since the context is already dead at that instant.
		// Compared as durations, so a hint of any size (up to maxRetryAfter) cannot overflow.
		now := c.clock.Now()
		if wait > deadline.Sub(now) || (hasCtxDeadline && wait >= ctxDeadline.Sub(now)) {
			cu := &CapacityUnavailable{
				Elapsed: now.Sub(start), Attempts: attempt + 1, LastCode: last.Code, Last: last, RetryAfter: hint,
			}
			if noAnswer != nil {
				cu.Err = noAnswer
			}
			return response{}, cu
		}
		if c.onRetry != nil {
			rt := Retry{Attempt: attempt + 1, Wait: wait, Last: last, FromRetryAfter: fromHint}
			if noAnswer != nil {
				rt.Err = noAnswer
			}
			c.onRetry(rt)
		}
		if err := c.clock.Sleep(ctx, wait); err != nil {
			return response{}, fmt.Errorf("berth: %s %s: stopped waiting to retry after %s: %w",
				r.method, r.path, last.Code, err)
		}
	}
}

// once sends one attempt of r, bounded by attemptTimeout(r) from sending the request to the
// last byte of the answer, which it reads in full before that bound is released (C28). An
// attempt cut by the bound fails with an *attemptTimeoutError; one cut by ctx, with ctx's
// error. first is the time of the call's first attempt.
func (c *Client) once(ctx context.Context, r request, first time.Time, attempt int) (response, error) {
	within := c.attemptTimeout(r)
	actx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	// cut names what ended an attempt that failed: its own bound when ctx is still live.
	cut := func(err error) error {
		if ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			return &attemptTimeoutError{within: within, err: err}
		}
		return err
	}
	u := c.baseURL + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(actx, r.method, u, body)
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
		return response{}, cut(err)
	}
	defer res.Body.Close()
	limit := int64(maxErrorBody)
	if res.StatusCode >= 200 && res.StatusCode <= 299 {
		limit = maxAnswerBody + 1
	}
	// Read the whole body here, while actx lives: cancelling it (the deferred cancel) cuts
	// whatever of the body is still unread.
	b, err := io.ReadAll(io.LimitReader(res.Body, limit))
	if err != nil {
		return response{}, cut(err)
	}
	if int64(len(b)) > maxAnswerBody {
		return response{}, fmt.Errorf("the answer is larger than %d MiB, more than any Berth answer: not a Berth server, or a broken one", maxAnswerBody>>20)
	}
	return response{status: res.StatusCode, header: res.Header, body: b}, nil
}

// Per-attempt bounds of the calls that take longer than an ordinary one (C28). Each is the
// server's own bound on that work, plus attemptMargin for the server's own steps and the
// network, so the server answers (or gives up) before the client stops listening.
const (
	attemptMargin = 30 * time.Second
	// defaultExecS is the server's timeout_s for an exec that sends none; maxExecS its largest.
	defaultExecS, maxExecS = 60, 3600
	// transferAttempt bounds a file read or write and a pause: the server gives the agent 10
	// minutes to move a file (up to 64 MiB) or to checkpoint and upload a sandbox
	// (PauseTimeout's default).
	transferAttempt = 10*time.Minute + attemptMargin
	// placementAttempt bounds a create and a resume: the server tries up to 3 hosts
	// (MaxHostsPerCreate) for 30 s each (AgentTimeout) by default.
	placementAttempt = 3*30*time.Second + attemptMargin
	// maxEvacuate is the largest deadline_in_ms the server takes: a day.
	maxEvacuate = 24 * time.Hour
)

// attemptTimeout returns how long one attempt of r may take (C28): the client's attempt
// timeout (WithAttemptTimeout, default 60 s), or the call's own bound when that is longer —
//   - exec: its timeout_s (60 when absent) + 30 s;
//   - an agent's evacuation plan: its deadline_in_ms (berth.DefaultEvacuateWindow when
//     absent) + 30 s;
//   - file read and write, pause: 10 min + 30 s;
//   - create and resume: 2 min.
//
// A body that does not decode counts as one without the field (the server refuses it anyway).
func (c *Client) attemptTimeout(r request) time.Duration {
	var own time.Duration
	sandboxCall := func(method, verb string) bool {
		return r.method == method && strings.HasPrefix(r.path, "/v1/sandboxes/") && strings.HasSuffix(r.path, "/"+verb)
	}
	switch {
	case sandboxCall(http.MethodPost, "exec"):
		var b struct {
			TimeoutS int `json:"timeout_s"`
		}
		_ = json.Unmarshal(r.body, &b)
		s := b.TimeoutS
		if s <= 0 {
			s = defaultExecS
		}
		own = time.Duration(min(s, maxExecS))*time.Second + attemptMargin
	case r.method == http.MethodPost && strings.HasPrefix(r.path, "/v1/agents/") && strings.HasSuffix(r.path, "/evacuate"):
		var b struct {
			DeadlineInMS int64 `json:"deadline_in_ms"`
		}
		_ = json.Unmarshal(r.body, &b)
		window := berth.DefaultEvacuateWindow
		if b.DeadlineInMS > 0 {
			window = time.Duration(min(b.DeadlineInMS, maxEvacuate.Milliseconds())) * time.Millisecond
		}
		own = window + attemptMargin
	case sandboxCall(http.MethodPut, "files"), sandboxCall(http.MethodGet, "files"), sandboxCall(http.MethodPost, "pause"):
		own = transferAttempt
	case r.method == http.MethodPost && r.path == "/v1/sandboxes", sandboxCall(http.MethodPost, "resume"):
		own = placementAttempt
	}
	return max(c.attempt, own)
}

// attemptTimeoutError is the failure of an attempt its per-attempt bound cut (C28): the
// server did not answer — status, headers and the whole body — within that time. It is a
// transport failure: SDK-1 retries it for idempotent calls; others return it inside a
// *TransportError. It is a timeout (net.Error), so IsUnreachable reports it.
type attemptTimeoutError struct {
	within time.Duration
	err    error // what net/http returned, wrapping context.DeadlineExceeded
}

func (e *attemptTimeoutError) Error() string {
	return fmt.Sprintf("timed out after %s", e.within)
}

func (e *attemptTimeoutError) Unwrap() error { return e.err }

// Timeout and Temporary make it a net.Error that timed out.
func (e *attemptTimeoutError) Timeout() bool   { return true }
func (e *attemptTimeoutError) Temporary() bool { return true }

// decodeJSON decodes a 2xx answer's body into v.
func decodeJSON(r request, resp response, v any) error {
	if err := json.Unmarshal(resp.body, v); err != nil {
		// Exec, the one call that runs twice, reads its answer with berth.ParseExecResult
		// (outcome_unknown for anything that is not a result), not here.
		return fmt.Errorf("berth: %s %s: the answer (HTTP %d) is not the JSON Berth sends: %s",
			r.method, r.path, resp.status, strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}
