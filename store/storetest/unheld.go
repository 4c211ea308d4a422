package storetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/berth-dev/berth"
)

// unheldGrace is the grace the UnheldRunning tests ask for: two heartbeats of 10 s.
const unheldGrace = 20 * time.Second

// numbered returns a whole-list heartbeat of agent id, boot b1, numbered seq, listing held.
func numbered(id string, seq int64, held ...berth.HeldSandbox) berth.Heartbeat {
	hb := heartbeat(id, 2048)
	hb.BootID, hb.Seq, hb.Sandboxes = "b1", seq, held
	return hb
}

// wantUnheld fails the test unless UnheldRunning(seenSince, grace, limit) answers want.
func wantUnheld(t *testing.T, s berth.Store, what string, seenSince time.Time, grace time.Duration, limit int, want []berth.UnheldSandbox) {
	t.Helper()
	got, err := s.UnheldRunning(t.Context(), seenSince, grace, limit)
	if err != nil {
		t.Fatalf("%s: UnheldRunning: %v", what, err)
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("%s: UnheldRunning (-want +got):\n%s", what, diff)
	}
}

// testUnheldRunning (AGT-6, the same boot): UnheldRunning returns the running sandboxes that
// their live agent's current held list leaves out, once that list was received at least the
// grace after the sandbox last entered running — and nothing else: not a listed one (even
// listed as starting), not one within the grace (the create race), not one whose latest entry
// into running is recent though its first is old, not a paused, stopped, starting or stopping
// row, not one of a silent agent, not one of an agent whose list a refused delta leaves old,
// not one of an unnumbered agent, and not one listed by another agent than its own (which is
// its own agent's ghost). It writes nothing.
func testUnheldRunning(t *testing.T, s berth.Store) {
	ctx := t.Context()
	held := []berth.HeldSandbox{{ID: "held"}, {ID: "held-starting", Starting: true}, {ID: "misfiled"}, {ID: "resumed"}}
	record(t, s, numbered("a1", 1, held...), T0)
	record(t, s, numbered("a2", 1, berth.HeldSandbox{ID: "elsewhere"}), T0)
	record(t, s, numbered("a3", 1), at(time.Second))
	for _, sb := range []berth.Sandbox{
		sandbox("held", "acme", "a1", berth.SandboxRunning),
		sandbox("held-starting", "acme", "a1", berth.SandboxRunning),
		sandbox("resumed", "acme", "a1", berth.SandboxRunning),
		sandbox("ghost", "acme", "a1", berth.SandboxRunning),
		sandbox("starting", "acme", "a1", berth.SandboxStarting),
		sandbox("stopping", "acme", "a1", berth.SandboxStopping),
		sandbox("stopped", "acme", "a1", berth.SandboxStopped),
		sandbox("lost", "acme", "a1", berth.SandboxLost),
		sandbox("paused", "acme", "", berth.SandboxPaused),
		sandbox("elsewhere", "acme", "a2", berth.SandboxRunning),
		sandbox("misfiled", "acme", "a2", berth.SandboxRunning), // a1 lists it, its own a2 does not
		sandbox("behind-resync", "acme", "a3", berth.SandboxRunning),
		sandbox("unnumbered", "acme", "a4", berth.SandboxRunning),
	} {
		mustCreate(t, s, sb, T0)
	}
	wantUnheld(t, s, "lists received 10 s after the running marks", T0, unheldGrace, 0, nil)

	// a1's next heartbeat (a delta, nothing changed) comes 10 s in: still within the grace.
	d := numbered("a1", 2)
	d.Delta, d.BaseSeq = true, 1
	record(t, s, d, at(10*time.Second))
	wantUnheld(t, s, "a1's delta 10 s after the running marks", T0, unheldGrace, 0, nil)

	// "resumed" is paused away from a1 and resumed onto it again: its latest entry into
	// running (T0+22 s) is what counts, not its first (T0).
	if ok, err := s.MoveSandbox(ctx, "resumed", []berth.SandboxState{berth.SandboxRunning},
		berth.SandboxMove{To: berth.SandboxPaused, PausedAt: at(12 * time.Second)}, "paused", "test", at(12*time.Second)); err != nil || !ok {
		t.Fatalf("pause resumed: %v, %v", ok, err)
	}
	if ok, err := s.MoveSandbox(ctx, "resumed", []berth.SandboxState{berth.SandboxPaused},
		berth.SandboxMove{To: berth.SandboxResuming, AgentID: "a1"}, "resuming", "test", at(20*time.Second)); err != nil || !ok {
		t.Fatalf("resume resumed: %v, %v", ok, err)
	}
	mustCreate(t, s, sandbox("young", "acme", "a1", berth.SandboxRunning), at(15*time.Second))
	if ok, err := s.TransitionSandbox(ctx, "resumed", []berth.SandboxState{berth.SandboxResuming}, berth.SandboxRunning,
		"restored", "test", at(22*time.Second)); err != nil || !ok {
		t.Fatalf("resumed → running: %v, %v", ok, err)
	}
	// 25 s in: a1's delta drops "resumed" (its new guest is not listed yet) and a2 heartbeats.
	d = numbered("a1", 3)
	d.Delta, d.BaseSeq, d.Removed = true, 2, []string{"resumed"}
	record(t, s, d, at(25*time.Second))
	record(t, s, numbered("a2", 2, berth.HeldSandbox{ID: "elsewhere"}), at(25*time.Second))
	// a3's only list is from T0+1 s; its next heartbeats are deltas on a base the store does
	// not hold (resync pending): refused, they leave the list, and its age, as they were.
	bad := numbered("a3", 3)
	bad.Delta, bad.BaseSeq = true, 2
	if res := record(t, s, bad, at(30*time.Second)); res.Applied || !res.Resync {
		t.Fatalf("a3's delta on a base the store does not hold: %+v; want resync", res)
	}
	// a4 does not number its heartbeats: its list cannot be told current.
	record(t, s, numbered("a4", 0), at(30*time.Second))

	ghost := berth.UnheldSandbox{ID: "ghost", AgentID: "a1", RunningSince: T0, HeldAt: at(25 * time.Second)}
	misfiled := berth.UnheldSandbox{ID: "misfiled", AgentID: "a2", RunningSince: T0, HeldAt: at(25 * time.Second)}
	wantUnheld(t, s, "25 s in", T0, unheldGrace, 0, []berth.UnheldSandbox{ghost, misfiled})
	wantUnheld(t, s, "25 s in, limit 1", T0, unheldGrace, 1, []berth.UnheldSandbox{ghost})
	wantUnheld(t, s, "agents seen since 26 s", at(26*time.Second), unheldGrace, 0, nil)
	wantUnheld(t, s, "a grace of 26 s", T0, 26*time.Second, 0, nil)
	wantUnheld(t, s, "a grace of exactly 25 s", T0, 25*time.Second, 0, []berth.UnheldSandbox{ghost, misfiled})

	// 45 s in, whole lists from a1 (again without "resumed" and "young") and a3.
	record(t, s, numbered("a1", 4, held[:3]...), at(45*time.Second))
	record(t, s, numbered("a3", 4), at(45*time.Second))
	ghost.HeldAt = at(45 * time.Second)
	wantUnheld(t, s, "45 s in", T0, unheldGrace, 0, []berth.UnheldSandbox{
		{ID: "behind-resync", AgentID: "a3", RunningSince: T0, HeldAt: at(45 * time.Second)},
		ghost, misfiled,
		{ID: "resumed", AgentID: "a1", RunningSince: at(22 * time.Second), HeldAt: at(45 * time.Second)},
		{ID: "young", AgentID: "a1", RunningSince: at(15 * time.Second), HeldAt: at(45 * time.Second)},
	})
	if _, err := s.UnheldRunning(ctx, T0, -time.Second, 0); err == nil {
		t.Errorf("UnheldRunning with a negative grace: no error")
	}
	// It only reads: the ghost is still running, with its creation event alone.
	if sb, err := s.Sandbox(ctx, "ghost"); err != nil || sb.State != berth.SandboxRunning {
		t.Errorf("ghost after UnheldRunning: %v, %v; want running", sb.State, err)
	}
	if evs := events(t, s, berth.EventFilter{Entity: "sandbox/ghost"}); len(evs) != 1 {
		t.Errorf("ghost has %d events after UnheldRunning, want 1 (its creation)", len(evs))
	}
}

