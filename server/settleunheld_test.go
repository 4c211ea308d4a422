package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
)

// wantLostUnheld fails the test unless sandbox id's latest event is the sweeper's running →
// lost for a sandbox agent no longer holds.
func wantLostUnheld(t *testing.T, h *clockHarness, id, agentID string) {
	t.Helper()
	e := h.lastEvent(t, "sandbox/"+id)
	if e.From != string(berth.SandboxRunning) || e.To != string(berth.SandboxLost) || e.Actor != "sweeper/"+h.s.cfg.ReplicaID ||
		!strings.HasPrefix(e.Reason, "agent/"+agentID+" no longer holds it: its heartbeat of ") || !e.At.Equal(h.clk.Now()) {
		t.Fatalf("%s's last event: %+v; want running → lost by the sweeper, agent/%s no longer holds it, at %v", id, e, agentID, h.clk.Now())
	}
}

// TestAGT6_SweeperLosesGhostRunningRow (AGT-6, the same boot): a real agent (noop runtime,
// its internal API and heartbeats over real HTTP on 127.0.0.1) holds the sandboxes created
// through a real server, on SQLite and PostgreSQL, whose clock the test moves. A running row
// the agent never held — a ghost — stays running while the agent's heartbeats are within the
// grace (StaleAfter, 30 s; longer than 2 intervals of 10 s) of its running mark, and ends lost, with the sweeper's event and
// reason, at the first sweep after a heartbeat received a grace later still leaves it out;
// the tenant's usage stops counting it. Sandboxes created normally — one per round, swept at
// once, before the agent's next heartbeat can list it — are never touched across the rounds.
func TestAGT6_SweeperLosesGhostRunningRow(t *testing.T) {
	onEachStore(t, testSweeperLosesGhost)
}

func testSweeperLosesGhost(t *testing.T, st berth.Store) {
	ctx := context.Background()
	h := newClockHarness(t, st)
	acfg := agent.DefaultConfig()
	acfg.ID, acfg.Admission, acfg.MemoryMiB, acfg.HeadroomMiB = "host-1", berth.AdmissionCommitted, 4096, 0
	acfg.HeartbeatInterval, acfg.MeasureInterval = 20*time.Millisecond, 20*time.Millisecond
	acfg.ServerURL, acfg.NodeToken = h.url, "node-token"
	acfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.New(acfg, &noop.Runtime{})
	must(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(runCtx) }()
	t.Cleanup(func() { cancel(); <-done })

	// held waits until the agent's list, received at the server's current time, holds ids:
	// real heartbeats over loopback, every 20 ms of real time.
	held := func(ids []string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
			got, err := st.Agent(ctx, "host-1")
			if err != nil || !got.LastSeen.Equal(h.clk.Now()) {
				time.Sleep(5 * time.Millisecond) // real: the agent's next heartbeat over loopback
				continue
			}
			if !slices.ContainsFunc(ids, func(id string) bool {
				return !slices.ContainsFunc(got.Sandboxes, func(s berth.HeldSandbox) bool { return s.ID == id })
			}) {
				return
			}
		}
		t.Fatalf("host-1 never listed %v in a heartbeat received at %v", ids, h.clk.Now())
	}
	create := func() string {
		t.Helper()
		code, sb, e := h.create(t)
		if code != http.StatusCreated || sb.AgentID != "host-1" || sb.State != berth.SandboxRunning {
			t.Fatalf("create: %d %+v %+v; want 201 running on host-1", code, sb, e)
		}
		return sb.ID
	}
	held(nil) // registered
	created := []string{create()}
	t0 := h.clk.Now()
	must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-ghost", Template: "python", Tenant: "acme", AgentID: "host-1",
		State: berth.SandboxRunning, MemoryMiB: 512, VCPUs: 1, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "test", t0))
	held(created)
	h.s.sweep(ctx)
	if got := h.state(t, "sb-ghost"); got != berth.SandboxRunning {
		t.Fatalf("ghost at once: %s; want running (within the grace)", got)
	}
	for round := 1; round <= 4; round++ {
		h.clk.Add(10 * time.Second)
		created = append(created, create())
		h.s.sweep(ctx) // the create race: marked running, not listed yet
		held(created)
		h.s.sweep(ctx)
		want := berth.SandboxRunning
		if round >= 3 { // a list received 30 s (StaleAfter) after the running mark leaves it out
			want = berth.SandboxLost
		}
		if got := h.state(t, "sb-ghost"); got != want {
			t.Fatalf("round %d (%s after the ghost's running mark): ghost %s; want %s", round, h.clk.Now().Sub(t0), got, want)
		}
		if round == 3 {
			wantLostUnheld(t, h, "sb-ghost", "host-1")
		}
		for _, id := range created {
			if got := h.state(t, id); got != berth.SandboxRunning {
				t.Fatalf("round %d: %s, created normally and held, is %s; want running", round, id, got)
			}
		}
	}
	if n, _, err := st.TenantUsage(ctx, "acme"); err != nil || n != len(created) {
		t.Fatalf("tenant usage: %d, %v; want the %d held sandboxes, not the ghost", n, err, len(created))
	}
}

