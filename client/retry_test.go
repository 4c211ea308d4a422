package client

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// A refused create is retried with the same Idempotency-Key and Berth-First-Attempt, and
// the same body (API-4, SDK-3).
func TestCreateRetrySendsTheSameKeyAndFirstAttempt(t *testing.T) {
	srv, s := newScripted(t, refusal(""), reply{status: 201, body: sandboxJSON})
	first := time.Date(2030, 1, 2, 4, 4, 5, 123456789, time.FixedZone("CET", 3600))
	clk := newFakeClock(first)
	c := New(srv.URL, "k", WithClock(clk), WithRand(half))
	sb, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python", TTLSeconds: 60})
	if err != nil {
		t.Fatalf("CreateSandbox: %v", err)
	}
	if diff := cmp.Diff(sandboxWant, sb); diff != "" {
		t.Errorf("sandbox (-want +got):\n%s", diff)
	}
	got := s.Seen()
	if len(got) != 2 {
		t.Fatalf("server saw %d requests, want 2", len(got))
	}
	key := got[0].Header.Get(berth.HeaderIdempotencyKey)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(key) {
		t.Errorf("Idempotency-Key %q, want 128 bits of hex", key)
	}
	for i, r := range got {
		if k := r.Header.Get(berth.HeaderIdempotencyKey); k != key {
			t.Errorf("attempt %d: Idempotency-Key %q, want %q", i, k, key)
		}
		if fa := r.Header.Get(berth.HeaderFirstAttempt); fa != "2030-01-02T03:04:05.123456789Z" {
			t.Errorf("attempt %d: %s %q, want the first attempt in UTC", i, berth.HeaderFirstAttempt, fa)
		}
		if r.Body != `{"template":"python","ttl_seconds":60}` {
			t.Errorf("attempt %d: body %s", i, r.Body)
		}
	}
	if diff := cmp.Diff([]time.Duration{DefaultBackoffBase / 2}, clk.Sleeps()); diff != "" {
		t.Errorf("sleeps (-want +got):\n%s", diff)
	}

	// A second call is a second create: a new key.
	if _, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"}); err != nil {
		t.Fatalf("second CreateSandbox: %v", err)
	}
	if k := s.Seen()[2].Header.Get(berth.HeaderIdempotencyKey); k == key || k == "" {
		t.Errorf("second call reused key %q", k)
	}
}

