// Package evacuate is the triage of SPOT-3 and the arithmetic of PLAN-1, as pure functions:
// given a host's guests, a preemption notice's deadline and the link rate, Triage returns a
// plan (reconstruct, snapshot-move smallest first inside the bandwidth budget, or budgeted
// loss) that an executor carries out; Spot answers the spot-suitability questions of
// `berth plan`. Sizes are MiB, rates MiB/s, times are inputs (STYLE habit 1).
package evacuate

import (
	"cmp"
	"slices"
	"time"
)

// Action is what the plan does with one guest.
type Action string

// Actions of a plan (SPOT-3).
const (
	// Reconstruct: the authoritative copy lives outside the guest; recreate it elsewhere from
	// its template through the normal scheduler. Costs no link bandwidth.
	Reconstruct Action = "reconstruct"
	// SnapshotMove: irreproducible; snapshot its memory and move it, inside the budget.
	SnapshotMove Action = "snapshot_move"
	// Loss: irreproducible and cannot be moved in time (or at all): a budgeted loss, recorded
	// as lost with an event, never dropped silently.
	Loss Action = "loss"
)

// Guest is one sandbox on the host under notice. SnapshotMiB is the bytes a snapshot would
// move (non-zero chunks only, SPOT-4); CanSnapshot is false for runtimes that cannot (the
// process runtime).
type Guest struct {
	ID              string
	Stateful        bool
	Reconstructible bool
	CanSnapshot     bool
	SnapshotMiB     int64
}

// Input is everything Triage needs. Margin is how far inside the notice the hard deadline
// lies (SPOT-3: strictly inside the window).
type Input struct {
	Guests      []Guest
	Now         time.Time
	NoticeEnd   time.Time
	Margin      time.Duration
	LinkMiBps   float64
	Preemptible bool
	// SnapshotStateless moves reconstructible guests that can snapshot by their memory too,
	// with the budget the irreproducible ones leave, smallest first: a code-interpreter
	// session keeps its variables instead of starting over. What does not fit is
	// reconstructed, and a failed move falls back to a reconstruction (PAUSE-2).
	SnapshotStateless bool
}

// Step is the plan for one guest.
type Step struct {
	GuestID string `json:"guest_id"`
	Action  Action `json:"action"`
	MiB     int64  `json:"mb"`
	Reason  string `json:"reason"`
}

// Plan is Triage's answer: the hard deadline, the bandwidth budget in MiB, one step per
// guest (in the order to carry them out: reconstructions, then moves smallest first, then
// losses) and the MiB the moves use (≤ BudgetMiB).
type Plan struct {
	HardDeadline time.Time `json:"hard_deadline"`
	BudgetMiB    int64     `json:"budget_mb"`
	MovedMiB     int64     `json:"moved_mb"`
	Steps        []Step    `json:"steps"`
}

// Triage plans an evacuation (SPOT-3): triage, not a loop. The budget is link rate × time
// left before the hard deadline, shared by every guest; irreproducible guests are moved
// smallest first, so one big guest never starves the small ones; what does not fit is a
// budgeted loss. A stateful guest on a preemptible host breaks POOL-3: it is reported, as a
// loss, so the violation is seen rather than hidden.
func Triage(in Input) Plan {
	hard := in.NoticeEnd.Add(-max(in.Margin, 0))
	left := max(hard.Sub(in.Now), 0)
	budget := int64(max(in.LinkMiBps, 0) * left.Seconds())
	p := Plan{HardDeadline: hard, BudgetMiB: budget, Steps: make([]Step, 0, len(in.Guests))}

	var movable, optional, losses []Step
	for _, g := range in.Guests {
		switch {
		case g.Stateful && in.Preemptible:
			losses = append(losses, Step{g.ID, Loss, 0, "stateful sandbox on a preemptible host (POOL-3 violated)"})
		case g.Reconstructible && in.SnapshotStateless && g.CanSnapshot:
			optional = append(optional, Step{g.ID, SnapshotMove, max(g.SnapshotMiB, 0), ""})
		case g.Reconstructible:
			p.Steps = append(p.Steps, Step{g.ID, Reconstruct, 0, "authoritative copy outside the guest: recreate from its template"})
		case !g.CanSnapshot:
			losses = append(losses, Step{g.ID, Loss, 0, "irreproducible and its runtime cannot snapshot"})
		default:
			movable = append(movable, Step{g.ID, SnapshotMove, max(g.SnapshotMiB, 0), ""})
		}
	}
	// Smallest first (ties by id, so plans are deterministic).
	bySize := func(a, b Step) int { return cmp.Or(cmp.Compare(a.MiB, b.MiB), cmp.Compare(a.GuestID, b.GuestID)) }
	slices.SortFunc(movable, bySize)
	slices.SortFunc(optional, bySize)
	var moves []Step
	for _, s := range movable {
		if p.MovedMiB+s.MiB <= budget {
			p.MovedMiB += s.MiB
			s.Reason = "snapshot fits the bandwidth budget, smallest first"
			moves = append(moves, s)
			continue
		}
		losses = append(losses, Step{s.GuestID, Loss, s.MiB, "snapshot does not fit the bandwidth left before the hard deadline"})
	}
	// Stateless guests share what the irreproducible ones left; the rest are reconstructed.
	for _, s := range optional {
		if p.MovedMiB+s.MiB <= budget {
			p.MovedMiB += s.MiB
			s.Reason = "stateless, but its memory moves inside the budget (a reconstruction if the snapshot fails)"
			moves = append(moves, s)
			continue
		}
		p.Steps = append(p.Steps, Step{s.GuestID, Reconstruct, 0, "authoritative copy outside the guest and no budget left to move its memory: recreate from its template"})
	}
	p.Steps = append(p.Steps, moves...)
	p.Steps = append(p.Steps, losses...)
	return p
}