// TestAGT6_UnheldGraceCoversTheCreateRace (AGT-6, the same boot): a heartbeat the agent
// composed before it accepted a create, received after the running mark (within the agent's
// POST timeout), does not list the sandbox — and must not make it lost. The agent is driven
// by hand over real HTTP, so the race happens every time: the sandbox stays running through
// that heartbeat's sweep and through later heartbeats that list it, and ends lost only once
// the agent drops it without a word and a heartbeat received a grace after the running mark
// says so. Config.HeartbeatInterval is 1 s and StaleAfter 2 s: the grace is 2 s.
func TestAGT6_UnheldGraceCoversTheCreateRace(t *testing.T) {
	onEachStore(t, testUnheldCreateRace)
}

func testUnheldCreateRace(t *testing.T, st berth.Store) {
	ctx := context.Background()
	h := newClockHarness(t, st)
	h.s.cfg.HeartbeatInterval, h.s.cfg.StaleAfter = time.Second, 2*time.Second // grace 2 s
	host := newFakeAgent(t, "")
	hb := func(seq int64, held ...string) berth.Heartbeat { return heldBeat(h, host.srv.URL, seq, held...) }
	h.beat(t, hb(1))
	early := hb(2) // composed now, before the agent accepts the create below
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.State != berth.SandboxRunning {
		t.Fatalf("create: %d %+v %+v; want 201 running", code, sb, e)
	}
	marked := h.clk.Now()
	h.clk.Add(1500 * time.Millisecond)
	h.beat(t, early) // received 1.5 s after the running mark, not listing it
	h.s.sweep(ctx)
	if got := h.state(t, sb.ID); got != berth.SandboxRunning {
		t.Fatalf("after a heartbeat composed before the create: %s; want running", got)
	}
	for i, seq := range []int64{3, 4, 5} {
		h.clk.Add(time.Second)
		h.beat(t, hb(seq, sb.ID))
		h.s.sweep(ctx)
		if got := h.state(t, sb.ID); got != berth.SandboxRunning {
			t.Fatalf("heartbeat %d listing it, %s after the mark: %s; want running", i, h.clk.Now().Sub(marked), got)
		}
	}
	// The agent loses the guest without reporting it ended; its next list leaves it out.
	h.clk.Add(time.Second)
	h.beat(t, hb(6))
	h.s.sweep(ctx)
	if got := h.state(t, sb.ID); got != berth.SandboxLost {
		t.Fatalf("dropped by its agent, %s after the mark: %s; want lost", h.clk.Now().Sub(marked), got)
	}
	wantLostUnheld(t, h, sb.ID, "a1")
	if n, _, err := st.TenantUsage(ctx, "acme"); err != nil || n != 0 {
		t.Fatalf("tenant usage: %d, %v; want 0", n, err)
	}
}

// countingUnheld counts the sweeper's reads of unheld running sandboxes.
type countingUnheld struct {
	berth.Store
	reads int
}