// Other 4xx/5xx answers return at once with the decoded *berth.Error.
func TestNonRetryableAnswersReturnAtOnce(t *testing.T) {
	tests := []struct {
		status int
		code   string
	}{
		{400, berth.EInvalidRequest},
		{401, berth.EUnauthorized},
		{403, berth.ETenantOverQuota},
		{404, berth.ETemplateNotFound},
		{409, berth.EConflict},
		{413, berth.ETooLarge},
		{429, berth.ENoCapacity}, // not in the retried set, whatever the code says
		{500, berth.EInternal},
	}
	for _, tt := range tests {
		t.Run(tt.code, func(t *testing.T) {
			srv, s := newScripted(t, reply{status: tt.status, body: errBody(tt.code, 0)}, reply{status: 201, body: sandboxJSON})
			clk := newFakeClock(time.Now())
			_, err := New(srv.URL, "k", WithClock(clk)).CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"})
			want := &berth.Error{Code: tt.code, Message: tt.code + " (test)"}
			var got *berth.Error
			if !errors.As(err, &got) {
				t.Fatalf("err = %v, want *berth.Error", err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if IsCapacityUnavailable(err) || len(s.Seen()) != 1 || len(clk.Sleeps()) != 0 {
				t.Errorf("retried: %d requests, sleeps %v, err %v", len(s.Seen()), clk.Sleeps(), err)
			}
		})
	}
}

// Out of patience: a distinct transient error carrying elapsed time, attempts and last code,
// found by errors.Is, errors.As and IsCapacityUnavailable, with the last *berth.Error inside.
func TestOutOfPatienceIsCapacityUnavailable(t *testing.T) {
	srv, s := newScripted(t, refusal("2"))
	clk := newFakeClock(time.Now())
	c := New(srv.URL, "k", WithClock(clk), WithDeadline(10*time.Second))
	_, err := c.CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"})

	if !errors.Is(err, ErrCapacityUnavailable) || !IsCapacityUnavailable(err) {
		t.Fatalf("err = %v, want ErrCapacityUnavailable", err)
	}
	var cu *CapacityUnavailable
	if !errors.As(err, &cu) {
		t.Fatalf("errors.As(%v) to *CapacityUnavailable failed", err)
	}
	last := &berth.Error{Code: berth.ENoCapacity, Message: "no_capacity (test)", RetryAfter: 2 * time.Second}
	want := &CapacityUnavailable{Elapsed: 10 * time.Second, Attempts: 6, LastCode: berth.ENoCapacity, Last: last, RetryAfter: 2 * time.Second}
	if diff := cmp.Diff(want, cu); diff != "" {
		t.Errorf("CapacityUnavailable (-want +got):\n%s", diff)
	}
	var be *berth.Error
	if !errors.As(err, &be) || be.Code != berth.ENoCapacity || berth.ErrorCode(err) != berth.ENoCapacity {
		t.Errorf("errors.As to *berth.Error: %v", be)
	}
	wantSleeps := []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second}
	if diff := cmp.Diff(wantSleeps, clk.Sleeps()); diff != "" {
		t.Errorf("sleeps (-want +got):\n%s", diff)
	}
	if len(s.Seen()) != 6 {
		t.Errorf("server saw %d requests, want 6", len(s.Seen()))
	}
}

// With jitter the waits grow within their windows and never add up past the deadline.
func TestJitteredRetriesStayInsideTheDeadline(t *testing.T) {
	srv, s := newScripted(t, reply{status: 504, body: "<html>gateway timeout</html>"})
	clk := newFakeClock(time.Now())
	c := New(srv.URL, "k", WithClock(clk), WithDeadline(3*time.Second))
	_, err := c.Templates(context.Background())
	var cu *CapacityUnavailable
	if !errors.As(err, &cu) || cu.LastCode != berth.EUnavailable {
		t.Fatalf("err = %v, want *CapacityUnavailable with last code unavailable", err)
	}
	var total time.Duration
	for i, d := range clk.Sleeps() {
		if w := Backoff(i, DefaultBackoffBase, DefaultBackoffCap); d < 0 || d >= w {
			t.Errorf("sleep %d = %v, want in [0, %v)", i, d, w)
		}
		total += d
	}
	if total > 3*time.Second || cu.Elapsed != total || cu.Attempts != len(s.Seen()) {
		t.Errorf("slept %v, got %+v after %d requests", total, cu, len(s.Seen()))
	}
}

// Exec, heartbeats, drain/undrain and tenant/key creation are sent exactly once.
func TestNonIdempotentCallsAreNotRetried(t *testing.T) {
	calls := map[string]func(*Client) error{
		"exec": func(c *Client) error {
			_, err := c.Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
			return err
		},
		"heartbeat": func(c *Client) error { return c.Heartbeat(context.Background(), berth.Heartbeat{AgentID: "a1"}) },
		"drain":     func(c *Client) error { return c.DrainAgent(context.Background(), "a1", "x") },
		"undrain":   func(c *Client) error { return c.UndrainAgent(context.Background(), "a1") },
		"tenant": func(c *Client) error {
			_, err := c.CreateTenant(context.Background(), "acme")
			return err
		},
		"key": func(c *Client) error {
			_, err := c.CreateAPIKey(context.Background(), "acme", berth.RoleTenant)
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			srv, s := newScripted(t, refusal("1"), reply{status: 200, body: "{}"})
			clk := newFakeClock(time.Now())
			err := call(New(srv.URL, "k", WithClock(clk)))
			var be *berth.Error
			if !errors.As(err, &be) || be.Code != berth.ENoCapacity || IsCapacityUnavailable(err) {
				t.Errorf("err = %v, want the no_capacity *berth.Error itself", err)
			}
			if len(s.Seen()) != 1 || len(clk.Sleeps()) != 0 {
				t.Errorf("retried: %d requests, sleeps %v", len(s.Seen()), clk.Sleeps())
			}
		})
	}
}

