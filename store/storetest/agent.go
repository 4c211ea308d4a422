package storetest

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth"
)

// fullHeartbeat sets every Heartbeat field to a non-zero value, so a field the store forgets
// to keep shows up in the round-trip diff.
func fullHeartbeat() berth.Heartbeat {
	return berth.Heartbeat{
		AgentID: "a1", Address: "http://127.0.0.1:7071", Region: "eu-west", Pool: berth.PoolStateful,
		Preemptible: true, HeartbeatAt: at(-2 * time.Second), Seq: 7, Status: berth.AgentActive,
		CPUTotal: 16, CPUUsed: 3.25, MemoryMiBTotal: 65536, MemoryMiBUsed: 12000, MemoryMiBCommitted: 30000,
		MemoryAdmission: berth.AdmissionWorkingSet, MemoryMiBAdmittable: 40000, IntakeOpen: true,
		MemoryPressure: 0.125, StartsInFlight: 3,
		Sandboxes: []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 300, Measured: true}, {ID: "sb-2"}},
		Ended:     []berth.EndedSandbox{{ID: "sb-gone", State: berth.SandboxStopped, Reason: "ttl", At: at(-time.Second)}},
		Version:   "v1.2.3", BootID: "boot-1", MeasurementErrors: 2, Runtime: "gvisor", Checkpoint: true,
	}
}

func testHeartbeatRoundTrip(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := fullHeartbeat()
	v := reflect.ValueOf(hb)
	for i := range v.NumField() {
		switch v.Type().Field(i).Name {
		case "Delta", "BaseSeq", "Removed":
			continue // how a heartbeat travels (issue 16, goal 2), not what the store keeps: testHeldDelta
		case "StatusReason":
			continue // written into the status change's event, not kept: testHeartbeatEvents
		}
		if v.Field(i).IsZero() {
			t.Fatalf("fixture leaves Heartbeat.%s zero; set it so the round trip covers it", v.Type().Field(i).Name)
		}
	}
	if n := mustHeartbeat(t, s, hb, T0); n != 0 {
		t.Errorf("netted = %d, want 0", n)
	}
	want := berth.Agent{Heartbeat: hb, LastSeen: T0}
	got, err := s.Agent(ctx, "a1")
	if err != nil {
		t.Fatalf("Agent(a1): %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Agent(a1) mismatch (-want +got):\n%s", diff)
	}

	second := heartbeat("a2", 1024)
	second.Status = "" // empty means active
	mustHeartbeat(t, s, second, at(time.Second))
	all, err := s.Agents(ctx)
	if err != nil {
		t.Fatalf("Agents: %v", err)
	}
	second.Status = berth.AgentActive
	wantAll := []berth.Agent{want, {Heartbeat: second, LastSeen: at(time.Second)}}
	if diff := cmp.Diff(wantAll, all, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("Agents mismatch (-want +got):\n%s", diff)
	}
	_, err = s.Agent(ctx, "nope")
	wantNotFound(t, "Agent(nope)", err)
}

func testHeartbeatEvents(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 2048)
	hb.BootID = "b1"
	mustHeartbeat(t, s, hb, T0)
	mustHeartbeat(t, s, hb, at(time.Second)) // nothing changes: no event
	got, err := s.Agent(ctx, "a1")
	if err != nil || !got.LastSeen.Equal(at(time.Second)) {
		t.Errorf("LastSeen = %v, %v; want %v", got.LastSeen, err, at(time.Second))
	}
	hb.Status, hb.StatusReason = berth.AgentDraining, "aws rebalance notice" // the agent drains itself and says why
	mustHeartbeat(t, s, hb, at(2*time.Second))
	hb.Status, hb.BootID = berth.AgentActive, "b2" // it restarted; a reason sent while active writes nothing
	mustHeartbeat(t, s, hb, at(3*time.Second))
	ev := func(d time.Duration, from, to, reason string) berth.Event {
		return berth.Event{At: at(d), Entity: "agent/a1", From: from, To: to, Reason: reason, Actor: "agent/a1"}
	}
	wantEvents(t, s, "agent/a1", []berth.Event{
		ev(0, "", "active", "registered"),
		ev(2*time.Second, "active", "draining", "heartbeat: aws rebalance notice"),
		ev(3*time.Second, "draining", "active", "heartbeat"),
		ev(3*time.Second, "b1", "b2", "agent restarted"),
	})
}

