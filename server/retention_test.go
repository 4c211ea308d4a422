package server

import (
	"context"
	"errors"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/berth-dev/berth"
)

// TestSweepRetention: the sweeper deletes terminal sandboxes older than Retention, with
// their events, in batches, counts them in berth_retention_rows_deleted_total, and keeps a
// live sandbox however old and a recently ended one; Retention < 0 keeps everything
// (issue 15, point 5).
func TestSweepRetention(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
		purged    bool
	}{{"7 days", 7 * 24 * time.Hour, true}, {"forever", -1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Date(2031, 3, 14, 15, 0, 0, 0, time.UTC)
			h := newHarnessWith(t, func(c *Config) {
				c.Clock, c.Retention, c.RetentionBatch = func() time.Time { return now }, tc.retention, 2
			})
			ctx := context.Background()
			for _, id := range []string{"old-1", "old-2", "old-3", "recent", "live"} {
				must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
					State: berth.SandboxRunning, MemoryMiB: 512, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
			}
			for _, id := range []string{"old-1", "old-2", "old-3"} {
				_, err := h.st.TransitionSandbox(ctx, id, nil, berth.SandboxStopped, "deleted", "test", now)
				must(t, err)
			}
			now = now.Add(8 * 24 * time.Hour)
			_, err := h.st.TransitionSandbox(ctx, "recent", nil, berth.SandboxStopped, "deleted", "test", now)
			must(t, err)
			h.s.purgeEnded(ctx)
			for _, id := range []string{"old-1", "old-2", "old-3"} {
				_, err := h.st.Sandbox(ctx, id)
				if gone := errors.Is(err, berth.ErrNotFound); gone != tc.purged {
					t.Fatalf("%s: %v; want purged %v", id, err, tc.purged)
				}
			}
			for _, id := range []string{"recent", "live"} {
				if _, err := h.st.Sandbox(ctx, id); err != nil {
					t.Fatalf("%s was purged: %v", id, err)
				}
			}
			want := 0.0
			if tc.purged {
				want = 3
			}
			if got := counterValue(t, h.s, "sandboxes"); got != want {
				t.Fatalf(`berth_retention_rows_deleted_total{table="sandboxes"} = %v, want %v`, got, want)
			}
			if tc.purged && counterValue(t, h.s, "events") < 6 {
				t.Fatal("the purged sandboxes' events were not counted")
			}
		})
	}
}

// counterValue reads berth_retention_rows_deleted_total{table}.
func counterValue(t *testing.T, s *Server, table string) float64 {
	t.Helper()
	var m dto.Metric
	must(t, s.retained.WithLabelValues(table).Write(&m))
	return m.GetCounter().GetValue()
}