// An exec that may have reached the server and got no answer of Berth's — the server hung up
// after reading it, a proxy answered 503 with its own page, or a 200 carried no exec result
// (an empty body, null, {}, an exit_code missing or not an integer: berth.ParseExecResult) —
// is outcome_unknown, not retryable and not "unreachable" (so `berth sandbox exec` exits 1, not 3's "try again"),
// sent once; one that never left (connection refused) is still an unreachable transport error.
func TestExecWhoseAnswerIsLostIsOutcomeUnknown(t *testing.T) {
	exec := func(c *Client) error {
		_, err := c.Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
		return err
	}
	for name, r := range map[string]reply{
		"hang-up after the request": {hangup: true},
		"a proxy's 503 page":        {status: 503, body: "<html>no healthy upstream</html>"},
		"an empty 200":              {status: 200, body: ""},
		// A 200 whose JSON is not an exec result (berth.ParseExecResult) read as exit code 0.
		"a 200 null":                        {status: 200, body: "null"},
		"a 200 {}":                          {status: 200, body: "{}"},
		"a 200 []":                          {status: 200, body: "[]"},
		"a 200 with output, no exit_code":   {status: 200, body: `{"stdout":"hi"}`},
		"a 200 whose exit_code is a string": {status: 200, body: `{"exit_code":"0"}`},
		"a 200 whose exit_code is 1.5":      {status: 200, body: `{"exit_code":1.5}`},
		"a 200 with a byte order mark":      {status: 200, body: "\ufeff" + `{"exit_code":0}`},
		"a 200 holding NaN":                 {status: 200, body: `{"exit_code":0,"x":NaN}`},
	} {
		t.Run(name, func(t *testing.T) {
			srv, s := newScripted(t, r, reply{status: 200, body: `{"exit_code":0,"stdout":"","stderr":""}`})
			err := exec(New(srv.URL, "k"))
			var be *berth.Error
			if !errors.As(err, &be) || be.Code != berth.EOutcomeUnknown || be.Retryable() || IsUnreachable(err) ||
				!strings.Contains(err.Error(), "may have been done") {
				t.Errorf("err = %v, want outcome_unknown, not retryable, not unreachable", err)
			}
			if len(s.Seen()) != 1 {
				t.Errorf("sent %d times, want once", len(s.Seen()))
			}
		})
	}
	srv, _ := newScripted(t)
	srv.Close() // its port now refuses: nothing is sent
	err := exec(New(srv.URL, "k"))
	var te *TransportError
	if !errors.As(err, &te) || !IsUnreachable(err) || berth.ErrorCode(err) == berth.EOutcomeUnknown {
		t.Errorf("refused: err = %v, want an unreachable *TransportError", err)
	}
}

// A 429 rate_limited is answered before the server does anything (a tenant over its request
// rate, an exec over a bound of execs in flight), so even the calls sent exactly once are
// sent again after its Retry-After, with the same body; other refusals of them still return
// at once (TestNonIdempotentCallsAreNotRetried).
func TestRateLimitedIsRetriedForEveryCall(t *testing.T) {
	limited := reply{status: 429, header: map[string]string{"Retry-After": "1"}, body: errBody(berth.ERateLimited, 1)}
	srv, s := newScripted(t, limited, reply{status: 200, body: `{"exit_code":0,"stdout":"hi\n","stderr":""}`})
	clk := newFakeClock(time.Now())
	res, err := New(srv.URL, "k", WithClock(clk)).Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || res.Stdout != "hi\n" {
		t.Fatalf("Exec after a 429 rate_limited: %+v, %v; want the second answer", res, err)
	}
	got := s.Seen()
	if len(got) != 2 || got[0].Body != got[1].Body || got[0].Body != `{"cmd":["echo","hi"]}` {
		t.Errorf("requests %+v; want the same exec twice", got)
	}
	if diff := cmp.Diff([]time.Duration{time.Second}, clk.Sleeps()); diff != "" {
		t.Errorf("sleeps (-want +got):\n%s", diff)
	}
}

