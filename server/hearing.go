package server

import (
	"log/slog"
	"sync"
	"time"
)

// slowSweep is how long a sweep's first store call may take before the replica counts the
// time as deaf (hearing.ok): a store that slow cannot be trusted to have recorded the fleet's
// heartbeats meanwhile (they wait on the same connections, each within its own 10 s).
const slowSweep = 10 * time.Second

// hearing is since when this replica has been able to hear the fleet: record its heartbeats
// in the store. Lease expiry (LIF-2) counts an agent's silence from the later of its last
// heartbeat and that moment (countedSilence), so silence the control plane caused — this
// replica was not running, or its store failed — is never blamed on the hosts and their
// sandboxes are not declared lost for it. Without it, a store failover or a restart of every
// replica that outlasted the ephemeral lease (90 s) turned every sandbox of the fleet into
// lost at the first sweep after, and the agents then stopped them (AGT-6): the fleet's work
// ended by the control plane's own outage. docs/DECISIONS.md, "Lease expiry counts only the
// silence a replica could hear".
//
// The signals are the replica's own: its loops starting (Run) and its sweeps' store calls
// failing, or taking longer than slowSweep. Never an agent's heartbeat failing: an agent can
// make its own heartbeats fail, and must not be able to hold every other host's leases open.
// A replica that heard throughout is unaffected, and with several replicas the ones that heard
// expire leases on time; the cost is a dead host's sandboxes lost up to one lease TTL later
// when every replica was deaf when it died.
type hearing struct {
	mu sync.Mutex
	// since is when hearing last (re)started: the replica's loops started, or the store
	// answered a sweep again after failing or stalling. Zero before Run: nothing deferred.
	since time.Time
	// failingSince is when the store's current run of failed sweeps began (zero: none).
	failingSince time.Time
}

// start marks the replica's loops starting at now (Run).
func (h *hearing) start(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since = now
}

// failed records that the store failed a sweep begun at now: until it answers again this
// replica is taken to hear nothing.
func (h *hearing) failed(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failingSince.IsZero() {
		h.failingSince = now
	}
	h.since = now
}

// ok records that the store answered a sweep begun at start by end. The first answer after
// failures, or an answer slower than slowSweep, restarts hearing at end, logged once.
func (h *hearing) ok(start, end time.Time, log *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.failingSince.IsZero():
		log.Warn("the store answers again: lease expiry counts agents' silence from now",
			"store_failing_since", h.failingSince, "for", end.Sub(h.failingSince).Round(time.Millisecond))
	case end.Sub(start) > slowSweep:
		log.Warn("the store took too long to answer a sweep: lease expiry counts agents' silence from now",
			"took", end.Sub(start).Round(time.Millisecond))
	default:
		return
	}
	h.failingSince, h.since = time.Time{}, end
}

// from is when hearing last (re)started (zero before Run).
func (h *hearing) from() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since
}

// countedSilence is how long an agent last seen at lastSeen has been silent by now, counting
// only the time this replica could hear it.
func (h *hearing) countedSilence(now, lastSeen time.Time) time.Duration {
	if from := h.from(); from.After(lastSeen) {
		return now.Sub(from)
	}
	return now.Sub(lastSeen)
}
