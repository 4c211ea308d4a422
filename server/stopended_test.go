package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent"
	"github.com/berth-dev/berth/agent/runtime/noop"
	"github.com/berth-dev/berth/store/sqlite"
)

// endedCalls records the ids of every EndedSandboxes read, and every HeldEnded read.
type endedCalls struct {
	berth.Store
	mu    sync.Mutex
	calls [][]string
}

func (e *endedCalls) EndedSandboxes(ctx context.Context, agentID string, held []berth.HeldCopy) (berth.HeldCheck, error) {
	ids := make([]string, len(held))
	for i, h := range held {
		ids[i] = h.ID
	}
	e.mu.Lock()
	e.calls = append(e.calls, ids)
	e.mu.Unlock()
	return e.Store.EndedSandboxes(ctx, agentID, held)
}

func (e *endedCalls) HeldEnded(ctx context.Context, agentID string) ([]string, berth.HeldCheck, error) {
	e.mu.Lock()
	e.calls = append(e.calls, []string{"all held by " + agentID})
	e.mu.Unlock()
	return e.Store.HeldEnded(ctx, agentID)
}

func (e *endedCalls) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.calls)
}

// stopEndedServer is a server on a fresh in-memory SQLite store, which it sees through wrap
// (nil: as it is), whose clock reads *now (nil: the real clock). The store is returned too.
func stopEndedServer(t *testing.T, wrap func(berth.Store) berth.Store, now *time.Time) (*Server, *sqlite.Store) {
	t.Helper()
	st, err := sqlite.Open(context.Background(), ":memory:")
	must(t, err)
	t.Cleanup(func() { st.Close() })
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	if now != nil {
		cfg.Clock = func() time.Time { return *now }
	}
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	var seen berth.Store = st
	if wrap != nil {
		seen = wrap(st)
	}
	return New(cfg, seen), st
}

// TestAGT6_DeltaChecksWhatIsNew (issue 16, goal 2): a delta's AGT-6 check reads the store
// only for the sandboxes no round has found live for the agent's boot, so an agent whose
// sandboxes' working sets move costs no read per heartbeat. A sandbox the store does not know
// is still stopped at its first listing; one the store ended while the agent kept listing it
// is stopped by the sweep (Config.HeldSweepEvery); another boot's findings count for nothing.
func TestAGT6_DeltaChecksWhatIsNew(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	calls := &endedCalls{}
	s, st := stopEndedServer(t, func(st berth.Store) berth.Store { calls.Store = st; return calls }, &now)
	var err error
	agent := newFakeAgent(t, "")
	for _, id := range []string{"sb-1", "sb-2"} {
		must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
			State: berth.SandboxRunning, MemoryMiB: 256, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	}
	whole := berth.Heartbeat{AgentID: "a1", Address: agent.srv.URL, Status: berth.AgentActive, BootID: "b1", Seq: 1,
		Sandboxes: []berth.HeldSandbox{{ID: "sb-1"}, {ID: "sb-2"}}}
	_, err = st.ApplyHeartbeat(ctx, whole, now) // the store's agent_held, which the sweep reads
	must(t, err)
	seq := int64(1)
	round := func(what string, hb berth.Heartbeat, reads int, deletes int64) {
		t.Helper()
		before := calls.count()
		s.stopEnded(hb)
		waitUntil(t, what+": the round", func() (bool, string) { return !s.stopRounds.busy("a1"), "" })
		if got := calls.count() - before; got != reads {
			t.Errorf("%s: %d reads of the store (%v); want %d", what, got, calls.calls[before:], reads)
		}
		if got := agent.deletes.Load(); got != deletes {
			t.Errorf("%s: the agent was told to stop %d sandboxes in all; want %d", what, got, deletes)
		}
	}
	delta := func(ids ...string) berth.Heartbeat {
		seq++
		hb := whole
		hb.Seq, hb.Delta, hb.BaseSeq, hb.Sandboxes = seq, true, seq-1, nil
		for _, id := range ids {
			hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: id, ResidentMiB: 100 + seq})
		}
		return hb
	}

	round("the whole list", whole, 1, 0)
	round("a delta listing a sandbox found live", delta("sb-1"), 0, 0)
	round("a delta listing a sandbox the store does not know", delta("sb-3"), 1, 1)
	_, err = st.TransitionSandbox(ctx, "sb-2", []berth.SandboxState{berth.SandboxRunning}, berth.SandboxStopped, "deleted", "test", now)
	must(t, err)
	round("a delta listing a sandbox the store ended since it was found live", delta("sb-2"), 0, 1)
	now = now.Add(s.cfg.HeldSweepEvery)
	round("the sweep", delta(), 1, 2)
	other := delta("sb-1")
	other.BootID = "b2"
	round("a delta of another boot", other, 1, 2)

	// A whole list that finds a round busy is skipped, and must not count as the sweep: the
	// next delta past HeldSweepEvery since the last real sweep sweeps (found by an attack:
	// recording it put the sweep off by a minute more, so an ended sandbox ran on ~2 min).
	_, err = st.TransitionSandbox(ctx, "sb-1", []berth.SandboxState{berth.SandboxRunning}, berth.SandboxStopped, "deleted", "test", now)
	must(t, err)
	now = now.Add(s.cfg.HeldSweepEvery - time.Second)
	inFlight := make(chan struct{})
	s.stopRounds.run("a1", "other", func() { <-inFlight }, nil) // a round in flight
	skipped := whole
	skipped.BootID = "b2"
	s.stopEnded(skipped)
	close(inFlight)
	waitUntil(t, "the round in flight", func() (bool, string) { return !s.stopRounds.busy("a1"), "" })
	now = now.Add(2 * time.Second)
	next := delta()
	next.BootID = "b2"
	// The sweep reads the store's held list (sb-1 and sb-2: this test's agent never stopped
	// sb-2), and both are ended now.
	round("the first delta a minute after the last sweep, a whole list skipped between", next, 1, 4)
}

