package server

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/berth-dev/berth"
)

// unheldPerSweep bounds how many running rows one sweep ends as unheld (settleUnheld): a
// fleet-wide fault (an agent that lost every guest without a word) drains over a few sweeps
// instead of holding one sweep for minutes.
const unheldPerSweep = 100

// unheldSweep is settleUnheld's name for Store.ClaimSweep.
const unheldSweep = "unheld"

// since is how long before now the unix-nanosecond time last was, for a sweep's local gate;
// a last after now (the clock was set back since) counts as long ago, so a clock step back
// does not hold the sweep off for the length of the step.
func since(now time.Time, last int64) time.Duration {
	d := now.Sub(time.Unix(0, last))
	if d < 0 {
		return math.MaxInt64
	}
	return d
}

// unheldGrace is how long after a sandbox entered running its agent's held list must have been
// received before leaving it out counts (settleUnheld): StaleAfter (30 s by default), or two
// heartbeat intervals of at least a second if that is longer. A heartbeat the agent composed
// before it accepted the create can arrive after the running mark — the agent's POST gives up
// max(interval, 1 s) after composing it — and the two times compared are stamped by the
// replicas' clocks, possibly two different replicas. Two intervals alone lost live sandboxes
// in an attack: a replica clock 2 s ahead (interval 1 s), or agents whose real interval is
// longer than the server was told. StaleAfter already bounds what the fleet tolerates of
// both (an agent silent that long is stale; replicas that far apart misjudge staleness), so
// the grace is at least that: a ghost is settled later, a live sandbox is not lost.
func (s *Server) unheldGrace() time.Duration {
	return max(2*max(s.cfg.HeartbeatInterval, time.Second), s.cfg.StaleAfter)
}

// settleUnheld is the sweeper's part for running rows their agent no longer holds (AGT-6's
// same-boot twin): an agent alive (seen within StaleAfter) on the same boot whose held list —
// current, and received at least unheldGrace after the sandbox last entered running — does
// not list a sandbox the store says it runs. Such a row is a ghost: it counts against its
// tenant's quota and the fleet's books, and tells its tenant it runs. Each is re-read (still
// running on that agent, still not listed) and moved running → lost with an event (actor
// sweeper/<replica>), at most unheldPerSweep a sweep; an app's lost sandbox is placed again
// at the reconciler's next round, kicked now. Silent agents are the leases' business (LIF-2)
// and a restarted agent's first heartbeat settles its own (AGT-6). It runs at most every
// Config.UnheldEvery, and with a positive UnheldEvery once per period across the replicas
// sharing the store (Store.ClaimSweep): the read grows with the fleet's running sandboxes.
func (s *Server) settleUnheld(ctx context.Context) {
	now := s.cfg.Clock()
	if s.cfg.UnheldEvery < 0 {
		return // turned off
	}
	if last := s.unheldAt.Load(); last != 0 && since(now, last) < s.cfg.UnheldEvery {
		return // looked less than UnheldEvery ago
	}
	s.unheldAt.Store(now.UnixNano())
	if every := s.cfg.UnheldEvery; every > 0 {
		// One replica a period does it for all: the read is fleet-wide and the same on every
		// replica. A claim lost to another replica is tried again a quarter period later, so
		// if that replica dies, the next run comes at most 1¼ periods after its last.
		claimed, err := s.store.ClaimSweep(ctx, unheldSweep, now, every)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("unheld running sandboxes: cannot claim the sweep", "err", err)
			}
			return
		}
		if !claimed {
			s.unheldAt.Store(now.Add(-every * 3 / 4).UnixNano())
			return
		}
	}
	grace := s.unheldGrace()
	unheld, err := s.store.UnheldRunning(ctx, now.Add(-s.cfg.StaleAfter), grace, unheldPerSweep)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("unheld running sandboxes: cannot read them", "err", err)
		}
		return
	}
	actor := "sweeper/" + s.cfg.ReplicaID
	for _, u := range unheld {
		sb, err := s.store.Sandbox(ctx, u.ID)
		if err != nil || sb.State != berth.SandboxRunning || sb.AgentID != u.AgentID {
			continue // moved on since the read (or cannot be re-read: a later sweep judges it)
		}
		a, err := s.store.Agent(ctx, u.AgentID)
		if err != nil || slices.ContainsFunc(a.Sandboxes, func(h berth.HeldSandbox) bool { return h.ID == u.ID }) {
			continue // listed since the read (or its agent cannot be re-read)
		}
		reason := fmt.Sprintf("agent/%s no longer holds it: its heartbeat of %s, %s after the sandbox entered running, does not list it",
			u.AgentID, u.HeldAt.Format(time.RFC3339), u.HeldAt.Sub(u.RunningSince).Round(time.Millisecond))
		ok, err := s.store.TransitionSandbox(ctx, u.ID, []berth.SandboxState{berth.SandboxRunning}, berth.SandboxLost, reason, actor, now)
		if err != nil || !ok {
			continue
		}
		s.log.Warn("running sandbox its agent no longer holds marked lost", "sandbox", u.ID, "agent", u.AgentID, "reason", reason)
		if sb.Metadata["app"] != "" {
			s.kickApps()
		}
	}
}
