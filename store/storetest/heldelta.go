package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth"
)

// record runs RecordHeartbeat and fails the test on an error.
func record(t *testing.T, s berth.Store, hb berth.Heartbeat, now time.Time) berth.HeartbeatResult {
	t.Helper()
	res, err := s.RecordHeartbeat(t.Context(), hb, "", now)
	if err != nil {
		t.Fatalf("RecordHeartbeat(%s seq %d): %v", hb.AgentID, hb.Seq, err)
	}
	return res
}

// wantHeld fails the test unless the store lists exactly want (in id order) as agent's held
// sandboxes.
func wantHeld(t *testing.T, s berth.Store, agent string, want []berth.HeldSandbox) {
	t.Helper()
	a, err := s.Agent(t.Context(), agent)
	if err != nil {
		t.Fatalf("Agent(%s): %v", agent, err)
	}
	if diff := cmp.Diff(want, a.Sandboxes, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("held sandboxes of %s (-want +got):\n%s", agent, diff)
	}
}

// testHeldDelta: a delta heartbeat (issue 16, goal 2) changes only what it lists and removes
// what it names, onto exactly the base it names; any other base — a lost answer, another
// boot, an unknown agent, an overtaken heartbeat — is refused with Resync, applying nothing
// but Ended (and leaving no placeholder agent behind).
func testHeldDelta(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 2048)
	hb.BootID, hb.Seq = "b1", 1
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 10, Measured: true}, {ID: "sb-2"}, {ID: "sb-3"}}
	if res := record(t, s, hb, T0); !res.Applied || res.Resync || res.Agent.MemoryMiBAdmittable != 2048 {
		t.Fatalf("whole list: %+v; want applied, the agent as written", res)
	}
	wantHeld(t, s, "a1", hb.Sandboxes)

	d := hb
	d.Seq, d.Delta, d.BaseSeq, d.MemoryMiBAdmittable = 2, true, 1, 1500
	d.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 40, Measured: true}, {ID: "sb-4", Starting: true}}
	d.Removed = []string{"sb-2", "never-held"}
	if res := record(t, s, d, at(time.Second)); !res.Applied || res.Resync {
		t.Fatalf("delta onto the acknowledged base: %+v; want applied", res)
	}
	wantHeld(t, s, "a1", []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 40, Measured: true}, {ID: "sb-3"}, {ID: "sb-4", Starting: true}})

	// A delta onto a base the store does not hold (its answer to seq 2 was lost, say).
	mustCreate(t, s, sandbox("sb-3", "t1", "a1", berth.SandboxRunning), T0)
	stale := d
	stale.Seq, stale.BaseSeq, stale.MemoryMiBAdmittable = 4, 3, 100
	stale.Sandboxes, stale.Removed = nil, []string{"sb-1"}
	stale.Ended = []berth.EndedSandbox{{ID: "sb-3", State: berth.SandboxStopped, Reason: "ttl"}}
	if res := record(t, s, stale, at(2*time.Second)); res.Applied || !res.Resync {
		t.Fatalf("delta onto seq 3 while the store holds seq 2: %+v; want resync", res)
	}
	a, err := s.Agent(ctx, "a1")
	if err != nil || a.MemoryMiBAdmittable != 1500 || a.Seq != 2 {
		t.Fatalf("after a refused delta: admittable %d seq %d, %v; want 1500 and 2 kept", a.MemoryMiBAdmittable, a.Seq, err)
	}
	wantHeld(t, s, "a1", []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 40, Measured: true}, {ID: "sb-3"}, {ID: "sb-4", Starting: true}})
	if sb, err := s.Sandbox(ctx, "sb-3"); err != nil || sb.State != berth.SandboxStopped {
		t.Fatalf("sb-3 after a refused delta that ended it: %+v, %v; want its ended list applied", sb, err)
	}

	// An overtaken delta, a delta of another boot and one from an unknown agent: resync too.
	over := d
	over.Seq, over.BaseSeq = 2, 1
	other := d
	other.BootID, other.Seq, other.BaseSeq = "b2", 3, 2
	unknown := d
	unknown.AgentID = "a9"
	for name, x := range map[string]berth.Heartbeat{"overtaken": over, "another boot": other, "unknown agent": unknown} {
		if res := record(t, s, x, at(3*time.Second)); res.Applied || !res.Resync {
			t.Fatalf("%s delta: %+v; want resync", name, res)
		}
	}
	if _, err := s.Agent(ctx, "a9"); err == nil {
		t.Fatalf("a delta from an unknown agent left agent a9 behind")
	}

	// The whole list after a resync replaces the held rows, and deltas follow from it.
	full := hb
	full.Seq = 5
	full.Sandboxes = []berth.HeldSandbox{{ID: "sb-4"}, {ID: "sb-5", ResidentMiB: 7, Measured: true}}
	if res := record(t, s, full, at(4*time.Second)); !res.Applied {
		t.Fatalf("whole list after a resync: %+v; want applied", res)
	}
	wantHeld(t, s, "a1", full.Sandboxes)
	next := full
	next.Seq, next.Delta, next.BaseSeq, next.Sandboxes, next.Removed = 6, true, 5, nil, []string{"sb-4"}
	if res := record(t, s, next, at(5*time.Second)); !res.Applied {
		t.Fatalf("delta after the resync: %+v; want applied", res)
	}
	wantHeld(t, s, "a1", []berth.HeldSandbox{{ID: "sb-5", ResidentMiB: 7, Measured: true}})
}