func (c *countingUnheld) UnheldRunning(ctx context.Context, seenSince time.Time, grace time.Duration, limit int) ([]berth.UnheldSandbox, error) {
	c.reads++
	return c.Store.UnheldRunning(ctx, seenSince, grace, limit)
}

// TestSettleUnheldEvery: the read behind settleUnheld grows with the running sandboxes of
// live hosts, so a replica makes it at most every Config.UnheldEvery (default 30 s), whatever
// the sweep interval.
func TestSettleUnheldEvery(t *testing.T) {
	st := storeBackends[0].open(t)
	counted := &countingUnheld{Store: st}
	clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
	cfg := DefaultConfig()
	cfg.Clock, cfg.Logger = clk.Now, slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(cfg, counted)
	for i, want := range []int{1, 1, 1, 2, 2, 2, 3} { // at 0, 10, …, 60 s
		s.settleUnheld(context.Background())
		if counted.reads != want {
			t.Fatalf("after %d sweeps %s apart: %d reads; want %d (at most one per %s)", i+1, cfg.SweepInterval*2, counted.reads, want, cfg.UnheldEvery)
		}
		clk.Add(2 * cfg.SweepInterval) // 10 s
	}
}

// replicaOn is a second replica over h's store with a clock of its own (real HTTP in front).
type replicaOn struct {
	clk *fakeClock
	s   *Server
	url string
}

func newReplicaOn(t *testing.T, h *clockHarness, clk *fakeClock, id string) *replicaOn {
	t.Helper()
	cfg := DefaultConfig() // a registry of its own
	cfg.NodeToken, cfg.ReplicaID, cfg.Logger = "node-token", id, h.s.cfg.Logger
	cfg.Clock, cfg.CacheTTL, cfg.UnheldEvery, cfg.HeartbeatInterval = clk.Now, time.Millisecond, 0, h.s.cfg.HeartbeatInterval
	s := New(cfg, h.st)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &replicaOn{clk: clk, s: s, url: srv.URL}
}

// beatTo posts hb to the replica at url with its agent's credential.
func beatTo(t *testing.T, h *clockHarness, url string, hb berth.Heartbeat) {
	t.Helper()
	saved := h.url
	h.url = url
	defer func() { h.url = saved }()
	h.beat(t, hb)
}

// TestAGT6_UnheldSurvivesReplicaSkew: replica R1 places a create and marks it running; the
// agent's heartbeats go to replica R2, whose clock is ahead of R1's; the heartbeat the agent
// composed just before it accepted the create reaches R2 100 ms after the mark, not listing
// it, and R1 sweeps. Nothing is wrong with the agent — its next heartbeat lists the sandbox —
// so the sandbox must stay running. With a grace of two intervals it was lost at a skew of
// 1.95 s (interval 1 s) or 19.95 s (interval 10 s), and the agent then told to delete it;
// the grace is now at least StaleAfter (found by an attack).
func TestAGT6_UnheldSurvivesReplicaSkew(t *testing.T) {
	for _, c := range []struct {
		interval, skew time.Duration
	}{{time.Second, 1950 * time.Millisecond}, {10 * time.Second, 19950 * time.Millisecond}, {10 * time.Second, 25 * time.Second}} {
		t.Run(fmt.Sprintf("interval %s, skew %s", c.interval, c.skew), func(t *testing.T) {
			onEachStore(t, func(t *testing.T, st berth.Store) { testUnheldReplicaSkew(t, st, c.interval, c.skew) })
		})
	}
}

