package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// testRestartClearsQuarantine: a heartbeat with a new boot id clears the agent's create
// failures and its quarantine, with the event "quarantined → active" (issue 15, point 5):
// the failures were the old process's. A heartbeat of the same boot lifts nothing.
func testRestartClearsQuarantine(t *testing.T, s berth.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, heartbeat("a1", 2048), T0)
	q := berth.QuarantinePolicy{After: 2, Backoff: 10 * time.Minute, MaxBackoff: 10 * time.Minute}
	for i := range 2 {
		if _, err := s.RecordCreateOutcome(ctx, "a1", true, q, "replica/r1", at(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	hb := heartbeat("a1", 2048)
	hb.Seq = 2
	mustHeartbeat(t, s, hb, at(2*time.Second))
	if a, _ := s.Agent(ctx, "a1"); a.QuarantinedUntil.IsZero() || a.CreateFailures != 2 {
		t.Fatalf("same boot: failures %d, until %v; want the quarantine kept", a.CreateFailures, a.QuarantinedUntil)
	}
	hb = heartbeat("a1", 2048)
	hb.BootID, hb.Seq = "boot-a1-2", 1
	mustHeartbeat(t, s, hb, at(3*time.Second))
	a, err := s.Agent(ctx, "a1")
	if err != nil || a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() {
		t.Fatalf("after a restart: failures %d, until %v, %v; want 0 and none", a.CreateFailures, a.QuarantinedUntil, err)
	}
	evs, err := s.Events(ctx, berth.EventFilter{Entity: "agent/a1"})
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, e := range evs {
		path = append(path, e.From+">"+e.To)
	}
	want := []string{">active", "active>quarantined", "boot-a1>boot-a1-2", "quarantined>active"}
	if diff := cmp.Diff(want, path); diff != "" {
		t.Fatalf("agent events (-want +got):\n%s", diff)
	}
}

// testPurgeEnded: retention deletes terminal sandboxes that ended before the cutoff, their
// events and the events of reservations the ledger no longer holds, in batches; it keeps
// live sandboxes (however old), sandboxes that ended after the cutoff, held reservations and
// other entities' events; a second pass finds nothing (issue 15, point 5).
func testPurgeEnded(t *testing.T, s berth.Store) {
	ctx := t.Context()
	r, ok := s.(berth.Retainer)
	if !ok {
		t.Fatalf("%T does not implement berth.Retainer", s)
	}
	mustHeartbeat(t, s, heartbeat("a1", 8192), T0)
	for _, id := range []string{"old-1", "old-2", "old-3", "recent", "live"} {
		mustCreate(t, s, sandbox(id, "acme", "a1", berth.SandboxRunning), T0)
	}
	if ok, err := s.Reserve(ctx, reservation("res-gone", "a1", "old-1", 64, T0), T0); err != nil || !ok {
		t.Fatalf("Reserve: %v, %v", ok, err)
	}
	if ok, err := s.Reserve(ctx, reservation("res-held", "a1", "live", 64, T0), T0); err != nil || !ok {
		t.Fatalf("Reserve: %v, %v", ok, err)
	}
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		mustTransition(t, s, id, berth.SandboxStopped, "deleted", at(time.Hour)) // releases res-gone
	}
	mustTransition(t, s, "recent", berth.SandboxFailed, "boom", at(10*24*time.Hour))
	cutoff := at(7 * 24 * time.Hour)
	var total berth.Purged
	for i := 0; ; i++ {
		p, err := r.PurgeEnded(ctx, cutoff, 2)
		if err != nil {
			t.Fatalf("PurgeEnded: %v", err)
		}
		if p.Sandboxes > 2 {
			t.Fatalf("one batch of 2 deleted %d sandboxes", p.Sandboxes)
		}
		if p == (berth.Purged{}) {
			break
		}
		if i == 10 {
			t.Fatal("PurgeEnded still deleting after 10 batches")
		}
		total.Sandboxes, total.Events, total.Reservations = total.Sandboxes+p.Sandboxes, total.Events+p.Events, total.Reservations+p.Reservations
	}
	if total.Sandboxes != 3 {
		t.Fatalf("purged %d sandboxes, want the 3 that ended before the cutoff", total.Sandboxes)
	}
	for _, id := range []string{"old-1", "old-2", "old-3"} {
		if _, err := s.Sandbox(ctx, id); !errors.Is(err, berth.ErrNotFound) {
			t.Fatalf("%s after the purge: %v; want ErrNotFound", id, err)
		}
		if evs, _ := s.Events(ctx, berth.EventFilter{Entity: "sandbox/" + id}); len(evs) != 0 {
			t.Fatalf("%s's events survive: %+v", id, evs)
		}
	}
	for id, st := range map[string]berth.SandboxState{"recent": berth.SandboxFailed, "live": berth.SandboxRunning} {
		if sb, err := s.Sandbox(ctx, id); err != nil || sb.State != st {
			t.Fatalf("%s after the purge: %s, %v; want kept (%s)", id, sb.State, err, st)
		}
		if evs, _ := s.Events(ctx, berth.EventFilter{Entity: "sandbox/" + id}); len(evs) == 0 {
			t.Fatalf("%s's events were purged", id)
		}
	}
	if evs, _ := s.Events(ctx, berth.EventFilter{Entity: "reservation/res-gone"}); len(evs) != 0 {
		t.Fatalf("the ended reservation's events survive: %+v", evs)
	}
	if evs, _ := s.Events(ctx, berth.EventFilter{Entity: "reservation/res-held"}); len(evs) == 0 {
		t.Fatal("the held reservation's events were purged")
	}
	if res, _ := s.Reservations(ctx); len(res) != 1 || res[0].ID != "res-held" {
		t.Fatalf("reservations after the purge: %+v; want res-held only", res)
	}
	if evs, _ := s.Events(ctx, berth.EventFilter{Entity: "agent/a1"}); len(evs) == 0 {
		t.Fatal("an agent's events were purged")
	}
	if n, _, err := s.TenantUsage(ctx, "acme"); err != nil || n != 1 {
		t.Fatalf("acme's usage after the purge: %d, %v; want the live sandbox", n, err)
	}
}