// testHeldDeltaNetsAndPromotes: what a delta leaves unchanged still counts as held (LED-4,
// LIF-1, C09): a reservation for a sandbox listed by an earlier heartbeat is netted by a
// delta that does not list it, a guest whose Starting flag a delta clears becomes running,
// and an OOM count is compared with the stored one, not with the delta's silence.
func testHeldDeltaNetsAndPromotes(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustCreate(t, s, sandbox("sb-1", "t1", "a1", berth.SandboxStarting), T0)
	hb := heartbeat("a1", 2048)
	hb.BootID, hb.Seq = "b1", 1
	hb.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", Starting: true}, {ID: "sb-2"}}
	record(t, s, hb, T0)
	if sb, _ := s.Sandbox(ctx, "sb-1"); sb.State != berth.SandboxStarting {
		t.Fatalf("sb-1 listed as starting: %s, want starting", sb.State)
	}
	// A reservation taken for sb-2 after the heartbeat that listed it (a retried create):
	// the next delta, silent about sb-2, nets it all the same.
	if ok, err := s.Reserve(ctx, reservation("r-2", "a1", "sb-2", 256, at(time.Second)), at(time.Second)); err != nil || !ok {
		t.Fatalf("Reserve r-2: %v, %v", ok, err)
	}
	d := hb
	d.Seq, d.Delta, d.BaseSeq = 2, true, 1
	d.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", OOMKills: 1}}
	res := record(t, s, d, at(2*time.Second))
	if !res.Applied || res.Netted != 1 {
		t.Fatalf("delta: %+v; want applied, r-2 netted", res)
	}
	if sb, _ := s.Sandbox(ctx, "sb-1"); sb.State != berth.SandboxRunning {
		t.Fatalf("sb-1 after a delta clearing Starting: %s, want running", sb.State)
	}
	d2 := d
	d2.Seq, d2.BaseSeq, d2.Sandboxes = 3, 2, []berth.HeldSandbox{{ID: "sb-2", ResidentMiB: 5, Measured: true}}
	record(t, s, d2, at(3*time.Second)) // silent about sb-1: no new kill
	d3 := d2
	d3.Seq, d3.BaseSeq, d3.Sandboxes = 4, 3, []berth.HeldSandbox{{ID: "sb-1", OOMKills: 3}}
	record(t, s, d3, at(4*time.Second))
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "sandbox/sb-1", To: "oom_kill"})
	if err != nil || len(evs) != 2 || !evs[0].At.Equal(at(2*time.Second)) || !evs[1].At.Equal(at(4*time.Second)) ||
		evs[1].Reason != "the kernel OOM killer killed 2 process(es) in it" {
		t.Fatalf("OOM events: %+v, %v; want one at 2 s (1 kill) and one at 4 s (2 more)", evs, err)
	}
}