func testOperatorDrain(t *testing.T, s berth.Store) {
	ctx := t.Context()
	check := func(when, status, reason string) {
		t.Helper()
		a, err := s.Agent(ctx, "a1")
		if err != nil {
			t.Fatalf("%s: Agent: %v", when, err)
		}
		if string(a.Status) != status || a.DrainReason != reason {
			t.Errorf("%s: agent = %s (drain %q), want %s (drain %q)", when, a.Status, a.DrainReason, status, reason)
		}
	}
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	if err := s.SetAgentDrain(ctx, "a1", true, "kernel upgrade", "admin/ops", at(time.Second)); err != nil {
		t.Fatalf("drain: %v", err)
	}
	check("drained", "draining", "kernel upgrade")
	if err := s.SetAgentDrain(ctx, "a1", true, "again", "admin/ops", at(2*time.Second)); err != nil {
		t.Fatalf("drain again: %v", err)
	}
	check("drained twice", "draining", "kernel upgrade")
	mustHeartbeat(t, s, heartbeat("a1", 2048), at(3*time.Second)) // says active
	check("after an active heartbeat", "draining", "kernel upgrade")
	if err := s.SetAgentDrain(ctx, "a1", false, "upgrade done", "admin/ops", at(4*time.Second)); err != nil {
		t.Fatalf("undrain: %v", err)
	}
	check("undrained", "active", "")
	if err := s.SetAgentDrain(ctx, "a1", false, "", "admin/ops", at(5*time.Second)); err != nil {
		t.Fatalf("undrain again: %v", err)
	}
	evs := events(t, s, berth.EventFilter{Entity: "agent/a1"})
	want := []berth.Event{
		{At: T0, Entity: "agent/a1", From: "", To: "active", Reason: "registered", Actor: "agent/a1"},
		{At: at(time.Second), Entity: "agent/a1", From: "active", To: "draining", Reason: "kernel upgrade", Actor: "admin/ops"},
		{At: at(4 * time.Second), Entity: "agent/a1", From: "draining", To: "active", Reason: "upgrade done", Actor: "admin/ops"},
	}
	if diff := cmp.Diff(want, evs, eventOpts); diff != "" {
		t.Errorf("agent events (-want +got):\n%s", diff)
	}

	if err := s.SetAgentDrain(ctx, "a1", true, "", "admin/ops", at(6*time.Second)); err != nil {
		t.Fatalf("drain without reason: %v", err)
	}
	if a, err := s.Agent(ctx, "a1"); err != nil || a.Status != berth.AgentDraining || a.DrainReason == "" {
		t.Errorf("drain without reason: agent = %s (drain %q), %v; want draining with a non-empty reason", a.Status, a.DrainReason, err)
	}
	wantNotFound(t, "SetAgentDrain(nope)", s.SetAgentDrain(ctx, "nope", true, "x", "admin/ops", T0))
}

// testDrainOfSelfDraining pins that lifting an operator drain restores the status the agent
// itself reported, so an agent draining on its own (preemption) stays draining.
func testDrainOfSelfDraining(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 2048)
	hb.Status = berth.AgentDraining
	mustHeartbeat(t, s, hb, T0)
	if err := s.SetAgentDrain(ctx, "a1", true, "ops", "admin/ops", at(time.Second)); err != nil {
		t.Fatalf("drain: %v", err)
	}
	if err := s.SetAgentDrain(ctx, "a1", false, "", "admin/ops", at(2*time.Second)); err != nil {
		t.Fatalf("undrain: %v", err)
	}
	a, err := s.Agent(ctx, "a1")
	if err != nil || a.Status != berth.AgentDraining || a.DrainReason != "" {
		t.Errorf("agent = %s (drain %q), %v; want draining (drain \"\")", a.Status, a.DrainReason, err)
	}
	// The undrain's event says why the status did not move, not a bare draining → draining.
	evs := events(t, s, berth.EventFilter{Entity: "agent/a1"})
	if last := evs[len(evs)-1]; last.From != "draining" || last.To != "draining" || last.Reason != "undrained; the agent still reports draining" {
		t.Errorf("undrain event = %+v; want draining → draining, \"undrained; the agent still reports draining\"", last)
	}
}