// TestAGT6_ForgetsDepartedAgents: a replica drops its AGT-6 memory (stopSwept, stopLive) of
// an agent not swept for stopForgetAfter, keeps it for agents swept since, and looks at most
// once per HeldSweepEvery; before, an entry stayed for every agent id the replica ever met.
func TestAGT6_ForgetsDepartedAgents(t *testing.T) {
	s := New(DefaultConfig(), nil)
	t0 := time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)
	remember := func(id string, swept time.Time) {
		s.stopSwept.Store(id, swept)
		s.rememberLive(id, "boot-1", []string{id + "-sb"}, nil, true)
	}
	has := func(id string) bool {
		_, swept := s.stopSwept.Load(id)
		_, live := s.stopLive.Load(id)
		if swept != live {
			t.Fatalf("%s: in stopSwept %v, in stopLive %v; want both or neither", id, swept, live)
		}
		return swept
	}
	remember("gone", t0)
	remember("here", t0.Add(s.stopForgetAfter()-s.cfg.HeldSweepEvery/2))
	s.forgetStopRounds(t0.Add(s.stopForgetAfter()))
	if has("gone") || !has("here") {
		t.Fatalf("after a look at stopForgetAfter: gone %v, here %v; want only here kept", has("gone"), has("here"))
	}
	remember("gone-later", t0)
	s.forgetStopRounds(t0.Add(s.stopForgetAfter() + s.cfg.HeldSweepEvery/2))
	if !has("gone-later") {
		t.Fatal("a second look within HeldSweepEvery dropped an entry: it should not have looked")
	}
	s.forgetStopRounds(t0.Add(s.stopForgetAfter() + s.cfg.HeldSweepEvery))
	if has("gone-later") || !has("here") {
		t.Fatalf("after the next look: gone-later %v, here %v; want only here kept", has("gone-later"), has("here"))
	}
	// A look while the clock ran a day ahead does not hold the next one off once it is set
	// back.
	s.forgetStopRounds(t0.Add(24 * time.Hour))
	remember("gone-again", t0)
	s.forgetStopRounds(t0.Add(s.stopForgetAfter() + 2*s.cfg.HeldSweepEvery))
	if has("gone-again") {
		t.Fatal("after the clock was set back a day, forgetStopRounds did not look again")
	}
}

// TestAGT6_StaleCopiesAreStoppedByIncarnation: an agent listing a copy of a sandbox the store
// places on another agent ("moved": a create retried elsewhere after this agent's answer was
// lost) or on none ("paused": a checkpoint whose answer was lost, the guest restored here)
// is told to stop that copy, naming the incarnation it listed, both from a heartbeat's list
// and from the sweep of the store's held list; its own sandboxes are left alone, and so is a
// copy from an agent that does not number them (0: its delete could not spare a copy placed
// there again). A stale copy is not remembered as live, so it is checked again until it goes.
// Before, only terminal and unknown sandboxes were stopped: both copies ran on for good.
func TestAGT6_StaleCopiesAreStoppedByIncarnation(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	s, st := stopEndedServer(t, nil, &now)
	agent := newFakeAgent(t, "")
	for id, where := range map[string]struct {
		agent string
		state berth.SandboxState
	}{"mine": {"a1", berth.SandboxRunning}, "moved": {"a2", berth.SandboxRunning}, "paused": {"", berth.SandboxPaused},
		"unnumbered": {"a2", berth.SandboxRunning}} {
		must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: where.agent,
			State: where.state, MemoryMiB: 256, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	}
	whole := berth.Heartbeat{AgentID: "a1", Address: agent.srv.URL, Status: berth.AgentActive, BootID: "b1", Seq: 1,
		Sandboxes: []berth.HeldSandbox{{ID: "mine", Incarnation: 1}, {ID: "moved", Incarnation: 4},
			{ID: "paused", Incarnation: 5}, {ID: "unnumbered"}}}
	_, err := st.ApplyHeartbeat(ctx, whole, now) // the store's agent_held, which the sweep reads
	must(t, err)
	round := func(what string, hb berth.Heartbeat, want ...string) {
		t.Helper()
		before := len(agent.deletesAsked())
		s.stopEnded(hb)
		waitUntil(t, what+": the round", func() (bool, string) { return !s.stopRounds.busy("a1"), "" })
		got := agent.deletesAsked()[before:]
		if !slices.Equal(got, want) {
			t.Errorf("%s: deletes %q; want %q", what, got, want)
		}
	}
	stale := []string{"/internal/sandboxes/moved?boot=b1&incarnation=4", "/internal/sandboxes/paused?boot=b1&incarnation=5"}
	round("the whole list", whole, stale...)
	delta := whole
	delta.Seq, delta.Delta, delta.BaseSeq = 2, true, 1
	delta.Sandboxes = []berth.HeldSandbox{{ID: "mine", Incarnation: 1, ResidentMiB: 50}, {ID: "paused", Incarnation: 5, ResidentMiB: 50}}
	round("a delta listing a stale copy again", delta, "/internal/sandboxes/paused?boot=b1&incarnation=5")
	now = now.Add(s.cfg.HeldSweepEvery)
	delta.Seq, delta.BaseSeq, delta.Sandboxes = 3, 2, nil
	round("the sweep of the store's held list", delta, stale...)
}

