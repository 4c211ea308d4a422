package sim

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/berth-dev/berth/evacuate"
)

// markDirty schedules host h's next heartbeat on its 10 s grid. A heartbeat that would carry
// nothing new only renews freshness, which the engine treats as given for a live host, so
// heartbeats are simulated only when something changed: the figures are the same and a
// 10,000-host fleet costs what its changes cost.
func (e *engine) markDirty(h int) {
	hs := &e.hosts[h]
	if hs.hbPending || !hs.alive {
		return
	}
	hb := int64(e.s.Heartbeat)
	next := hs.phase + ((e.now-hs.phase)/hb+1)*hb
	if e.now < hs.phase {
		next = hs.phase
	}
	hs.hbPending = true
	e.q.push(next, evHeartbeat, int32(h))
}

// heartbeat publishes the agent's verdict (ADM-6, AGT-1): the store's row for h now holds the
// admittable the one formula gives over the agent's books, and the ledger nets out every
// reservation for a create the agent now lists (LED-4). The replica that receives the
// heartbeat folds it into its snapshot at once; the others see it at their next refresh.
func (e *engine) heartbeat(h int) {
	hs := &e.hosts[h]
	hs.hbPending = false
	if !hs.alive {
		return
	}
	if e.p.Gate {
		hs.gate.Observe(e.pressure(h), time.Unix(0, e.now))
	}
	row := &e.store[h]
	row.AdmittableMiB = e.agentAdmittable(h)
	row.IntakeOpen = !hs.gate.Closed() && !hs.draining
	row.Draining = hs.draining
	for _, rid := range hs.unnetted {
		e.release(rid)
	}
	hs.unnetted = hs.unnetted[:0]
	e.changed(h)
	rep := &e.reps[h%len(e.reps)]
	pend := rep.snap[h].PendingMiB
	rep.snap[h] = *row
	rep.snap[h].PendingMiB = pend
	for j := range hs.books {
		if !hs.books[j].Measured { // the next heartbeat will carry its first measurement
			e.markDirty(h)
			break
		}
	}
}

// pressure models PSI "some avg10" (percent) from the share of host memory in use: 0 up to
// the knee, rising linearly to 100 at a full host (docs/DECISIONS.md).
func (e *engine) pressure(h int) float64 {
	u := float64(e.hosts[h].resident) / float64(e.s.HostMiB)
	return min(max((u-e.s.PressureKnee)/(1-e.s.PressureKnee)*100, 0), 100)
}

// critical is ADM-9's line as the agent draws it: available memory under the floor
// (5 % of the host, at least 64 MiB) or pressure over 40 %.
func (e *engine) critical(h int) bool {
	return e.s.HostMiB-e.hosts[h].resident < e.critLine || e.pressure(h) > 40
}

// change moves guest gid to its next resident size. Growth past the host's memory is a
// kernel OOM kill at once; growth past the critical line starts the agent's readings.
func (e *engine) change(gid int32) {
	g := &e.guests[gid]
	if g.dead {
		return
	}
	cr := &e.creates[g.create]
	age := e.now - g.born + g.ageBase
	mib, next := e.w.Resident(&cr.a, age)
	if next >= 0 {
		e.q.push(e.now+next-age, evChange, gid)
	}
	if mib == g.resident {
		return
	}
	h := int(g.host)
	hs := &e.hosts[h]
	hs.resident += mib - g.resident
	hs.books[g.bi].ResidentMiB = mib
	g.resident = mib
	e.markDirty(h)
	e.oomCheck(h)
	e.pressureChanged(h)
}

// oomCheck is the kernel's answer when the guests' resident memory exceeds the host: the OOM
// killer takes the largest guest, stateful or not, until it fits. Each kill is one kernel-OOM
// event, counted apart from ADM-9 evictions.
func (e *engine) oomCheck(h int) {
	hs := &e.hosts[h]
	for hs.resident > e.s.HostMiB && len(hs.gids) > 0 {
		e.removeGuest(e.largest(h, true))
		e.r.OOMKills++
		e.sample.ooms++
	}
}

