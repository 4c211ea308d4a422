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
// (PLC-1…7): choose a host (Pick), reserve the charge in the ledger (LED-1), bind (record the
// attempt on its host, have the agent start it, record it running) — or unbind the attempt
// and try the next host.
type attempt struct {
	// fresh: every host tried is a new sandbox with its own id (a create); otherwise the
	// sandbox keeps its id from host to host.
	fresh bool
	// record writes the attempt (sb.AgentID is its host); an error ends the placement.
	record func(ctx context.Context, sb berth.Sandbox) error
	// reserveAndRecord, when set, takes the reservation and writes the record in one store
	// transaction (issue 16, goal 1); it reports false, writing nothing, when the ledger has
	// no room. Errors as record's.
	reserveAndRecord func(ctx context.Context, res berth.Reservation, sb berth.Sandbox) (bool, error)
	// ask is what the agent is asked to start.
	ask func(sb berth.Sandbox) berth.AgentCreate
	// inFlight is the state record leaves the sandbox in; bind then moves it to running.
	inFlight berth.SandboxState
	// undo ends an abandoned attempt's record, on a context of its own; false when the
	// record had already left inFlight (its agent's heartbeat promoted it, or it ended).
	undo func(ctx context.Context, sb berth.Sandbox, reason string) (bool, error)
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
	return s.placeWith(ctx, sb, req, actor, s.createAttempt(req, actor))
}

// createAttempt is place's attempt: a new row starting on the host, a failed row when
// abandoned (which frees its Idempotency-Key).
func (s *scheduler) createAttempt(req berth.CreateRequest, actor string) attempt {
	return attempt{
		fresh: true,
		record: func(ctx context.Context, sb berth.Sandbox) error {
			sb.State, sb.Reason = berth.SandboxStarting, "placed on agent/"+sb.AgentID
			return recordError(s.store.CreateSandbox(ctx, sb, actor, s.cfg.Clock()))
		},
		reserveAndRecord: func(ctx context.Context, res berth.Reservation, sb berth.Sandbox) (bool, error) {
			sb.State, sb.Reason = berth.SandboxStarting, "placed on agent/"+sb.AgentID
			ok, err := s.store.ReserveAndCreate(ctx, res, sb, actor, s.cfg.Clock())
			return ok, recordError(err)
		},
		ask: func(sb berth.Sandbox) berth.AgentCreate {
			return berth.AgentCreate{ID: sb.ID, Template: sb.Template, MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs,
				Stateful: sb.Stateful, ExpiresAt: sb.ExpiresAt, Volume: volumeKey(sb.Tenant, req.Volume)}
		},
		inFlight: berth.SandboxStarting,
		undo: func(ctx context.Context, sb berth.Sandbox, reason string) (bool, error) {
			return s.store.TransitionSandbox(ctx, sb.ID, []berth.SandboxState{berth.SandboxStarting},
				berth.SandboxFailed, reason, actor, s.cfg.Clock())
		},
	}
}

// recordError is the placement's answer when recording a create's row failed: errIdempotent
// for a key another create holds, tenant_over_quota when a concurrent create took the last
// of the quota since the pre-check, unavailable or internal for a store fault.
func recordError(err error) error {
	var refusal *berth.QuotaRefusal
	switch {
	case err == nil:
		return nil
	case errors.Is(err, berth.ErrIdempotencyConflict):
		return errIdempotent
	case errors.As(err, &refusal):
		return overQuota(refusal)
	case errors.Is(err, berth.ErrOverQuota):
		return berth.Errorf(berth.ETenantOverQuota, "tenant over quota")
	}
	return berth.Fault(err, "record sandbox")
}

// placeRestore places the existing sandbox sb, whose checkpoint image is sb.Image, on a host
// that restores it with its processes and memory (PAUSE-1 resume, SPOT-3 snapshot move):
// only hosts whose runtime can restore qualify, a stateful one in the stateful pool only and
// a volume's on its host (POOL-2). The sandbox keeps its id: each attempt moves it from one
// of from to resuming on the host, with the TTL clock moved on by the time it was paused,
// and back to paused (no host) when abandoned. It returns the running sandbox. Errors as
// place's.
func (s *scheduler) placeRestore(ctx context.Context, sb berth.Sandbox, from []berth.SandboxState, actor string) (berth.Sandbox, error) {
	sb, at := s.restoreAttempt(sb, from, actor)
	return s.placeWith(ctx, sb, berth.CreateRequest{Volume: sb.Volume}, actor, at)
}

