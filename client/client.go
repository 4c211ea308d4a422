package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/tlsconf"
)

// Defaults of the retry policy (SDK-1).
const (
	DefaultDeadline    = 90 * time.Second
	DefaultBackoffBase = berth.BackoffBase
	DefaultBackoffCap  = berth.BackoffCap
	DefaultUserAgent   = "berth-go-client/1"
)

// DefaultAttemptTimeout bounds one attempt of an ordinary call, from sending the request to
// the last byte of the answer (C28; WithAttemptTimeout). Calls whose own work is longer get
// their own bound instead: see "Per-attempt deadline" in the package doc.
const DefaultAttemptTimeout = 60 * time.Second

// Clock is the client's source of time: Now for the first-attempt stamp and the deadline,
// Sleep for the waits between attempts. Sleep returns early with a non-nil error (normally
// ctx.Err()) when ctx is done. Tests inject a fake so nothing really sleeps.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration) error
}

// systemClock is the real clock.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Client calls one Berth server. Create it with New; it is safe for concurrent use as long
// as the Clock and random source given to it are.
type Client struct {
	baseURL   string
	key       string
	http      *http.Client
	deadline  time.Duration
	attempt   time.Duration // one attempt of an ordinary call (C28); see attemptTimeout
	base, cap time.Duration
	clock     Clock
	rand      func() float64
	userAgent string
	onRetry   func(Retry)
	caFile    string
	// setupErr is an option that could not be applied (WithCAFile's file): every call
	// returns it without sending anything.
	setupErr error
}

// Retry describes a retry the client is about to wait for: the attempt that was refused
// (1-based), how long it will wait and why that long, and the refusal (or connection
// failure, as code "unavailable").
type Retry struct {
	Attempt int
	Wait    time.Duration
	// FromRetryAfter is true when Wait is the server's Retry-After, false when it is full
	// jitter (SDK-1).
	FromRetryAfter bool
	Last           *berth.Error
	// Err is the *TransportError when the attempt got no answer; nil when the server answered.
	Err error
}

// WithRetryNotify calls f before every wait between attempts, so a caller (the CLI, a log)
// can say what is happening instead of going silent for up to the deadline.
func WithRetryNotify(f func(Retry)) Option {
	return func(c *Client) { c.onRetry = f }
}

// Option configures a Client.
type Option func(*Client)

// New returns a client for the server at baseURL (e.g. "http://127.0.0.1:7070", with or
// without a trailing slash) that authenticates every request with "Authorization: Bearer
// <key>": a tenant or admin API key, or an agent's node token for Heartbeat.
func New(baseURL, key string, opts ...Option) *Client {
	c := &Client{
		baseURL:   strings.TrimRight(baseURL, "/"),
		key:       key,
		http:      http.DefaultClient,
		deadline:  DefaultDeadline,
		attempt:   DefaultAttemptTimeout,
		base:      DefaultBackoffBase,
		cap:       DefaultBackoffCap,
		clock:     systemClock{},
		rand:      rand.Float64,
		userAgent: DefaultUserAgent,
	}
	for _, o := range opts {
		o(c)
	}
	if c.caFile != "" {
		c.setupErr = c.trustCA()
	}
	return c
}

// WithCAFile makes the client trust only the CA certificates in the PEM file at path when it
// verifies an https:// server (a private CA, such as the one `berth server --tls-cert` was
// issued by), instead of the system's roots (issue 15, point 2). It applies to the
// http.Client's Transport when that is an *http.Transport (the default is), in a copy whose
// InsecureSkipVerify is off; the file is read once, by New. When the file cannot be read or
// holds no certificate, the server URL is http://, or the Transport is another RoundTripper
// or dials TLS itself (DialTLSContext), every call returns a *berth.Error with code
// invalid_request naming the problem, and nothing is sent: a key never leaves under a trust
// the caller did not ask for.
func WithCAFile(path string) Option {
	return func(c *Client) { c.caFile = path }
}

// trustCA installs WithCAFile's pool in a copy of the client's transport, keeping any other
// TLS setting the caller gave it.
func (c *Client) trustCA() error {
	if u, err := url.Parse(c.baseURL); err != nil || u.Scheme != "https" { // url.Parse lower-cases the scheme
		return berth.Errorf(berth.EInvalidRequest, "client CA %s given for %s: a CA is for an https:// server; over anything else the key would cross in clear", c.caFile, c.baseURL)
	}
	pool, err := tlsconf.CAPool(c.caFile)
	if err != nil {
		return berth.Wrap(berth.EInvalidRequest, err, "client CA")
	}
	t := c.http.Transport
	if t == nil {
		t = http.DefaultTransport
	}
	ht, ok := t.(*http.Transport)
	if !ok {
		return berth.Errorf(berth.EInvalidRequest, "client CA %s: the http.Client's Transport is a %T, not an *http.Transport: set its TLS configuration there", c.caFile, t)
	}
	if ht.DialTLSContext != nil || ht.DialTLS != nil {
		return berth.Errorf(berth.EInvalidRequest, "client CA %s: the http.Transport dials TLS itself (DialTLSContext), so its TLS configuration is not used: verify the CA there", c.caFile)
	}
	ht = ht.Clone()
	cfg := &tls.Config{MinVersion: tlsconf.MinVersion}
	if ht.TLSClientConfig != nil {
		cfg = ht.TLSClientConfig.Clone()
	}
	cfg.RootCAs, cfg.InsecureSkipVerify = pool, false
	ht.TLSClientConfig = cfg
	h := *c.http
	h.Transport = ht
	c.http = &h
	return nil
}

