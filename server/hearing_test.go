package server

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
)

// sweepCounter counts the sweeps a replica's Run makes through the store, those the store
// answered and those it failed, so a test can wait for sweeps rather than time.
type sweepCounter struct {
	berth.Store
	ok, failed atomic.Int64
	// stall, when set, runs inside the next sweep's store call (once): a store that hangs.
	stall atomic.Pointer[func()]
	// failing fails every sweep's store call while set: a store that errs for a while (the
	// real outage is TestLIF2_StoreOutageLosesNoSandbox's).
	failing atomic.Bool
	// stallRead, when set, runs inside the next read of one agent (once): lease expiry's
	// confirming read, when the store starts hanging after the sweep's own call.
	stallRead atomic.Pointer[func()]
}

func (s *sweepCounter) Agent(ctx context.Context, id string) (berth.Agent, error) {
	if f := s.stallRead.Swap(nil); f != nil {
		(*f)()
	}
	return s.Store.Agent(ctx, id)
}

func (s *sweepCounter) SweepReservations(ctx context.Context, now time.Time) (int, error) {
	if f := s.stall.Swap(nil); f != nil {
		(*f)()
	}
	if s.failing.Load() {
		s.failed.Add(1)
		return 0, berth.Errorf(berth.EUnavailable, "store failing (injected)")
	}
	n, err := s.Store.SweepReservations(ctx, now)
	if err != nil {
		s.failed.Add(1)
	} else {
		s.ok.Add(1)
	}
	return n, err
}

// waitSweeps waits until n more sweeps than seen so far were answered by the store (failed:
// failed by it). A sweep also expires leases (Run: sweep → expireLeases).
func (s *sweepCounter) waitSweeps(t *testing.T, failed bool, n int64) {
	t.Helper()
	c := &s.ok
	if failed {
		c = &s.failed
	}
	want := c.Load() + n
	waitUntil(t, fmt.Sprintf("%d more sweeps (failed: %v)", n, failed), func() (bool, string) {
		got := c.Load()
		return got >= want, fmt.Sprintf("%d of %d", got, want)
	})
}

// advance moves clk on by d in steps of 5 s, waiting for a sweep after each: time that
// passes while a replica sweeps, as it does, not in one jump that a sweep in flight would
// take for a store that hung (slowSweep).
func (s *sweepCounter) advance(t *testing.T, clk *fakeClock, d time.Duration) {
	t.Helper()
	for step := 5 * time.Second; d > 0; d -= step {
		clk.Add(min(step, d))
		s.waitSweeps(t, s.failing.Load(), 1)
	}
}

// leaseHarness is a replica on a fake clock whose sweeps (every 10 ms) are counted, with one
// host, a1, on 90 s leases, heartbeated at the clock's start, and a sandbox running there.
// Its loops are not started (runReplica).
func leaseHarness(t *testing.T) (*harness, *fakeClock, *sweepCounter, berth.Sandbox) {
	t.Helper()
	clk := &fakeClock{now: time.Date(2031, 5, 1, 12, 0, 0, 0, time.UTC)}
	var sweeps *sweepCounter
	h := newHarnessOn(t, func(st berth.Store) berth.Store { sweeps = &sweepCounter{Store: st}; return sweeps }, func(c *Config) {
		c.Clock, c.SweepInterval, c.CacheTTL = clk.Now, 10*time.Millisecond, time.Millisecond
		c.LeaseEphemeral, c.LeaseStateful = 90*time.Second, 90*time.Second
	})
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	code, sb, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	return h, clk, sweeps, sb
}

// runReplica runs h's loops (sweeps, lease expiry) until the test ends.
func runReplica(t *testing.T, h *harness) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.s.Run(ctx)
}

// sandboxState reads sandbox id's state from st.
func sandboxState(t *testing.T, st berth.Store, id string) berth.SandboxState {
	t.Helper()
	sb, err := st.Sandbox(context.Background(), id)
	must(t, err)
	return sb.State
}

// waitState waits until sandbox id is in state want (what names the wait in a failure).
func waitState(t *testing.T, st berth.Store, id string, want berth.SandboxState, what string) {
	t.Helper()
	waitUntil(t, what, func() (bool, string) {
		got := sandboxState(t, st, id)
		return got == want, string(got)
	})
}

// TestLIF2_RestartOfTheControlPlaneLosesNoSandbox: every replica was down for five minutes —
// longer than the 90 s lease — while the host went on running its sandbox. The replica that
// starts again does not declare the sandbox lost for silence it could not hear; once it has
// heard nothing from the host for a whole lease TTL, it does (LIF-2). Before, its first sweep
// turned every sandbox of the fleet into lost.
func TestLIF2_RestartOfTheControlPlaneLosesNoSandbox(t *testing.T) {
	h, clk, sweeps, sb := leaseHarness(t)
	// The replica was down: its loops start five minutes after the host's last heartbeat.
	clk.Add(5 * time.Minute)
	runReplica(t, h)
	sweeps.waitSweeps(t, false, 3)
	if got := sandboxState(t, h.st, sb.ID); got != berth.SandboxRunning {
		t.Fatalf("after the control plane's restart, a sandbox whose host it could not hear for 5 min is %s, want running", got)
	}
	sweeps.advance(t, clk, 91*time.Second) // now heard nothing from the host for a whole lease
	waitState(t, h.st, sb.ID, berth.SandboxLost, "the sandbox lost once its host was silent for a lease the replica heard")
}

