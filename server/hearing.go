package server

import (
	"log/slog"
	"sync"
	"time"
)

// deafAfter is how long the store must keep failing the replica's sweeps, or take to answer
// one, before the replica counts that time as deaf (hearing). Shorter failures change
// nothing: an agent can make a shared store fail or stall for seconds (an attack: eight
// concurrent heartbeats of 100,000 held ids made a SQLite sweep fail with SQLITE_BUSY, sixteen
// made a PostgreSQL sweep wait 17 s for a pooled connection), and must not thereby hold other
// hosts' leases open. 30 s is three heartbeat intervals and a third of the ephemeral lease:
// leases of the whole fleet run out only after about 80 s without a recorded heartbeat, long
// after a failure has lasted this long.
const deafAfter = 30 * time.Second

// hearing is since when this replica has been able to hear the fleet: record its heartbeats
// in the store. Lease expiry (LIF-2) counts an agent's silence from the later of its last
// heartbeat and that moment (countedSilence), so silence the control plane caused — this
// replica was not running, or its store failed or hung for deafAfter or longer — is never
// blamed on the hosts and their sandboxes are not declared lost for it. Without it, a store
// failover or a restart of every replica that outlasted the ephemeral lease (90 s) turned
// every sandbox of the fleet into lost at the first sweep after, and the agents then stopped
// them (AGT-6): the fleet's work ended by the control plane's own outage. docs/DECISIONS.md,
// "Lease expiry counts only the silence a replica could hear".
//
// The signals are the replica's own — its loops starting (Run), its sweeps' store calls
// failing or hanging — never an agent's heartbeat failing: an agent can make its own
// heartbeats fail. A replica that heard throughout is unaffected, and with several replicas
// the ones that heard expire leases on time; the cost is a dead host's sandboxes lost up to
// one lease TTL later when every replica was deaf when it died.
type hearing struct {
	mu sync.Mutex
	// since is when hearing last (re)started: the replica's loops started, or the store
	// answered a sweep after failing or hanging for deafAfter. Zero before Run.
	since time.Time
	// failingSince and lastFailed bound the store's current run of failed sweeps (zero:
	// none). Once it spans deafAfter, silence counts from lastFailed until it ends.
	failingSince, lastFailed time.Time
}

// start marks the replica's loops starting at now (Run).
func (h *hearing) start(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.since = now
}

// failed records that the store failed a sweep begun at now.
func (h *hearing) failed(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failingSince.IsZero() {
		h.failingSince = now
	}
	h.lastFailed = now
}

// ok records that the store answered a sweep begun at start by end. A run of failures that
// spanned deafAfter, or an answer that took that long, restarts hearing at end, logged once;
// a shorter one is forgotten.
func (h *hearing) ok(start, end time.Time, log *slog.Logger) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.failingSince.IsZero() && end.Sub(h.failingSince) >= deafAfter:
		log.Warn("the store answers again: lease expiry counts agents' silence from now",
			"store_failing_since", h.failingSince, "for", end.Sub(h.failingSince).Round(time.Millisecond))
		h.since = end
	case end.Sub(start) >= deafAfter:
		log.Warn("the store took too long to answer a sweep: lease expiry counts agents' silence from now",
			"took", end.Sub(start).Round(time.Millisecond))
		h.since = end
	}
	h.failingSince, h.lastFailed = time.Time{}, time.Time{}
}

// from is when silence starts to count now: when hearing last (re)started, or the last
// failure of a run of failures that has spanned deafAfter and goes on (zero before Run).
func (h *hearing) from() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.failingSince.IsZero() && h.lastFailed.Sub(h.failingSince) >= deafAfter && h.lastFailed.After(h.since) {
		return h.lastFailed
	}
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