// restoreAttempt is placeRestore's attempt, and sb as its record writes it (its TTL moved on
// by the time it was paused, PAUSE-1).
func (s *scheduler) restoreAttempt(sb berth.Sandbox, from []berth.SandboxState, actor string) (berth.Sandbox, attempt) {
	now := s.cfg.Clock()
	expires := sb.ExpiresAt
	if !expires.IsZero() && !sb.PausedAt.IsZero() && now.After(sb.PausedAt) {
		// PAUSE-1: a paused sandbox's TTL clock stops. To the millisecond, as the store keeps
		// it, so the resume's answer reads as every later get does.
		expires = expires.Add(now.Sub(sb.PausedAt)).UTC().Truncate(time.Millisecond)
	}
	pausedAt := sb.PausedAt
	if pausedAt.IsZero() {
		pausedAt = now // a move whose placement fails leaves it paused from now
	}
	oldExpires, image := sb.ExpiresAt, sb.Image
	sb.ExpiresAt, sb.PausedAt = expires, time.Time{} // as the record below writes them
	return sb, attempt{
		restore: true,
		started: "agent restored it: its processes and memory as they were",
		record: func(ctx context.Context, at berth.Sandbox) error {
			ok, err := s.store.MoveSandbox(ctx, at.ID, from, berth.SandboxMove{To: berth.SandboxResuming,
				AgentID: at.AgentID, ExpiresAt: expires, Image: image},
				"restoring it on agent/"+at.AgentID, actor, s.cfg.Clock())
			if err != nil {
				return berth.Fault(err, "record resuming")
			}
			if !ok {
				return berth.Errorf(berth.EConflict, "sandbox %s changed state meanwhile (deleted, or resumed by another request)", at.ID)
			}
			from = []berth.SandboxState{berth.SandboxPaused} // the next attempt starts from the undo's paused
			return nil
		},
		ask: func(at berth.Sandbox) berth.AgentCreate {
			return berth.AgentCreate{ID: at.ID, Template: at.Template, MemoryMiB: at.MemoryMiB, VCPUs: at.VCPUs,
				Stateful: at.Stateful, ExpiresAt: expires, Volume: volumeKey(at.Tenant, at.Volume), RestoreImage: image}
		},
		inFlight: berth.SandboxResuming,
		undo: func(ctx context.Context, at berth.Sandbox, reason string) (bool, error) {
			return s.store.MoveSandbox(ctx, at.ID, []berth.SandboxState{berth.SandboxResuming},
				berth.SandboxMove{To: berth.SandboxPaused, ExpiresAt: oldExpires, PausedAt: pausedAt, Image: image},
				reason, actor, s.cfg.Clock())
		},
	}
}

// placeWith is the loop place and placeRestore share (see attempt), in the steps of the
// Kubernetes scheduler framework, each a function of its own: choose (Filter and Score: Pick
// over the snapshot), reserve (the ledger), bind (pin the volume, record the attempt, have
// the agent start it, record it running) and, on every path where a reserved attempt does
// not become a running sandbox, unbind (stop the agent's copy, unreserve, undo the record).
// next then decides whether another host is tried (PLC-7).
func (s *scheduler) placeWith(ctx context.Context, sb berth.Sandbox, req berth.CreateRequest, actor string, at attempt) (berth.Sandbox, error) {
	p, err := s.begin(ctx, sb, req, actor, at)
	if err != nil {
		return sb, err
	}
	for {
		c, err := s.choose(ctx, p)
		if err != nil {
			return p.sb, err
		}
		h, err := s.reserve(ctx, p, c)
		if errors.Is(err, errLedgerSaidNo) {
			continue // the snapshot is re-read: pick again
		}
		if err != nil {
			return p.sb, err
		}
		placed, u := s.bind(ctx, p, c, h)
		if u == nil {
			s.afterCreate(h.renewing) // counted until the agent's heartbeat lists it (LED-4)
			return placed, nil
		}
		// The one failure path after reserve: it unreserves, unless the attempt turns out
		// to be running after all.
		if kept, ok := s.unbind(ctx, p, c, h, u); ok {
			s.afterCreate(h.renewing)
			return kept, nil
		}
		if err := s.next(ctx, p, c, u); err != nil {
			return p.sb, err
		}
	}
}

