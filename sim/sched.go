package sim

import (
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// attempt is one try of create c through a replica, as server/scheduler.go's place does it:
// Pick over the replica's cached snapshot; before refusing, re-read and pick once more
// (PLC-6); take the reservation in the ledger with the same Fits (LED-1); send it to the
// agent, whose local gate judges it again (AGT-2); if the agent says no, release and try the
// next host, up to MaxHosts (PLC-7). A refusal is answered the SDK's way: retry after the
// server's Retry-After or full jitter, until the SDK's deadline (SDK-1).
func (e *engine) attempt(c int32) {
	cr := &e.creates[c]
	if cr.evac > 0 && cr.attempt == 0 && e.guests[cr.src].dead {
		return // the guest ended on its own (counted Ended) or was killed before it could leave
	}
	cr.attempt++
	r := int(c) % len(e.reps)
	rep := &e.reps[r]
	if e.now-rep.refreshedAt >= int64(e.s.RefreshEvery) {
		e.refresh(r)
	}
	req := placement.Request{MemoryMiB: cr.a.MemoryMiB, Stateful: cr.a.Stateful}
	opt := placement.Options{StaleAfterNano: int64(e.s.StaleAfter), Strategy: e.p.Strategy, Reserve: e.p.Reserve}
	reread, hops, races := false, 0, 0
	for {
		rep.seed++
		d := placement.Pick(rep.snap, req, e.now, opt, mix(rep.seed))
		if d.Index < 0 {
			if !reread && rep.logPos != e.logBase+len(e.log) {
				// PLC-6: re-read before refusing. When nothing changed since this replica's
				// last read the re-read snapshot is this one and Pick would refuse again.
				reread = true
				e.refresh(r)
				continue
			}
			e.refuse(c, d)
			return
		}
		if hops >= e.s.MaxHosts {
			d.Rejected[placement.ReasonSaturated]++
			d.Index = -1
			e.refuse(c, d)
			return
		}
		h := d.Index
		// A cordoned host picked from a cache that has not seen the cordon yet (PLC-5): the
		// cordon's heartbeat published admittable 0, so the ledger (or, charging nothing, the
		// agent) turns it away and the pick is wasted.
		cordoned := e.store[h].Draining
		if cordoned {
			e.r.CordonMisses++
		}
		// The ledger (LED-1): the store's check, atomic with taking the room, against the
		// agent's published verdict and the reservations this ledger holds.
		if !admission.Fits(e.store[h].AdmittableMiB, e.ledgerPending(r, h), d.ChargeMiB) {
			if !cordoned {
				e.r.LedgerRaces++
			}
			races++
			e.refresh(r)
			if races > 2*e.s.MaxHosts {
				d.Index = -1
				e.refuse(c, d)
				return
			}
			continue
		}
		hops++
		if !admission.Fits(e.store[h].AdmittableMiB, e.pending[h], d.ChargeMiB) {
			e.r.OverGrants++ // only a per-replica ledger gets here: the shared one said no above
		}
		rid := e.reserve(r, h, d.ChargeMiB)
		rep.snap[h].PendingMiB += d.ChargeMiB
		hs := &e.hosts[h]
		no := ""
		switch {
		case !hs.alive:
			no, e.r.Unreachable = "unreachable", e.r.Unreachable+1
		case hs.draining:
			no = "draining" // counted above
		case !e.p.TrustScheduler && !admission.Fits(e.agentAdmittable(h), 0, e.p.Reserve.Charge(e.p.Mode, cr.a.MemoryMiB, cr.a.Stateful)):
			no, e.r.AgentRefusals = "full", e.r.AgentRefusals+1
		}
		if no != "" {
			e.release(rid)
			req.Exclude = append(req.Exclude, h)
			continue
		}
		hs.unnetted = append(hs.unnetted, rid)
		e.admit(c, h)
		return
	}
}

// refuse answers create c with a refusal (API-2) and schedules the SDK's retry.
func (e *engine) refuse(c int32, d placement.Decision) {
	cr := &e.creates[c]
	code := d.Code()
	e.r.Refusals[code]++
	e.r.Reasons[dominant(&d)]++
	e.sample.refused++
	if cr.firstRefusal < 0 {
		cr.firstRefusal = e.now
	}
	if e.s.Retry {
		var wait int64
		if e.s.RetryAfter {
			wait = e.retryAfter(code)
		} else {
			wait = int64(e.rng.float() * float64(berth.Backoff(int(cr.attempt)-1, 0, 0))) // full jitter (SDK-1)
		}
		if e.now+wait <= cr.first+int64(e.s.SDKDeadline) {
			e.q.push(e.now+wait, evAttempt, c)
			return
		}
	}
	if cr.evac == 0 {
		e.r.GaveUp++
	}
}

// dominant names the reason most hosts were rejected for (PLC-10); ties go to the first
// filter in placement's order.
func dominant(d *placement.Decision) string {
	best, n := placement.Reason(0), -1
	for r, k := range d.Rejected {
		if k > n {
			best, n = placement.Reason(r), k
		}
	}
	return best.String()
}

// retryAfter is the server's estimate (API-3, server/scheduler.go): the earliest moment a
// running sandbox's lifetime or an outstanding reservation ends, plus one heartbeat, clamped
// to [1 s, 60 s]; 5 s when nothing ends; 30 s for no_healthy_agents. Unlike the server it
// does not restrict the search to hosts that could take work.
func (e *engine) retryAfter(code string) int64 {
	if code == berth.ENoHealthyAgents {
		return int64(30 * time.Second)
	}
	earliest := int64(-1)
	for e.departs.len() > 0 {
		t := e.departs.top()
		if t.at <= e.now || e.guests[t.id].dead {
			e.departs.pop()
			continue
		}
		earliest = t.at
		break
	}
	for e.resFIFO < len(e.res) && (!e.res[e.resFIFO].live || e.res[e.resFIFO].expires <= e.now) {
		e.resFIFO++
	}
	if e.resFIFO < len(e.res) && (earliest < 0 || e.res[e.resFIFO].expires < earliest) {
		earliest = e.res[e.resFIFO].expires
	}
	if earliest < 0 {
		return int64(5 * time.Second)
	}
	return min(max(earliest-e.now+int64(e.s.Heartbeat), int64(time.Second)), int64(time.Minute))
}

// ledgerPending is what replica r's ledger holds against host h: the shared ledger's sum, or
// the replica's own reservations only.
func (e *engine) ledgerPending(r, h int) int64 {
	if e.p.PerReplicaLedger {
		return e.reps[r].pend[h]
	}
	return e.pending[h]
}

// reserve takes a reservation (LED-1, LED-2) and returns its id.
func (e *engine) reserve(r, h int, mib int64) int32 {
	e.res = append(e.res, reservation{host: int32(h), owner: int32(r), mib: mib, expires: e.now + int64(e.s.ReserveTTL), live: true})
	e.pending[h] += mib
	if e.p.PerReplicaLedger {
		e.reps[r].pend[h] += mib
	}
	e.changed(h)
	return int32(len(e.res) - 1)
}

// release frees a reservation, idempotently (STYLE 5).
func (e *engine) release(id int32) {
	rv := &e.res[id]
	if !rv.live {
		return
	}
	rv.live = false
	e.pending[rv.host] -= rv.mib
	if e.p.PerReplicaLedger {
		e.reps[rv.owner].pend[rv.host] -= rv.mib
	}
	e.changed(int(rv.host))
}

// changed notes that host h's store row or ledger entry changed, for replicas' refreshes.
func (e *engine) changed(h int) { e.log = append(e.log, int32(h)) }

// refresh brings replica r's snapshot up to date with the store and its ledger: only the hosts
// that changed since its last refresh are copied, which gives the same snapshot as a full
// re-read.
func (e *engine) refresh(r int) {
	rep := &e.reps[r]
	for _, h := range e.log[rep.logPos-e.logBase:] {
		rep.snap[h] = e.store[h]
		rep.snap[h].PendingMiB = e.ledgerPending(r, int(h))
	}
	rep.logPos = e.logBase + len(e.log)
	rep.refreshedAt = e.now
	if len(e.log) > 1<<16 { // forget what every replica has read
		low := rep.logPos
		for i := range e.reps {
			low = min(low, e.reps[i].logPos)
		}
		if n := low - e.logBase; n > len(e.log)/2 {
			e.log = append(e.log[:0], e.log[n:]...)
			e.logBase = low
		}
	}
}

// admit starts create c's guest on host h: the agent books it at its charge until a
// measurement sees it (ADM-5), and the guest's resident memory follows the workload.
func (e *engine) admit(c int32, h int) {
	cr := &e.creates[c]
	if cr.firstRefusal >= 0 && cr.evac == 0 {
		e.tts = append(e.tts, e.now-cr.firstRefusal)
	}
	if cr.evac > 0 {
		e.r.Losses[cr.evac-1].Saved++
		e.guests[cr.src].saved = true
	} else {
		e.r.Admitted++
	}
	gid := int32(len(e.guests))
	mib, next := e.w.Resident(&cr.a, cr.ageBase)
	g := guest{create: c, host: int32(h), resident: mib, born: e.now, ageBase: cr.ageBase}
	if cr.a.Lifetime > 0 {
		g.end = e.now + max(cr.a.Lifetime-cr.ageBase, 1)
	}
	hs := &e.hosts[h]
	g.bi = int32(len(hs.books))
	e.guests = append(e.guests, g)
	hs.books = append(hs.books, admission.Guest{ConfiguredMiB: cr.a.MemoryMiB, ResidentMiB: mib, Stateful: cr.a.Stateful})
	hs.gids = append(hs.gids, gid)
	hs.born = append(hs.born, e.now)
	hs.resident += mib
	e.r.BusiestHost = max(e.r.BusiestHost, len(hs.gids))
	e.live++
	if g.end > 0 {
		e.q.push(g.end, evDepart, gid)
		e.departs.push(g.end, evDepart, gid)
	}
	if next >= 0 {
		e.q.push(e.now+next-cr.ageBase, evChange, gid)
	}
	e.markDirty(h)
	e.oomCheck(h)
	e.pressureChanged(h)
}
