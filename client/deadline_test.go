package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/blackhole"
)

// guard bounds a call that must end by its own deadline: if the SDK waited forever, the call
// ends with this context's error after 10 s and the test fails instead of hanging.
func guard(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// cutAfter checks that err says an attempt got no answer within d: a *TransportError whose
// cause is the per-attempt deadline (not the caller's context) and that IsUnreachable
// reports, as the CLI's exit code needs.
func cutAfter(t *testing.T, err error, d time.Duration) {
	t.Helper()
	var te *TransportError
	var at *attemptTimeoutError
	switch {
	case !errors.As(err, &te):
		t.Fatalf("err = %v (%T), want a *TransportError", err, err)
	case !errors.As(te, &at) || at.within != d:
		t.Errorf("transport error %v: want the per-attempt deadline of %s as its cause", te, d)
	case !IsUnreachable(err):
		t.Errorf("IsUnreachable(%v) = false, want true", err)
	case !strings.Contains(te.Error(), "no answer from "+te.Server+": timed out after "+d.String()):
		t.Errorf("message %q does not say the server gave no answer", te.Error())
	}
}

// TestCase_C28_HungServerIdempotentCall: a GET to a server that accepts and never answers
// is cut by the per-attempt deadline, retried by SDK-1, and given up with
// *CapacityUnavailable (code unavailable, the last attempt's transport error inside) once
// the next wait would end past the overall deadline — instead of waiting forever.
func TestCase_C28_HungServerIdempotentCall(t *testing.T) {
	const attempt = 100 * time.Millisecond
	var retries []Retry
	c := New(blackhole.Start(t), "k", WithAttemptTimeout(attempt), WithDeadline(time.Second),
		WithBackoff(time.Millisecond, 10*time.Millisecond), WithRetryNotify(func(r Retry) { retries = append(retries, r) }))
	_, err := c.Sandbox(guard(t), "sb-1")
	var cu *CapacityUnavailable
	if !errors.As(err, &cu) {
		t.Fatalf("err = %v, want *CapacityUnavailable after retries", err)
	}
	if cu.LastCode != berth.EUnavailable || cu.Attempts < 2 || len(retries) != cu.Attempts-1 {
		t.Errorf("gave up with last code %q after %d attempts and %d retries; want unavailable after ≥ 2 attempts, one retry fewer",
			cu.LastCode, cu.Attempts, len(retries))
	}
	t.Logf("get: %v", err)
	cutAfter(t, cu.Err, attempt)
	if !IsUnreachable(err) {
		t.Errorf("IsUnreachable(%v) = false, want true", err)
	}
	for _, r := range retries {
		cutAfter(t, r.Err, attempt)
	}
}

// TestCase_C28_HungServerNonIdempotentCall: a call that is sent once (drain) to a server
// that never answers returns a *TransportError saying so after the per-attempt deadline,
// without a retry.
func TestCase_C28_HungServerNonIdempotentCall(t *testing.T) {
	const attempt = 100 * time.Millisecond
	retried := 0
	c := New(blackhole.Start(t), "k", WithAttemptTimeout(attempt), WithRetryNotify(func(Retry) { retried++ }))
	err := c.DrainAgent(guard(t), "a-1", "maintenance")
	t.Logf("drain: %v", err)
	cutAfter(t, err, attempt)
	if IsCapacityUnavailable(err) || retried != 0 {
		t.Errorf("drain: err %v after %d retries; want the transport error of its one attempt", err, retried)
	}
}

// deadlineTransport answers every request with 200 "{}" and records the deadline the
// request's context carried.
type deadlineTransport struct {
	deadline time.Time
	ok       bool
}

func (d *deadlineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	d.deadline, d.ok = req.Context().Deadline()
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	body := "{}"
	if strings.HasSuffix(req.URL.Path, "/exec") {
		body = `{"exit_code":0,"stdout":"","stderr":""}` // {} is no exec result (berth.ParseExecResult)
	}
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader(body))}, nil
}

