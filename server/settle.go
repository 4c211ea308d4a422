package server

import (
	"context"
	"slices"
	"time"

	"gocloud.dev/gcerrors"

	"github.com/berth-dev/berth"
)

// settleCheckpoints is the sweeper's part for pauses, resumes and snapshot moves whose
// replica died half-way (PAUSE-1): a sandbox left pausing or snapshotting longer than
// PauseTimeout plus StartingGrace, or resuming longer than StartingGrace, is settled by
// what its agent and the snapshot store hold:
//
//   - pausing/snapshotting: its image stored and not listed by its agent → paused; stored
//     and listed by a heartbeat that arrived after the grace → running (the upload failed
//     after its file list landed and the agent restored the guest), the image dropped;
//     stored and listed only by an older heartbeat → left for the agent's next one, for at
//     most StaleAfter (that list may predate the guest's stop); otherwise listed → running
//     (the checkpoint never happened or failed); else lost ("pause interrupted, no image");
//   - resuming: its agent lists it → the heartbeat already promoted it; else paused again
//     (its image is still there) and the agent is told to stop whatever it started.
func (s *Server) settleCheckpoints(ctx context.Context) {
	// One budget for the round's questions to the snapshot store: a store that hangs holds
	// the sweep — lease expiry with it — snapshotRoundBudget once, not that long per row, and
	// an image the store fails on at once keeps no other from being asked (attacks). The
	// images the store could not answer for last round are asked about last: four images it
	// hangs on, the oldest rows, spent the whole budget every round before any younger row
	// was asked.
	snap, cancel := context.WithTimeout(ctx, snapshotRoundBudget)
	defer cancel()
	var slowLast map[string]bool
	if p := s.slowImages.Load(); p != nil {
		slowLast = *p
	}
	slow := map[string]bool{}
	type row struct {
		st berth.SandboxState
		sb berth.Sandbox
	}
	var later []row
	for _, st := range []berth.SandboxState{berth.SandboxPausing, berth.SandboxSnapshotting, berth.SandboxResuming} {
		if s.eachInState(ctx, st, func(sb berth.Sandbox) bool {
			if slowLast[sb.Image] && st != berth.SandboxResuming {
				later = append(later, row{st, sb})
			} else {
				s.settleCheckpoint(ctx, snap, st, sb, slow)
			}
			return true
		}) != nil {
			return
		}
	}
	for _, r := range later {
		s.settleCheckpoint(ctx, snap, r.st, r.sb, slow)
	}
	s.slowImages.Store(&slow)
}

// settleCheckpoint settles sb, found in state st, if it has been there past its grace; see
// settleCheckpoints. Questions to the snapshot store go with snap, the round's budget for
// them; a pause or snapshot move whose image the store cannot vouch for within it (a fault,
// or the budget spent) waits for a later round, and its image, if it was asked about, is
// put in slow.
func (s *Server) settleCheckpoint(ctx, snap context.Context, st berth.SandboxState, sb berth.Sandbox, slow map[string]bool) {
	now := s.cfg.Clock()
	grace := s.cfg.StartingGrace
	if st != berth.SandboxResuming {
		grace += s.cfg.PauseTimeout
	}
	since, ok := s.enteredAt(ctx, sb.ID, st)
	if !ok || now.Sub(since) < grace {
		return
	}
	held, listedAt := s.agentList(ctx, sb.AgentID, sb.ID)
	stored, ok := s.checkpointImage(snap, st, sb.Image, slow)
	if !ok {
		return // the snapshot store cannot tell: a later round asks again
	}
	listedLate := listedAt.After(since.Add(grace)) // after the checkpoint surely ended
	move := berth.SandboxMove{ExpiresAt: sb.ExpiresAt, Image: sb.Image}
	var why, drop string // drop: images to delete once the move is recorded
	switch {
	case st == berth.SandboxResuming && held:
		return // its agent's heartbeat promotes it
	case st == berth.SandboxResuming:
		// Paused again only once the agent took the delete of whatever it started (in the
		// delete's turn, sweepDelete): once paused, no round would send it.
		move.To, move.PausedAt = berth.SandboxPaused, now
		why = "resume abandoned: no replica finished it and agent/" + sb.AgentID + " does not list it; paused again"
		s.sweepDelete(ctx, sb, func() { s.settled(ctx, sb.ID, st, move, why, "", now) })
		return
	case stored && held && !listedLate && now.Before(since.Add(grace+s.cfg.StaleAfter)):
		// Both stored and listed, by a list from before the checkpoint surely ended:
		// the list may predate the guest's stop, and the agent's next one decides.
		return
	case stored && held && listedLate:
		// Listed after the checkpoint ended: the upload failed after its file list
		// landed and the agent restored the guest. It runs; the image is stale.
		move.To, move.AgentID = berth.SandboxRunning, sb.AgentID
		why = "checkpoint abandoned: agent/" + sb.AgentID + " still runs it after the checkpoint ended; its image is dropped"
		drop = sb.Image + "/"
	case stored && !held:
		move.To, move.PausedAt = berth.SandboxPaused, now
		why = "checkpoint finished without its replica: its image " + sb.Image + " is stored"
	case held:
		move.To, move.AgentID = berth.SandboxRunning, sb.AgentID
		why = "checkpoint abandoned: no replica finished it; agent/" + sb.AgentID + " still runs it"
	default:
		move.To, move.Image = berth.SandboxLost, ""
		why = "checkpoint interrupted: agent/" + sb.AgentID + " does not hold it and no image was stored"
	}
	s.settled(ctx, sb.ID, st, move, why, drop, now)
}