// Every idempotent call is retried on 502/503/504.
func TestIdempotentCallsAreRetried(t *testing.T) {
	ctx := context.Background()
	calls := map[string]struct {
		ok   reply
		call func(*Client) error
	}{
		"create": {reply{status: 201, body: sandboxJSON}, func(c *Client) error {
			_, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "python"})
			return err
		}},
		"get": {reply{status: 200, body: sandboxJSON}, func(c *Client) error { _, err := c.Sandbox(ctx, "sb-1"); return err }},
		"list": {reply{status: 200, body: `{"sandboxes":[]}`}, func(c *Client) error {
			_, err := c.Sandboxes(ctx, "")
			return err
		}},
		"delete":    {reply{status: 204}, func(c *Client) error { return c.DeleteSandbox(ctx, "sb-1") }},
		"writefile": {reply{status: 204}, func(c *Client) error { return c.WriteFile(ctx, "sb-1", "/a", []byte("x")) }},
		"readfile":  {reply{status: 200, body: "x"}, func(c *Client) error { _, err := c.ReadFile(ctx, "sb-1", "/a"); return err }},
		"templates": {reply{status: 200, body: `{"templates":[]}`}, func(c *Client) error { _, err := c.Templates(ctx); return err }},
		"agents":    {reply{status: 200, body: `{"agents":[]}`}, func(c *Client) error { _, err := c.Agents(ctx); return err }},
		"events":    {reply{status: 200, body: `{"events":[]}`}, func(c *Client) error { _, err := c.Events(ctx, ""); return err }},
	}
	for name, tc := range calls {
		for _, status := range []int{502, 503, 504} {
			t.Run(name+"/"+http.StatusText(status), func(t *testing.T) {
				srv, s := newScripted(t, reply{status: status, body: "busy"}, tc.ok)
				clk := newFakeClock(time.Now())
				if err := tc.call(New(srv.URL, "k", WithClock(clk))); err != nil {
					t.Fatalf("err = %v, want success after one retry", err)
				}
				if len(s.Seen()) != 2 || len(clk.Sleeps()) != 1 {
					t.Errorf("%d requests, sleeps %v; want 2 and one", len(s.Seen()), clk.Sleeps())
				}
			})
		}
	}
}

// refusingTransport dials a closed port (a real ECONNREFUSED) for the first `refuse` dials,
// then the real server.
func refusingTransport(t *testing.T, serverAddr string, refuse int32, dials *atomic.Int32) *http.Client {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			if dials.Add(1) <= refuse {
				return d.DialContext(ctx, network, closed)
			}
			return d.DialContext(ctx, network, serverAddr)
		},
	}}
}

func TestConnectionRefusedIsRetriedOnlyForIdempotentCalls(t *testing.T) {
	srv, s := newScripted(t, reply{status: 200, body: sandboxJSON})
	addr := srv.Listener.Addr().String()

	t.Run("GET retried", func(t *testing.T) {
		var dials atomic.Int32
		clk := newFakeClock(time.Now())
		c := New(srv.URL, "k", WithClock(clk), WithRand(half), WithHTTPClient(refusingTransport(t, addr, 1, &dials)))
		sb, err := c.Sandbox(context.Background(), "sb-1")
		if err != nil {
			t.Fatalf("Sandbox: %v", err)
		}
		if sb.ID != "sb-1" || dials.Load() != 2 || len(clk.Sleeps()) != 1 {
			t.Errorf("sandbox %q, %d dials, sleeps %v; want sb-1, 2, one", sb.ID, dials.Load(), clk.Sleeps())
		}
	})

	t.Run("GET out of patience: last code unavailable", func(t *testing.T) {
		var dials atomic.Int32
		clk := newFakeClock(time.Now())
		c := New(srv.URL, "k", WithClock(clk), WithRand(half), WithDeadline(time.Second),
			WithHTTPClient(refusingTransport(t, addr, 1<<30, &dials)))
		_, err := c.Sandbox(context.Background(), "sb-1")
		var cu *CapacityUnavailable
		if !errors.As(err, &cu) {
			t.Fatalf("err = %v, want *CapacityUnavailable", err)
		}
		// waits 0.125 + 0.25 + 0.5 s; the fourth (1 s) would end past the 1 s deadline
		if cu.LastCode != berth.EUnavailable || cu.Attempts != 4 || cu.Elapsed != 875*time.Millisecond {
			t.Errorf("got %+v, want last code unavailable after 4 attempts in 875ms", cu)
		}
	})

	t.Run("exec not retried", func(t *testing.T) {
		var dials atomic.Int32
		clk := newFakeClock(time.Now())
		before := len(s.Seen())
		c := New(srv.URL, "k", WithClock(clk), WithHTTPClient(refusingTransport(t, addr, 1, &dials)))
		_, err := c.Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
		if !errors.Is(err, syscall.ECONNREFUSED) || IsCapacityUnavailable(err) {
			t.Errorf("err = %v, want the connection refusal itself", err)
		}
		if dials.Load() != 1 || len(s.Seen()) != before {
			t.Errorf("%d dials, %d new requests; want 1 and 0", dials.Load(), len(s.Seen())-before)
		}
	})
}

