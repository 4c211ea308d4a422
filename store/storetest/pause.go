package storetest

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// stateList is a list of sandbox states, for from arguments.
func stateList(states ...berth.SandboxState) []berth.SandboxState { return states }

// mustSandbox returns sandbox id.
func mustSandbox(t *testing.T, s berth.Store, id string) berth.Sandbox {
	t.Helper()
	sb, err := s.Sandbox(t.Context(), id)
	if err != nil {
		t.Fatalf("Sandbox(%s): %v", id, err)
	}
	return sb
}

// testPauseStatesAreLive: pausing, paused, resuming and snapshotting are live states (LIF-1,
// PAUSE-1): a store takes them, does not call them ended, counts them against the tenant and
// lets a transition from "any non-terminal state" leave them.
func testPauseStatesAreLive(t *testing.T, s berth.Store) {
	ctx := t.Context()
	states := stateList(berth.SandboxPausing, berth.SandboxPaused, berth.SandboxResuming, berth.SandboxSnapshotting)
	var ids []string
	for _, st := range states {
		mustCreate(t, s, sandbox(string(st), "acme", "a1", st), T0)
		ids = append(ids, string(st))
	}
	if got, err := s.EndedSandboxes(ctx, "a1", copies(ids...)); err != nil || len(got.Ended) != 0 {
		t.Errorf("EndedSandboxes(%v) = %+v, %v; want none ended", ids, got, err)
	}
	if n, mem, err := s.TenantUsage(ctx, "acme"); err != nil || n != len(states) || mem != int64(512*len(states)) {
		t.Errorf("TenantUsage = %d, %d, %v; want %d sandboxes, %d MiB", n, mem, err, len(states), 512*len(states))
	}
	for _, id := range ids {
		mustTransition(t, s, id, berth.SandboxStopped, "deleted", at(time.Second))
	}
}

// testMoveSandbox: MoveSandbox moves a sandbox with the event "<old> → m.To" and writes m's
// agent, TTL end, pause time and image (a zero time as unset), leaving the other fields; it
// refuses, writing nothing, when the state is not in from or already m.To; an unknown id is
// (false, nil) (PAUSE-1, SPOT-3, LIF-3).
func testMoveSandbox(t *testing.T, s berth.Store) {
	ctx := t.Context()
	sb := sandbox("sb-1", "acme", "a1", berth.SandboxPausing)
	sb.Stateful, sb.Volume, sb.Metadata, sb.IdempotencyKey = true, "data", map[string]string{"job": "ci"}, "k1"
	mustCreate(t, s, sb, T0)
	created := berth.Event{At: T0, Entity: "sandbox/sb-1", From: "pending", To: "pausing", Reason: "placed on agent/a1", Actor: "test"}
	var evs []berth.Event
	move := func(when time.Duration, from []berth.SandboxState, m berth.SandboxMove, wantMoved bool) {
		t.Helper()
		before := mustSandbox(t, s, "sb-1")
		moved, err := s.MoveSandbox(ctx, "sb-1", from, m, "why "+string(m.To), "server/r1", at(when))
		if err != nil || moved != wantMoved {
			t.Fatalf("MoveSandbox(%s → %s, from %v) = %v, %v; want %v, nil", before.State, m.To, from, moved, err, wantMoved)
		}
		want := before
		if moved {
			want.State, want.Reason, want.AgentID = m.To, "why "+string(m.To), m.AgentID
			want.ExpiresAt, want.PausedAt, want.Image = m.ExpiresAt, m.PausedAt, m.Image
			evs = append(evs, berth.Event{At: at(when), Entity: "sandbox/sb-1", From: string(before.State), To: string(m.To),
				Reason: "why " + string(m.To), Actor: "server/r1"})
		}
		if diff := cmp.Diff(want, mustSandbox(t, s, "sb-1")); diff != "" {
			t.Errorf("after MoveSandbox(%s → %s), sandbox (-want +got):\n%s", before.State, m.To, diff)
		}
		wantEvents(t, s, "sandbox/sb-1", append([]berth.Event{created}, evs...))
	}
	paused := berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: at(time.Hour), PausedAt: at(time.Minute), Image: "img-1"}
	move(time.Minute, stateList(berth.SandboxPausing), paused, true)
	move(2*time.Minute, stateList(berth.SandboxRunning, berth.SandboxPausing), // not in from
		berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a2", ExpiresAt: at(2 * time.Hour)}, false)
	move(2*time.Minute, nil, paused, false) // already paused
	resuming := berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a2", ExpiresAt: at(2 * time.Hour), Image: "img-1"}
	// Resuming clears paused_at; an empty from is any live state, and zero fields clear theirs.
	move(3*time.Minute, stateList(berth.SandboxPaused), resuming, true)
	move(4*time.Minute, nil, berth.SandboxMove{To: berth.SandboxRunning, AgentID: "a2"}, true)
	move(5*time.Minute, nil, berth.SandboxMove{To: berth.SandboxStopped}, true)
	// A terminal state is final when from is empty.
	move(6*time.Minute, nil, berth.SandboxMove{To: berth.SandboxPaused, Image: "img-2"}, false)

	moved, err := s.MoveSandbox(ctx, "nope", nil, paused, "why", "server/r1", T0)
	if err != nil || moved {
		t.Errorf("MoveSandbox(nope) = %v, %v; want false, nil", moved, err)
	}
	wantEvents(t, s, "sandbox/nope", nil)
	if _, err := s.MoveSandbox(ctx, "sb-1", nil, berth.SandboxMove{To: "sleeping"}, "why", "server/r1", T0); err == nil {
		t.Errorf("MoveSandbox to an unknown state: err = nil, want an error")
	}
}