// TestLIF2_StalledStoreLosesNoSandbox: the store hangs for five minutes (a partition to
// the database that drops packets: no error, just no answer) and then answers. Nothing failed,
// but nothing was recorded either: the call that waited it out — the sweep's own, or lease
// expiry's read of the silent host — counts the time as deaf, and the sandbox is lost only
// after a lease TTL of silence heard after it (LIF-2).
func TestLIF2_StalledStoreLosesNoSandbox(t *testing.T) {
	for _, where := range []string{"the sweep's own call", "lease expiry's read of the host"} {
		t.Run(where, func(t *testing.T) {
			h, clk, sweeps, sb := leaseHarness(t)
			runReplica(t, h)
			sweeps.waitSweeps(t, false, 1)
			hang := func() { clk.Add(5 * time.Minute) }
			if where == "the sweep's own call" {
				sweeps.stall.Store(&hang)
			} else {
				// The host is about to be a candidate: the store hangs in its confirming read.
				sweeps.advance(t, clk, 85*time.Second)
				sweeps.stallRead.Store(&hang)
				sweeps.advance(t, clk, 5*time.Second)
			}
			sweeps.waitSweeps(t, false, 3)
			if got := sandboxState(t, h.st, sb.ID); got != berth.SandboxRunning {
				t.Fatalf("after the store hung for 5 min, a sandbox whose host no heartbeat could be recorded for is %s, want running", got)
			}
			sweeps.advance(t, clk, 91*time.Second)
			waitState(t, h.st, sb.ID, berth.SandboxLost, "the sandbox lost once its host was silent for a lease after the stall")
		})
	}
}

// TestLIF2_ShortStoreTroubleHoldsNoLease: a store that fails the replica's sweeps for 20 s, or
// takes 20 s to answer one, defers nothing — an agent can cause that much on a shared store
// (an attack: SQLITE_BUSY from eight large heartbeats at once), and must not hold a dead
// host's lease open with it. The host silent for its lease is lost at once after (LIF-2).
func TestLIF2_ShortStoreTroubleHoldsNoLease(t *testing.T) {
	for _, name := range []string{"failing", "hanging"} {
		t.Run(name, func(t *testing.T) {
			h, clk, sweeps, sb := leaseHarness(t)
			runReplica(t, h)
			sweeps.waitSweeps(t, false, 1)         // the replica hears from the host's last heartbeat on
			sweeps.advance(t, clk, 70*time.Second) // the host died at its last heartbeat
			if name == "failing" {
				sweeps.failing.Store(true)
				sweeps.advance(t, clk, 20*time.Second)
				sweeps.failing.Store(false)
			} else {
				hang := func() { clk.Add(20 * time.Second) }
				sweeps.stall.Store(&hang)
			}
			waitUntil(t, "the dead host's sandbox lost right after 20 s of store trouble", func() (bool, string) {
				st := sandboxState(t, h.st, sb.ID)
				return st == berth.SandboxLost, string(st)
			})
		})
	}
}

// TestLIF2_StoreOutageLosesNoSandbox: PostgreSQL is down for five minutes (a failover that
// went wrong) while the replica runs and the host keeps its sandbox. When the store answers
// again, the replica does not declare the sandbox lost for the silence of the outage, in which
// no heartbeat could be recorded; a whole lease TTL of silence after it, it does (LIF-2).
func TestLIF2_StoreOutageLosesNoSandbox(t *testing.T) {
	pg := pgtest.StartPrivate(t)
	ctx := context.Background()
	st, err := postgres.Open(ctx, pg.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := &fakeClock{now: time.Date(2031, 5, 1, 12, 0, 0, 0, time.UTC)}
	t0 := clk.Now()
	_, err = st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a1", Pool: berth.PoolEphemeral, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, HeartbeatAt: t0}, t0)
	must(t, err)
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: t0})))
	must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-1", Template: "python", Tenant: "acme", AgentID: "a1",
		State: berth.SandboxRunning, MemoryMiB: 512, VCPUs: 1, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "test", t0))
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Clock, cfg.SweepInterval, cfg.CacheTTL = clk.Now, 10*time.Millisecond, time.Millisecond
	sweeps := &sweepCounter{Store: st}
	s := New(cfg, sweeps)
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go s.Run(runCtx)
	sweeps.waitSweeps(t, false, 1)

	pg.Stop(t)
	sweeps.waitSweeps(t, true, 1)
	for range 60 { // a 5 min outage; the host keeps heartbeating into errors
		clk.Add(5 * time.Second)
		sweeps.waitSweeps(t, true, 1)
	}
	pg.Start(t)
	sweeps.waitSweeps(t, false, 3)
	if got := sandboxState(t, st, "sb-1"); got != berth.SandboxRunning {
		t.Fatalf("after a 5 min store outage, the sandbox of a host no heartbeat could be recorded for is %s, want running", got)
	}
	sweeps.advance(t, clk, 91*time.Second)
	waitState(t, st, "sb-1", berth.SandboxLost, "the sandbox lost once its host was silent for a lease after the outage")
	evs, err := st.Events(ctx, berth.EventFilter{Entity: "sandbox/sb-1"})
	must(t, err)
	if last := evs[len(evs)-1]; last.To != "lost" || !strings.Contains(last.Reason, "lease expired") {
		t.Fatalf("last event %+v, want running → lost for an expired lease", last)
	}
}