// settled records the move of sandbox id from st that settleCheckpoint decided on, if it is
// still in st, and then deletes the images under drop ("" for none).
func (s *Server) settled(ctx context.Context, id string, st berth.SandboxState, move berth.SandboxMove, why, drop string, now time.Time) {
	if ok, err := s.store.MoveSandbox(ctx, id, []berth.SandboxState{st}, move, why, "sweeper/"+s.cfg.ReplicaID, now); err == nil && ok {
		s.log.Warn("settled an abandoned checkpoint or resume", "sandbox", id, "from", st, "to", move.To, "reason", why)
		if drop != "" {
			s.deleteImages(ctx, drop)
		}
	}
}

// checkpointImage reports whether a pause or snapshot move's image is stored (a resume's is
// not asked about: false); ok is false when the snapshot store could not tell within a
// quarter of the round's budget (the image is then put in slow, unless the round's end cut
// the question short), or snap (the round's budget) has ended.
func (s *Server) checkpointImage(snap context.Context, st berth.SandboxState, image string, slow map[string]bool) (stored, ok bool) {
	if st == berth.SandboxResuming {
		return false, true
	}
	if snap.Err() != nil {
		return false, false
	}
	// Each question takes at most a quarter of the round's budget: one image the store hangs
	// on (asked first every round, its row the oldest) no longer spends it all (an attack).
	quarter := snapshotRoundBudget / 4
	end, _ := snap.Deadline()
	whole := time.Until(end) >= quarter // a question the round's end cuts short is not the image's fault
	q, cancel := context.WithTimeout(snap, quarter)
	defer cancel()
	stored, ok = s.imageStored(q, image)
	if !ok && whole {
		slow[image] = true
	}
	return stored, ok
}

// enteredAt returns when sandbox id last entered state st (from its events).
func (s *Server) enteredAt(ctx context.Context, id string, st berth.SandboxState) (time.Time, bool) {
	evs, err := s.store.Events(ctx, berth.EventFilter{Entity: "sandbox/" + id, To: string(st)})
	if err != nil || len(evs) == 0 {
		return time.Time{}, false
	}
	return evs[len(evs)-1].At, true
}

// agentHolds reports whether agent id's latest heartbeat lists sandbox sbID.
func (s *Server) agentHolds(ctx context.Context, id, sbID string) bool {
	held, _ := s.agentList(ctx, id, sbID)
	return held
}

// agentList reports whether agent id's latest heartbeat lists sandbox sbID, and when that
// heartbeat arrived (zero when the agent is unknown).
func (s *Server) agentList(ctx context.Context, id, sbID string) (bool, time.Time) {
	a, err := s.store.Agent(ctx, id)
	if err != nil {
		return false, time.Time{}
	}
	return slices.ContainsFunc(a.Sandboxes, func(h berth.HeldSandbox) bool { return h.ID == sbID }), a.LastSeen
}

// imageStored reports whether the snapshot store holds image complete (its file list is
// written last). known is false when the store could not tell — an error other than "not
// found", or no answer within snapshotCheckTimeout — so a caller never reads a store's fault
// as a missing image (a sweep did: the sandbox was recorded lost, its stored image orphaned).
// Without a store configured nothing can have been stored: (false, true).
func (s *Server) imageStored(ctx context.Context, image string) (stored, known bool) {
	if s.cfg.Snapshots == nil || image == "" {
		return false, true
	}
	ctx, cancel := context.WithTimeout(ctx, snapshotCheckTimeout)
	defer cancel()
	ok, err := s.cfg.Snapshots.Exists(ctx, image+"/files.json")
	if err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		s.log.Warn("snapshot store: cannot tell whether an image exists", "image", image, "err", err)
		return false, false
	}
	return ok, true
}

// snapshotCheckTimeout bounds imageStored's question to the snapshot store, so a store that
// hangs holds neither a sweep nor a pause's answer for long.
const snapshotCheckTimeout = 30 * time.Second

// snapshotRoundBudget bounds all of one sweep round's questions to the snapshot store
// (settleCheckpoints); a variable for tests.
var snapshotRoundBudget = snapshotCheckTimeout

// eachInState calls fn on every sandbox in state st, oldest created first, reading sweepPage
// rows at a time: a state holding more rows than one read is still swept whole (a single
// read of the newest 1,000 left the oldest — the ones past their grace — unsettled for good).
// It stops early when fn returns false (nil), or when a read fails or ctx ends (the error).
func (s *Server) eachInState(ctx context.Context, st berth.SandboxState, fn func(berth.Sandbox) bool) error {
	f := berth.SandboxFilter{State: st, OldestFirst: true, Limit: sweepPage}
	for {
		sbs, err := s.store.Sandboxes(ctx, f)
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if !fn(sb) {
				return nil
			}
		}
		if len(sbs) < sweepPage || ctx.Err() != nil {
			return ctx.Err()
		}
		last := sbs[len(sbs)-1]
		f.After = berth.SandboxKey{CreatedAt: last.CreatedAt, ID: last.ID}
	}
}

// sweepPage is how many sandboxes of a state the sweeper reads at once.
const sweepPage = 1000
