package client

import (
	"context"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestRateLimitedIsRetried (issue 15): a 429 rate_limited answer to an idempotent call is
// retried after its Retry-After, like a 503; TestNonRetryableAnswersReturnAtOnce pins that a
// 429 with any other code is not.
func TestRateLimitedIsRetried(t *testing.T) {
	srv, s := newScripted(t,
		reply{status: 429, header: map[string]string{"Retry-After": "2"}, body: errBody(berth.ERateLimited, 2)},
		reply{status: 201, body: sandboxJSON})
	clk := newFakeClock(time.Now())
	if _, err := New(srv.URL, "k", WithClock(clk)).CreateSandbox(context.Background(), berth.CreateRequest{Template: "python"}); err != nil {
		t.Fatalf("CreateSandbox after a 429 rate_limited: %v", err)
	}
	if n := len(s.Seen()); n != 2 {
		t.Fatalf("%d requests, want 2", n)
	}
	if diff := cmp.Diff([]time.Duration{2 * time.Second}, clk.Sleeps()); diff != "" {
		t.Errorf("sleeps (-want +got):\n%s", diff)
	}
}