// testMoveSandboxReleases: a move into a terminal state releases the sandbox's reservations,
// with their events, as TransitionSandbox does; a move between live states keeps them.
func testMoveSandboxReleases(t *testing.T, s berth.Store) {
	mustHeartbeat(t, s, heartbeat("a1", 4096), T0)
	mustHeartbeat(t, s, heartbeat("a2", 4096), T0)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxSnapshotting), T0)
	mustReserve(t, s, reservation("r1", "a1", "sb-1", 512, T0), T0)
	mustReserve(t, s, reservation("r2", "a2", "sb-1", 512, T0), T0)
	mustReserve(t, s, reservation("r3", "a2", "sb-2", 512, T0), T0)
	ok, err := s.MoveSandbox(t.Context(), "sb-1", stateList(berth.SandboxSnapshotting),
		berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a2", ExpiresAt: at(time.Hour), Image: "img-1"},
		"snapshot moved", "server/r1", at(time.Second))
	if err != nil || !ok {
		t.Fatalf("MoveSandbox(snapshotting → resuming) = %v, %v; want true, nil", ok, err)
	}
	if diff := cmp.Diff([]string{"r1", "r2", "r3"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("after a live move, reservations (-want +got):\n%s", diff)
	}
	ok, err = s.MoveSandbox(t.Context(), "sb-1", stateList(berth.SandboxResuming), berth.SandboxMove{To: berth.SandboxLost},
		"restore failed", "server/r1", at(2*time.Second))
	if err != nil || !ok {
		t.Fatalf("MoveSandbox(resuming → lost) = %v, %v; want true, nil", ok, err)
	}
	if diff := cmp.Diff([]string{"r3"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("after a terminal move, reservations (-want +got):\n%s", diff)
	}
	for _, id := range []string{"r1", "r2"} {
		wantEvents(t, s, "reservation/"+id, []berth.Event{
			{At: T0, Entity: "reservation/" + id, From: "", To: "held", Reason: "reserved for sandbox/sb-1 by replica-1", Actor: "replica-1"},
			{At: at(2 * time.Second), Entity: "reservation/" + id, From: "held", To: "released", Reason: "sandbox lost", Actor: "server/r1"},
		})
	}
}

// testPausedUntouchedByHeartbeats: a paused sandbox belongs to no agent, so neither its former
// agent's heartbeats (listing it, reporting it ended, or restarting without it) nor another
// agent's touch it (PAUSE-1, AGT-6).
func testPausedUntouchedByHeartbeats(t *testing.T, s berth.Store) {
	hb := heartbeat("a1", 4096)
	hb.BootID = "b1"
	mustHeartbeat(t, s, hb, T0)
	mustCreate(t, s, sandbox("p", "acme", "a1", berth.SandboxPausing), T0)
	mustCreate(t, s, sandbox("r", "acme", "a1", berth.SandboxRunning), T0) // shows the restart reconciled
	pause := berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: at(time.Hour), PausedAt: at(time.Second), Image: "img-p"}
	if ok, err := s.MoveSandbox(t.Context(), "p", stateList(berth.SandboxPausing), pause, "paused", "server/r1", at(time.Second)); err != nil || !ok {
		t.Fatalf("MoveSandbox(pausing → paused) = %v, %v; want true, nil", ok, err)
	}
	want := mustSandbox(t, s, "p")
	hb.Sandboxes = []berth.HeldSandbox{{ID: "p"}, {ID: "r"}}
	hb.Ended = []berth.EndedSandbox{{ID: "p", State: berth.SandboxStopped, Reason: "ttl", At: at(2 * time.Second)}}
	mustHeartbeat(t, s, hb, at(2*time.Second)) // same boot, lists it and reports it ended
	other := heartbeat("a2", 4096)
	other.Sandboxes = []berth.HeldSandbox{{ID: "p"}}
	mustHeartbeat(t, s, other, at(3*time.Second))
	hb.BootID, hb.Sandboxes, hb.Ended = "b2", nil, nil
	mustHeartbeat(t, s, hb, at(4*time.Second)) // restarted without it
	if diff := cmp.Diff(want, mustSandbox(t, s, "p")); diff != "" {
		t.Errorf("paused sandbox after heartbeats (-want +got):\n%s", diff)
	}
	if got := len(events(t, s, berth.EventFilter{Entity: "sandbox/p"})); got != 2 {
		t.Errorf("sandbox/p has %d events, want 2 (create, pause)", got)
	}
	if got := mustSandbox(t, s, "r"); got.State != berth.SandboxLost {
		t.Errorf("r = %s, want lost (the restart was reconciled)", got.State)
	}
}