// placing is one placement in progress (placeWith): the sandbox, what Pick is asked, and
// what the attempts so far have learned.
type placing struct {
	sb     berth.Sandbox // the current attempt: its id, and its host once bound
	volume string        // the request's volume ("" for none)
	actor  string
	at     attempt
	preq   placement.Request
	pinned bool // the volume is pinned, to preq.VolumeHost
	// excluded maps the agents that said no to the code they said it with (PLC-7).
	excluded     map[string]string
	reread       bool  // the store was re-read before a refusal (PLC-6)
	tries        int   // hosts tried so far, at most MaxHostsPerCreate (PLC-7)
	lastAgentErr error // the last agent's no, for the refusal's code (PLC-4)
}

// candidate is the host choose picked for one attempt.
type candidate struct {
	d    placement.Decision
	host string // agent id
	addr string // its internal API's base URL
}

// hold is one attempt's reservation in the ledger (LED-1), renewed while the create is in
// flight (C31); unreserve ends it.
type hold struct {
	res      berth.Reservation
	renewing *renewal
	release  func() // idempotent (scheduler.releaser)
	// recorded: the attempt's record was written with the reservation (reserveAndRecord).
	recorded bool
}

// unbound is how a bind failed and what it leaves to undo (unbind) and to decide (next).
type unbound struct {
	// err is the placement's answer when it ends here; nil: it goes on to pick again.
	err error
	// recorded: the attempt's record was written and is undone with reason.
	recorded bool
	reason   string
	// stopAgent: the agent's side is unknown (it failed rather than refused, or it started
	// the sandbox and recording running failed), so it is told to stop the sandbox unless
	// the record moved on to running meanwhile (unbind), and an agent's failure counts
	// toward its host's quarantine (PLC-9).
	stopAgent bool
	// agentErr is the agent's no ("" code when the agent was never asked).
	agentErr error
}

// errLedgerSaidNo is reserve's answer when the ledger no longer has the room the snapshot
// showed (another create took it): the snapshot has been re-read and Pick runs again.
var errLedgerSaidNo = errors.New("the ledger has no room on that host")

// begin starts a placement of sb: a re-read of the snapshot when it is stale (PLC-5) and,
// for a volume, the host it is pinned to (POOL-2: a volume lands only on its host; one not
// yet pinned may land on any stateful-pool host, and is pinned where it first lands).
// Errors: unavailable when the store fails.
func (s *scheduler) begin(ctx context.Context, sb berth.Sandbox, req berth.CreateRequest, actor string, at attempt) (*placing, error) {
	if err := s.refreshIfStale(ctx); err != nil {
		return nil, berth.Fault(err, "store")
	}
	p := &placing{sb: sb, volume: req.Volume, actor: actor, at: at, excluded: map[string]string{},
		preq: placement.Request{MemoryMiB: sb.MemoryMiB, Stateful: sb.Stateful, Region: req.Region, Pool: req.Pool, Restore: at.restore}}
	if req.Volume == "" {
		return p, nil
	}
	v, err := s.store.Volume(ctx, sb.Tenant, req.Volume)
	switch {
	case err == nil:
		p.preq.VolumeHost, p.pinned = v.AgentID, true
	case errors.Is(err, berth.ErrNotFound):
		// Not pinned yet: any stateful-pool host (a volume sandbox is stateful).
	default:
		return nil, berth.Fault(err, "read volume")
	}
	return p, nil
}