// TestLIF2_AnAgentThatNeverAnswersHoldsNoLease: a host keeps ten of its sandboxes listed in
// stopping (deletes nobody finished) and never answers a delete. The sweeper sends those
// deletes again, in the background, one to that agent at a time; its loop goes on, and another
// host that died is declared lost when its lease ends (LIF-2). Sent inline, each delete held
// the loop for AgentTimeout (30 s), and the dead host's sandbox stayed running (an attack).
func TestLIF2_AnAgentThatNeverAnswersHoldsNoLease(t *testing.T) {
	h, clk, sweeps, sb := leaseHarness(t)
	ctx := context.Background()
	release := make(chan struct{})
	var deletes, inFlight, most atomic.Int64
	stalling := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		deletes.Add(1)
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		select { // never answer while the test runs
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(stalling.Close)
	t.Cleanup(func() { close(release) })
	t0 := clk.Now()
	var held []berth.HeldSandbox
	for i := range 10 {
		id := fmt.Sprintf("sb-stuck-%d", i)
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a2",
			State: berth.SandboxRunning, MemoryMiB: 1, VCPUs: 1, CreatedAt: t0, ExpiresAt: t0.Add(24 * time.Hour)}, "test", t0))
		_, err := h.st.TransitionSandbox(ctx, id, nil, berth.SandboxStopping, "delete requested", "tenant/acme", t0)
		must(t, err)
		held = append(held, berth.HeldSandbox{ID: id})
	}
	beat := func() { // a2 keeps heartbeating, listing its stopping sandboxes
		_, err := h.st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: "a2", Address: stalling.URL, Status: berth.AgentActive,
			IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, CPUTotal: 2,
			Sandboxes: held, HeartbeatAt: clk.Now()}, clk.Now())
		must(t, err)
	}
	beat()
	runReplica(t, h)
	sweeps.waitSweeps(t, false, 1)
	for range 14 { // a1 is silent from its heartbeat at t0; a2 heartbeats every 5 s
		clk.Add(5 * time.Second)
		beat()
		sweeps.waitSweeps(t, false, 1)
	}
	waitUntil(t, "the sweeper sending a2 its deletes again", func() (bool, string) {
		return deletes.Load() > 0, fmt.Sprintf("%d deletes", deletes.Load())
	})
	clk.Add(21 * time.Second) // a1's lease (90 s) has ended; a2's deletes still hang
	beat()
	waitUntil(t, "the dead host's sandbox lost while another host's deletes hang", func() (bool, string) {
		st := sandboxState(t, h.st, sb.ID)
		return st == berth.SandboxLost, string(st)
	})
	if m := most.Load(); m != 1 {
		t.Errorf("%d deletes in flight to one agent at once, want 1", m)
	}
}

// TestLIF2_ABusyHostsEndedSandboxesHideNoLiveOne: a host ran one long-lived sandbox and then
// ended 1,000 short ones (kept for retention), then died. Its long-lived sandbox is lost when
// the lease ends: lease expiry reads the host's live sandboxes, not its newest 1,000 of any
// state, which hid it for good (an attack).
func TestLIF2_ABusyHostsEndedSandboxesHideNoLiveOne(t *testing.T) {
	h, clk, sweeps, sb := leaseHarness(t)
	ctx := context.Background()
	t0 := clk.Now()
	for i := range 1000 {
		at := t0.Add(time.Duration(i+1) * time.Millisecond)
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: fmt.Sprintf("sb-short-%04d", i), Template: "python", Tenant: "acme",
			AgentID: "a1", State: berth.SandboxStopped, MemoryMiB: 1, VCPUs: 1, CreatedAt: at, ExpiresAt: at.Add(time.Hour)}, "test", at))
	}
	runReplica(t, h)
	sweeps.waitSweeps(t, false, 1)
	sweeps.advance(t, clk, 91*time.Second)
	waitUntil(t, "the long-lived sandbox of a dead busy host lost", func() (bool, string) {
		st := sandboxState(t, h.st, sb.ID)
		return st == berth.SandboxLost, string(st)
	})
}