// TestCase_C28_EachCallsAttemptDeadline pins the per-attempt deadline of every kind of call,
// as the public methods send them: exec its timeout_s + 30 s, files and pause 10½ min,
// create and resume 2 min, an evacuation its deadline + 30 s, everything else the client's
// attempt timeout — which is also the least any call gets. The deadline is read from each
// request's context, between a time taken before the call and one after it, so the check
// is exact whatever the machine's speed.
func TestCase_C28_EachCallsAttemptDeadline(t *testing.T) {
	ctx := context.Background()
	calls := []struct {
		name string
		opts []Option
		call func(*Client) error
		want time.Duration
	}{
		{"get, default", nil, func(c *Client) error { _, err := c.Sandbox(ctx, "sb-1"); return err }, 60 * time.Second},
		{"get, option", []Option{WithAttemptTimeout(7 * time.Second)},
			func(c *Client) error { _, err := c.Sandbox(ctx, "sb-1"); return err }, 7 * time.Second},
		{"drain", nil, func(c *Client) error { return c.DrainAgent(ctx, "a-1", "") }, 60 * time.Second},
		{"exec, default timeout", nil, func(c *Client) error {
			_, err := c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
			return err
		}, 90 * time.Second},
		{"exec, an hour", []Option{WithAttemptTimeout(time.Second)}, func(c *Client) error {
			_, err := c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: 3600})
			return err
		}, time.Hour + 30*time.Second},
		{"exec, 5 s, short option", []Option{WithAttemptTimeout(time.Second)}, func(c *Client) error {
			_, err := c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: 5})
			return err
		}, 35 * time.Second},
		{"exec, 5 s, default option", nil, func(c *Client) error {
			_, err := c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: 5})
			return err
		}, 60 * time.Second},
		{"exec, out of range", nil, func(c *Client) error {
			_, err := c.Exec(ctx, "sb-1", berth.ExecRequest{Cmd: []string{"true"}, TimeoutS: 1 << 62})
			return err
		}, time.Hour + 30*time.Second},
		{"write file", nil, func(c *Client) error { return c.WriteFile(ctx, "sb-1", "/tmp/f", []byte("x")) }, 10*time.Minute + 30*time.Second},
		{"read file", nil, func(c *Client) error { _, err := c.ReadFile(ctx, "sb-1", "/tmp/f"); return err }, 10*time.Minute + 30*time.Second},
		{"read file, longer option", []Option{WithAttemptTimeout(20 * time.Minute)},
			func(c *Client) error { _, err := c.ReadFile(ctx, "sb-1", "/tmp/f"); return err }, 20 * time.Minute},
		{"pause", nil, func(c *Client) error { _, err := c.PauseSandbox(ctx, "sb-1"); return err }, 10*time.Minute + 30*time.Second},
		{"resume", nil, func(c *Client) error { _, err := c.ResumeSandbox(ctx, "sb-1"); return err }, 2 * time.Minute},
		{"create", nil, func(c *Client) error {
			_, err := c.CreateSandbox(ctx, berth.CreateRequest{Template: "shell"})
			return err
		}, 2 * time.Minute},
		{"evacuate, 2 min", nil, func(c *Client) error {
			_, err := c.Evacuate(ctx, "a-1", berth.EvacuateRequest{DeadlineInMS: 120_000})
			return err
		}, 150 * time.Second},
		{"evacuate, no deadline_in_ms", []Option{WithAttemptTimeout(time.Second)}, func(c *Client) error {
			_, err := c.Evacuate(ctx, "a-1", berth.EvacuateRequest{})
			return err
		}, 60 * time.Second},
		{"evacuate, a day", nil, func(c *Client) error {
			_, err := c.Evacuate(ctx, "a-1", berth.EvacuateRequest{DeadlineInMS: 86_400_000})
			return err
		}, 24*time.Hour + 30*time.Second},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			rt := &deadlineTransport{}
			c := New("http://berth.invalid", "k", append([]Option{WithHTTPClient(&http.Client{Transport: rt})}, tc.opts...)...)
			before := time.Now()
			if err := tc.call(c); err != nil {
				t.Fatalf("call: %v", err)
			}
			after := time.Now()
			// The deadline is start + want for a start between before and after.
			if !rt.ok || rt.deadline.Sub(before) < tc.want || rt.deadline.Sub(after) > tc.want {
				t.Errorf("the request's deadline is %v after the call began (had one: %v); want %s",
					rt.deadline.Sub(before), rt.ok, tc.want)
			}
		})
	}
}

// TestCase_C28_AttemptDeadlineDoesNotCutTheBody: the per-attempt deadline ends only after
// the answer's body is read in full: an 8 MiB file, more than the socket buffers hold once
// the headers are in, arrives whole.
func TestCase_C28_AttemptDeadlineDoesNotCutTheBody(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef"), 8<<20/16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // the headers leave before the body
		_, _ = w.Write(want)
	}))
	t.Cleanup(srv.Close)
	got, err := New(srv.URL, "k").ReadFile(guard(t), "sb-1", "/tmp/big")
	if err != nil {
		t.Fatalf("ReadFile: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("read %d bytes, want the %d sent", len(got), len(want))
	}
}