func testUnheldReplicaSkew(t *testing.T, st berth.Store, interval, skew time.Duration) {
	h := newClockHarness(t, st)
	h.s.cfg.HeartbeatInterval = interval
	r2 := newReplicaOn(t, h, &fakeClock{now: h.clk.Now().Add(skew)}, "r2")
	host := newFakeAgent(t, "")
	hb := func(seq int64, held ...string) berth.Heartbeat { return heldBeat(h, host.srv.URL, seq, held...) }
	beatTo(t, h, r2.url, hb(1))
	early := hb(2) // composed before the accept below
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.State != berth.SandboxRunning {
		t.Fatalf("create: %d %+v %+v", code, sb, e)
	}
	h.clk.Add(100 * time.Millisecond)
	r2.clk.Add(100 * time.Millisecond)
	beatTo(t, h, r2.url, early)
	h.s.sweep(context.Background())
	if got := h.state(t, sb.ID); got != berth.SandboxRunning {
		t.Fatalf("interval %s, replica skew %s: a sandbox its agent runs is %s (%s); want running",
			interval, skew, got, h.lastEvent(t, "sandbox/"+sb.ID).Reason)
	}
}

// heldBeat is agent a1's heartbeat number seq (boot-1, at h's clock) from addr, listing held.
func heldBeat(h *clockHarness, addr string, seq int64, held ...string) berth.Heartbeat {
	b := berth.Heartbeat{AgentID: "a1", Address: addr, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, CPUTotal: 4,
		BootID: "boot-1", Seq: seq, HeartbeatAt: h.clk.Now()}
	for _, id := range held {
		b.Sandboxes = append(b.Sandboxes, berth.HeldSandbox{ID: id})
	}
	return b
}

// unheldReads counts the store's UnheldRunning reads.
type unheldReads struct {
	berth.Store
	n atomic.Int64
}

func (u *unheldReads) UnheldRunning(ctx context.Context, seenSince time.Time, grace time.Duration, limit int) ([]berth.UnheldSandbox, error) {
	u.n.Add(1)
	return u.Store.UnheldRunning(ctx, seenSince, grace, limit)
}

// TestAGT6_UnheldSweepOncePerPeriodAcrossReplicas (issue 16, goal 2): two replicas sharing a
// store, on SQLite and PostgreSQL, both sweeping, read the running sandboxes their agents no
// longer hold once per UnheldEvery between them, not once each; when the replica that had
// been doing it stops, the other takes over within a quarter period of the next period.
func TestAGT6_UnheldSweepOncePerPeriodAcrossReplicas(t *testing.T) {
	onEachStore(t, func(t *testing.T, st berth.Store) {
		ctx := t.Context()
		counted := &unheldReads{Store: st}
		clk := &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}
		replica := func(id string) *Server {
			cfg := DefaultConfig()
			cfg.ReplicaID, cfg.Clock, cfg.UnheldEvery = id, clk.Now, 30*time.Second
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			return New(cfg, counted)
		}
		a, b := replica("a"), replica("b")
		reads := func(step string, sweepers []*Server, want int64) {
			t.Helper()
			before := counted.n.Load()
			for _, s := range sweepers {
				s.settleUnheld(ctx)
			}
			if got := counted.n.Load() - before; got != want {
				t.Fatalf("%s: %d reads of the unheld running sandboxes, want %d", step, got, want)
			}
		}
		both := []*Server{a, b}
		reads("t=0, both sweep", both, 1)
		for range 5 { // t = 5 … 25 s
			clk.Add(5 * time.Second)
			reads(fmt.Sprintf("t=%s, both sweep", clk.Now().Sub(time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC))), both, 0)
		}
		clk.Add(5 * time.Second)
		reads("t=30s, both sweep", both, 1)
		// a stops; b takes over once a's claim is a period old, within a quarter period.
		for range 6 { // t = 35 … 60 s
			clk.Add(5 * time.Second)
			want := int64(0)
			if clk.Now().Sub(time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)) == 60*time.Second {
				want = 1
			}
			reads(fmt.Sprintf("t=%s, b alone", clk.Now().Sub(time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC))), []*Server{b}, want)
		}
		// b's clock runs a day ahead for a sweep, then is set back: the sweep goes on at
		// once, held off neither by b's own gate nor by the claim written a day ahead.
		clk.Add(24 * time.Hour)
		reads("a day ahead, b alone", []*Server{b}, 1)
		clk.Add(-24*time.Hour + 5*time.Second)
		reads("set back a day, b alone", []*Server{b}, 1)
	})
}