// runAgent is a real agent (noop runtime) with id, run until the test ends; its internal API
// is served by the test (Handler), not its own listener.
func runAgent(t *testing.T, id string) *agent.Agent {
	t.Helper()
	acfg := agent.DefaultConfig()
	acfg.ID, acfg.Admission, acfg.MemoryMiB, acfg.HeadroomMiB = id, berth.AdmissionCommitted, 4096, 0
	acfg.NodeToken = "node-token"
	acfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := agent.New(acfg, &noop.Runtime{})
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// TestAGT6_AStaleStopSparesTheNextBootsCopy (an attack): incarnations are numbered anew with
// each boot. A round checks boot b1's list and finds its copy of "sb-x" (incarnation 1) stale
// — the store records sb-x paused — and while the round is still sending its deletes, the
// host restarts as boot b2 at the same address and sb-x is resumed there: b2's first copy,
// incarnation 1 again, recorded running. The round's stop, meant for b1's copy, must not stop
// b2's: before the stop named its boot, it did, and the resumed sandbox was gone from its host.
func TestAGT6_AStaleStopSparesTheNextBootsCopy(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	s, st := stopEndedServer(t, nil, nil)
	b1, b2 := runAgent(t, "a1"), runAgent(t, "a1")
	var cur atomic.Pointer[http.Handler]
	h1, h2 := b1.Handler(), b2.Handler()
	cur.Store(&h1)
	var restarted atomic.Bool
	host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete && r.URL.Path == "/internal/sandboxes/sb-gone" && restarted.CompareAndSwap(false, true) {
			// The host restarts while the round sends its deletes; a resume of sb-x lands on it.
			cur.Store(&h2)
			if ok, err := st.MoveSandbox(ctx, "sb-x", []berth.SandboxState{berth.SandboxPaused},
				berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a1", ExpiresAt: now.Add(time.Hour), Image: "sb-x/1"},
				"restoring it on agent/a1", "test", time.Now()); err != nil || !ok {
				t.Errorf("record resuming: %v %v", ok, err)
			}
			if err := b2.Create(ctx, berth.AgentCreate{ID: "sb-x", Template: "python", MemoryMiB: 256}); err != nil {
				t.Errorf("resume on boot b2: %v", err)
			}
			if ok, err := st.TransitionSandbox(ctx, "sb-x", []berth.SandboxState{berth.SandboxResuming}, berth.SandboxRunning,
				"agent restored it", "test", time.Now()); err != nil || !ok {
				t.Errorf("record running: %v %v", ok, err)
			}
		}
		// The call token is bound to the agent's own address; this host stands in for both boots.
		r.Header.Set(berth.HeaderNodeToken, "node-token")
		(*cur.Load()).ServeHTTP(w, r)
	}))
	t.Cleanup(host.Close)
	must(t, b1.Create(ctx, berth.AgentCreate{ID: "sb-x", Template: "python", MemoryMiB: 256}))
	must(t, b1.Create(ctx, berth.AgentCreate{ID: "sb-gone", Template: "python", MemoryMiB: 256}))
	must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-x", Template: "python", Tenant: "acme", State: berth.SandboxPaused,
		Image: "sb-x/1", PausedAt: now, MemoryMiB: 256, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, "test", now))
	hb := b1.Heartbeat(now)
	hb.Address = host.URL
	_, err := st.ApplyHeartbeat(ctx, hb, now)
	must(t, err)
	s.stopEnded(hb)
	waitUntil(t, "the round", func() (bool, string) { return !s.stopRounds.busy("a1"), "" })
	if !restarted.Load() {
		t.Fatal("the round sent no delete of sb-gone")
	}
	listed := slices.ContainsFunc(b2.Heartbeat(time.Now()).Sandboxes, func(h berth.HeldSandbox) bool { return h.ID == "sb-x" })
	if sb, err := st.Sandbox(ctx, "sb-x"); err != nil || sb.State != berth.SandboxRunning || !listed {
		t.Fatalf("sb-x is %s (%v), boot b2 holds it: %v; want running and held: the stop meant for boot b1's copy stopped b2's",
			sb.State, err, listed)
	}
}
