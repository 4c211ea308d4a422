package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestCase_C32_TTLCountsFromArrival: the TTL stop (AGT-7) of an agent whose clock is a day ahead
// of the server's, or a day behind, happens after the TTL the server sent (ttl_ms, counted
// from the create's arrival), not when the agent's wall clock passes the server's
// expires_at: a day ahead would stop every sandbox at once, a day behind a day late.
func TestCase_C32_TTLCountsFromArrival(t *testing.T) {
	for _, tc := range []struct {
		name string
		skew time.Duration // agent clock − server clock
	}{
		{"a day ahead", 24 * time.Hour},
		{"a day behind", -24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := &fakeRuntime{}
			a := newTestAgent(t, berth.AdmissionCommitted, 4096, rt)
			ctx := context.Background()
			server := time.Now().Add(-tc.skew)
			for _, c := range []berth.AgentCreate{
				{ID: "hour", MemoryMiB: 512, ExpiresAt: server.Add(time.Hour), TTLMS: time.Hour.Milliseconds()},
				{ID: "short", MemoryMiB: 512, ExpiresAt: server.Add(10 * time.Minute), TTLMS: (10 * time.Minute).Milliseconds()},
			} {
				if err := a.Create(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			a.measureOnce(ctx, time.Now())
			if len(rt.stopped) != 0 {
				t.Fatalf("stopped %v at once; want none before its TTL", rt.stopped)
			}
			later := time.Now().Add(11 * time.Minute)
			a.measureOnce(ctx, later)
			if !slices.Equal(rt.stopped, []string{"short"}) {
				t.Fatalf("stopped %v 11 min after the creates; want [short] (10 min TTL), not the 1 h one", rt.stopped)
			}
			if hb := a.Heartbeat(later); len(hb.Ended) != 1 || hb.Ended[0].Reason != "ttl" {
				t.Fatalf("ended %+v; want short stopped for its ttl", hb.Ended)
			}
		})
	}
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, &fakeRuntime{})
	if err := a.Create(context.Background(), berth.AgentCreate{ID: "s", MemoryMiB: 512, TTLMS: -1}); berth.ErrorCode(err) != berth.EInvalidRequest {
		t.Fatalf("negative ttl_ms: %v, want invalid_request", err)
	}
}

// TestCase_C32_HeartbeatsNumberedNotClockOrdered: each heartbeat of a boot carries the next Seq,
// and its HeartbeatAt is the agent's clock as it is, even when that clock jumps back: the
// store orders by Seq (C32), so the agent no longer bends its timestamps to keep an order.
func TestCase_C32_HeartbeatsNumberedNotClockOrdered(t *testing.T) {
	a := newTestAgent(t, berth.AdmissionCommitted, 4096, &fakeRuntime{})
	t0 := time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)
	for i, at := range []time.Time{t0, t0.Add(-24 * time.Hour), t0.Add(24 * time.Hour), t0.Add(-time.Hour)} {
		hb := a.Heartbeat(at)
		if hb.Seq != int64(i+1) || !hb.HeartbeatAt.Equal(at) {
			t.Fatalf("heartbeat %d: seq %d at %v; want seq %d at %v", i, hb.Seq, hb.HeartbeatAt, i+1, at)
		}
	}
}
