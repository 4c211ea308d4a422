package server

import (
	"context"

	"github.com/berth-dev/berth"
)

// settleStopping is the sweeper's part for deletes whose replica died half-way (issue 15,
// point 5): a sandbox left stopping for longer than StartingGrace (AgentTimeout + 30 s, so
// any replica still deleting it has given up) is ended by what its agent reports:
//
//   - its agent's latest heartbeat, received after the delete began, does not list it →
//     stopped, with the event "stopping → stopped" (actor sweeper/<replica>); entering a
//     terminal state releases its reservations, and the tenant's quota no longer counts it;
//   - its agent still lists it → the delete is sent again; a later round ends the row once
//     the agent stops listing it;
//   - it has no agent (a paused sandbox being deleted) → stopped.
//
// An agent that is silent is the leases' business (LIF-2): its sandboxes become lost.
func (s *Server) settleStopping(ctx context.Context) {
	_ = s.eachInState(ctx, berth.SandboxStopping, func(sb berth.Sandbox) bool {
		s.settleStop(ctx, sb)
		return true
	})
}

// settleStop settles one sandbox found stopping, if it has been so past StartingGrace; see
// settleStopping.
func (s *Server) settleStop(ctx context.Context, sb berth.Sandbox) {
	now := s.cfg.Clock()
	since, ok := s.enteredAt(ctx, sb.ID, berth.SandboxStopping)
	if !ok || now.Sub(since) < s.cfg.StartingGrace {
		return
	}
	why := "delete abandoned: no replica finished it and its host no longer holds it"
	if sb.AgentID != "" {
		a, err := s.store.Agent(ctx, sb.AgentID)
		if err != nil || !a.LastSeen.After(since) {
			return // no heartbeat since the delete began: nothing to judge by
		}
		if s.agentHolds(ctx, sb.AgentID, sb.ID) {
			s.sweepDelete(ctx, sb, nil) // finish the delete; a later round records it
			return
		}
		why = "delete abandoned: no replica finished it and agent/" + sb.AgentID + " no longer lists it"
	}
	ok, err := s.store.TransitionSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxStopping}, berth.SandboxStopped, why,
		"sweeper/"+s.cfg.ReplicaID, now)
	if err != nil || !ok {
		return
	}
	s.sched.noteEnded(sb.AgentID)
	s.log.Warn("abandoned delete settled by the sweeper", "sandbox", sb.ID, "agent", sb.AgentID)
}