// A server that hangs up before answering (EOF before a response) is retried for a GET,
// not for an exec.
func TestHangupBeforeResponse(t *testing.T) {
	srv, s := newScripted(t, reply{hangup: true}, reply{status: 200, body: sandboxJSON})
	clk := newFakeClock(time.Now())
	if _, err := New(srv.URL, "k", WithClock(clk)).Sandbox(context.Background(), "sb-1"); err != nil {
		t.Fatalf("Sandbox: %v", err)
	}
	if len(s.Seen()) != 2 || len(clk.Sleeps()) != 1 {
		t.Errorf("%d requests, sleeps %v; want 2 and one", len(s.Seen()), clk.Sleeps())
	}

	srv, s = newScripted(t, reply{hangup: true}, reply{status: 200, body: `{"exit_code":0}`})
	clk = newFakeClock(time.Now())
	if _, err := New(srv.URL, "k", WithClock(clk)).Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}}); err == nil {
		t.Errorf("Exec after a hangup succeeded, want the transport error")
	}
	if len(s.Seen()) != 1 {
		t.Errorf("exec sent %d times, want 1", len(s.Seen()))
	}
}

// Cancelling the context stops a wait at once, with the real clock: a 30 s Retry-After is
// never slept out. (If it were, the test would hang, not pass.)
func TestCancelStopsWaiting(t *testing.T) {
	srv, s := newScripted(t, refusal("30"))
	clk := &signalClock{sleeping: make(chan time.Duration, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-clk.sleeping
		cancel()
	}()
	_, err := New(srv.URL, "k", WithClock(clk)).Sandbox(ctx, "sb-1")
	if !errors.Is(err, context.Canceled) || IsCapacityUnavailable(err) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if !errors.Is(clk.err, context.Canceled) {
		t.Errorf("the wait ended with %v, want context.Canceled", clk.err)
	}
	if len(s.Seen()) != 1 {
		t.Errorf("server saw %d requests, want 1", len(s.Seen()))
	}
}

// signalClock is the real clock that reports each sleep as it begins.
type signalClock struct {
	systemClock
	sleeping chan time.Duration
	err      error // what the last Sleep returned
}

func (c *signalClock) Sleep(ctx context.Context, d time.Duration) error {
	c.sleeping <- d
	c.err = c.systemClock.Sleep(ctx, d)
	return c.err
}

// A context deadline earlier than the overall deadline is the one that counts.
func TestContextDeadlineBoundsTheWait(t *testing.T) {
	srv, s := newScripted(t, refusal("120"))
	clk := newFakeClock(time.Now())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := New(srv.URL, "k", WithClock(clk), WithDeadline(time.Hour)).Sandbox(ctx, "sb-1")
	if !IsCapacityUnavailable(err) {
		t.Errorf("err = %v, want CapacityUnavailable", err)
	}
	if len(s.Seen()) != 1 || len(clk.Sleeps()) != 0 {
		t.Errorf("%d requests, sleeps %v; want 1 and none", len(s.Seen()), clk.Sleeps())
	}
}

func TestSystemClockSleepStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	go cancel()
	if err := (systemClock{}).Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Sleep = %v, want context.Canceled", err)
	}
	if err := (systemClock{}).Sleep(context.Background(), 0); err != nil {
		t.Errorf("Sleep(0) = %v, want nil", err)
	}
}