// WithHTTPClient sets the http.Client used for every request (nil keeps
// http.DefaultClient). Its Timeout, if any, bounds each single attempt.
func WithHTTPClient(h *http.Client) Option {
	return func(c *Client) {
		if h != nil {
			c.http = h
		}
	}
}

// WithDeadline sets the overall deadline of a retried call, measured from its first attempt
// (SDK-1, default 90 s). A non-positive d keeps the default.
func WithDeadline(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.deadline = d
		}
	}
}

// WithAttemptTimeout sets how long one attempt of an ordinary call may take, from sending the
// request to the last byte of the answer (C28, default 60 s). An attempt that runs out is a
// transport failure: an idempotent call retries it within the overall deadline (SDK-1), any
// other returns a *TransportError. Exec, file, pause, resume, create and evacuation calls
// get their own longer bound when it is longer than d (see the package doc). A non-positive
// d keeps the default.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *Client) {
		if d > 0 {
			c.attempt = d
		}
	}
}

// WithBackoff sets the full-jitter base and cap (SDK-1, default 0.25 s and 8 s). A
// non-positive value keeps its default; a base above the cap is lowered to the cap.
func WithBackoff(base, cap time.Duration) Option {
	return func(c *Client) {
		if base > 0 {
			c.base = base
		}
		if cap > 0 {
			c.cap = cap
		}
	}
}

// WithClock replaces the real clock (nil keeps it). Note that a context deadline is always
// real time and is compared against this clock's Now.
func WithClock(clk Clock) Option {
	return func(c *Client) {
		if clk != nil {
			c.clock = clk
		}
	}
}

// WithRand sets the uniform [0,1) source of the jitter (nil keeps math/rand/v2's Float64).
// It must be safe for concurrent use if the client is shared.
func WithRand(f func() float64) Option {
	return func(c *Client) {
		if f != nil {
			c.rand = f
		}
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua }
}

// maxErrorBody bounds how much of a non-2xx body is read (a proxy's page can be large).
const maxErrorBody = 1 << 20

// maxAnswerBody bounds how much of a success body is read, in bytes (128 MiB): twice the
// largest file the files API moves (64 MiB), far above any list. A server that sends more
// (hostile, or not Berth) fails the call, not the process's memory.
const maxAnswerBody = 128 << 20

// plaintextToTLS is what net/http's TLS server answers (400) to a request sent in clear.
const plaintextToTLS = "Client sent an HTTP request to an HTTPS server"

// decodeError turns a non-2xx answer into a *berth.Error (API-2). A body that is not a
// berth.ErrorBody (a proxy's HTML page, say) yields code "unavailable" for 502/503/504 and
// "internal" otherwise, with the status in the message; net/http's answer to a plaintext
// request at a TLS port is invalid_request saying to use https://. RetryAfter comes from the body's
// retry_after_s, or else from the Retry-After header read against now.
func decodeError(status int, h http.Header, body []byte, now time.Time) *berth.Error {
	if eb, ok := berth.ParseErrorBody(body); ok {
		e := &berth.Error{Code: eb.Error.Code, Message: eb.Error.Message, Hosts: eb.Error.Hosts}
		if eb.Error.RetryAfterS > 0 {
			e.RetryAfter = seconds(int64(eb.Error.RetryAfterS))
		} else if d, ok := retryAfterHeader(h, now); ok {
			e.RetryAfter = d
		}
		return e
	}
	if status == http.StatusBadRequest && bytes.Contains(body, []byte(plaintextToTLS)) {
		return berth.Errorf(berth.EInvalidRequest, "the server speaks HTTPS and this request went in clear: use an https:// URL")
	}
	code := berth.EInternal
	if retryableStatus(status) {
		code = berth.EUnavailable
	}
	msg := fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	if snippet := strings.TrimSpace(string(body)); snippet != "" {
		if len(snippet) > 200 {
			snippet = snippet[:200] + "…"
		}
		msg += ": " + strings.Join(strings.Fields(snippet), " ")
	}
	e := &berth.Error{Code: code, Message: msg}
	if d, ok := retryAfterHeader(h, now); ok {
		e.RetryAfter = d
	}
	return e
}

// retryableStatus reports whether an HTTP status is one SDK-1 retries.
func retryableStatus(status int) bool {
	switch status {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
