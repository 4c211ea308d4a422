package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/evacuate"
	"github.com/berth-dev/berth/internal/inflight"
	"github.com/berth-dev/berth/preempt"
)

// Create admits and starts one sandbox (AGT-2): it takes a start slot (ADM-10), checks the
// local gate with the one admission formula (ADM-2…7), books the guest at its charge and
// starts it. A create the warm pool can serve (same template and memory size, no volume, no
// restore) is handed a started warm guest instead, with no start slot; a cold create that
// needs the pool's room stops warm guests first (issue 16, goal 5). A create for an id the
// agent already holds returns the held guest (the scheduler may retry). Errors are
// *berth.Error: host_starts_saturated, no_capacity (lost race), invalid_request (also an id
// with the pool's prefix "berth-warm-", a start below berth.MinSandboxMiB, and what the
// runtime refuses as invalid_request: the request itself is bad, on any host), unsupported
// (this host cannot: no volume directory, a template root it lacks), unavailable (runtime
// failure, with the cause). Only unavailable and internal count toward the host's
// quarantine (PLC-9): a tenant's bad request must never take a host out of placement.
func (a *Agent) Create(ctx context.Context, c berth.AgentCreate) error {
	if c.ID == "" || c.MemoryMiB <= 0 {
		return berth.Errorf(berth.EInvalidRequest, "id and a positive memory_mb are required")
	}
	if c.RestoreImage == "" && c.MemoryMiB < berth.MinSandboxMiB {
		// No runtime starts a guest this small: refused before a start slot is taken, as the
		// request's fault. (A restore keeps the size it was checkpointed with.)
		return berth.Errorf(berth.EInvalidRequest, "memory_mb %d is below the minimum of %d MiB every runtime can start",
			c.MemoryMiB, berth.MinSandboxMiB)
	}
	if c.TTLMS < 0 {
		return berth.Errorf(berth.EInvalidRequest, "ttl_ms must not be negative")
	}
	if err := checkCreateID(c.ID); err != nil {
		return err
	}
	a.mu.Lock()
	held, err := a.reconfirmLocked(c)
	a.mu.Unlock()
	if held {
		return err
	}
	// A warm guest serves it at once, without a start slot (issue 16, goal 5).
	if a.takeWarm(c) {
		return nil
	}

	release, err := a.starts.Take(ctx, a.cfg.StartSlotWait)
	switch {
	case errors.Is(err, inflight.ErrNoSlot):
		return &berth.Error{Code: berth.EHostStartsSaturated,
			Message: fmt.Sprintf("agent %s: %d starts in flight", a.cfg.ID, a.cfg.MaxStarts)}
	case err != nil:
		return berth.Errorf(berth.EUnavailable, "create cancelled: %v", err)
	}
	defer release()

	charge := admission.Charge(a.cfg.Admission, c.MemoryMiB, c.Stateful)
	a.mu.Lock()
	if a.drainingLocked() {
		a.mu.Unlock()
		return berth.Errorf(berth.ENoCapacity, "agent %s is draining", a.cfg.ID)
	}
	if a.gate.Closed() {
		a.mu.Unlock()
		return berth.Errorf(berth.ENoCapacity, "agent %s: memory pressure closed intake (ADM-8)", a.cfg.ID)
	}
	if held, err := a.reconfirmLocked(c); held {
		a.mu.Unlock()
		return err
	}
	adm := a.admittableLocked()
	if !admission.Fits(adm, 0, charge) {
		a.mu.Unlock()
		return &berth.Error{Code: berth.ENoCapacity,
			Message: fmt.Sprintf("agent %s: admittable %d MiB < charge %d MiB", a.cfg.ID, adm, charge)}
	}
	// The pool never makes the host refuse a create: what the create needs of its room,
	// it takes, stopping warm guests before its own start.
	victims := a.makeRoomFromPoolLocked(charge)
	admitted := time.Now()
	g := &guest{spec: c, admittedAt: admitted, expires: ttlEnd(c, admitted), incarnation: a.nextIncarnationLocked()}
	a.guests[c.ID] = g
	a.mu.Unlock()
	if len(victims) > 0 {
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		a.stopWarm(stop, victims, "a create needs the room")
		cancel()
	}

	// Every exit path below either marks the guest started or removes it, so its
	// reserve never outlives a failed start (ADM-5).
	ok := false
	defer func() {
		if !ok {
			a.leaveStart(c.ID, g) // each failure path stopped what it may have started
		}
	}()
	volumeDir, err := a.volumeDir(c.Volume)
	if err != nil {
		return err
	}
	spec := Spec{ID: c.ID, Template: c.Template, MemoryMiB: c.MemoryMiB, VCPUs: c.VCPUs, VolumeDir: volumeDir}
	if c.RestoreImage != "" {
		if err := a.restore(ctx, spec, c.RestoreImage); err != nil {
			stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = a.rt.Stop(stop, c.ID)
			if code := berth.ErrorCode(err); code != berth.EInternal {
				return err // a refusal the scheduler acts on (unsupported, conflict, not_found)
			}
			return fmt.Errorf("agent %s: restore %s: %w", a.cfg.ID, c.ID,
				&berth.Error{Code: berth.EUnavailable, Message: "sandbox restore failed: " + err.Error()})
		}
	} else if err := a.rt.Start(ctx, spec); err != nil {
		stop, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.rt.Stop(stop, c.ID)
		if code := berth.ErrorCode(err); code == berth.EInvalidRequest || code == berth.EUnsupported {
			// The runtime refused the request (invalid_request: any host would) or cannot
			// run it here (unsupported): a refusal, not this host failing (PLC-9).
			return fmt.Errorf("agent %s: start %s: %w", a.cfg.ID, c.ID, err)
		}
		return fmt.Errorf("agent %s: start %s: %w", a.cfg.ID, c.ID,
			&berth.Error{Code: berth.EUnavailable, Message: "sandbox start failed: " + err.Error()})
	}
	a.mu.Lock()
	if cur := a.guests[c.ID]; cur != g || g.deleting {
		// Deleted while it was starting: the delete could not stop what did not run yet
		// (an attack: its stop found nothing, and the guest then ran with no booking), so
		// stop it now rather than leave a sandbox nobody accounts for; the deferred
		// leaveStart then takes the copy off the books.
		a.mu.Unlock()
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = a.rt.Stop(stop, c.ID)
		return berth.Errorf(berth.EConflict, "sandbox %s was deleted while it started", c.ID)
	}
	g.started = true
	a.mu.Unlock()
	ok = true
	a.log.Info("sandbox started", "sandbox", c.ID, "memory_mb", c.MemoryMiB, "charge_mb", charge)
	return nil
}