func testHeartbeatNetting(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 4096), T0)
	mustHeartbeat(t, s, heartbeat("a2", 4096), T0)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("sb-2", "acme", "a1", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("sb-3", "acme", "a2", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("sb-4", "acme", "a2", berth.SandboxStopped), T0)
	for _, r := range []berth.Reservation{
		reservation("r1", "a1", "sb-1", 512, T0), // listed by a1: netted
		reservation("r2", "a1", "sb-2", 512, T0), // not listed yet: kept
		reservation("r3", "a2", "sb-3", 512, T0), // another agent's: kept until a2 lists it
		reservation("r4", "a2", "sb-4", 512, T0), // terminal sandbox: netted by a2's heartbeat
		reservation("r5", "a2", "sb-1", 512, T0), // sb-1 on another agent's ledger: kept
		reservation("r6", "a1", "sb-x", 512, T0), // unknown sandbox, not listed: kept (expires)
	} {
		mustReserve(t, s, r, T0)
	}
	hb := heartbeat("a1", 4096)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1"}}
	if n := mustHeartbeat(t, s, hb, at(time.Second)); n != 1 {
		t.Errorf("a1 heartbeat netted %d, want 1", n)
	}
	// a1's heartbeat reads only a1's reservations (issue 16, goal 2): a2's, even of a
	// terminal sandbox, wait for a2's heartbeat.
	if diff := cmp.Diff([]string{"r2", "r3", "r4", "r5", "r6"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("reservations after a1's heartbeat (-want +got):\n%s", diff)
	}
	hb2 := heartbeat("a2", 4096)
	hb2.Sandboxes = []berth.HeldSandbox{{ID: "sb-3"}}
	if n := mustHeartbeat(t, s, hb2, at(2*time.Second)); n != 2 {
		t.Errorf("a2 heartbeat netted %d, want 2 (r3 listed, r4 of a terminal sandbox)", n)
	}
	for id, want := range map[string]struct {
		actor string
		at    time.Time
	}{"r1": {"agent/a1", at(time.Second)}, "r3": {"agent/a2", at(2 * time.Second)}, "r4": {"agent/a2", at(2 * time.Second)}} {
		evs := events(t, s, berth.EventFilter{Entity: "reservation/" + id})
		last := evs[len(evs)-1]
		if last.From != "held" || last.To != "netted" || last.Actor != want.actor || !last.At.Equal(want.at) {
			t.Errorf("last event of %s = %+v, want held → netted by %s at %v", id, last, want.actor, want.at)
		}
	}
	if n := mustHeartbeat(t, s, hb2, at(3*time.Second)); n != 0 {
		t.Errorf("repeated a2 heartbeat netted %d, want 0", n)
	}
	if diff := cmp.Diff([]string{"r2", "r5", "r6"}, reservationIDs(t, s)); diff != "" {
		t.Errorf("reservations after a2's heartbeat (-want +got):\n%s", diff)
	}
	pending, err := s.Pending(ctx, at(3*time.Second))
	if err != nil {
		t.Fatalf("Pending: %v", err)
	}
	if diff := cmp.Diff(map[string]int64{"a1": 1024, "a2": 512}, pending); diff != "" {
		t.Errorf("Pending (-want +got):\n%s", diff)
	}
}

func testHeartbeatEnded(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 4096), T0)
	mustHeartbeat(t, s, heartbeat("a2", 4096), T0)
	mustCreate(t, s, sandbox("sb-1", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("sb-2", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("sb-3", "acme", "a2", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("sb-4", "acme", "a1", berth.SandboxRunning), T0)
	mustTransition(t, s, "sb-2", berth.SandboxStopped, "deleted", T0)
	mustReserve(t, s, reservation("r1", "a1", "sb-1", 512, T0), T0)

	hb := heartbeat("a1", 4096)
	hb.Ended = []berth.EndedSandbox{
		{ID: "sb-1", State: berth.SandboxFailed, Reason: "exit status 1", At: T0},
		{ID: "sb-2", State: berth.SandboxLost, Reason: "late", At: T0},        // already terminal
		{ID: "sb-3", State: berth.SandboxEvicted, Reason: "not mine", At: T0}, // belongs to a2
		{ID: "sb-9", State: berth.SandboxStopped, Reason: "unknown", At: T0},  // no such sandbox
		{ID: "sb-4", State: berth.SandboxRunning, Reason: "bogus", At: T0},    // not an end state
	}
	if n := mustHeartbeat(t, s, hb, at(time.Second)); n != 0 {
		t.Errorf("netted = %d, want 0 (the ended sandbox's reservation is released, not netted)", n)
	}
	mustHeartbeat(t, s, hb, at(2*time.Second)) // repeated until accepted: no new effects
	for id, want := range map[string]berth.SandboxState{
		"sb-1": berth.SandboxFailed, "sb-2": berth.SandboxStopped, "sb-3": berth.SandboxRunning, "sb-4": berth.SandboxRunning,
	} {
		sb, err := s.Sandbox(ctx, id)
		if err != nil || sb.State != want {
			t.Errorf("%s = %s, %v; want %s", id, sb.State, err, want)
		}
	}
	wantEvents(t, s, "sandbox/sb-1", []berth.Event{
		{At: T0, Entity: "sandbox/sb-1", From: "pending", To: "running", Reason: "placed on agent/a1", Actor: "test"},
		{At: at(time.Second), Entity: "sandbox/sb-1", From: "running", To: "failed", Reason: "exit status 1", Actor: "agent/a1"},
	})
	wantEvents(t, s, "reservation/r1", []berth.Event{
		{At: T0, Entity: "reservation/r1", From: "", To: "held", Reason: "reserved for sandbox/sb-1 by replica-1", Actor: "replica-1"},
		{At: at(time.Second), Entity: "reservation/r1", From: "held", To: "released", Reason: "sandbox failed", Actor: "agent/a1"},
	})
	if got := len(events(t, s, berth.EventFilter{Entity: "sandbox/sb-2"})); got != 2 {
		t.Errorf("sb-2 has %d events, want 2 (create, stopped)", got)
	}
	for _, id := range []string{"sb-3", "sb-4"} {
		if got := len(events(t, s, berth.EventFilter{Entity: "sandbox/" + id})); got != 1 {
			t.Errorf("%s has %d events, want 1 (create)", id, got)
		}
	}
}

// testRestartLosesUnheld: the first heartbeat of a new boot lists what the agent holds; every
// other live sandbox the store assigns to it becomes lost with an event (AGT-6), and nothing
// changes while the boot id stays the same.
func testRestartLosesUnheld(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 2048)
	hb.BootID = "b1"
	mustHeartbeat(t, s, hb, T0)
	mustCreate(t, s, sandbox("kept", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("gone", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("other", "acme", "a2", berth.SandboxRunning), T0)
	mustHeartbeat(t, s, hb, at(time.Second)) // same boot, empty list: no reconcile
	if sb, err := s.Sandbox(ctx, "gone"); err != nil || sb.State != berth.SandboxRunning {
		t.Fatalf("same boot: gone = %+v, %v; want still running", sb, err)
	}
	hb.BootID = "b2"
	hb.Sandboxes = []berth.HeldSandbox{{ID: "kept", ResidentMiB: 10, Measured: true}}
	mustHeartbeat(t, s, hb, at(2*time.Second))
	for id, want := range map[string]berth.SandboxState{"kept": berth.SandboxRunning, "gone": berth.SandboxLost, "other": berth.SandboxRunning} {
		if sb, err := s.Sandbox(ctx, id); err != nil || sb.State != want {
			t.Errorf("after restart: %s = %+v, %v; want %s", id, sb.State, err, want)
		}
	}
	wantEvents(t, s, "sandbox/gone", []berth.Event{
		{At: T0, Entity: "sandbox/gone", From: "pending", To: "running", Reason: "placed on agent/a1", Actor: "test"},
		{At: at(2 * time.Second), Entity: "sandbox/gone", From: "running", To: "lost", Reason: "agent restarted without it", Actor: "agent/a1"},
	})
}

// testHeartbeatPromotesStarting: a starting sandbox its agent lists is running (its replica
// may have died before recording it); one on another agent, or not listed, is left alone.
func testHeartbeatPromotesStarting(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	mustCreate(t, s, sandbox("listed", "acme", "a1", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("unlisted", "acme", "a1", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("elsewhere", "acme", "a2", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("still-starting", "acme", "a1", berth.SandboxStarting), T0)
	hb := heartbeat("a1", 2048)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "listed"}, {ID: "elsewhere"}, {ID: "unknown"}, {ID: "still-starting", Starting: true}}
	mustHeartbeat(t, s, hb, at(time.Second))
	for id, want := range map[string]berth.SandboxState{"listed": berth.SandboxRunning, "unlisted": berth.SandboxStarting,
		"elsewhere": berth.SandboxStarting, "still-starting": berth.SandboxStarting} {
		if sb, err := s.Sandbox(ctx, id); err != nil || sb.State != want {
			t.Errorf("%s = %v, %v; want %s", id, sb.State, err, want)
		}
	}
	wantEvents(t, s, "sandbox/listed", []berth.Event{
		{At: T0, Entity: "sandbox/listed", From: "pending", To: "starting", Reason: "placed on agent/a1", Actor: "test"},
		{At: at(time.Second), Entity: "sandbox/listed", From: "starting", To: "running", Reason: "agent reports it running", Actor: "agent/a1"},
	})
}

// testOvertakenHeartbeat: a heartbeat that arrives after a newer one of the same boot (its
// POST was slow) does not roll the agent's figures back; its ended list still applies. Newer
// means a higher Seq, whatever the agent's clock said (C32): here the overtaken one carries
// the later timestamp.
func testOvertakenHeartbeat(t *testing.T, s berth.Store) {
	ctx := t.Context()
	newer := heartbeat("a1", 2048)
	newer.BootID, newer.Seq, newer.HeartbeatAt = "b1", 2, at(-24*time.Hour)
	older := heartbeat("a1", 512)
	older.BootID, older.Seq, older.HeartbeatAt = "b1", 1, at(24*time.Hour)
	older.Sandboxes = []berth.HeldSandbox{{ID: "old"}}
	mustCreate(t, s, sandbox("old", "acme", "a1", berth.SandboxRunning), T0)
	older.Ended = []berth.EndedSandbox{{ID: "old", State: berth.SandboxStopped, Reason: "ttl", At: at(time.Second)}}
	mustHeartbeat(t, s, newer, at(3*time.Second))
	mustHeartbeat(t, s, older, at(4*time.Second))
	a, err := s.Agent(ctx, "a1")
	if err != nil || a.MemoryMiBAdmittable != 2048 || len(a.Sandboxes) != 0 {
		t.Fatalf("after an overtaken heartbeat: admittable %d, held %v, %v; want the newer figures", a.MemoryMiBAdmittable, a.Sandboxes, err)
	}
	if sb, err := s.Sandbox(ctx, "old"); err != nil || sb.State != berth.SandboxStopped {
		t.Fatalf("the overtaken heartbeat's ended list: %v, %v; want stopped", sb.State, err)
	}
	if a, err := s.Agent(ctx, "a1"); err != nil || !a.LastSeen.Equal(at(3*time.Second)) || a.Seq != 2 {
		t.Fatalf("after an overtaken heartbeat: last seen %v, seq %d, %v; want the newer one's (T0+3s, 2)", a.LastSeen, a.Seq, err)
	}
	restarted := heartbeat("a1", 1024)
	restarted.BootID, restarted.Seq, restarted.HeartbeatAt = "b2", 1, at(time.Second) // a new boot starts over
	mustHeartbeat(t, s, restarted, at(5*time.Second))
	if a, err := s.Agent(ctx, "a1"); err != nil || a.MemoryMiBAdmittable != 1024 {
		t.Fatalf("a new boot's heartbeat was ignored: %d, %v", a.MemoryMiBAdmittable, err)
	}
	// The clock jumps back and forth between heartbeats: every newer Seq is applied, and
	// the store's last_seen is the receive time, never the agent's stamp.
	for i, skew := range []time.Duration{-24 * time.Hour, 24 * time.Hour, -time.Hour, -48 * time.Hour} {
		hb := heartbeat("a1", int64(100*(i+1)))
		hb.BootID, hb.Seq, hb.HeartbeatAt = "b2", int64(i+2), at(skew)
		now := at(time.Duration(6+i) * time.Second)
		mustHeartbeat(t, s, hb, now)
		a, err := s.Agent(ctx, "a1")
		if err != nil || a.MemoryMiBAdmittable != hb.MemoryMiBAdmittable || !a.LastSeen.Equal(now) {
			t.Fatalf("heartbeat seq %d stamped %v: admittable %d, last seen %v, %v; want %d, %v",
				hb.Seq, skew, a.MemoryMiBAdmittable, a.LastSeen, err, hb.MemoryMiBAdmittable, now)
		}
	}
	// An agent that does not number its heartbeats (Seq 0) is applied in arrival order.
	for i, skew := range []time.Duration{time.Hour, -time.Hour} {
		hb := heartbeat("a3", int64(1000+i))
		hb.BootID, hb.HeartbeatAt = "b1", at(skew)
		mustHeartbeat(t, s, hb, at(time.Duration(10+i)*time.Second))
		if a, err := s.Agent(ctx, "a3"); err != nil || a.MemoryMiBAdmittable != hb.MemoryMiBAdmittable {
			t.Fatalf("unnumbered heartbeat %d: admittable %d, %v; want %d", i, a.MemoryMiBAdmittable, err, hb.MemoryMiBAdmittable)
		}
	}
}

// testCreateOutcome: consecutive failed creates quarantine an agent with an event, a success
// resets the count and lifts it with an event; an unknown agent is ErrNotFound (PLC-9).
func testCreateOutcome(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	q := berth.QuarantinePolicy{After: 3, Backoff: 30 * time.Second, MaxBackoff: time.Minute}
	var a berth.Agent
	var err error
	for i := range 3 {
		if a, err = s.RecordCreateOutcome(ctx, "a1", true, q, "replica/r1", at(time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("failure %d: %v", i+1, err)
		}
	}
	if a.CreateFailures != 3 || !a.QuarantinedUntil.Equal(at(2*time.Second+30*time.Second)) {
		t.Fatalf("after 3 failures: failures %d, until %v", a.CreateFailures, a.QuarantinedUntil)
	}
	if got, err := s.Agent(ctx, "a1"); err != nil || got.CreateFailures != 3 || !got.QuarantinedUntil.Equal(a.QuarantinedUntil) {
		t.Fatalf("stored agent: %+v, %v", got, err)
	}
	mustHeartbeat(t, s, heartbeat("a1", 2048), at(3*time.Second)) // heartbeats do not lift it
	if got, _ := s.Agent(ctx, "a1"); got.QuarantinedUntil.IsZero() {
		t.Fatal("a heartbeat lifted the quarantine")
	}
	if a, err = s.RecordCreateOutcome(ctx, "a1", false, q, "replica/r1", at(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() {
		t.Fatalf("after a success: %d, %v", a.CreateFailures, a.QuarantinedUntil)
	}
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "agent/a1"})
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, e := range evs {
		path = append(path, e.From+">"+e.To)
	}
	want := []string{">active", "active>quarantined", "quarantined>active"}
	if diff := cmp.Diff(want, path); diff != "" {
		t.Fatalf("agent events (-want +got):\n%s", diff)
	}
	if _, err := s.RecordCreateOutcome(ctx, "nope", true, q, "replica/r1", T0); !errors.Is(err, berth.ErrNotFound) {
		t.Fatalf("unknown agent: %v", err)
	}
}

// testOOMEvents: a heartbeat whose sandbox reports more OOM kills than the previous one
// writes an event for it (C09); an unchanged count writes nothing.
func testOOMEvents(t *testing.T, s berth.Store) {
	hb := heartbeat("a1", 2048)
	hb.BootID = "b1"
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1"}}
	mustHeartbeat(t, s, hb, T0)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", OOMKills: 2}}
	mustHeartbeat(t, s, hb, at(time.Second))
	mustHeartbeat(t, s, hb, at(2*time.Second)) // same count: nothing new
	evs, err := s.Events(t.Context(), berth.EventFilter{Entity: "sandbox/sb-1"})
	if err != nil || len(evs) != 1 || evs[0].To != "oom_kill" || !evs[0].At.Equal(at(time.Second)) {
		t.Fatalf("OOM events: %+v, %v; want one at the heartbeat that reported the kills", evs, err)
	}
}

// testAgentsChangedSince (issue 16, goal 2): a read with no cursor is every agent without
// held lists; a read since a cursor returns every agent written after it — by a heartbeat, a
// drain, a join — and, merged by id into what was read before, equals a whole read.
func testAgentsChangedSince(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 4096)
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 100, Measured: true}, {ID: "sb-2", Starting: true}}
	mustHeartbeat(t, s, hb, T0)
	mustHeartbeat(t, s, heartbeat("a2", 2048), T0)
	read := func(cursor string) berth.AgentChanges {
		t.Helper()
		c, err := s.AgentsChangedSince(ctx, cursor)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range c.Agents {
			if a.Sandboxes == nil || len(a.Sandboxes) > 0 {
				t.Fatalf("agent %s read with held list %v; want empty, not nil", a.AgentID, a.Sandboxes)
			}
		}
		return c
	}
	merged := map[string]berth.Agent{}
	merge := func(c berth.AgentChanges) {
		if c.Full {
			clear(merged)
		}
		for _, a := range c.Agents {
			merged[a.AgentID] = a
		}
	}
	whole := func(when string) {
		t.Helper()
		full, err := s.Agents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]berth.Agent, 0, len(merged))
		for i := range full {
			full[i].Sandboxes = []berth.HeldSandbox{}
			got = append(got, merged[full[i].AgentID])
		}
		if len(merged) != len(full) {
			t.Fatalf("%s: %d agents merged from the reads, the store has %d", when, len(merged), len(full))
		}
		if diff := cmp.Diff(full, got); diff != "" {
			t.Errorf("%s: the reads merged differ from a whole read (-whole +merged):\n%s", when, diff)
		}
	}

	full, err := s.Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(full) != 2 || len(full[0].Sandboxes) != 2 {
		t.Fatalf("Agents = %+v; want a1 with its 2 held sandboxes, and a2", full)
	}
	first := read("")
	if !first.Full || len(first.Agents) != 2 {
		t.Fatalf("a read without a cursor: full %v, %d agents; want every agent (2)", first.Full, len(first.Agents))
	}
	merge(first)
	whole("first read")

	cursor := first.Cursor
	steps := []struct {
		what    string
		changed string
		write   func() error
	}{
		{"a heartbeat", "a1", func() error {
			hb := heartbeat("a1", 3000)
			_, err := s.ApplyHeartbeat(ctx, hb, at(time.Second))
			return err
		}},
		{"a drain", "a2", func() error { return s.SetAgentDrain(ctx, "a2", true, "kernel upgrade", "op", at(2*time.Second)) }},
		{"a join", "a3", func() error {
			_, err := s.ApplyHeartbeat(ctx, heartbeat("a3", 1024), at(3*time.Second))
			return err
		}},
		{"nothing", "", func() error { return nil }},
	}
	for _, st := range steps {
		if err := st.write(); err != nil {
			t.Fatalf("%s: %v", st.what, err)
		}
		c := read(cursor)
		found := st.changed == ""
		for _, a := range c.Agents {
			found = found || a.AgentID == st.changed
		}
		if !found {
			t.Fatalf("the read after %s (cursor %q, full %v) misses agent %s", st.what, cursor, c.Full, st.changed)
		}
		merge(c)
		whole("after " + st.what)
		cursor = c.Cursor
	}
	if c := read("not-a-cursor"); !c.Full || len(c.Agents) != 3 {
		t.Errorf("a read with a cursor the store never gave: full %v, %d agents; want every agent (3)", c.Full, len(c.Agents))
	}
}
