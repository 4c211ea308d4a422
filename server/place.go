package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/placement"
)

// errIdempotent is returned by place when another create already holds the sandbox's
// Idempotency-Key; the caller answers with that create's sandbox (API-4).
var errIdempotent = errors.New("idempotency key held by another create")

// attempt is what differs between placing a new sandbox (a create) and placing an existing
// one again (a resume, a snapshot move: PAUSE-1, SPOT-3). placeWith runs the loop they share
// (PLC-1…7): Pick, reserve the charge in the ledger (LED-1), record the attempt on its host,
// have the agent start it, then confirm it — or undo the attempt and try the next host.
type attempt struct {
	// fresh: every host tried is a new sandbox with its own id (a create); otherwise the
	// sandbox keeps its id from host to host.
	fresh bool
	// record writes the attempt (sb.AgentID is its host); an error ends the placement.
	record func(ctx context.Context, sb berth.Sandbox) error
	// ask is what the agent is asked to start.
	ask func(sb berth.Sandbox) berth.AgentCreate
	// inFlight is the state record leaves the sandbox in; confirm moves it to running.
	inFlight berth.SandboxState
	// undo ends an abandoned attempt's record, on a context of its own.
	undo func(ctx context.Context, sb berth.Sandbox, reason string) error
	// restore: only hosts that can restore a checkpoint image qualify (ISO-4).
	restore bool
	// started is the reason of the transition to running ("agent started it" when empty).
	started string
}

// place finds a host for a new sandbox sb, reserves its charge in the ledger, records the
// sandbox as starting on that host (holding its Idempotency-Key, so a retry on any replica
// finds it) and has the agent start it; it returns the running sandbox. Each host tried is
// one attempt with its own sandbox id: when an agent refuses (PLC-7), the attempt's
// reservation is released, its row ends failed with the agent's reason (freeing the key) and
// the next host is tried, up to cfg.MaxHostsPerCreate. If the request dies mid-way, the
// cleanup runs on a context of its own; if the whole replica dies, the row is promoted by the
// agent's heartbeat or failed by the sweeper, and the reservation expires (LED-2).
//
// Errors are *berth.Error refusals (no_capacity, no_healthy_agents, host_starts_saturated,
// with host counts and Retry-After), unavailable when the store fails, or errIdempotent.
func (s *scheduler) place(ctx context.Context, sb berth.Sandbox, req berth.CreateRequest, actor string) (berth.Sandbox, error) {
	return s.placeWith(ctx, sb, req, actor, attempt{
		fresh: true,
		record: func(ctx context.Context, sb berth.Sandbox) error {
			sb.State, sb.Reason = berth.SandboxStarting, "placed on agent/"+sb.AgentID
			err := s.store.CreateSandbox(ctx, sb, actor, s.cfg.Clock())
			switch {
			case errors.Is(err, berth.ErrIdempotencyConflict):
				return errIdempotent
			case errors.Is(err, berth.ErrOverQuota):
				// A concurrent create took the last of the quota since the pre-check.
				return berth.Errorf(berth.ETenantOverQuota, "%v", err)
			case err != nil:
				return berth.Errorf(berth.EUnavailable, "record sandbox: %v", err)
			}
			return nil
		},
		ask: func(sb berth.Sandbox) berth.AgentCreate {
			return berth.AgentCreate{ID: sb.ID, Template: sb.Template, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
				Stateful: sb.Stateful, ExpiresAt: sb.ExpiresAt, Volume: volumeKey(sb.Tenant, req.Volume)}
		},
		inFlight: berth.SandboxStarting,
		undo: func(ctx context.Context, sb berth.Sandbox, reason string) error {
			_, err := s.store.TransitionSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxStarting},
				berth.SandboxFailed, reason, actor, s.cfg.Clock())
			return err
		},
	})
}

