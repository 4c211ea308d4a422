package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// evacuate is POST /v1/agents/{id}/evacuate with agent {id}'s credential (SPOT-3, TRUST-1): an agent under a
// preemption notice hands over its triage plan, and the server carries out the steps only a
// control plane can: a reconstructible sandbox is recreated elsewhere from its template
// through the normal scheduler (evacuating → reconstructed, or lost if no host takes it
// before the deadline, retried until then); a snapshot move is checkpointed on this agent and
// restored on another (moveBySnapshot); a budgeted loss is recorded as lost with its reason.
// Every outcome is an event. Steps run in the plan's order (reconstructions, then moves
// smallest first, then losses). The credential is checked again before each step: once it is
// revoked the plan stops and the answer is 401, whatever steps already ran.
func (s *Server) evacuate(w http.ResponseWriter, r *http.Request) {
	if cred, err := s.agentCredential(r.Context(), r); err != nil {
		s.writeError(w, r, err)
		return
	} else if err := sameAgent(cred, r.PathValue("id")); err != nil { // TRUST-1
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
	if req.DeadlineInMS < 0 || req.DeadlineInMS > maxEvacuateMS {
		s.writeError(w, r, berth.Errorf(berth.EInvalidRequest, "deadline_in_ms must be 0..%d (a day)", maxEvacuateMS))
		return
	}
	agentID := r.PathValue("id")
	actor := "agent/" + agentID
	// C32: the deadline is counted on this server's monotonic clock from the plan's arrival,
	// never read off the agent's wall clock (req.Deadline is logged only).
	window := berth.DefaultEvacuateWindow
	if req.DeadlineInMS > 0 {
		window = time.Duration(req.DeadlineInMS) * time.Millisecond
	} else if !req.Deadline.IsZero() {
		s.log.Warn("evacuation plan without deadline_in_ms: its wall-clock deadline is not trusted; using the default window",
			"agent", agentID, "agent_deadline", req.Deadline, "window", window)
	}
	ctx, cancel := context.WithTimeout(r.Context(), window)
	defer cancel()
	outcomes := make([]berth.EvacuateOutcome, 0, len(req.Steps))
	for _, step := range req.Steps {
		// TRUST-1: a credential revoked while the plan was uploading or running carries out
		// no further step (each step is read back against the store: a plan is a handful of
		// steps, and a store fault here does not stop an evacuation racing its deadline).
		if _, err := s.agentCredential(ctx, r); berth.ErrorCode(err) == berth.EUnauthorized {
			s.log.Warn("evacuation plan stopped: its agent's credential was revoked", "agent", agentID,
				"done", len(outcomes), "left", len(req.Steps)-len(outcomes))
			s.writeError(w, r, err)
			return
		}
		outcomes = append(outcomes, s.evacuateOne(ctx, agentID, actor, step))
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"outcomes": outcomes})
}

// maxEvacuateMS bounds deadline_in_ms: no provider's notice window is near a day.
const maxEvacuateMS = int64(24 * time.Hour / time.Millisecond)

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
			// Not recorded: the outcome is the state the store still holds, so the agent does
			// not stop a sandbox the store calls live (its lease settles it later).
			s.log.Error("could not record an evacuation outcome", "sandbox", sb.ID, "err", err)
			out.State, out.Reason = sb.State, "the store did not record "+string(state)+": "+err.Error()
			return out
		}
		out.State, out.Reason = state, reason
		return out
	}
	if app := sb.Metadata["app"]; app != "" && step.Action != "loss" {
		// An app's sandbox is rebuilt by its reconciler (files, command, readiness, routing),
		// not as a bare copy: hand it over now, inside the notice, instead of at lease expiry.
		defer s.kickApps()
		return end(berth.SandboxReconstructed, "preemption notice: app "+app+"'s reconciler starts it on another host")
	}
	switch step.Action {
	case "reconstruct":
		return s.reconstruct(ctx, sb, actor, "preemption notice: recreating it elsewhere from its template")
	case "snapshot_move":
		return s.moveBySnapshot(ctx, sb, actor)
	}
	return end(berth.SandboxLost, "budgeted loss under a preemption notice: "+step.Reason)
}

// deadlineText says when ctx's deadline is, for event reasons.
func deadlineText(ctx context.Context) string {
	if d, ok := ctx.Deadline(); ok {
		return "hard deadline " + d.UTC().Format(time.RFC3339)
	}
	return "no deadline"
}