func TestConnectionFailure(t *testing.T) {
	dnsErr := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "berth.invalid"}}
	readTimeout := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"EOF before a response", &url.Error{Op: "Get", URL: "u", Err: io.EOF}, true},
		{"truncated body", io.ErrUnexpectedEOF, true},
		{"refused", &url.Error{Op: "Get", URL: "u", Err: &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, true},
		{"reset", &url.Error{Op: "Put", URL: "u", Err: &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}}, true},
		{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
		{"dial error of any kind", &url.Error{Op: "Get", URL: "u", Err: dnsErr}, true},
		{"server closed idle connection", &url.Error{Op: "Delete", URL: "u", Err: errors.New("http: server closed idle connection")}, true},
		{"read timeout", &url.Error{Op: "Get", URL: "u", Err: readTimeout}, false},
		{"bad URL", &url.Error{Op: "parse", URL: "::", Err: errors.New("missing protocol scheme")}, false},
		{"TLS", errors.New("tls: failed to verify certificate"), false},
	}
	for _, tt := range tests {
		if got := connectionFailure(tt.err); got != tt.want {
			t.Errorf("%s: connectionFailure(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestRetryNotifyAndUnavailableMessage: the notify hook sees every wait, and giving up on an
// unreachable server says "server unavailable", not "capacity unavailable".
func TestRetryNotifyAndUnavailableMessage(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there any more: every attempt is a connection failure
	clk := newFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	var seen []Retry
	c := New(url, "k", WithClock(clk), WithRand(half), WithDeadline(3*time.Second),
		WithRetryNotify(func(r Retry) { seen = append(seen, r) }))
	_, err := c.Templates(context.Background())
	var cu *CapacityUnavailable
	if !errors.As(err, &cu) || cu.LastCode != berth.EUnavailable {
		t.Fatalf("err = %v, want CapacityUnavailable with last code unavailable", err)
	}
	if !strings.Contains(err.Error(), "server unavailable") {
		t.Fatalf("message %q should say the server was unavailable", err)
	}
	if len(seen) != cu.Attempts-1 || len(seen) == 0 {
		t.Fatalf("notify saw %d waits for %d attempts", len(seen), cu.Attempts)
	}
	for i, r := range seen {
		if r.Attempt != i+1 || r.Last == nil || r.Last.Code != berth.EUnavailable || r.Wait <= 0 {
			t.Fatalf("notify %d = %+v", i, r)
		}
	}
}

// App creates and deploys are keyed like sandbox creates (API-4, C26): a refused attempt is
// retried with the same Idempotency-Key and body, and each call has its own key.
func TestAppCallsRetryWithOneKey(t *testing.T) {
	calls := map[string]func(*Client) error{
		"create": func(c *Client) error {
			_, err := c.CreateApp(context.Background(), berth.AppRequest{Name: "web"})
			return err
		},
		"deploy": func(c *Client) error {
			_, err := c.DeployApp(context.Background(), "web", berth.AppSpec{Template: "python"})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			srv, s := newScripted(t, refusal("1"), reply{status: 201, body: `{"name":"web"}`},
				reply{status: 201, body: `{"name":"web"}`})
			c := New(srv.URL, "k", WithClock(newFakeClock(time.Now())))
			if err := call(c); err != nil {
				t.Fatal(err)
			}
			if err := call(c); err != nil {
				t.Fatal(err)
			}
			seen := s.Seen()
			if len(seen) != 3 {
				t.Fatalf("server saw %d requests, want 3 (a refusal, its retry, a second call)", len(seen))
			}
			k0, k1, k2 := seen[0].Header.Get(berth.HeaderIdempotencyKey), seen[1].Header.Get(berth.HeaderIdempotencyKey),
				seen[2].Header.Get(berth.HeaderIdempotencyKey)
			if k0 == "" || k1 != k0 || seen[1].Body != seen[0].Body {
				t.Errorf("retry sent key %q and body %s; want the first attempt's %q and %s", k1, seen[1].Body, k0, seen[0].Body)
			}
			if k2 == "" || k2 == k0 {
				t.Errorf("a second call sent key %q; want a new one (first %q)", k2, k0)
			}
		})
	}
}

// A server's own bytes cannot pass for net/http's "server closed idle connection" (which means
// nothing was sent): an exec the server read and answered with that text as a malformed header
// line is outcome_unknown, not an unreachable server (found by an attack: the CLI exited 3).
func TestExecAnsweredWithForgedTransportTextIsOutcomeUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var read atomic.Int32
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		req, err := http.ReadRequest(bufio.NewReader(conn))
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		read.Add(1)
		_, _ = io.WriteString(conn, "HTTP/1.1 200 OK\r\nserver closed idle connection\r\n\r\n")
	}()
	_, err = New("http://"+ln.Addr().String(), "k").Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
	if berth.ErrorCode(err) != berth.EOutcomeUnknown || IsUnreachable(err) {
		t.Errorf("err = %v, want outcome_unknown, not unreachable (the server read %d exec)", err, read.Load())
	}
	// netfail's own test holds that net/http's real error is still told as not sent.
}

// An exec through an HTTP proxy that refuses the connection was never sent: it is the
// unreachable transport error (the CLI's exit 3), not outcome_unknown (found by an attack).
func TestExecThroughADownProxyIsNotSent(t *testing.T) {
	srv, s := newScripted(t, reply{status: 200, body: `{"exit_code":0}`})
	proxy, _ := newScripted(t)
	proxy.Close() // the proxy's port now refuses
	pu, _ := url.Parse(proxy.URL)
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	_, err := New(srv.URL, "k", WithHTTPClient(hc)).Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
	var te *TransportError
	if !errors.As(err, &te) || !IsUnreachable(err) || berth.ErrorCode(err) == berth.EOutcomeUnknown {
		t.Errorf("err = %v, want an unreachable *TransportError", err)
	}
	if n := len(s.Seen()); n != 0 {
		t.Errorf("the server saw %d requests through a proxy that was down", n)
	}
}