// placeRestore places the existing sandbox sb, whose checkpoint image is sb.Image, on a host
// that restores it with its processes and memory (PAUSE-1 resume, SPOT-3 snapshot move):
// only hosts whose runtime can restore qualify, a stateful one in the stateful pool only and
// a volume's on its host (POOL-2). The sandbox keeps its id: each attempt moves it from one
// of from to resuming on the host, with the TTL clock moved on by the time it was paused,
// and back to paused (no host) when abandoned. It returns the running sandbox. Errors as
// place's.
func (s *scheduler) placeRestore(ctx context.Context, sb berth.Sandbox, from []berth.SandboxState, actor string) (berth.Sandbox, error) {
	now := s.cfg.Clock()
	expires := sb.ExpiresAt
	if !expires.IsZero() && !sb.PausedAt.IsZero() && now.After(sb.PausedAt) {
		expires = expires.Add(now.Sub(sb.PausedAt)) // PAUSE-1: a paused sandbox's TTL clock stops
	}
	pausedAt := sb.PausedAt
	if pausedAt.IsZero() {
		pausedAt = now // a move whose placement fails leaves it paused from now
	}
	oldExpires := sb.ExpiresAt
	sb.ExpiresAt, sb.PausedAt = expires, time.Time{} // as the record below writes them
	return s.placeWith(ctx, sb, berth.CreateRequest{Volume: sb.Volume}, actor, attempt{
		restore: true,
		started: "agent restored it: its processes and memory as they were",
		record: func(ctx context.Context, at berth.Sandbox) error {
			ok, err := s.store.MoveSandbox(ctx, at.ID, from, berth.SandboxMove{To: berth.SandboxResuming,
				AgentID: at.AgentID, ExpiresAt: expires, Image: sb.Image},
				"restoring it on agent/"+at.AgentID, actor, s.cfg.Clock())
			if err != nil {
				return berth.Errorf(berth.EUnavailable, "record resuming: %v", err)
			}
			if !ok {
				return berth.Errorf(berth.EConflict, "sandbox %s changed state meanwhile (deleted, or resumed by another request)", at.ID)
			}
			from = []berth.SandboxState{berth.SandboxPaused} // the next attempt starts from the undo's paused
			return nil
		},
		ask: func(at berth.Sandbox) berth.AgentCreate {
			return berth.AgentCreate{ID: at.ID, Template: at.Template, MemoryMiB: at.MemoryMiB, VCPUs: at.VCPUs,
				Stateful: at.Stateful, ExpiresAt: expires, Volume: volumeKey(at.Tenant, at.Volume), RestoreImage: sb.Image}
		},
		inFlight: berth.SandboxResuming,
		undo: func(ctx context.Context, at berth.Sandbox, reason string) error {
			_, err := s.store.MoveSandbox(ctx, at.ID, []berth.SandboxState{berth.SandboxResuming},
				berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: oldExpires, PausedAt: pausedAt, Image: sb.Image},
				reason, actor, s.cfg.Clock())
			return err
		},
	})
}