// reconstruct recreates sb elsewhere from its template through the normal scheduler
// (evacuating → reconstructed with its replacement), retrying refusals until ctx's deadline
// (the notice's hard deadline), not once; lost if no host takes it by then.
func (s *Server) reconstruct(ctx context.Context, sb berth.Sandbox, actor, why string) berth.EvacuateOutcome {
	rec := context.WithoutCancel(ctx)
	out := berth.EvacuateOutcome{SandboxID: sb.ID}
	end := func(state berth.SandboxState, reason string) berth.EvacuateOutcome {
		if _, err := s.store.TransitionSandbox(rec, sb.ID, nil, state, reason, actor, s.cfg.Clock()); err != nil {
			s.log.Error("could not record an evacuation outcome", "sandbox", sb.ID, "err", err)
		}
		out.State, out.Reason = state, reason
		return out
	}
	if _, err := s.store.TransitionSandbox(rec, sb.ID, nil, berth.SandboxEvacuating, why+"; "+deadlineText(ctx), actor, s.cfg.Clock()); err != nil {
		return end(berth.SandboxLost, "could not start its evacuation: "+err.Error())
	}
	meta := maps.Clone(sb.Metadata)
	if meta == nil {
		meta = map[string]string{}
	}
	meta["evacuated_from"] = sb.ID
	var placed berth.Sandbox
	err := s.untilDeadline(ctx, func() error {
		now := s.cfg.Clock().UTC()
		repl := berth.Sandbox{
			ID: newID("sb"), Template: sb.Template, Tenant: sb.Tenant, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
			Stateful: sb.Stateful, CreatedAt: now, ExpiresAt: sb.ExpiresAt, Metadata: meta,
		}
		if !repl.ExpiresAt.After(now) {
			repl.ExpiresAt = now.Add(time.Minute)
		}
		var err error
		placed, err = s.sched.place(ctx, repl, berth.CreateRequest{}, actor)
		return err
	})
	if err != nil {
		return end(berth.SandboxLost, fmt.Sprintf("could not be recreated before the notice deadline: %v", err))
	}
	out.Replacement = placed.ID
	return end(berth.SandboxReconstructed, fmt.Sprintf("recreated as sandbox/%s on agent/%s", placed.ID, placed.AgentID))
}

// moveBySnapshot moves sb by its memory (SPOT-3, PAUSE-2): evacuating → snapshotting (its
// agent checks that the init answers, checkpoints it and stores the image) → paused →
// resuming → running on another host that restores it, stateful ones on the stateful pool
// only, retrying refusals until the deadline. A snapshot that fails or times out falls back:
// a stateless guest is reconstructed from its template, a stateful one is lost with the real
// reason. A guest whose image is stored but that no host can take before the deadline stays
// paused — its memory is safe — and can be resumed later.
func (s *Server) moveBySnapshot(ctx context.Context, sb berth.Sandbox, actor string) berth.EvacuateOutcome {
	rec := context.WithoutCancel(ctx)
	out := berth.EvacuateOutcome{SandboxID: sb.ID}
	ok, err := s.store.TransitionSandbox(rec, sb.ID, []berth.SandboxState{berth.SandboxRunning}, berth.SandboxEvacuating,
		"preemption notice: moving it by snapshot; "+deadlineText(ctx), actor, s.cfg.Clock())
	if err != nil || !ok {
		out.State, out.Reason = sb.State, fmt.Sprintf("could not start its evacuation (ok %t): %v", ok, err)
		return out
	}
	paused, res, err := s.checkpointSandbox(ctx, sb, []berth.SandboxState{berth.SandboxEvacuating}, berth.SandboxSnapshotting,
		"preemption notice: snapshotting it; "+deadlineText(ctx), actor)
	if err != nil {
		why := "its snapshot failed: " + berth.ErrorMessage(err)
		if ctx.Err() != nil {
			why = "its snapshot did not finish before the notice's hard deadline: " + berth.ErrorMessage(err)
		}
		if !sb.Stateful {
			return s.reconstruct(ctx, sb, actor, why+"; recreating it from its template instead")
		}
		cur, _ := s.store.Sandbox(rec, sb.ID)
		if cur.State.Terminal() {
			out.State, out.Reason = cur.State, cur.Reason
			return out
		}
		if _, err := s.store.TransitionSandbox(rec, sb.ID, nil, berth.SandboxLost, why, actor, s.cfg.Clock()); err != nil {
			s.log.Error("could not record an evacuation outcome", "sandbox", sb.ID, "err", err)
		}
		out.State, out.Reason = berth.SandboxLost, why
		return out
	}
	var placed berth.Sandbox
	err = s.untilDeadline(ctx, func() error {
		var err error
		placed, err = s.resume(ctx, paused, []berth.SandboxState{berth.SandboxPaused}, actor)
		return err
	})
	if err != nil {
		out.State = berth.SandboxPaused
		out.Reason = fmt.Sprintf("its image is stored but no host restored it before the notice deadline (%v): it stays paused; resume it when room frees", err)
		s.log.Error("evacuated sandbox left paused", "sandbox", sb.ID, "err", err)
		return out
	}
	out.State = berth.SandboxRunning
	out.Reason = fmt.Sprintf("moved from agent/%s to agent/%s by snapshot (%d MiB resident, %.1f MiB stored, checkpoint %d ms, upload %d ms)",
		sb.AgentID, placed.AgentID, res.ResidentMiB, float64(res.StoredBytes)/(1<<20), res.CheckpointMS, res.UploadMS)
	return out
}

// untilDeadline calls try until it succeeds, fails with a code a retry cannot fix, or ctx's
// deadline leaves no time to wait a refusal's Retry-After (at least 100 ms) once more.
func (s *Server) untilDeadline(ctx context.Context, try func() error) error {
	for {
		err := try()
		var be *berth.Error
		if err == nil || !errors.As(err, &be) || !be.Retryable() || ctx.Err() != nil {
			return err
		}
		wait := 250 * time.Millisecond
		if be.RetryAfter > 0 {
			wait = min(be.RetryAfter, 2*time.Second) // the fleet changes fast under a notice
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}
