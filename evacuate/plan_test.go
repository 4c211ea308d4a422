package evacuate

import (
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

var guestGen = rapid.Custom(func(t *rapid.T) Guest {
	return Guest{
		Stateful:        rapid.Bool().Draw(t, "stateful"),
		Reconstructible: rapid.Bool().Draw(t, "reconstructible"),
		CanSnapshot:     rapid.Bool().Draw(t, "canSnapshot"),
		SnapshotMiB:     rapid.Int64Range(0, 2048).Draw(t, "snapshot"),
	}
})

// TestSPOT3_TriageProperties: over random hosts, the plan never moves more bytes than the
// budget, never drops a small irreproducible guest while moving a bigger one, accounts for
// every guest exactly once, keeps its hard deadline strictly inside the window, and never
// reconstructs or moves a stateful guest on a preemptible host.
func TestSPOT3_TriageProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		guests := rapid.SliceOfN(guestGen, 0, 30).Draw(t, "guests")
		byID := map[string]Guest{}
		for i := range guests {
			guests[i].ID = fmt.Sprintf("g%d", i)
			byID[guests[i].ID] = guests[i]
		}
		in := Input{
			Guests:            guests,
			Now:               t0,
			NoticeEnd:         t0.Add(time.Duration(rapid.IntRange(0, 60).Draw(t, "notice")) * time.Second),
			Margin:            time.Duration(rapid.IntRange(1, 10).Draw(t, "margin")) * time.Second,
			LinkMiBps:         float64(rapid.IntRange(0, 200).Draw(t, "link")),
			Preemptible:       rapid.Bool().Draw(t, "preemptible"),
			SnapshotStateless: rapid.Bool().Draw(t, "snapshotStateless"),
		}
		p := Triage(in)
		if !p.HardDeadline.Before(in.NoticeEnd) {
			t.Fatalf("hard deadline %v not strictly inside the notice ending %v", p.HardDeadline, in.NoticeEnd)
		}
		if p.MovedMiB > p.BudgetMiB {
			t.Fatalf("moves %d MiB over a %d MiB budget", p.MovedMiB, p.BudgetMiB)
		}
		if len(p.Steps) != len(in.Guests) {
			t.Fatalf("%d steps for %d guests", len(p.Steps), len(in.Guests))
		}
		var moved int64
		biggestMoved, smallestLost := int64(-1), int64(math.MaxInt64)
		var irreproducibleMoved int64
		seen := map[string]bool{}
		for _, s := range p.Steps {
			g, ok := byID[s.GuestID]
			if !ok || seen[s.GuestID] {
				t.Fatalf("step %+v: unknown or repeated guest", s)
			}
			seen[s.GuestID] = true
			if in.Preemptible && g.Stateful && s.Action != Loss {
				t.Fatalf("stateful guest %s on a preemptible host planned as %s", g.ID, s.Action)
			}
			if s.Action == SnapshotMove && g.Reconstructible && !(in.SnapshotStateless && g.CanSnapshot) {
				t.Fatalf("reconstructible guest %s moved by snapshot without SnapshotStateless", g.ID)
			}
			switch s.Action {
			case SnapshotMove:
				moved += s.MiB
				if g.Reconstructible {
					break
				}
				irreproducibleMoved += s.MiB
				biggestMoved = max(biggestMoved, s.MiB)
			case Loss:
				if g.CanSnapshot && !g.Reconstructible && !(in.Preemptible && g.Stateful) {
					smallestLost = min(smallestLost, s.MiB)
				}
			}
		}
		if moved != p.MovedMiB {
			t.Fatalf("moved %d MiB but the plan says %d", moved, p.MovedMiB)
		}
		if smallestLost < biggestMoved {
			t.Fatalf("a %d MiB guest is lost while a %d MiB one is moved", smallestLost, biggestMoved)
		}
		// Stateless moves take only what the irreproducible ones left: no irreproducible guest
		// is lost that would have fitted in it.
		if smallestLost != math.MaxInt64 && smallestLost <= p.BudgetMiB-irreproducibleMoved {
			t.Fatalf("an irreproducible %d MiB guest is lost though %d of the %d MiB budget was left by the irreproducible moves",
				smallestLost, p.BudgetMiB-irreproducibleMoved, p.BudgetMiB)
		}
	})
}

