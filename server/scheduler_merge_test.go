package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// lastChanges remembers the last read of the agent table a scheduler made.
type lastChanges struct {
	berth.Store
	last berth.AgentChanges
}

func (l *lastChanges) AgentsChangedSince(ctx context.Context, cursor string) (berth.AgentChanges, error) {
	c, err := l.Store.AgentsChangedSince(ctx, cursor)
	l.last = c
	return c, err
}

// TestRefreshMergesChanges (issue 16, goal 2): a refresh that reads only the agents changed
// since the last one (PostgreSQL) builds the snapshot a whole read would: a heartbeat's new
// figures, a drain, a quarantine and a new agent that sorts before the others all arrive,
// and the agents that did not change keep theirs.
func TestRefreshMergesChanges(t *testing.T) {
	onEachStore(t, func(t *testing.T, st berth.Store) {
		ctx := t.Context()
		now := time.Now()
		beat := func(id string, admittable int64) {
			t.Helper()
			hb := berth.Heartbeat{AgentID: id, Address: "http://127.0.0.1:1/" + id, Status: berth.AgentActive, CPUTotal: 4,
				MemoryMiBTotal: 8192, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBAdmittable: admittable,
				IntakeOpen: true, BootID: "b1", HeartbeatAt: now}
			if _, err := st.ApplyHeartbeat(ctx, hb, now); err != nil {
				t.Fatal(err)
			}
		}
		for i := 1; i <= 5; i++ {
			beat(fmt.Sprintf("a%d", i), 4096)
		}
		cfg := DefaultConfig()
		cfg.Clock = func() time.Time { return now }
		cfg.Quarantine = berth.QuarantinePolicy{After: 1, Backoff: time.Minute, MaxBackoff: time.Hour}
		seen := &lastChanges{Store: st}
		s := newScheduler(seen, cfg, nil, nil)
		must(t, s.refresh(ctx))
		if !seen.last.Full {
			t.Fatal("the first refresh was not a whole read")
		}

		beat("a2", 1000)
		must(t, st.SetAgentDrain(ctx, "a3", true, "kernel upgrade", "op", now))
		if _, err := st.RecordCreateOutcome(ctx, "a4", true, cfg.Quarantine, "test", now); err != nil {
			t.Fatal(err)
		}
		beat("a0", 2048)
		must(t, s.refresh(ctx))
		if seen.last.Full && seen.last.Cursor != "" {
			t.Errorf("a store with change cursors read the whole table again")
		}

		whole := newScheduler(st, cfg, nil, nil)
		must(t, whole.refresh(ctx))
		type view struct {
			Hosts    any
			Addrs    []string
			Totals   []int64
			Failures []int
			Index    map[string]int
			QEnd     time.Time
		}
		got := view{s.snap.Hosts(), s.addrs, s.totals, s.failures, s.index, s.qEnd}
		want := view{whole.snap.Hosts(), whole.addrs, whole.totals, whole.failures, whole.index, whole.qEnd}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the snapshot merged from changes differs from a whole read (-whole +merged):\n%s", diff)
		}
		if len(s.known) != 6 || s.known[0].AgentID != "a0" {
			t.Errorf("agents known after the merge: %d, first %q; want 6 sorted by id", len(s.known), s.known[0].AgentID)
		}
	})
}