// choose is Filter and Score: Pick over the cached snapshot, without the hosts that said no
// (PLC-1…4, PLC-7). Before a refusal it re-reads the store and picks once more, once per
// placement (PLC-6); past MaxHostsPerCreate hosts it refuses, counting the host it would
// have tried next as saturated. Each host chosen is one attempt: a create's every attempt
// after the first is a new sandbox id (the refused one stays failed). Errors: the 503
// refusal (scheduler.refusal), or unavailable when the store fails.
func (s *scheduler) choose(ctx context.Context, p *placing) (candidate, error) {
	d, host, addr := s.pick(p.preq, p.excluded)
	if d.Index < 0 && !p.reread {
		p.reread = true // PLC-6: never serve a refusal from the cache
		if err := s.refresh(ctx); err != nil {
			return candidate{}, berth.Fault(err, "store")
		}
		d, host, addr = s.pick(p.preq, p.excluded)
	}
	if d.Index < 0 {
		return candidate{}, s.refusal(ctx, d, p.sb, p.preq.Region, p.lastAgentErr)
	}
	if p.tries >= s.cfg.MaxHostsPerCreate {
		d.Rejected[placement.ReasonSaturated]++ // the host it would try next, had it the patience
		return candidate{}, s.refusal(ctx, d, p.sb, p.preq.Region, p.lastAgentErr)
	}
	p.tries++
	if p.tries > 1 && p.at.fresh {
		p.sb.ID = newID("sb")
	}
	return candidate{d: d, host: host, addr: addr}, nil
}

// reserve is Reserve: it takes the attempt's charge (MiB) on c's host in the ledger, only if
// it still fits there, atomically with that check (LED-1), counts it in the snapshot at once
// and keeps it renewed until the create ends (C31). Errors: errLedgerSaidNo when the ledger
// knew more than the snapshot (another create took the room; the snapshot is re-read, so the
// next Pick judges the host on memory), unavailable when the store fails.
func (s *scheduler) reserve(ctx context.Context, p *placing, c candidate) (*hold, error) {
	now := s.cfg.Clock()
	res := berth.Reservation{
		ID: newID("rsv"), AgentID: c.host, SandboxID: p.sb.ID, MiB: c.d.ChargeMiB,
		Owner: s.cfg.ReplicaID, CreatedAt: now, ExpiresAt: now.Add(s.cfg.ReservationTTL),
	}
	// A create whose volume (if any) needs no pinning writes its row with the reservation.
	together := p.at.reserveAndRecord != nil && (p.volume == "" || p.pinned)
	var ok bool
	var err error
	if together {
		sb := p.sb
		sb.AgentID = c.host
		if ok, err = p.at.reserveAndRecord(ctx, res, sb); err != nil {
			return nil, err
		}
	} else if ok, err = s.store.Reserve(ctx, res, now); err != nil {
		return nil, berth.Fault(err, "ledger")
	}
	if !ok {
		if err := s.refresh(ctx); err != nil {
			return nil, berth.Fault(err, "store")
		}
		return nil, errLedgerSaidNo
	}
	s.adjustPending(c.host, res.MiB)
	return &hold{res: res, renewing: s.keepReserved(res), release: s.releaser(res), recorded: together}, nil
}

// unreserve is Unreserve: it ends an attempt's hold — stops its renewals, releases its
// reservation in the ledger and in the snapshot (LED-3). Idempotent; a release the store
// fails is left to the reservation's TTL (LED-2).
func (s *scheduler) unreserve(h *hold) {
	h.renewing.stop()
	h.release()
}

// bind is Bind: it pins a new volume to c's host (pinVolume), records the attempt there (a
// create's row starting, holding its Idempotency-Key; a resume's resuming), has the agent
// start it and records it running (running). It returns the running sandbox, or how it
// failed (unbound); it never touches the reservation.
func (s *scheduler) bind(ctx context.Context, p *placing, c candidate, h *hold) (berth.Sandbox, *unbound) {
	if !h.recorded {
		if u := s.pinVolume(ctx, p, c.host); u != nil {
			return p.sb, u
		}
		p.sb.AgentID = c.host
		if err := p.at.record(ctx, p.sb); err != nil {
			return p.sb, &unbound{err: err}
		}
	}
	p.sb.AgentID = c.host
	// The start is not tied to the client's patience: once sent it completes (bounded by
	// AgentTimeout), and a sandbox whose client left is then discarded or kept for its
	// Idempotency-Key, instead of being torn mid-start.
	if err := s.agents.create(context.WithoutCancel(ctx), agentAt{c.host, c.addr}, withTTLLeft(p.at.ask(p.sb), s.cfg.Clock())); err != nil {
		return p.sb, agentSaidNo(c.host, err)
	}
	s.recordOutcome(ctx, c.host, false, p.actor)
	return s.running(ctx, p)
}