// largest returns the guest with the largest resident memory on h (ties: the youngest, as
// the agent's eviction policy breaks them); stateful guests only when anyStateful. −1: none.
func (e *engine) largest(h int, anyStateful bool) int32 {
	hs := &e.hosts[h]
	best := -1
	for j := range hs.books {
		if hs.books[j].Stateful && !anyStateful {
			continue
		}
		if best < 0 || hs.books[j].ResidentMiB > hs.books[best].ResidentMiB ||
			(hs.books[j].ResidentMiB == hs.books[best].ResidentMiB && hs.born[j] > hs.born[best]) {
			best = j
		}
	}
	if best < 0 {
		return -1
	}
	return hs.gids[best]
}

// pressureChanged lets the agent read the new state: the pressure gate (ADM-8) closes at
// once above its line, and a host over the critical line gets 1 s readings (ADM-9).
func (e *engine) pressureChanged(h int) {
	if !e.p.Gate {
		return
	}
	hs := &e.hosts[h]
	was := hs.gate.Closed()
	hs.gate.Observe(e.pressure(h), time.Unix(0, e.now))
	if hs.gate.Closed() != was {
		e.markDirty(h)
	}
	if (hs.gate.Closed() || e.critical(h)) && !hs.tickPending {
		hs.tickPending = true
		e.q.push(e.now+int64(time.Second), evTick, int32(h))
	}
}

// tick is the agent's 1 s measurement while its gate is closed or it is over the critical
// line: two critical readings in a row evict the stateless guest with the largest working set
// (ADM-9), one per reading; stateful guests are never victims.
func (e *engine) tick(h int) {
	hs := &e.hosts[h]
	hs.tickPending = false
	if !hs.alive {
		return
	}
	if e.critical(h) {
		hs.critTicks++
		if hs.critTicks >= 2 {
			if v := e.largest(h, false); v >= 0 {
				e.removeGuest(v)
				e.r.Evictions++
				e.sample.evictions++
			}
		}
	} else {
		hs.critTicks = 0
	}
	e.pressureChanged(h)
}

// removeGuest ends guest gid on its host, whatever the reason.
func (e *engine) removeGuest(gid int32) {
	g := &e.guests[gid]
	g.dead = true
	h := int(g.host)
	hs := &e.hosts[h]
	last := len(hs.books) - 1
	i := int(g.bi)
	hs.resident -= g.resident
	if i != last {
		hs.books[i], hs.gids[i], hs.born[i] = hs.books[last], hs.gids[last], hs.born[last]
		e.guests[hs.gids[i]].bi = int32(i)
	}
	hs.books, hs.gids, hs.born = hs.books[:last], hs.gids[:last], hs.born[:last]
	e.live--
	e.markDirty(h)
}

// scheduleLoss schedules the next host loss of the Poisson process over live hosts.
func (e *engine) scheduleLoss() {
	if len(e.alive) == 0 {
		return
	}
	perSec := e.s.Failures.LossPerHostHour / 3600 * float64(len(e.alive))
	after := e.rng.exp() / perSec * 1e9
	// A loss drawn past 146 years (--loss-rate 1e-300), or once the clock is there, is past any
	// run: none is scheduled. Converted unchecked, it was a negative time, a loss at once.
	if after > maxLifetime || e.now > int64(maxLifetime) {
		return
	}
	e.q.push(e.now+int64(after), evLoss, 0)
}

