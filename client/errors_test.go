package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// A transport failure reads as a reason a person understands, and IsUnreachable tells a
// server that cannot be reached (retry later) from one that answered badly.
func TestTransportErrorReasonAndIsUnreachable(t *testing.T) {
	dial := func(err error) error {
		return &url.Error{Op: "Post", URL: "http://127.0.0.1:1/v1/sandboxes/sb-1/exec",
			Err: &net.OpError{Op: "dial", Net: "tcp", Err: err}}
	}
	timeout := &url.Error{Op: "Get", URL: "u", Err: &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}}
	tests := []struct {
		name        string
		err         error
		reason      string
		unreachable bool
	}{
		{"refused", dial(os.NewSyscallError("connect", syscall.ECONNREFUSED)), "connection refused", true},
		{"DNS", dial(&net.DNSError{Err: "no such host", Name: "berth.invalid"}), "cannot resolve berth.invalid: no such host", true},
		{"dial timeout", dial(os.ErrDeadlineExceeded), "timed out", true},
		{"read timeout", timeout, "timed out", true},
		{"reset", &url.Error{Op: "Get", URL: "u", Err: syscall.ECONNRESET}, "the connection was reset", true},
		{"hang-up", &url.Error{Op: "Get", URL: "u", Err: io.EOF}, "the connection closed before an answer", true},
		{"network unreachable", dial(os.NewSyscallError("connect", syscall.ENETUNREACH)), "network is unreachable", true},
		{"TLS", &url.Error{Op: "Get", URL: "u", Err: errors.New("tls: failed to verify certificate")}, "tls: failed to verify certificate", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			te := &TransportError{Method: "POST", Path: "/v1/x", Server: "http://127.0.0.1:1", Err: tt.err}
			got := struct {
				Reason                   string
				Unreachable, InCapacity  bool
				Wrapped, UnwrapsToItself bool
			}{te.Reason(), IsUnreachable(te), IsUnreachable(&CapacityUnavailable{Err: te}),
				IsUnreachable(fmt.Errorf("run: %w", te)), errors.Is(te, tt.err)}
			want := got
			want.Reason, want.Unreachable, want.InCapacity, want.Wrapped, want.UnwrapsToItself =
				tt.reason, tt.unreachable, tt.unreachable, tt.unreachable, true
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if msg := te.Error(); strings.Contains(msg, `Post "`) || strings.Contains(msg, "dial tcp") {
				t.Errorf("message %q shows net/http's internals", msg)
			}
		})
	}
	for _, err := range []error{nil, errors.New("x"), &berth.Error{Code: berth.ENoCapacity}, &CapacityUnavailable{LastCode: berth.ENoCapacity}} {
		if IsUnreachable(err) {
			t.Errorf("IsUnreachable(%v) = true", err)
		}
	}
}

// Every error the SDK makes says "berth: ", never the package's Go name, and a connection
// failure's message names the server, not net/http's framing — retried or not.
func TestErrorMessagesHaveNoGoInternals(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	closed := srv.URL
	srv.Close()
	clk := newFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := New(closed, "k", WithClock(clk), WithRand(half), WithDeadline(time.Second))
	_, execErr := c.Exec(context.Background(), "sb-1", berth.ExecRequest{Cmd: []string{"true"}})
	_, getErr := c.Templates(context.Background())
	ok, _ := newScripted(t, reply{status: 200, body: "<html>captive portal</html>"})
	_, decodeErr := New(ok.URL, "k").Templates(context.Background())
	for name, err := range map[string]error{"exec": execErr, "get": getErr, "decode": decodeErr} {
		msg := fmt.Sprint(err)
		if !strings.HasPrefix(msg, "berth: ") || strings.Contains(msg, "client:") || strings.Contains(msg, "dial tcp") ||
			strings.Contains(msg, `Get "`) || strings.Contains(msg, `Post "`) || strings.Contains(msg, "json:") {
			t.Errorf("%s: message %q", name, msg)
		}
	}
	if !IsUnreachable(execErr) || !IsUnreachable(getErr) || !errors.Is(execErr, syscall.ECONNREFUSED) {
		t.Errorf("exec %v, get %v: want both unreachable, exec still ECONNREFUSED underneath", execErr, getErr)
	}
	if want := "no answer from " + closed + ": connection refused"; !strings.Contains(getErr.Error(), want) {
		t.Errorf("get: %q lacks %q", getErr, want)
	}
}