// pinVolume pins the placement's volume, when it is not pinned yet, to host (POOL-2). When
// another create pinned it first, elsewhere, the placement follows it there: the unbound it
// returns then has no error (pick again, on the volume's host). Errors: unavailable.
func (s *scheduler) pinVolume(ctx context.Context, p *placing, host string) *unbound {
	if p.volume == "" || p.pinned {
		return nil
	}
	v, err := s.store.PinVolume(ctx, berth.Volume{Tenant: p.sb.Tenant, Name: p.volume, AgentID: host}, p.actor, s.cfg.Clock())
	if err != nil {
		return &unbound{err: berth.Fault(err, "pin volume")}
	}
	p.pinned = true
	if v.AgentID != host {
		p.preq.VolumeHost = v.AgentID
		return &unbound{}
	}
	return nil
}

// agentSaidNo is a bind the agent on host did not start. An explicit refusal (full,
// saturated) means the agent holds nothing; a failure (runtime error, timeout, unreachable)
// leaves its side unknown, so it is told to stop the sandbox, and it counts toward
// quarantine (PLC-9): the host accepted the create and did not deliver. A create that never
// connected (refused, dial failure) reached no agent: nothing to stop, and it does not count
// toward quarantine (a host that is down is handled by its lease, LIF-2). One whose TLS
// handshake failed reached a host that is up and cannot be spoken to: it counts.
func agentSaidNo(host string, err error) *unbound {
	code := berth.ErrorCode(err)
	return &unbound{recorded: true, reason: fmt.Sprintf("agent/%s: %v", host, err),
		stopAgent: (code == berth.EInternal || code == berth.EUnavailable) && !errors.Is(err, errNotConnected), agentErr: err}
}

// runningAttempts bounds running's tries of a transition whose statement failed.
const runningAttempts = 3

// running records the started attempt running, whatever the client does meanwhile (the
// agent runs it now). When something else moved it first (its agent's heartbeat promoted it,
// or it ended) it returns what the store holds. A failed statement may still have been
// applied (its answer lost with its connection) or been overtaken by a promotion, so the
// store's row decides: moved on, it is the answer; still in flight, the transition is tried
// again, up to runningAttempts. Only then is it unavailable, with the attempt to undo.
func (s *scheduler) running(ctx context.Context, p *placing) (berth.Sandbox, *unbound) {
	rec := context.WithoutCancel(ctx)
	started := cmp.Or(p.at.started, "agent started it")
	var ok bool
	var err error
	for range runningAttempts {
		ok, err = s.store.TransitionSandbox(rec, p.sb.ID, []berth.SandboxState{p.at.inFlight},
			berth.SandboxRunning, started, p.actor, s.cfg.Clock())
		if err == nil {
			break
		}
		cur, rerr := s.store.Sandbox(rec, p.sb.ID)
		if rerr == nil && cur.State != p.at.inFlight {
			return movedOn(cur)
		}
	}
	if err != nil {
		return p.sb, &unbound{err: berth.Fault(err, "record running"),
			recorded: true, reason: "recording running failed: " + err.Error(), stopAgent: true}
	}
	if !ok {
		if cur, err := s.store.Sandbox(rec, p.sb.ID); err == nil {
			return movedOn(cur)
		}
	}
	sb := p.sb
	sb.State, sb.Reason = berth.SandboxRunning, started
	return sb, nil
}

// movedOn is running's answer when the attempt's record left its in-flight state before the
// placement marked it running: the store's sandbox (promoted to running by its agent's
// heartbeat, or deleted by its tenant meanwhile) — except a sandbox its agent reported
// failed as it started, which is this host's failure: the placement goes on to the next
// host (PLC-7) rather than answer 201 for a sandbox that is not running. Its record already
// ended, so nothing is undone and the agent holds nothing to stop.
func movedOn(cur berth.Sandbox) (berth.Sandbox, *unbound) {
	if cur.State != berth.SandboxFailed {
		return cur, nil
	}
	return cur, &unbound{agentErr: berth.Errorf(berth.EUnavailable, "sandbox %s failed on agent/%s as it started: %s",
		cur.ID, cur.AgentID, cur.Reason)}
}