// UnheldAfterOldReplica is UnheldRunning's case that the store's API cannot reach (AGT-6, the
// same boot): a replica of the previous release applies a heartbeat, moving the agent's
// heartbeat_seq and last_seen but not agent_held nor held_seq. The held list is then older
// than last_seen says, so its sandboxes are not judged until a heartbeat of this release
// writes the list again. exec runs one SQL statement, without arguments, on s's database.
func UnheldAfterOldReplica(t *testing.T, s berth.Store, exec func(query string) error) {
	record(t, s, numbered("a1", 1, berth.HeldSandbox{ID: "held"}), T0)
	mustCreate(t, s, sandbox("held", "acme", "a1", berth.SandboxRunning), T0)
	mustCreate(t, s, sandbox("ghost", "acme", "a1", berth.SandboxRunning), T0)
	wantUnheld(t, s, "the list received with the running marks", T0, unheldGrace, 0, nil)
	// The previous release's UPDATE: the figures, the seq and last_seen; no held list.
	if err := exec(fmt.Sprintf(`UPDATE agents SET heartbeat_seq = 2, last_seen = %d WHERE id = 'a1'`, at(time.Minute).UnixMilli())); err != nil {
		t.Fatalf("a previous release's heartbeat: %v", err)
	}
	wantUnheld(t, s, "after a previous release's heartbeat", T0, unheldGrace, 0, nil)
	record(t, s, numbered("a1", 3, berth.HeldSandbox{ID: "held"}), at(2*time.Minute))
	wantUnheld(t, s, "after this release's next heartbeat", T0, unheldGrace, 0, []berth.UnheldSandbox{
		{ID: "ghost", AgentID: "a1", RunningSince: T0, HeldAt: at(2 * time.Minute)},
	})
}

