package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/snapshot"
)

// pauseSandbox is POST /v1/sandboxes/{id}/pause (PAUSE-1): the sandbox's agent checkpoints
// it — processes, memory, /tmp — into the snapshot store and stops it, which frees its host
// memory and its admission charge; the sandbox is then paused, on no host, its TTL clock
// stopped. 200 with the sandbox. Pausing a paused sandbox answers it as it is. Errors: 404,
// 409 conflict (not running; its host's runtime cannot checkpoint; its init does not
// answer), 503 unavailable (the checkpoint or the upload failed and it runs on: retry).
func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.sandboxFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	switch sb.State {
	case berth.SandboxPaused:
		httpjson.WriteJSON(w, http.StatusOK, sb)
		return nil
	case berth.SandboxRunning:
	default:
		return berth.Errorf(berth.EConflict, "sandbox %s is %s: only a running sandbox can be paused", sb.ID, sb.State)
	}
	if !s.sched.canCheckpoint(sb.AgentID) {
		return berth.Errorf(berth.EConflict, "sandbox %s runs on agent/%s, whose runtime cannot checkpoint (gVisor can): it cannot be paused", sb.ID, sb.AgentID)
	}
	paused, res, err := s.checkpointSandbox(r.Context(), sb, []berth.SandboxState{berth.SandboxRunning},
		berth.SandboxPausing, "pause requested", p.actor())
	if err != nil {
		return err
	}
	s.log.Info("sandbox paused", "sandbox", sb.ID, "agent", sb.AgentID, "image", paused.Image, "resident_mb", res.ResidentMiB,
		"image_bytes", res.ImageBytes, "stored_bytes", res.StoredBytes, "checkpoint_ms", res.CheckpointMS, "upload_ms", res.UploadMS)
	httpjson.WriteJSON(w, http.StatusOK, paused)
	return nil
}

// checkpointSandbox moves sb from one of from through via (pausing, or snapshotting under a
// notice) while its agent checkpoints it into the snapshot store, and records it paused —
// no host, its TTL clock stopped at now — once the image is stored (PAUSE-1, PAUSE-2). On
// failure it records what became of the guest: running again when its agent says it runs
// on, failed with the real reason when it died in the attempt. It returns the paused
// sandbox and the checkpoint's figures. An agent that gave no answer leaves the outcome
// unknown: its image stored means it worked; otherwise the sandbox stays in via for the
// sweeper to settle from the facts. Errors: conflict (the state changed meanwhile), or the
// agent's (see agent.Checkpoint).
func (s *Server) checkpointSandbox(ctx context.Context, sb berth.Sandbox, from []berth.SandboxState, via berth.SandboxState,
	reason, actor string) (berth.Sandbox, berth.CheckpointResult, error) {
	now := s.cfg.Clock()
	image := fmt.Sprintf("%s/%d", sb.ID, now.UnixMilli())
	ok, err := s.store.MoveSandbox(ctx, sb.ID, from, berth.SandboxMove{To: via, AgentID: sb.AgentID, ExpiresAt: sb.ExpiresAt, Image: image},
		reason, actor, now)
	if err != nil {
		return sb, berth.CheckpointResult{}, berth.Fault(err, "record %s", via)
	}
	if !ok {
		return sb, berth.CheckpointResult{}, berth.Errorf(berth.EConflict, "sandbox %s changed state meanwhile", sb.ID)
	}
	rec := context.WithoutCancel(ctx) // the outcome is recorded whatever the client does
	addr, err := s.agentAddress(rec, sb.AgentID)
	var res berth.CheckpointResult
	if err == nil {
		res, err = s.agents.checkpoint(rec, addr, sb.ID, image, s.cfg.PauseTimeout)
	}
	why := ""
	switch {
	case err == nil:
		why = fmt.Sprintf("checkpointed on agent/%s: %d MiB resident, a %.1f MiB image (%.1f MiB stored) in %d ms + %d ms upload",
			sb.AgentID, res.ResidentMiB, float64(res.ImageBytes)/(1<<20), float64(res.StoredBytes)/(1<<20), res.CheckpointMS, res.UploadMS)
	case errors.Is(err, errUnreachable):
		if stored, _ := s.imageStored(rec, image); !stored {
			// What the agent did is unknown: the sweeper settles it from what the agent
			// and the store hold (settleCheckpoints), never a guess here.
			s.log.Warn("checkpoint outcome unknown; left to the sweeper", "sandbox", sb.ID, "state", via, "err", err)
			return sb, res, err
		}
		// The answer was lost, not the checkpoint: its image is whole in the store.
		why, err = "checkpointed on agent/"+sb.AgentID+" (its answer was lost; the image is stored)", nil
	default:
		to, why := berth.SandboxRunning, "checkpoint failed; it runs on: "+berth.ErrorMessage(err)
		if berth.ErrorCode(err) == berth.ESandboxNotFound {
			to, why = berth.SandboxFailed, berth.ErrorMessage(err)
		}
		if _, terr := s.store.TransitionSandbox(rec, sb.ID, []berth.SandboxState{via}, to, why, actor, s.cfg.Clock()); terr != nil {
			s.log.Error("could not record a failed checkpoint", "sandbox", sb.ID, "err", terr)
		}
		s.deleteImages(rec, image+"/")
		return sb, res, err
	}
	now = s.cfg.Clock()
	if _, err := s.store.MoveSandbox(rec, sb.ID, []berth.SandboxState{via},
		berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: sb.ExpiresAt, PausedAt: now, Image: image}, why, actor, now); err != nil {
		s.log.Error("could not record a paused sandbox; the sweeper will", "sandbox", sb.ID, "err", err)
	}
	s.sched.noteEnded(sb.AgentID) // its room shows at that host's next heartbeat (API-3)
	sb.State, sb.AgentID, sb.Image, sb.Reason = berth.SandboxPaused, "", image, why
	sb.PausedAt = now.UTC().Truncate(time.Millisecond) // as the store keeps it, so get reads the same
	return sb, res, nil
}