// unbind undoes a reserved attempt that did not become a running sandbox: the hold is
// unreserved and the attempt's record, if written, undone (a create's row ends failed, which
// frees its Idempotency-Key; a resume's is paused again). When the agent's side is unknown
// (stopAgent) the record is undone first: if it had already moved on to running on this
// host — the agent did start it and its heartbeat promoted it, or recording running was
// applied but its answer lost — the sandbox is kept and returned (true), reservation and
// all, instead of being stopped under a record that says running (an attack with killed
// PostgreSQL backends found such rows: running, with nothing behind them until their TTL).
// If the undo itself fails, the agent keeps its copy (its heartbeat promotes the record, or
// its TTL ends it). Otherwise the agent is told to stop the sandbox before its room is given
// back. It runs on a context of its own: a client that went away must not leave a
// reservation or a starting row behind (C20). Failures are logged: the sweeper and the
// reservation's TTL settle them.
func (s *scheduler) unbind(ctx context.Context, p *placing, c candidate, h *hold, u *unbound) (berth.Sandbox, bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if u.recorded {
		moved, err := p.at.undo(cctx, p.sb, u.reason)
		switch {
		case err != nil:
			// The record is in an unknown state: the sweeper settles it. An agent whose side
			// is unknown too keeps its copy, which its heartbeat then promotes (or its TTL
			// ends) — a sandbox that runs under a record that says so, never a record that
			// says running over nothing.
			s.cfg.Logger.Error("could not record an abandoned attempt; the sweeper or the agent's heartbeat will settle it",
				"sandbox", p.sb.ID, "agent", c.host, "err", err)
			s.unreserve(h)
			return berth.Sandbox{}, false
		case !moved && u.stopAgent:
			if cur, err := s.store.Sandbox(cctx, p.sb.ID); err == nil && cur.State == berth.SandboxRunning && cur.AgentID == c.host {
				s.cfg.Logger.Warn("the attempt failed but its sandbox is running on its host; kept", "sandbox", p.sb.ID, "agent", c.host, "reason", u.reason)
				return cur, true
			}
		}
	}
	if u.stopAgent {
		if err := s.agents.delete(cctx, agentAt{c.host, c.addr}, p.sb.ID); err != nil {
			s.cfg.Logger.Warn("could not stop an abandoned sandbox; its TTL or reconcile will", "sandbox", p.sb.ID, "err", err)
		}
	}
	s.unreserve(h)
	return berth.Sandbox{}, false
}

// next decides, after an unbind, whether the placement goes on (nil) or ends with the error
// it returns. An agent's failure counts toward its host's quarantine (PLC-9); an agent's no
// excludes its host (PLC-7), unless the client went away (unavailable), a restore's image
// is gone (not_found: no host can restore it) or the agent judged the request itself bad
// (invalid_request: every host would say the same, so it is the caller's 400 after one
// try, never a retryable "N hosts saturated").
func (s *scheduler) next(ctx context.Context, p *placing, c candidate, u *unbound) error {
	if u.agentErr == nil {
		return u.err
	}
	if u.stopAgent {
		s.recordOutcome(ctx, c.host, true, p.actor)
	}
	if ctx.Err() != nil {
		return berth.Errorf(berth.EUnavailable, "placement cancelled: the client went away")
	}
	code := berth.ErrorCode(u.agentErr)
	if code == berth.ENotFound && !p.at.fresh || code == berth.EInvalidRequest {
		return u.agentErr
	}
	p.lastAgentErr = u.agentErr
	p.excluded[c.host] = code
	s.cfg.Logger.Info("agent refused; trying next host", "agent", c.host, "sandbox", p.sb.ID, "code", code, "err", u.agentErr)
	return nil
}

// volumeKey is the agent's name for a tenant's volume, "<tenant>/<name>" ("" for none).
func volumeKey(tenant, name string) string {
	if name == "" {
		return ""
	}
	return tenant + "/" + name
}
