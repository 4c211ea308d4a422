package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// evacuate is POST /v1/agents/{id}/evacuate with the node token (SPOT-3): an agent under a
// preemption notice hands over its triage plan, and the server carries out the steps only a
// control plane can: a reconstructible sandbox is recreated elsewhere from its template
// through the normal scheduler (evacuating → reconstructed, or lost if no host takes it
// before the deadline); a budgeted loss is recorded as lost with its reason. Every outcome
// is an event. Snapshot moves need a runtime that can snapshot and end lost here.
func (s *Server) evacuate(w http.ResponseWriter, r *http.Request) {
	if err := s.auth.node(r); err != nil {
		s.writeError(w, r, err)
		return
	}
	var req berth.EvacuateRequest
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if len(req.Steps) > 10000 {
		s.writeError(w, r, berth.Errorf(berth.EInvalidRequest, "at most 10000 steps"))
		return
	}
	agentID := r.PathValue("id")
	actor := "agent/" + agentID
	ctx := r.Context()
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	outcomes := make([]berth.EvacuateOutcome, 0, len(req.Steps))
	for _, step := range req.Steps {
		outcomes = append(outcomes, s.evacuateOne(ctx, agentID, actor, step))
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"outcomes": outcomes})
}

func (s *Server) evacuateOne(ctx context.Context, agentID, actor string, step berth.EvacuateStep) berth.EvacuateOutcome {
	out := berth.EvacuateOutcome{SandboxID: step.SandboxID}
	// The records must be written even when the deadline has passed: the truth outlives it.
	rec := context.WithoutCancel(ctx)
	sb, err := s.store.Sandbox(rec, step.SandboxID)
	if err != nil || sb.AgentID != agentID || sb.State.Terminal() {
		out.State, out.Reason = sb.State, "not a live sandbox of this agent"
		return out
	}
	end := func(state berth.SandboxState, reason string) berth.EvacuateOutcome {
		if _, err := s.store.TransitionSandbox(rec, sb.ID, nil, state, reason, actor, s.cfg.Clock()); err != nil {
			s.log.Error("could not record an evacuation outcome", "sandbox", sb.ID, "err", err)
		}
		out.State, out.Reason = state, reason
		return out
	}
	if step.Action != "reconstruct" {
		return end(berth.SandboxLost, "budgeted loss under a preemption notice: "+step.Reason)
	}
	if app := sb.Metadata["app"]; app != "" {
		// An app's sandbox is rebuilt by its reconciler (files, command, readiness, routing),
		// not as a bare copy: hand it over now, inside the notice, instead of at lease expiry.
		defer s.kickApps()
		return end(berth.SandboxReconstructed, "preemption notice: app "+app+"'s reconciler starts it on another host")
	}
	if _, err := s.store.TransitionSandbox(rec, sb.ID, nil, berth.SandboxEvacuating,
		"preemption notice: recreating it elsewhere from its template", actor, s.cfg.Clock()); err != nil {
		return end(berth.SandboxLost, "could not start its evacuation: "+err.Error())
	}
	now := s.cfg.Clock().UTC()
	meta := maps.Clone(sb.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta["evacuated_from"] = sb.ID
	repl := berth.Sandbox{
		ID: newID("sb"), Template: sb.Template, Tenant: sb.Tenant, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
		Stateful: sb.Stateful, CreatedAt: now, ExpiresAt: sb.ExpiresAt, Metadata: meta,
	}
	if !repl.ExpiresAt.After(now) {
		repl.ExpiresAt = now.Add(time.Minute)
	}
	placed, err := s.sched.place(ctx, repl, berth.CreateRequest{}, actor)
	if err != nil {
		return end(berth.SandboxLost, fmt.Sprintf("could not be recreated before the notice deadline: %v", err))
	}
	out.Replacement = placed.ID
	return end(berth.SandboxReconstructed, fmt.Sprintf("recreated as sandbox/%s on agent/%s", placed.ID, placed.AgentID))
}