// ttlEnd is when a guest admitted at admitted reaches its TTL on this agent's clock (AGT-7):
// TTLMS after its arrival, measured on the monotonic clock, so an agent whose wall clock is
// a day ahead of the server's (or behind, or jumping) stops it after its TTL all the same
// (C32). A create without TTLMS goes by ExpiresAt (the server's clock read on this one's);
// zero for none.
func ttlEnd(c berth.AgentCreate, admitted time.Time) time.Time {
	if c.TTLMS > 0 {
		return admitted.Add(time.Duration(min(c.TTLMS, maxTTLMS)) * time.Millisecond)
	}
	return c.ExpiresAt
}

// maxTTLMS caps TTLMS so the duration cannot overflow: ten years, in milliseconds.
const maxTTLMS = int64(10 * 365 * 24 * time.Hour / time.Millisecond)

// Delete stops a sandbox and forgets it. It is idempotent: an unknown id is not an error.
func (a *Agent) Delete(ctx context.Context, id string) error {
	return a.DeleteIncarnation(ctx, id, "", 0)
}

// DeleteIncarnation is Delete of one copy only (AGT-6): with inc > 0 it stops sandbox id only
// while the copy here is incarnation inc of boot (berth.HeldSandbox.Incarnation), the copy a
// server found stale. A copy booked or re-confirmed by a create since, an agent of another
// boot (incarnations restart with each), or a copy being checkpointed (its checkpoint ends it
// or keeps it; a later stop finds out which) is not stopped: conflict. No copy here is not an
// error, and nothing is stopped. inc 0 is any copy, as Delete. A copy another delete is
// stopping already is that delete's: this one waits for its answer, and when that stop failed
// (its caller went away, say) tries itself, up to stopTries in all, so no delete answers
// before the copy is stopped; meanwhile a create of the id is refused (reconfirmLocked), so
// no new copy is booked under a stop in flight. When the runtime fails to stop it, the copy
// stays booked and a later delete tries again.
func (a *Agent) DeleteIncarnation(ctx context.Context, id, boot string, inc int64) error {
	var err error
	for range stopTries {
		var waited bool
		if waited, err = a.deleteOnce(ctx, id, boot, inc); !waited || err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// stopTries bounds DeleteIncarnation's tries when other deletes' stops keep failing.
const stopTries = 3

// deleteOnce is one try of DeleteIncarnation; waited reports that another delete was stopping
// the copy, and err is that delete's answer.
func (a *Agent) deleteOnce(ctx context.Context, id, boot string, inc int64) (waited bool, err error) {
	a.mu.Lock()
	g, ok := a.guests[id]
	switch {
	case inc > 0 && boot != a.bootID:
		a.mu.Unlock()
		return false, berth.Errorf(berth.EConflict, "agent %s is boot %s now, not %s: its copies are numbered anew, so none is stopped",
			a.cfg.ID, a.bootID, boot)
	case inc > 0 && !ok:
		a.mu.Unlock()
		return false, nil
	case inc > 0 && g.incarnation != inc:
		cur := g.incarnation
		a.mu.Unlock()
		return false, berth.Errorf(berth.EConflict, "sandbox %s on agent %s is incarnation %d, not %d: placed here again since, so it is not stopped",
			id, a.cfg.ID, cur, inc)
	case inc > 0 && g.checkpointing && !g.deleting:
		a.mu.Unlock()
		return false, berth.Errorf(berth.EConflict, "sandbox %s on agent %s is being checkpointed: not stopped now", id, a.cfg.ID)
	case ok && g.deleting:
		claim := g.claim
		a.mu.Unlock()
		return true, a.awaitStop(ctx, id, claim)
	case ok:
		claimLocked(g, "deleted")
	}
	a.mu.Unlock()
	if !ok {
		return false, a.runtimeStop(ctx, id) // no copy booked: a runtime guest left under the id, if any
	}
	return false, a.stopClaimed(ctx, id, g)
}

// claimLocked marks copy g as being stopped, for why ("deleted", or how the agent ended it):
// its exit from here on is the stop's, not a crash (the measure loop must not report it failed
// while the runtime stops it; gVisor takes ~60 ms), a call cut short by it says why
// (runtimeErr), a create of its id is refused, and another delete waits for this stop's
// answer. stopClaimed ends the claim.
func claimLocked(g *guest, why string) {
	g.deleting, g.stopWhy, g.claim = true, why, &stopClaim{done: make(chan struct{})}
}

// stopClaimed stops copy g of id, claimed by claimLocked, and gives the deletes waiting on it
// its answer: stopped, the copy leaves the books — once its Create, if it was still starting,
// is done with it too (startDone: that Create stops what it started, leaveStart) —; not
// stopped (the runtime failed), it stays booked and unclaimed for a later stop to try again.
func (a *Agent) stopClaimed(ctx context.Context, id string, g *guest) error {
	claim := g.claim
	err := a.runtimeStop(ctx, id)
	a.mu.Lock()
	if err != nil {
		g.deleting = false
	} else if a.guests[id] == g && (g.started || g.startDone) {
		delete(a.guests, id)
	}
	claim.err, claim.finished = err, true
	close(claim.done)
	a.mu.Unlock()
	return err
}

// leaveStart is Create done with copy g of id without it running: its start failed, or a
// delete claimed it meanwhile and Create stopped what it started. The copy leaves the books
// now, unless a claim's stop is still in flight, which then takes it off (stopClaimed): no new
// copy of the id is booked while a stop of it may still land.
func (a *Agent) leaveStart(id string, g *guest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	g.startDone = true
	if a.guests[id] == g && (g.claim == nil || g.claim.finished) {
		delete(a.guests, id)
	}
}

// runtimeStop has the runtime stop guest id; one it does not know is not an error.
func (a *Agent) runtimeStop(ctx context.Context, id string) error {
	if err := a.rt.Stop(ctx, id); err != nil && berth.ErrorCode(err) != berth.ESandboxNotFound {
		return fmt.Errorf("agent %s: stop %s: %w", a.cfg.ID, id, err)
	}
	return nil
}

// awaitStop waits for claim, a stop of sandbox id in flight, and returns its answer (the
// claim's own: a later claim of the copy does not change it); ctx ending first is
// unavailable.
func (a *Agent) awaitStop(ctx context.Context, id string, claim *stopClaim) error {
	select {
	case <-claim.done:
	case <-ctx.Done():
		return berth.Errorf(berth.EUnavailable, "sandbox %s: a delete already in progress did not finish in time: %v", id, ctx.Err())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return claim.err
}

// nextIncarnationLocked numbers a copy being booked or re-confirmed: from 1, never reused
// in this agent's life.
func (a *Agent) nextIncarnationLocked() int64 {
	a.incarnations++
	return a.incarnations
}

// reconfirmLocked is create c when the agent may hold its sandbox already (the scheduler
// retried, or a placement landed on a copy left here): held reports whether it does. A held
// copy is re-confirmed, with a new incarnation and the create's TTL, so a server's stop of it
// as stale, sent before this create and still on its way, spares it (DeleteIncarnation). A
// copy being deleted cannot be, nor can a restore land on a copy: conflict, and the placement
// goes to another host. A restore starts from its image, the state the tenant paused; a copy
// left here from before (a checkpoint whose answer was lost) ran on past it, and AGT-6 stops
// it (an attack: adopting it kept its old TTL and its later state).
func (a *Agent) reconfirmLocked(c berth.AgentCreate) (held bool, err error) {
	g, ok := a.guests[c.ID]
	switch {
	case !ok:
		return false, nil
	case g.deleting:
		return true, berth.Errorf(berth.EConflict, "sandbox %s is being stopped on agent %s", c.ID, a.cfg.ID)
	case c.RestoreImage != "":
		return true, berth.Errorf(berth.EConflict, "a copy of sandbox %s already runs on agent %s: it is restored elsewhere, and this copy is stopped",
			c.ID, a.cfg.ID)
	}
	g.incarnation = a.nextIncarnationLocked()
	g.expires = ttlEnd(c, time.Now())
	return true, nil
}

// held reports whether the agent holds a started sandbox id, or a sandbox_not_found error.
func (a *Agent) held(id string) error {
	a.mu.Lock()
	g, ok := a.guests[id]
	a.mu.Unlock()
	if !ok || !g.started {
		return berth.Errorf(berth.ESandboxNotFound, "sandbox %s is not running on agent %s", id, a.cfg.ID)
	}
	return nil
}

// measureLoop measures every started guest, stops guests past their TTL (AGT-7), expires
// reserves that no measurement confirmed (ADM-5) and notices guests whose init died.
func (a *Agent) measureLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.MeasureInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.measureOnce(ctx, time.Now())
	}
}

func (a *Agent) measureOnce(ctx context.Context, now time.Time) {
	type job struct {
		id      string
		g       *guest
		expired bool
	}
	a.mu.Lock()
	jobs := make([]job, 0, len(a.guests))
	for id, g := range a.guests {
		if !g.started || g.checkpointing || g.deleting {
			continue
		}
		jobs = append(jobs, job{id, g, !g.expires.IsZero() && !now.Before(g.expires)})
	}
	a.mu.Unlock()

	for _, j := range jobs {
		if a.checkpointing(j.id) {
			continue // its stop is the checkpoint's, not an exit; its TTL waits
		}
		if j.expired {
			a.end(ctx, j.id, j.g, berth.SandboxStopped, "ttl", now)
			continue
		}
		m, err := a.rt.Measure(j.id)
		if err != nil {
			if !a.checkpointing(j.id) {
				a.log.Warn("measure", "sandbox", j.id, "err", err)
			}
			continue
		}
		if m.Exited {
			if a.checkpointing(j.id) {
				continue
			}
			reason := "sandbox init exited"
			a.mu.Lock()
			if g, ok := a.guests[j.id]; ok {
				a.countOOMLocked(g.oomKills, m.OOMKills)
				g.oomKills = max(g.oomKills, m.OOMKills)
			}
			a.mu.Unlock()
			if m.OOMKills > 0 {
				reason = "killed by the kernel OOM killer"
			}
			a.end(ctx, j.id, j.g, berth.SandboxFailed, reason, now)
			continue
		}
		clamped, bad := admission.ClampResident(m.ResidentMiB, a.cfg.MemoryMiB)
		a.mu.Lock()
		if g, ok := a.guests[j.id]; ok {
			if bad {
				// C07: an impossible reading is clamped and counted, never trusted.
				a.measureErrs++
				a.log.Warn("resident reading out of range; clamped", "sandbox", j.id,
					"resident_mb", m.ResidentMiB, "clamped_mb", clamped)
			}
			if m.OOMKills > g.oomKills {
				a.log.Error("kernel OOM killer struck inside a sandbox (C09)", "sandbox", j.id, "oom_kills", m.OOMKills)
			}
			a.countOOMLocked(g.oomKills, m.OOMKills)
			g.resident, g.oomKills = clamped, max(g.oomKills, m.OOMKills)
			if m.Seen || now.Sub(g.admittedAt) >= a.cfg.ReserveTTL {
				g.measured = true
			}
		}
		a.mu.Unlock()
	}
	a.sampleCPU()
	a.samplePressure(now)
	a.evictIfCritical(ctx, now)
	a.expireSoftCordon(now)
}

// checkpointing reports whether a checkpoint or a delete of guest id is under way: its
// runtime is stopping it on purpose, so its exit is not a crash and its TTL waits.
func (a *Agent) checkpointing(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	g, ok := a.guests[id]
	return ok && (g.checkpointing || g.deleting)
}

// evictIfCritical is ADM-9: when the host's available memory (total − Σ resident) has been
// under the floor, or pressure over the critical line, for two measurements in a row, it
// evicts one stateless sandbox — the one with the largest working set, which frees the most
// memory for the fewest victims (ties: the youngest, which has done the least work). One
// victim per measurement, so the next reading judges whether more are needed and one bad
// sample can never start an eviction storm (C07). Stateful sandboxes are never victims.
// The warm pool counts in the reading and goes first: the first critical reading stops it
// whole (it holds no one's work), and only a reading still critical after that evicts.
func (a *Agent) evictIfCritical(ctx context.Context, now time.Time) {
	a.mu.Lock()
	used := a.warmResidentLocked()
	for _, g := range a.guests {
		used += g.resident
	}
	avail := a.cfg.MemoryMiB - used
	critical := avail < a.cfg.EvictFloorMiB || a.pressure > a.cfg.EvictPressure
	if !critical {
		a.criticalTicks = 0
		a.mu.Unlock()
		return
	}
	a.criticalTicks++
	if len(a.warm.guests) > 0 {
		// The warm pool goes first, at the first critical reading: it holds no one's work
		// (issue 16, goal 5). The next reading judges whether a tenant's sandbox must go.
		warm := a.releaseWarmLocked()
		pressure := a.pressure
		a.mu.Unlock()
		a.stopWarm(ctx, warm, fmt.Sprintf("memory critical (available %d MiB, floor %d MiB, pressure %.1f%%, ADM-9)",
			avail, a.cfg.EvictFloorMiB, pressure))
		return
	}
	if a.criticalTicks < 2 {
		a.mu.Unlock()
		return
	}
	var victim *guest
	for _, g := range a.guests {
		if !g.started || g.spec.Stateful || g.checkpointing || g.deleting {
			continue
		}
		if victim == nil || g.resident > victim.resident ||
			(g.resident == victim.resident && g.admittedAt.After(victim.admittedAt)) {
			victim = g
		}
	}
	pressure := a.pressure
	a.mu.Unlock()
	if victim == nil {
		a.log.Error("memory critical but no stateless sandbox to evict", "available_mb", avail, "pressure", pressure)
		return
	}
	reason := fmt.Sprintf("memory critical (available %d MiB, floor %d MiB, pressure %.1f%%): evicted the largest stateless sandbox (%d MiB)",
		avail, a.cfg.EvictFloorMiB, pressure, victim.resident)
	a.log.Warn("evicting (ADM-9)", "sandbox", victim.spec.ID, "reason", reason)
	a.end(ctx, victim.spec.ID, victim, berth.SandboxEvicted, reason, now)
}

// end stops copy g of id, which the agent decided to end, and queues the transition for the
// next heartbeat (repeated until one is accepted). It acts only on that copy, and only while
// no delete is stopping it: a copy deleted meanwhile is the delete's, and a new copy of the id
// booked since must not be stopped nor reported ended by its predecessor's end (an attack).
func (a *Agent) end(ctx context.Context, id string, g *guest, state berth.SandboxState, reason string, now time.Time) {
	a.mu.Lock()
	if a.guests[id] != g || g.deleting {
		a.mu.Unlock()
		return
	}
	// Ended, it is no longer being checkpointed: a stop that fails leaves a copy the measure
	// loop and later stops see again (a failed checkpoint's end left it marked for good).
	g.checkpointing = false
	claimLocked(g, fmt.Sprintf("%s (%s)", state, reason))
	a.mu.Unlock()
	if err := a.stopClaimed(ctx, id, g); err != nil {
		a.log.Warn("stop", "sandbox", id, "reason", reason, "err", err)
		return
	}
	a.mu.Lock()
	a.ended = append(a.ended, berth.EndedSandbox{ID: id, State: state, Reason: reason, At: now.UTC()})
	a.mu.Unlock()
	a.log.Info("sandbox ended", "sandbox", id, "state", state, "reason", reason)
	a.Kick()
}

// Kick asks for a heartbeat now instead of at the next tick (AGT-5 drains use it too).
func (a *Agent) Kick() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Drain closes intake (AGT-5): admittable drops to 0, status becomes draining and a
// heartbeat goes out at once. Idempotent and non-blocking. Undrain reverses it.
func (a *Agent) Drain(reason string) {
	a.mu.Lock()
	changed := !a.draining
	a.draining, a.drainReason = true, reason
	a.mu.Unlock()
	if changed {
		a.log.Info("draining", "reason", reason)
		a.Kick()
	}
}

// Undrain lifts Drain. Intake stays closed while a preemption notice's cordon is in force
// (drainingLocked): an operator's undrain does not open a host about to go.
func (a *Agent) Undrain() {
	a.mu.Lock()
	changed := a.draining
	a.draining = false
	a.mu.Unlock()
	if changed {
		a.log.Info("undrained")
		a.Kick()
	}
}

// volumeDir returns (creating it) the host directory of volume "<tenant>/<name>", under the
// agent's volume directory (POOL-2, POOL-4). Errors: invalid_request for a malformed name or
// an agent without a volume directory.
func (a *Agent) volumeDir(volume string) (string, error) {
	if volume == "" {
		return "", nil
	}
	if a.cfg.VolumeDir == "" {
		// This host's lack, not the request's fault: another host may keep volumes.
		return "", berth.Errorf(berth.EUnsupported, "agent %s keeps no volumes (no volume directory)", a.cfg.ID)
	}
	tenant, name, ok := strings.Cut(volume, "/")
	if !ok || !validVolumePart(tenant) || !validVolumePart(name) {
		return "", berth.Errorf(berth.EInvalidRequest, "volume %q must be <tenant>/<name>", volume)
	}
	dir := filepath.Join(a.cfg.VolumeDir, tenant, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("agent %s: volume %s: %w", a.cfg.ID, volume, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("agent %s: volume %s: %w", a.cfg.ID, volume, err)
	}
	return abs, nil
}

// validVolumePart accepts the lowercase names the server allows, and nothing that could
// climb out of the volume directory.
func validVolumePart(s string) bool {
	if s == "" || len(s) > 63 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// HandleNotice reacts to a preemption notice (SPOT-2): cordon first — close intake, status
// draining, a heartbeat at once — and do it once per notice id, however often the cloud
// repeats it (C13). A soft notice (AWS rebalance) cordons only until SoftCordon passes, then
// the host returns to service by itself unless a real notice came meanwhile (C15).
func (a *Agent) HandleNotice(n preempt.Notice, now time.Time) {
	a.mu.Lock()
	if a.notices == nil {
		a.notices = map[string]bool{}
	}
	if a.notices[n.ID] {
		a.mu.Unlock()
		return
	}
	a.notices[n.ID] = true
	reason := fmt.Sprintf("%s %s notice", n.Provider, n.Kind)
	if !n.Deadline.IsZero() {
		reason += ", host goes at " + n.Deadline.UTC().Format(time.RFC3339)
	}
	if n.Soft {
		if !a.hardNotice {
			a.softUntil, a.noticeReason = now.Add(a.cfg.SoftCordon), reason
		}
	} else {
		a.hardNotice, a.softUntil, a.noticeReason = true, time.Time{}, reason
	}
	a.mu.Unlock()
	a.log.Warn("preemption notice: cordoning (SPOT-2)", "provider", n.Provider, "kind", n.Kind, "id", n.ID, "soft", n.Soft, "deadline", n.Deadline)
	a.Kick() // the cordon goes out at once
	if !n.Soft {
		go a.evacuate(n, now)
	}
}

// evacuate triages the host's sandboxes against the notice (SPOT-3) and has the server
// carry the plan out before a hard deadline strictly inside the window; then it stops them
// here. Stateless sandboxes are reconstructible (their authoritative copy is their template
// and the caller's input); stateful ones are irreproducible: with a runtime that can
// checkpoint they are snapshot-moved inside the bandwidth budget (the server calls back for
// each checkpoint, PAUSE-2), stateless ones too with what budget is left; otherwise they are
// budgeted losses, reported as such, never dropped silently.
func (a *Agent) evacuate(n preempt.Notice, now time.Time) {
	end := n.Deadline
	if end.IsZero() {
		end = now.Add(30 * time.Second)
	}
	margin := max(end.Sub(now)/10, 2*time.Second)
	a.mu.Lock()
	var guests []evacuate.Guest
	for id, g := range a.guests {
		if g.started {
			// A guest with a volume cannot leave the host its data is pinned to (POOL-2).
			guests = append(guests, evacuate.Guest{ID: id, Stateful: g.spec.Stateful, Reconstructible: !g.spec.Stateful,
				CanSnapshot: a.ckpt != nil && g.spec.Volume == "", SnapshotMiB: g.resident})
		}
	}
	a.mu.Unlock()
	plan := evacuate.Triage(evacuate.Input{Guests: guests, Now: now, NoticeEnd: end, Margin: margin,
		LinkMiBps: a.cfg.LinkMiBps, Preemptible: a.cfg.Preemptible, SnapshotStateless: a.ckpt != nil})
	// C32: the server counts the time left from the plan's arrival, on its own clock.
	req := berth.EvacuateRequest{Deadline: plan.HardDeadline, DeadlineInMS: max(time.Until(plan.HardDeadline).Milliseconds(), 1)}
	for _, st := range plan.Steps {
		req.Steps = append(req.Steps, berth.EvacuateStep{SandboxID: st.GuestID, Action: string(st.Action), Reason: st.Reason})
	}
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	c, err := a.serverClient(ctx)
	var outcomes []berth.EvacuateOutcome
	if err == nil {
		outcomes, err = c.Evacuate(ctx, a.cfg.ID, req)
	}
	if err != nil {
		a.log.Error("evacuation plan not carried out; the sandboxes' leases will settle them", "err", err)
		return
	}
	defer func() {
		// Azure waits for the host's word before it starts the event: give it once the
		// plan has run (SPOT-1).
		if ack, ok := a.cfg.Notices.(interface {
			Ack(ctx context.Context, eventID string) error
		}); ok {
			if err := ack.Ack(ctx, n.ID); err != nil {
				a.log.Warn("could not acknowledge the notice", "id", n.ID, "err", err)
			}
		}
	}()
	for _, o := range outcomes {
		a.log.Warn("evacuated", "sandbox", o.SandboxID, "state", o.State, "replacement", o.Replacement, "reason", o.Reason)
		if o.State.Terminal() {
			// The store already says how it ended: stop it here without reporting it again.
			_ = a.rt.Stop(ctx, o.SandboxID)
			a.mu.Lock()
			delete(a.guests, o.SandboxID)
			a.mu.Unlock()
		}
	}
}

// expireSoftCordon lifts a soft cordon whose time is up (C15).
func (a *Agent) expireSoftCordon(now time.Time) {
	a.mu.Lock()
	expired := !a.softUntil.IsZero() && !now.Before(a.softUntil) && !a.hardNotice
	if expired {
		a.softUntil = time.Time{}
	}
	a.mu.Unlock()
	if expired {
		a.log.Info("soft cordon expired with no interruption: back in service unless drained otherwise (C15)")
		a.Kick()
	}
}