// resumeSandbox is POST /v1/sandboxes/{id}/resume (PAUSE-1): a paused sandbox is admitted and
// placed like a create — 503 with Retry-After when no host can take it — on a host whose
// runtime can restore it, and restored there with its processes and memory as they were;
// its TTL moves on by the time it was paused. 200 with the running sandbox; resuming a
// running sandbox answers it as it is. Errors: 404, 409 (not paused; its image is gone —
// it is then lost), 503 refusals.
func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.sandboxFor(r.Context(), p, r.PathValue("id"))
	if err != nil {
		return err
	}
	switch sb.State {
	case berth.SandboxRunning:
		httpjson.WriteJSON(w, http.StatusOK, sb)
		return nil
	case berth.SandboxPaused:
	default:
		return berth.Errorf(berth.EConflict, "sandbox %s is %s: only a paused sandbox can be resumed", sb.ID, sb.State)
	}
	placed, err := s.resume(r.Context(), sb, []berth.SandboxState{berth.SandboxPaused}, p.actor())
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, placed)
	return nil
}

// resume places the checkpointed sandbox sb on a host that restores it (placeRestore) and,
// once it runs, removes its images from the snapshot store. An image the store has lost
// makes the sandbox lost (it can never come back) and answers conflict.
func (s *Server) resume(ctx context.Context, sb berth.Sandbox, from []berth.SandboxState, actor string) (berth.Sandbox, error) {
	start := s.cfg.Clock()
	placed, err := s.sched.placeRestore(ctx, sb, from, actor)
	if berth.ErrorCode(err) == berth.ENotFound {
		reason := "its checkpoint image " + sb.Image + " is gone from the snapshot store: " + berth.ErrorMessage(err)
		if _, terr := s.store.TransitionSandbox(context.WithoutCancel(ctx), sb.ID, []berth.SandboxState{berth.SandboxPaused},
			berth.SandboxLost, reason, actor, s.cfg.Clock()); terr != nil {
			s.log.Error("could not record a lost image", "sandbox", sb.ID, "err", terr)
		}
		return sb, berth.Errorf(berth.EConflict, "sandbox %s cannot be resumed: %s", sb.ID, reason)
	}
	if err != nil {
		return placed, err
	}
	// Its images are not needed any more; removing 2,000 chunks takes seconds, which the
	// caller does not wait for.
	go s.deleteImages(context.WithoutCancel(ctx), sb.ID+"/")
	s.log.Info("sandbox resumed", "sandbox", sb.ID, "agent", placed.AgentID, "took_ms", s.cfg.Clock().Sub(start).Milliseconds())
	return placed, nil
}

// deleteImages removes what the snapshot store holds under prefix (a sandbox's "<id>/", or
// one image's "<image>/"); failures are logged, never fatal: a leftover image costs storage,
// not correctness.
func (s *Server) deleteImages(ctx context.Context, prefix string) {
	if s.cfg.Snapshots == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := snapshot.DeletePrefix(ctx, s.cfg.Snapshots, prefix); err != nil {
		s.log.Warn("could not delete snapshot images", "prefix", prefix, "err", err)
	}
}