// testClaimSweep: ClaimSweep gives a fleet-wide sweep to one claimer per period — the first
// claim of a name, then the first at or after its period's end, never one inside it — keeps
// names apart, lets a claim recorded by a clock since set back (more than a period ahead) be
// overwritten, refuses a negative period, and of many concurrent claims of one period lets
// exactly one win.
func testClaimSweep(t *testing.T, s berth.Store) {
	ctx := t.Context()
	const every = 30 * time.Second
	claim := func(name string, now time.Time, want bool) {
		t.Helper()
		got, err := s.ClaimSweep(ctx, name, now, every)
		if err != nil || got != want {
			t.Fatalf("ClaimSweep(%q, %v): %v, %v; want %v", name, now, got, err, want)
		}
	}
	claim("unheld", at(0), true)
	claim("unheld", at(0), false)
	claim("unheld", at(every-time.Millisecond), false)
	claim("other", at(time.Second), true) // names are apart
	claim("unheld", at(every), true)
	claim("unheld", at(every+time.Second), false)
	// A clock set back: a recorded claim less than a period ahead of now still holds its
	// period; one more than a period ahead (at(every) seen from just before at(0)) is
	// overwritten, and the new claim holds its own period.
	claim("unheld", at(time.Second), false)
	claim("unheld", at(-time.Millisecond), true)
	claim("unheld", at(0), false)
	// Periods under the store's millisecond count as one: two claims in one instant never
	// both win (the first draft let them: now − period rounded to now itself).
	for _, every := range []time.Duration{time.Nanosecond, 999 * time.Microsecond, time.Millisecond + time.Nanosecond} {
		name := fmt.Sprintf("short-%s", every)
		for i, want := range []bool{true, false} {
			if got, err := s.ClaimSweep(ctx, name, at(time.Hour), every); err != nil || got != want {
				t.Fatalf("ClaimSweep(%q, every %s) #%d at one instant: %v, %v; want %v", name, every, i+1, got, err, want)
			}
		}
	}
	if _, err := s.ClaimSweep(ctx, "unheld", at(time.Hour), -time.Second); err == nil {
		t.Error("ClaimSweep with a negative period: no error")
	}
	if _, err := s.ClaimSweep(ctx, "", at(time.Hour), every); err == nil {
		t.Error("ClaimSweep with an empty name: no error")
	}

	// Racing: many claimers of one period, a fresh name each round.
	for round := range 5 {
		name := fmt.Sprintf("race-%d", round)
		var won atomic.Int64
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				ok, err := s.ClaimSweep(ctx, name, at(time.Duration(i)*time.Millisecond), every)
				if err != nil {
					t.Errorf("ClaimSweep(%q): %v", name, err)
				}
				if ok {
					won.Add(1)
				}
			})
		}
		wg.Wait()
		if n := won.Load(); n != 1 {
			t.Fatalf("round %d: %d concurrent claims of one period won, want exactly 1", round, n)
		}
	}
}