// testUsualDeltaKeepsOrder: the usual delta heartbeat (PostgreSQL's one-batch path, issue 16
// goal 2; SQLite's general path) writes what the general path writes: a sandbox the delta lists as
// started and also reports ended goes straight to its end (never through running), its
// reservation is released with its end (and the started one's netted) by the same heartbeat; a delta of a drained agent keeps it draining
// and writes no status event; a delta whose reported status changes writes that event.
func testUsualDeltaKeepsOrder(t *testing.T, s berth.Store) {
	ctx := t.Context()
	hb := heartbeat("a1", 2048)
	hb.BootID, hb.Seq = "b1", 1
	record(t, s, hb, T0)
	mustCreate(t, s, sandbox("sb-1", "t1", "a1", berth.SandboxStarting), T0)
	mustCreate(t, s, sandbox("sb-2", "t1", "a1", berth.SandboxStarting), T0)
	mustReserve(t, s, reservation("r-1", "a1", "sb-1", 256, T0), T0)
	mustReserve(t, s, reservation("r-2", "a1", "sb-2", 256, T0), T0)

	d := hb
	d.Seq, d.Delta, d.BaseSeq = 2, true, 1
	d.Sandboxes = []berth.HeldSandbox{{ID: "sb-1"}, {ID: "sb-2"}}
	d.Ended = []berth.EndedSandbox{{ID: "sb-1", State: berth.SandboxFailed, Reason: "init died"}}
	res := record(t, s, d, at(time.Second))
	if !res.Applied || res.Netted != 1 || res.Agent.Seq != 2 || res.Agent.AgentID != "a1" {
		t.Fatalf("delta: %+v; want applied, r-2 netted (r-1 goes with sb-1's end), the agent as written", res)
	}
	for id, want := range map[string]berth.SandboxState{"sb-1": berth.SandboxFailed, "sb-2": berth.SandboxRunning} {
		if sb, err := s.Sandbox(ctx, id); err != nil || sb.State != want {
			t.Fatalf("%s: %+v, %v; want %s", id, sb, err, want)
		}
	}
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "sandbox/sb-1"})
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, e := range evs {
		path = append(path, e.From+"→"+e.To)
	}
	if diff := cmp.Diff([]string{"pending→starting", "starting→failed"}, path); diff != "" {
		t.Fatalf("sb-1's events (-want +got):\n%s", diff)
	}
	if r, err := s.Reservations(ctx); err != nil || len(r) != 0 {
		t.Fatalf("reservations after the delta: %+v, %v; want none", r, err)
	}

	if err := s.SetAgentDrain(ctx, "a1", true, "maintenance", "admin", at(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	d.Seq, d.BaseSeq, d.Sandboxes, d.Ended = 3, 2, nil, nil
	if res := record(t, s, d, at(3*time.Second)); !res.Applied || res.Agent.Status != berth.AgentDraining {
		t.Fatalf("delta of a drained agent: %+v; want applied, still draining", res)
	}
	before, err := s.Events(ctx, berth.EventFilter{Entity: "agent/a1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetAgentDrain(ctx, "a1", false, "", "admin", at(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	d.Seq, d.BaseSeq, d.Status = 4, 3, berth.AgentDraining // the agent drains itself (a notice)
	if res := record(t, s, d, at(5*time.Second)); !res.Applied || res.Agent.Status != berth.AgentDraining {
		t.Fatalf("delta reporting draining: %+v; want applied, draining", res)
	}
	after, err := s.Events(ctx, berth.EventFilter{Entity: "agent/a1"})
	if err != nil {
		t.Fatal(err)
	}
	last := after[len(after)-1]
	if len(after) != len(before)+2 || last.To != string(berth.AgentDraining) || last.Reason != "heartbeat" {
		t.Fatalf("agent events: %d before the undrain, %d after, last %+v; want the undrain and then active → draining (heartbeat)",
			len(before), len(after), last)
	}
}

// testUnmeasuredHeld: UnmeasuredHeld lists exactly the held sandboxes the latest applied
// heartbeats left unmeasured, by agent; a delta that measures one takes it off, and an agent
// holding only measured guests is not there. HeldCounts counts every held sandbox by agent,
// measured or not, starting or not, through the same heartbeats.
func testUnmeasuredHeld(t *testing.T, s berth.Store) {
	ctx := t.Context()
	counts := func(w map[string]int) {
		t.Helper()
		got, err := s.HeldCounts(ctx)
		if err != nil {
			t.Fatalf("HeldCounts: %v", err)
		}
		if diff := cmp.Diff(w, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("held counts (-want +got):\n%s", diff)
		}
	}
	want := func(w map[string][]string) {
		t.Helper()
		got, err := s.UnmeasuredHeld(ctx)
		if err != nil {
			t.Fatalf("UnmeasuredHeld: %v", err)
		}
		for _, ids := range got {
			slices.Sort(ids)
		}
		if diff := cmp.Diff(w, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("unmeasured held sandboxes (-want +got):\n%s", diff)
		}
	}
	want(nil)
	counts(nil)
	a1 := heartbeat("a1", 2048)
	a1.BootID, a1.Seq = "b1", 1
	a1.Sandboxes = []berth.HeldSandbox{{ID: "sb-1", ResidentMiB: 10, Measured: true}, {ID: "sb-2"}, {ID: "sb-3", Starting: true}}
	record(t, s, a1, T0)
	a2 := heartbeat("a2", 2048)
	a2.Sandboxes = []berth.HeldSandbox{{ID: "sb-4", ResidentMiB: 20, Measured: true}}
	record(t, s, a2, T0)
	want(map[string][]string{"a1": {"sb-2", "sb-3"}})
	counts(map[string]int{"a1": 3, "a2": 1})

	d := a1
	d.Seq, d.Delta, d.BaseSeq = 2, true, 1
	d.Sandboxes = []berth.HeldSandbox{{ID: "sb-2", ResidentMiB: 30, Measured: true}}
	if res := record(t, s, d, at(time.Second)); !res.Applied {
		t.Fatalf("delta measuring sb-2: %+v; want applied", res)
	}
	want(map[string][]string{"a1": {"sb-3"}})
	a2.Sandboxes, a2.Seq = nil, a2.Seq+1
	record(t, s, a2, at(time.Second))
	counts(map[string]int{"a1": 3})
}