// testHeartbeatPromotesResuming: a resuming sandbox its agent lists, not flagged Starting, is
// running (the replica resuming it may have died); one still restoring, not listed, on another
// agent, or paused, is left alone (PAUSE-1).
func testHeartbeatPromotesResuming(t *testing.T, s berth.Store) {
	mustHeartbeat(t, s, heartbeat("a1", 4096), T0)
	for _, sb := range []berth.Sandbox{
		sandbox("resumed", "acme", "a1", berth.SandboxResuming),
		sandbox("restoring", "acme", "a1", berth.SandboxResuming),
		sandbox("unlisted", "acme", "a1", berth.SandboxResuming),
		sandbox("elsewhere", "acme", "a2", berth.SandboxResuming),
		sandbox("paused", "acme", "", berth.SandboxPaused),
		sandbox("snapshotting", "acme", "a1", berth.SandboxSnapshotting),
	} {
		mustCreate(t, s, sb, T0)
	}
	hb := heartbeat("a1", 4096)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "resumed", ResidentMiB: 100, Measured: true}, {ID: "restoring", Starting: true},
		{ID: "elsewhere"}, {ID: "paused"}, {ID: "snapshotting"}}
	mustHeartbeat(t, s, hb, at(time.Second))
	for id, want := range map[string]berth.SandboxState{
		"resumed": berth.SandboxRunning, "restoring": berth.SandboxResuming, "unlisted": berth.SandboxResuming,
		"elsewhere": berth.SandboxResuming, "paused": berth.SandboxPaused, "snapshotting": berth.SandboxSnapshotting,
	} {
		if got := mustSandbox(t, s, id); got.State != want {
			t.Errorf("%s = %s, want %s", id, got.State, want)
		}
	}
	wantEvents(t, s, "sandbox/resumed", []berth.Event{
		{At: T0, Entity: "sandbox/resumed", From: "pending", To: "resuming", Reason: "placed on agent/a1", Actor: "test"},
		{At: at(time.Second), Entity: "sandbox/resumed", From: "resuming", To: "running", Reason: "agent reports it running", Actor: "agent/a1"},
	})
}

// testAgentRuntime: the runtime and checkpoint capability a heartbeat reports are stored and
// follow later heartbeats (ISO-4, PAUSE-1); an agent that reports none has "" and false.
func testAgentRuntime(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 4096)
	hb.Runtime, hb.Checkpoint = "gvisor", true
	mustHeartbeat(t, s, hb, T0)
	mustHeartbeat(t, s, heartbeat("a2", 4096), T0)
	check := func(when string, want map[string]berth.Heartbeat) {
		t.Helper()
		all, err := s.Agents(ctx)
		if err != nil {
			t.Fatalf("%s: Agents: %v", when, err)
		}
		for _, a := range all {
			if w := want[a.AgentID]; a.Runtime != w.Runtime || a.Checkpoint != w.Checkpoint {
				t.Errorf("%s: Agents: %s runtime %q, checkpoint %v; want %q, %v", when, a.AgentID, a.Runtime, a.Checkpoint, w.Runtime, w.Checkpoint)
			}
			one, err := s.Agent(ctx, a.AgentID)
			if err != nil || one.Runtime != a.Runtime || one.Checkpoint != a.Checkpoint {
				t.Errorf("%s: Agent(%s) = %q, %v, %v; want what Agents says", when, a.AgentID, one.Runtime, one.Checkpoint, err)
			}
		}
	}
	check("first heartbeats", map[string]berth.Heartbeat{"a1": {Runtime: "gvisor", Checkpoint: true}, "a2": {}})
	hb.Runtime, hb.Checkpoint = "process", false
	mustHeartbeat(t, s, hb, at(time.Second))
	check("after a1 changed runtime", map[string]berth.Heartbeat{"a1": {Runtime: "process"}, "a2": {}})
}
