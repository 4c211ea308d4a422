package server

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
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

// BenchmarkSnapshotRefresh (issue 16, goal 2): one refresh of a replica's placement snapshot
// on PostgreSQL with BERTH_BENCH_FLEET_AGENTS agents (default 10,000), a tenth of whose rows
// were written since the last refresh (a heartbeat every 10 s, a refresh every second).
// read=whole re-reads the agent table (before), read=changed reads the rows changed since
// (after). It reports this process's and PostgreSQL's CPU per refresh; the writes between
// refreshes are not counted.
//
//	go test ./server -run '^$' -bench BenchmarkSnapshotRefresh -benchtime 20x
func BenchmarkSnapshotRefresh(b *testing.B) {
	n := envInt("BERTH_BENCH_FLEET_AGENTS", 10000)
	ctx := context.Background()
	url := pgtest.Start(b).NewDatabase(b)
	st, err := postgres.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ids := make([]string, n)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range ids {
		ids[i] = fmt.Sprintf("agent-%05d", i)
		g.Go(func() error {
			hb := berth.Heartbeat{AgentID: ids[i], Address: "http://127.0.0.1:1", Status: berth.AgentActive, CPUTotal: 8,
				MemoryMiBTotal: 65536, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBAdmittable: 60000,
				IntakeOpen: true, BootID: "b1"}
			_, err := st.ApplyHeartbeat(ctx, hb, time.Now())
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE agents`); err != nil {
		b.Fatal(err)
	}
	for _, whole := range []bool{true, false} {
		b.Run(map[bool]string{true: "read=whole", false: "read=changed"}[whole], func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Clock = time.Now
			s := newScheduler(st, cfg, nil, nil)
			if err := s.refreshAll(ctx); err != nil {
				b.Fatal(err)
			}
			var self, pg int64
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				tenth := ids[(i%10)*n/10 : (i%10+1)*n/10]
				if _, err := conn.Exec(ctx, `UPDATE agents SET cpu_used = cpu_used + 1 WHERE id = ANY($1)`, tenth); err != nil {
					b.Fatal(err)
				}
				self0, pg0 := selfCPU(), postgresCPU()
				b.StartTimer()
				if whole {
					err = s.refreshAll(ctx)
				} else {
					err = s.refresh(ctx)
				}
				b.StopTimer()
				self, pg = self+selfCPU()-self0, pg+postgresCPU()-pg0
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(self)/float64(b.N)/1e6, "server-ms/op")
			b.ReportMetric(float64(pg)/float64(b.N)/1e6, "pg-ms/op")
		})
	}
}

// failingReads fails the next whole agent read or the next ledger read, once each when set.
type failingReads struct {
	berth.Store
	failWhole, failPending atomic.Bool
}

func (f *failingReads) AgentsChangedSince(ctx context.Context, cursor string) (berth.AgentChanges, error) {
	if cursor == "" && f.failWhole.CompareAndSwap(true, false) {
		return berth.AgentChanges{}, errors.New("injected: connection reset")
	}
	return f.Store.AgentsChangedSince(ctx, cursor)
}

func (f *failingReads) Pending(ctx context.Context, now time.Time) (map[string]int64, error) {
	if f.failPending.CompareAndSwap(true, false) {
		return nil, errors.New("injected: connection reset")
	}
	return f.Store.Pending(ctx, now)
}

// TestRefreshWholeWhenTheCursorCannotSee (issue 16, goal 2; found by an attack): a change the
// store's cursor cannot show — here an agent row deleted by hand, as a restored dump would —
// leaves the snapshot by a whole read: one asked for (the change notifications reconnected)
// stays asked for when it fails, in the agent read or in the ledger read, until one succeeds;
// and without one asked for, a replica reads the whole table every wholeReadEvery.
func TestRefreshWholeWhenTheCursorCannotSee(t *testing.T) {
	for _, c := range []struct {
		name string
		fail func(*failingReads)
	}{
		{"asked, the agent read fails", func(f *failingReads) { f.failWhole.Store(true) }},
		{"asked, the ledger read fails", func(f *failingReads) { f.failPending.Store(true) }},
		{"not asked", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			url := pgtest.Start(t).NewDatabase(t)
			st, err := postgres.Open(ctx, url)
			must(t, err)
			t.Cleanup(func() { st.Close() })
			now := time.Now()
			for _, id := range []string{"a1", "a2", "a3"} {
				_, err := st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: id, Status: berth.AgentActive, BootID: "b1",
					MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, IntakeOpen: true}, now)
				must(t, err)
			}
			cfg := DefaultConfig()
			cfg.Clock = func() time.Time { return now }
			f := &failingReads{Store: st}
			s := newScheduler(f, cfg, nil, nil)
			must(t, s.refresh(ctx))
			conn, err := pgx.Connect(ctx, url)
			must(t, err)
			t.Cleanup(func() { conn.Close(context.Background()) })
			_, err = conn.Exec(ctx, `DELETE FROM agents WHERE id = 'a2'`)
			must(t, err)

			if c.fail != nil {
				c.fail(f)
				if err := s.refreshAll(ctx); err == nil {
					t.Fatal("the injected failure did not fail refreshAll")
				}
				must(t, s.refresh(ctx))
			} else {
				must(t, s.refresh(ctx))
				if _, kept := s.index["a2"]; !kept {
					t.Fatal("a read of changes saw a deleted row: this test no longer tests the whole read")
				}
				now = now.Add(wholeReadEvery + time.Second)
				must(t, s.refresh(ctx))
			}
			if _, kept := s.index["a2"]; kept || len(s.index) != 2 {
				t.Errorf("agents in the snapshot %v; want a1 and a3 (a2's row is gone)", s.index)
			}
		})
	}
}