// loss takes a host: a random live one for the Poisson process (scheduled 0), or the
// scheduled loss's host. It goes silently (SPOT-5) or after a preemption notice (SPOT-2,
// SPOT-3): cordon at once, triage with evacuate.Triage, recreate what the plan saves
// elsewhere through the scheduler, and lose the host at the end of the window.
func (e *engine) loss(scheduled int) {
	if e.arrDone && e.now > e.end {
		return
	}
	f := &e.s.Failures
	var h, kind int
	if scheduled > 0 {
		l := f.Scheduled[scheduled-1]
		h = l.Host
		if !e.hosts[h].alive || e.hosts[h].draining {
			return
		}
		if l.Notice > 0 {
			kind = 1 + slices.Index(f.Notices, l.Notice)
		}
		if k := slices.Index(e.alive, int32(h)); k >= 0 {
			e.alive = slices.Delete(e.alive, k, k+1)
		}
	} else {
		if len(e.alive) == 0 {
			return
		}
		k := int(e.rng.next() % uint64(len(e.alive)))
		h = int(e.alive[k])
		e.alive[k] = e.alive[len(e.alive)-1]
		e.alive = e.alive[:len(e.alive)-1]
		if len(f.Notices) > 0 && e.rng.float() < f.NoticeFrac {
			kind = 1 + e.r.lossCount()%len(f.Notices)
		}
	}
	st := &e.r.Losses[kind]
	st.Hosts++
	st.Guests += len(e.hosts[h].gids)
	if kind == 0 {
		e.death(h)
	} else {
		e.notice(h, kind)
	}
	if scheduled == 0 {
		e.scheduleLoss()
	}
}

func (e *engine) notice(h, kind int) {
	hs := &e.hosts[h]
	window := e.s.Failures.Notices[kind-1]
	hs.draining, hs.noticeKind = true, kind+1 // cordon first (SPOT-2): the agent's immediate heartbeat
	row := &e.store[h]
	row.Draining, row.IntakeOpen, row.AdmittableMiB = true, false, 0
	e.changed(h)
	e.reps[h%len(e.reps)].snap[h].Draining = true
	if e.s.CordonDelay >= 0 {
		e.q.push(e.now+int64(e.s.CordonDelay), evCordon, int32(h))
	}
	in := evacuate.Input{Now: time.Unix(0, e.now), NoticeEnd: time.Unix(0, e.now+int64(window)),
		Margin: e.s.Failures.Margin, LinkMiBps: e.s.Failures.LinkMiBps}
	for _, gid := range hs.gids {
		g := &e.guests[gid]
		a := &e.creates[g.create].a
		in.Guests = append(in.Guests, evacuate.Guest{ID: strconv.Itoa(int(gid)), Stateful: a.Stateful,
			Reconstructible: a.Reconstructible, CanSnapshot: e.s.Failures.CanSnapshot, SnapshotMiB: g.resident})
	}
	plan := evacuate.Triage(in)
	var moved int64
	for _, s := range plan.Steps {
		n, _ := strconv.Atoi(s.GuestID)
		gid := int32(n)
		g := &e.guests[gid]
		at := e.now
		switch s.Action {
		case evacuate.Loss:
			continue // counted lost when the host dies
		case evacuate.SnapshotMove:
			moved += s.MiB // moves run one after another, smallest first, on the host's link
			at += int64(float64(moved) / math.Max(e.s.Failures.LinkMiBps, 1e-9) * 1e9)
		}
		old := e.creates[g.create]
		e.creates = append(e.creates, createReq{a: old.a, first: at, firstRefusal: -1,
			ageBase: at - g.born + g.ageBase, evac: int8(kind + 1), src: gid})
		e.q.push(at, evAttempt, int32(len(e.creates)-1))
	}
	e.q.push(e.now+int64(window), evDeath, int32(h))
}

// death is the end of host h: its guests are gone, its heartbeats stop (so it turns stale
// after the cutoff, SPOT-5), and its unnetted reservations wait for their TTL (LED-2).
func (e *engine) death(h int) {
	hs := &e.hosts[h]
	if !hs.alive {
		return
	}
	for len(hs.gids) > 0 {
		e.removeGuest(hs.gids[len(hs.gids)-1])
	}
	hs.alive = false
	e.sample.hostsUp--
	hb := int64(e.s.Heartbeat)
	last := hs.phase + ((e.now-hs.phase)/hb)*hb
	if e.now < hs.phase {
		last = 0
	}
	e.store[h].LastSeenNano = last
	e.changed(h)
	for _, rid := range hs.unnetted {
		e.q.push(e.res[rid].expires, evExpire, rid)
	}
	hs.unnetted = nil
}
