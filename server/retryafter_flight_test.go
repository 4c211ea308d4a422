package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/placement"
	"github.com/berth-dev/berth/store/sqlite"
	"github.com/prometheus/client_golang/prometheus"
)

// countingEstimate gates the Retry-After estimate's reads of the store (one Reservations read
// each; readGate).
type countingEstimate struct {
	berth.Store
	readGate
}

func (c *countingEstimate) Reservations(ctx context.Context) ([]berth.Reservation, error) {
	c.pass()
	return c.Store.Reservations(ctx)
}

// TestRetryAfter_SingleFlight (API-3): refusals that need a fresh Retry-After estimate at the
// same moment share one read of the store, and refusals within the next second read nothing:
// a refusal storm does not scan the store once per refusal.
func TestRetryAfter_SingleFlight(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	synctest.Test(t, func(t *testing.T) {
		counted := &countingEstimate{Store: st, readGate: readGate{release: make(chan struct{})}}
		cfg := DefaultConfig()
		cfg.Clock = time.Now
		s := newScheduler(counted, cfg, nil, nil)
		const callers = 8
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() { s.retryAfter(context.Background(), berth.ENoCapacity, 512) })
		}
		synctest.Wait() // every refusal is in the read or waiting for it
		n := counted.reads.Load()
		close(counted.release)
		wg.Wait()
		if n != 1 {
			t.Fatalf("%d concurrent refusals read the store %d times; want 1", callers, n)
		}
		time.Sleep(500 * time.Millisecond) // fake time: still inside the kept estimate's second
		s.retryAfter(context.Background(), berth.ENoCapacity, 512)
		if n := counted.reads.Load(); n != 1 {
			t.Fatalf("a refusal half a second later read the store again (%d reads); want the kept estimate", n)
		}
		time.Sleep(time.Second) // fake time: the estimate is stale now
		s.retryAfter(context.Background(), berth.ENoCapacity, 512)
		if n := counted.reads.Load(); n != 2 {
			t.Fatalf("a refusal 1.5 s later: %d reads; want 2 (a fresh estimate)", n)
		}
	})
}

// noHeldLists fails the test when anything reads every agent with its held list.
type noHeldLists struct {
	berth.Store
	t *testing.T
}

func (n noHeldLists) Agents(context.Context) ([]berth.Agent, error) {
	n.t.Error("every agent's held list was read")
	return nil, nil
}

// TestMetricsScrapeReadsNoHeldLists: the fleet series (heartbeat ages, agents by status, the
// ledger per agent) come from the agent table without held lists, so a scrape costs the
// table, not the fleet's sandboxes; with them, 10,000 agents of 50 sandboxes outran the
// collectors' 2 s and every fleet series was missing (BenchmarkMetricsScrape).
func TestMetricsScrapeReadsNoHeldLists(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	hb := berth.Heartbeat{AgentID: "a1", Address: "http://127.0.0.1:1", Status: berth.AgentActive, MemoryAdmission: berth.AdmissionWorkingSet,
		MemoryMiBTotal: 4096, MemoryMiBAdmittable: 2048, BootID: "b", Seq: 1, Sandboxes: []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 10, Measured: true}}}
	if _, err := st.RecordHeartbeat(context.Background(), hb, "", time.Now()); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	newMetrics(reg, noHeldLists{Store: st, t: t}, 30*time.Second, 5*time.Minute, time.Now)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "agent" && l.GetValue() == "a1" {
					found[mf.GetName()] = true
				}
			}
		}
	}
	for _, name := range []string{"berth_agent_heartbeat_age_seconds", "berth_ledger_outstanding_reserved_bytes"} {
		if !found[name] {
			t.Errorf("the scrape has no %s for agent a1", name)
		}
	}
}

// cancellingStore answers ExpiringFirst with one running sandbox on a1 expiring in 30 s, but
// first calls cancelMe (once), as a refusal's client going away mid-read does; a read whose
// context is done fails as a real store's would. failReservations fails that many reads.
type cancellingStore struct {
	berth.Store
	now              time.Time
	cancelMe         context.CancelFunc
	failReservations int
	reservations     int
}

func (c *cancellingStore) ExpiringFirst(ctx context.Context, _ berth.Expiry, _ int) ([]berth.Expiry, error) {
	if c.cancelMe != nil {
		c.cancelMe()
		c.cancelMe = nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return []berth.Expiry{{SandboxID: "sb-1", AgentID: "a1", At: c.now.Add(30 * time.Second)}}, nil
}

func (c *cancellingStore) Reservations(ctx context.Context) ([]berth.Reservation, error) {
	c.reservations++
	if c.failReservations > 0 {
		c.failReservations--
		return nil, errors.New("statement timeout")
	}
	return c.Store.Reservations(ctx)
}

// TestRetryAfter_EstimateOutlivesItsCaller (found by an attack): the estimate every refusal
// of the next second reads ran on the first refusal's own context; when that client went
// away mid-read, the 5 s fallback was kept and handed to live clients whose true hint was
// 31 s. The estimate now runs on a context of its own, and one whose reads failed is not kept.
func TestRetryAfter_EstimateOutlivesItsCaller(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	must(t, err)
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	cfg := DefaultConfig()
	cfg.Clock = func() time.Time { return now }
	hosts := []placement.Host{{ID: "a1", LastSeenNano: now.UnixNano(), IntakeOpen: true, Mode: berth.AdmissionCommitted}}
	want := 30*time.Second + cfg.HeartbeatInterval

	cs := &cancellingStore{Store: st, now: now}
	s := newScheduler(cs, cfg, nil, nil)
	s.hosts = hosts
	gone, cancel := context.WithCancel(context.Background())
	cs.cancelMe = cancel
	if got := s.retryAfter(gone, berth.ENoCapacity, 512); got != want {
		t.Errorf("the refusal whose client left mid-read: Retry-After %v, want %v", got, want)
	}
	if got := s.retryAfter(context.Background(), berth.ENoCapacity, 512); got != want {
		t.Fatalf("a live client's refusal in the same second: Retry-After %v, want the store's %v", got, want)
	}

	// A read that fails: answered from what was read, not kept for the next refusal.
	failing := &cancellingStore{Store: st, now: now, failReservations: 1}
	s = newScheduler(failing, cfg, nil, nil)
	s.hosts = hosts
	s.retryAfter(context.Background(), berth.ENoCapacity, 512)
	s.retryAfter(context.Background(), berth.ENoCapacity, 512)
	if failing.reservations != 2 {
		t.Fatalf("reservations reads: %d; want 2 (an estimate whose read failed is not kept)", failing.reservations)
	}
}