// TestSPOT3_StatelessMovesWithWhatIsLeft: with a runtime that checkpoints, stateless guests
// are moved by their memory with the budget the stateful ones leave, smallest first, and the
// rest are reconstructed; the stateful guest comes first even though it is larger.
func TestSPOT3_StatelessMovesWithWhatIsLeft(t *testing.T) {
	p := Triage(Input{
		Guests: []Guest{
			{ID: "db", Stateful: true, CanSnapshot: true, SnapshotMiB: 1500},
			{ID: "session-big", Reconstructible: true, CanSnapshot: true, SnapshotMiB: 900},
			{ID: "session-small", Reconstructible: true, CanSnapshot: true, SnapshotMiB: 600},
		},
		Now: t0, NoticeEnd: t0.Add(30 * time.Second), Margin: 5 * time.Second, LinkMiBps: 100, SnapshotStateless: true,
	})
	got := map[string]Action{}
	for _, s := range p.Steps {
		got[s.GuestID] = s.Action
	}
	want := map[string]Action{"db": SnapshotMove, "session-small": SnapshotMove, "session-big": Reconstruct}
	for id, a := range want {
		if got[id] != a {
			t.Fatalf("plan %+v: %s is %s, want %s", p.Steps, id, got[id], a)
		}
	}
	if p.Steps[0].GuestID != "session-big" || p.Steps[1].GuestID != "db" {
		t.Fatalf("order %+v: want reconstructions, then the stateful move, then the stateless one", p.Steps)
	}
}

// TestSPOT3_ProcessRuntimeGuestsAreReconstructedOrLost: the process runtime cannot snapshot,
// so its irreproducible guests are budgeted losses, said so, never silently dropped.
func TestSPOT3_ProcessRuntimeGuestsAreReconstructedOrLost(t *testing.T) {
	p := Triage(Input{
		Guests: []Guest{{ID: "ci-job", Reconstructible: true}, {ID: "notebook", SnapshotMiB: 300}},
		Now:    t0, NoticeEnd: t0.Add(30 * time.Second), Margin: 5 * time.Second, LinkMiBps: 100,
	})
	if len(p.Steps) != 2 || p.Steps[0].Action != Reconstruct || p.Steps[1].Action != Loss || p.Steps[1].Reason == "" {
		t.Fatalf("plan %+v", p)
	}
	if p.BudgetMiB != 2500 {
		t.Fatalf("budget %d MiB, want 100 MiB/s × 25 s", p.BudgetMiB)
	}
}

// TestPLAN1_WorkedExample: a 4 GiB guest needs ≈137 MiB/s to leave inside a 30 s notice and
// ≈34 MiB/s inside 2 minutes; on a 1 Gbps link (≈119 MiB/s) none of 20 such guests fits in
// 30 s and 3 fit in 2 minutes.
func TestPLAN1_WorkedExample(t *testing.T) {
	link := 1e9 / 8 / (1 << 20) // 1 Gbps in MiB/s
	w := Workload{MemoryMiB: 4096, UnitSeconds: 600, InterruptionsPerHour: 0.05, NoticeSeconds: 30,
		LinkMiBps: link, GuestsPerHost: 20, CordonSeconds: 1}
	a := Spot(w)
	if math.Round(a.PerGuestMiBps) != 137 || a.GuestsThatFit != 0 || !a.CordonBeatsNotice || a.Pool != "stateful" {
		t.Fatalf("30 s notice: %+v", a)
	}
	w.NoticeSeconds = 120
	a = Spot(w)
	if math.Round(a.PerGuestMiBps) != 34 || a.GuestsThatFit != 3 {
		t.Fatalf("2 min notice: %+v", a)
	}
	if got := a.ExpectedLossPerHour; got != 0.05*20*300 {
		t.Fatalf("expected loss %v guest-seconds per hour, want rate × guests × half a unit", got)
	}
	w.AuthoritativeOutside = true
	if a := Spot(w); a.Pool != "ephemeral" {
		t.Fatalf("reconstructible work: %+v, want the ephemeral pool", a)
	}
}

// TestSpotGuestsThatFitNeverWraps (a new user's report: `berth plan --link-gbps NaN` printed
// "guests that leave in time -9223372036854775808 of 20"): a link so fast, or a guest so small,
// that the number of moves inside the window overflows an int — or is +Inf or NaN — answers
// every guest, or none for NaN, never a negative count.
func TestSpotGuestsThatFitNeverWraps(t *testing.T) {
	for _, tc := range []struct {
		name       string
		link, mem  float64
		wantFitted int
	}{
		{"link of 1e300 Gbps", 1e300 * 1e9 / 8 / (1 << 20), 4096, 20},
		{"link beyond an int", 1e25, 4096, 20},
		{"tiny guest", 100, 1e-300, 20},
		{"infinite link", math.Inf(1), 4096, 20},
		{"NaN link", math.NaN(), 4096, 0},
		{"one guest and a half", 4096 * 1.5 / 30, 4096, 1},
	} {
		w := Workload{MemoryMiB: tc.mem, NoticeSeconds: 30, LinkMiBps: tc.link, GuestsPerHost: 20}
		if got := Spot(w).GuestsThatFit; got != tc.wantFitted {
			t.Errorf("%s: %d guests fit, want %d", tc.name, got, tc.wantFitted)
		}
	}
}