// placeWith is the loop place and placeRestore share (see attempt).
func (s *scheduler) placeWith(ctx context.Context, sb berth.Sandbox, req berth.CreateRequest, actor string, at attempt) (berth.Sandbox, error) {
	if err := s.refreshIfStale(ctx); err != nil {
		return sb, berth.Errorf(berth.EUnavailable, "store: %v", err)
	}
	preq := placement.Request{MemoryMiB: sb.MemoryMiB, Stateful: sb.Stateful, Region: req.Region, Pool: req.Pool, Restore: at.restore}
	pinned := false
	if req.Volume != "" {
		// POOL-2: a volume lands only on its host; a new one is pinned where it first lands.
		v, err := s.store.Volume(ctx, sb.Tenant, req.Volume)
		switch {
		case err == nil:
			preq.VolumeHost, pinned = v.AgentID, true
		case errors.Is(err, berth.ErrNotFound):
			// Not pinned yet: any stateful-pool host (a volume sandbox is stateful).
		default:
			return sb, berth.Errorf(berth.EUnavailable, "read volume: %v", err)
		}
	}
	excluded := map[string]string{} // agent id → code it refused with
	reread := false
	var lastAgentErr error
	for tries := 0; ; {
		d, host, addr := s.pick(preq, excluded)
		if d.Index < 0 {
			if !reread {
				// PLC-6: never serve a refusal from the cache.
				reread = true
				if err := s.refresh(ctx); err != nil {
					return sb, berth.Errorf(berth.EUnavailable, "store: %v", err)
				}
				continue
			}
			return sb, s.refusal(ctx, d, sb, lastAgentErr)
		}
		if tries >= s.cfg.MaxHostsPerCreate {
			d.Rejected[placement.ReasonSaturated]++ // the host it would try next, had it the patience
			return sb, s.refusal(ctx, d, sb, lastAgentErr)
		}
		tries++
		if tries > 1 && at.fresh {
			sb.ID = newID("sb") // a new attempt is a new sandbox; the refused one stays failed
		}
		now := s.cfg.Clock()
		res := berth.Reservation{
			ID: newID("rsv"), AgentID: host, SandboxID: sb.ID, MiB: d.ChargeMiB,
			Owner: s.cfg.ReplicaID, CreatedAt: now, ExpiresAt: now.Add(s.cfg.ReservationTTL),
		}
		ok, err := s.store.Reserve(ctx, res, now)
		if err != nil {
			return sb, berth.Errorf(berth.EUnavailable, "ledger: %v", err)
		}
		if !ok {
			// The store knows more than the snapshot (another create took the room): refresh,
			// so the next Pick sees the ledger as it is and judges the host on memory.
			if err := s.refresh(ctx); err != nil {
				return sb, berth.Errorf(berth.EUnavailable, "store: %v", err)
			}
			continue
		}
		s.adjustPending(host, res.MiB)
		// C31: the reservation lives until its create ends, however long the start takes.
		renewing := s.keepReserved(res)
		unreserve := s.releaser(res)
		release := func() { renewing.stop(); unreserve() }
		if req.Volume != "" && !pinned {
			v, err := s.store.PinVolume(ctx, berth.Volume{Tenant: sb.Tenant, Name: req.Volume, AgentID: host}, actor, s.cfg.Clock())
			if err != nil {
				release()
				return sb, berth.Errorf(berth.EUnavailable, "pin volume: %v", err)
			}
			pinned = true
			if v.AgentID != host {
				// Another create pinned it first, elsewhere: go there instead.
				release()
				preq.VolumeHost = v.AgentID
				continue
			}
		}
		sb.AgentID = host
		if err := at.record(ctx, sb); err != nil {
			release()
			return sb, err
		}
		// The start is not tied to the client's patience: once sent it completes (bounded
		// by AgentTimeout), and a sandbox whose client left is then discarded or kept for
		// its Idempotency-Key, instead of being torn mid-start.
		err = s.agents.create(context.WithoutCancel(ctx), addr, withTTLLeft(at.ask(sb), s.cfg.Clock()))
		if err == nil {
			s.afterCreate(renewing) // counted until the agent's heartbeat lists it (LED-4)
			s.recordOutcome(ctx, host, false, actor)
			// Recorded whatever the client does meanwhile: the agent runs it now.
			started := cmp.Or(at.started, "agent started it")
			ok, err := s.store.TransitionSandbox(context.WithoutCancel(ctx), sb.ID, []berth.SandboxState{at.inFlight},
				berth.SandboxRunning, started, actor, s.cfg.Clock())
			if err == nil && !ok {
				// Something else moved it first (its agent's heartbeat already promoted it,
				// or it ended): report what the store holds.
				if cur, err := s.store.Sandbox(context.WithoutCancel(ctx), sb.ID); err == nil {
					return cur, nil
				}
			}
			if err != nil {
				s.abandon(ctx, sb, addr, true, release, "recording running failed: "+err.Error(), at)
				return sb, berth.Errorf(berth.EUnavailable, "record running: %v", err)
			}
			sb.State, sb.Reason = berth.SandboxRunning, started
			return sb, nil
		}
		code := berth.ErrorCode(err)
		// An explicit refusal (full, saturated) means the agent holds nothing; a failure
		// (runtime error, timeout, unreachable) leaves its side unknown, so it is told to
		// stop the sandbox, and it counts toward quarantine (PLC-9): the host accepted the
		// create and did not deliver.
		failed := code == berth.EInternal || code == berth.EUnavailable
		s.abandon(ctx, sb, addr, failed, release, fmt.Sprintf("agent/%s: %v", host, err), at)
		if failed {
			s.recordOutcome(ctx, host, true, actor)
		}
		if ctx.Err() != nil {
			return sb, berth.Errorf(berth.EUnavailable, "placement cancelled: the client went away")
		}
		if code == berth.ENotFound && !at.fresh {
			return sb, err // the image is gone: no host can restore it
		}
		lastAgentErr = err
		excluded[host] = code
		s.cfg.Logger.Info("agent refused; trying next host", "agent", host, "sandbox", sb.ID, "code", code, "err", err)
	}
}

// volumeKey is the agent's name for a tenant's volume, "<tenant>/<name>" ("" for none).
func volumeKey(tenant, name string) string {
	if name == "" {
		return ""
	}
	return tenant + "/" + name
}

// abandon undoes one attempt: when the agent's side is unknown (stopAgent) it is told to
// stop the sandbox, the reservation is released and the attempt's record is undone (a
// create's row ends failed, which frees its Idempotency-Key; a resume's is paused again). It
// runs on its own context: a client that went away must not leave a reservation or a
// starting row behind (C20).
func (s *scheduler) abandon(ctx context.Context, sb berth.Sandbox, addr string, stopAgent bool, release func(), reason string, at attempt) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if stopAgent {
		if err := s.agents.delete(cctx, addr, sb.ID); err != nil {
			s.cfg.Logger.Warn("could not stop an abandoned sandbox; its TTL or reconcile will", "sandbox", sb.ID, "err", err)
		}
	}
	release()
	if err := at.undo(cctx, sb, reason); err != nil {
		s.cfg.Logger.Error("could not record an abandoned attempt; the sweeper will", "sandbox", sb.ID, "err", err)
	}
}
