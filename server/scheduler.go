package server

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// scheduler places creates (PLC-1…8): Pick over a cached snapshot of the agent table, a
// reservation taken in the store atomically with the fits check (LED-1), the agent's own
// local gate, and the next host when an agent says no (PLC-7). The cache holds positive facts
// only; before any refusal it re-reads the store and picks once more (PLC-6, C22).
type scheduler struct {
	store   berth.Store
	cfg     Config
	agents  *agentCaller
	metrics *metrics

	mu       sync.RWMutex
	hosts    []placement.Host // indexed by snap (the same slice): change a host only through snap.Set
	snap     *placement.Snapshot
	index    map[string]int // agent id → position in hosts
	addrs    []string       // agent base URLs, parallel to hosts
	totals   []int64        // agents' memory_mb_total, parallel to hosts
	failures []int          // agents' consecutive failed creates (PLC-9), parallel to hosts
	qEnd     time.Time      // the earliest quarantine end in the snapshot: refresh then (probation)
	loadedAt time.Time

	refreshSem chan struct{} // one refreshIfStale read of the store at a time (single flight)
	raSem      chan struct{} // one retryAfter estimate read of the store at a time (single flight)

	loadMu  sync.Mutex     // one read of the store into the snapshot at a time; guards the four below
	known   []berth.Agent  // the agent table as last read (without held lists), sorted by id
	knownAt map[string]int // agent id → position in known
	cursor  string         // the store's change cursor of the last read ("": the next is whole)
	wholeAt time.Time      // when the last whole read of the agent table was taken

	raMu  sync.Mutex // guards the cached Retry-After estimate and ended
	raAt  time.Time
	raVal time.Duration
	// raSoon is, with raVal, the most MiB any open working-set host will have once its
	// reserves are measured (reserveRoom); -1 when no such host holds a reserve.
	raSoon int64
	// ended is when this replica last stopped a sandbox on each agent: room its next
	// heartbeat will show, which the Retry-After estimate counts (API-3).
	ended map[string]time.Time
}

func newScheduler(st berth.Store, cfg Config, ac *agentCaller, m *metrics) *scheduler {
	return &scheduler{store: st, cfg: cfg, agents: ac, metrics: m, snap: placement.NewSnapshot(nil),
		index: map[string]int{}, ended: map[string]time.Time{},
		refreshSem: make(chan struct{}, 1), raSem: make(chan struct{}, 1)}
}

// wholeReadEvery bounds the time between two whole reads of the agent table by a replica. A
// change the store's cursor cannot show — a row deleted by hand (Berth deletes no agent) —
// lasts in the snapshot at most this long, and a cursor is never older (its transaction ids
// wrap after about two billion transactions; minutes are far inside that).
const wholeReadEvery = 5 * time.Minute

// refresh re-reads the store into the snapshot: the agents whose rows changed since the last
// read, merged into those read before (issue 16, goal 2: a tenth of the table at 10,000
// agents), and every pending reservation. The merge sees what a whole read would: the store
// returns every change committed after the last read's cursor (AgentsChangedSince), Berth
// deletes no agent, and a row deleted by hand leaves at the next whole read (wholeReadEvery).
func (s *scheduler) refresh(ctx context.Context) error { return s.load(ctx, false) }

// refreshAll is refresh with a whole read of the agent table, for when changes may have been
// missed outside the store's cursor (its change notifications reconnected).
func (s *scheduler) refreshAll(ctx context.Context) error { return s.load(ctx, true) }

// load is refresh (whole false) or refreshAll (whole true).
func (s *scheduler) load(ctx context.Context, whole bool) error {
	s.loadMu.Lock()
	defer s.loadMu.Unlock()
	now := s.cfg.Clock()
	if whole || now.Sub(s.wholeAt) > wholeReadEvery || now.Before(s.wholeAt) {
		s.cursor = "" // dropped before the read: a whole read asked for stays asked for until one succeeds
	}
	changes, err := s.store.AgentsChangedSince(ctx, s.cursor) // placement reads no held list
	if err != nil {
		return fmt.Errorf("read agents: %w", err)
	}
	pending, err := s.store.Pending(ctx, now)
	if err != nil {
		return fmt.Errorf("read ledger: %w", err) // the old cursor stays: the next read is as exact
	}
	s.merge(changes)
	s.cursor = changes.Cursor
	if changes.Full {
		s.wholeAt = now
	}
	agents := s.known
	hosts := make([]placement.Host, len(agents))
	addrs := make([]string, len(agents))
	totals := make([]int64, len(agents))
	failures := make([]int, len(agents))
	index := make(map[string]int, len(agents))
	for i, a := range agents {
		hosts[i] = hostOf(a, pending[a.AgentID], now)
		addrs[i] = a.Address
		totals[i] = a.MemoryMiBTotal
		failures[i] = a.CreateFailures
		index[a.AgentID] = i
	}
	snap := placement.NewSnapshot(hosts)
	s.mu.Lock()
	s.hosts, s.snap, s.addrs, s.totals, s.failures, s.index, s.loadedAt = hosts, snap, addrs, totals, failures, index, now
	s.qEnd = time.Time{}
	for _, a := range agents {
		s.noteQuarantine(a.QuarantinedUntil, now)
	}
	s.mu.Unlock()
	return nil
}

// merge folds a read of the agent table into known: a whole read replaces it, a read of
// changes overwrites the agents it holds and adds the new ones. The caller holds loadMu.
func (s *scheduler) merge(c berth.AgentChanges) {
	added := c.Full
	if c.Full {
		s.known = c.Agents
	} else {
		for _, a := range c.Agents {
			if i, ok := s.knownAt[a.AgentID]; ok {
				s.known[i] = a
			} else {
				s.known, added = append(s.known, a), true
			}
		}
	}
	if !added {
		return
	}
	sort.Slice(s.known, func(i, j int) bool { return s.known[i].AgentID < s.known[j].AgentID })
	s.knownAt = make(map[string]int, len(s.known))
	for i, a := range s.known {
		s.knownAt[a.AgentID] = i
	}
}

func hostOf(a berth.Agent, pendingMiB int64, now time.Time) placement.Host {
	return placement.Host{
		ID:            a.AgentID,
		LastSeenNano:  a.LastSeen.UnixNano(),
		Draining:      a.Status == berth.AgentDraining || a.DrainReason != "",
		Quarantined:   a.QuarantinedUntil.After(now), // PLC-9; probation starts when it passes
		IntakeOpen:    a.IntakeOpen,
		Preemptible:   a.Preemptible,
		CanRestore:    a.Checkpoint,
		Region:        a.Region,
		Pool:          a.Pool,
		Mode:          a.MemoryAdmission,
		AdmittableMiB: a.MemoryMiBAdmittable,
		PendingMiB:    pendingMiB,
		CPUTotal:      a.CPUTotal,
		CPUUsed:       a.CPUUsed,
	}
}

// noteQuarantine remembers the earliest future quarantine end. The caller holds s.mu.
func (s *scheduler) noteQuarantine(until, now time.Time) {
	if until.After(now) && (s.qEnd.IsZero() || until.Before(s.qEnd)) {
		s.qEnd = until
	}
}

// refreshIfStale re-reads the store when the snapshot is older than the cache TTL (PLC-5) or
// a quarantine in it has ended (its host is back on probation, PLC-9).
//
// It is single-flight (issue 16, goal 2): callers that find the snapshot stale while another
// is re-reading it wait for that read and use it, instead of each reading the whole agent
// table again; only a caller that still finds it stale after the wait reads.
func (s *scheduler) refreshIfStale(ctx context.Context) error {
	if !s.stale() {
		return nil
	}
	select {
	case s.refreshSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.refreshSem }()
	if !s.stale() {
		return nil // refreshed while this caller waited
	}
	return s.refresh(ctx)
}

// stale reports whether the snapshot is older than the cache TTL or holds an ended quarantine.
func (s *scheduler) stale() bool {
	now := s.cfg.Clock()
	s.mu.RLock()
	defer s.mu.RUnlock()
	return now.Sub(s.loadedAt) > s.cfg.CacheTTL || (!s.qEnd.IsZero() && !now.Before(s.qEnd))
}

// observe folds a heartbeat this replica just stored into the snapshot, so the cache stays
// current between refreshes. Netted reservations are subtracted by the next refresh.
func (s *scheduler) observe(a berth.Agent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[a.AgentID]
	if !ok {
		s.loadedAt = time.Time{} // unknown agent: force a refresh on the next create
		return
	}
	s.snap.Set(i, hostOf(a, s.hosts[i].PendingMiB, s.cfg.Clock()))
	s.failures[i] = a.CreateFailures
	s.noteQuarantine(a.QuarantinedUntil, s.cfg.Clock())
	s.addrs[i] = a.Address
	s.totals[i] = a.MemoryMiBTotal
}

// silentAgents returns the agents whose cached last heartbeat is older than their pool's
// lease TTL: candidates for lease expiry, to be confirmed against the store.
// nextLeaseEnd returns the earliest moment after now at which a host in the snapshot that
// has not yet gone silent for its pool's lease TTL would (ok false: none), silence counted
// from no earlier than heard (the replica's hearing, LIF-2).
func (s *scheduler) nextLeaseEnd(now, heard time.Time, ephemeral, stateful time.Duration) (time.Time, bool) {
	var heardNano int64 // zero time: UnixNano is undefined before 1678
	if !heard.IsZero() {
		heardNano = heard.UnixNano()
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	var next int64
	for _, h := range s.hosts {
		ttl := stateful
		if h.Pool == berth.PoolEphemeral {
			ttl = ephemeral
		}
		if end := max(h.LastSeenNano, heardNano) + int64(ttl); end > now.UnixNano() && (next == 0 || end < next) {
			next = end
		}
	}
	return time.Unix(0, next), next != 0
}

func (s *scheduler) silentAgents(now time.Time, ephemeral, stateful time.Duration) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var ids []string
	for _, h := range s.hosts {
		ttl := stateful
		if h.Pool == berth.PoolEphemeral {
			ttl = ephemeral
		}
		if now.UnixNano()-h.LastSeenNano >= int64(ttl) {
			ids = append(ids, h.ID)
		}
	}
	return ids
}

// address returns the cached internal-API URL of an agent, if the snapshot has one.
func (s *scheduler) address(agentID string) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if i, ok := s.index[agentID]; ok && s.addrs[i] != "" {
		return s.addrs[i], true
	}
	return "", false
}

// canCheckpoint reports whether the snapshot says agentID's runtime checkpoints and
// restores guests (ISO-4).
func (s *scheduler) canCheckpoint(agentID string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	i, ok := s.index[agentID]
	return ok && s.hosts[i].CanRestore
}

// adjustPending adds delta MiB to the cached pending reservations of an agent.
func (s *scheduler) adjustPending(agentID string, delta int64) {
	s.mu.Lock()
	if i, ok := s.index[agentID]; ok {
		h := s.hosts[i]
		h.PendingMiB = max(h.PendingMiB+delta, 0)
		s.snap.Set(i, h)
	}
	s.mu.Unlock()
}

// recordOutcome feeds PLC-9: every failed create on a host, and a success on a host that had
// failures, go to the store, which quarantines or lifts it; the snapshot takes the result at
// once. A success on a host without failures costs nothing.
func (s *scheduler) recordOutcome(ctx context.Context, agentID string, failed bool, actor string) {
	s.mu.RLock()
	i, ok := s.index[agentID]
	clean := ok && s.failures[i] == 0
	s.mu.RUnlock()
	if !failed && clean {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	a, err := s.store.RecordCreateOutcome(cctx, agentID, failed, s.cfg.Quarantine, actor, s.cfg.Clock())
	if err != nil {
		s.cfg.Logger.Warn("could not record a create outcome", "agent", agentID, "failed", failed, "err", err)
		return
	}
	if a.QuarantinedUntil.After(s.cfg.Clock()) {
		s.cfg.Logger.Warn("agent quarantined", "agent", agentID, "failures", a.CreateFailures, "until", a.QuarantinedUntil)
	}
	s.observe(a)
}

// pick runs placement's Snapshot.Pick over the snapshot under the read lock (no I/O under
// it, PLC-8).
func (s *scheduler) pick(req placement.Request, excluded map[string]string) (placement.Decision, string, string) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	req.Exclude = req.Exclude[:0]
	for id := range excluded {
		if i, ok := s.index[id]; ok {
			req.Exclude = append(req.Exclude, i)
		}
	}
	start := time.Now()
	d := s.snap.Pick(req, s.cfg.Clock().UnixNano(),
		placement.Options{StaleAfterNano: int64(s.cfg.StaleAfter), Strategy: s.cfg.Strategy}, rand.Uint64())
	s.metrics.pickSeconds.Observe(time.Since(start).Seconds())
	if d.Index < 0 {
		return d, "", ""
	}
	return d, s.hosts[d.Index].ID, s.addrs[d.Index]
}

func (s *scheduler) releaser(res berth.Reservation) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := s.store.Release(ctx, res.ID); err != nil {
				// The TTL sweeper releases it later (LED-2); say so loudly.
				s.cfg.Logger.Error("release reservation failed; left to TTL", "reservation", res.ID, "err", err)
			}
			s.adjustPending(res.AgentID, -res.MiB)
		})
	}
}

// refusal builds the 503 for a create no host took: the code (PLC-4), the per-reason host
// counts (PLC-10, C21) and a Retry-After estimate (API-3). A create no host could ever take —
// a region (the one asked, "" for any) no host announces, a size above every host's total —
// is 400 invalid_request instead: retrying cannot help.
func (s *scheduler) refusal(ctx context.Context, d placement.Decision, sb berth.Sandbox, region string, agentErr error) error {
	code := d.Code()
	if announced, unknown := s.unknownRegion(region); unknown {
		// A region no host has ever announced is a typo or a region not built yet, not a
		// fleet that is full: a 503 would have clients retry for ever (found by a new user).
		return berth.Errorf(berth.EInvalidRequest, "region %q: no host has announced it (hosts announce %s)", region, announced)
	}
	if code == berth.ENoCapacity {
		if largest, never := s.neverFits(sb); never {
			// The "can never fit" kind of no (STYLE habit 3): retrying cannot help, so it is
			// not a 503 with a Retry-After that would be a lie.
			return berth.Errorf(berth.EInvalidRequest,
				"memory_mb %d can never be placed: it is charged more than the largest host's %d MiB", sb.MemoryMiB, largest)
		}
	}
	if code == berth.ENoCapacity && agentErr != nil && d.Rejected[placement.ReasonSaturated] > 0 &&
		d.Rejected[placement.ReasonSaturated]+d.Rejected[placement.ReasonInsufficientMemory] == d.Live &&
		berth.ErrorCode(agentErr) == berth.EHostStartsSaturated {
		code = berth.EHostStartsSaturated
	}
	e := &berth.Error{Code: code, Hosts: d.Hosts()}
	e.Message = refusalMessage(d)
	e.RetryAfter = s.retryAfter(ctx, code, admission.Charge(berth.AdmissionWorkingSet, sb.MemoryMiB, sb.Stateful))
	s.metrics.refusals.WithLabelValues(code).Inc()
	if code == berth.ENoHealthyAgents {
		// PLC-4: this pages a human.
		s.cfg.Logger.Error("no healthy agents", "sandbox", sb.ID, "hosts", e.Hosts)
	}
	return e
}

// unknownRegion reports whether region is asked ("" is any) while no host in the snapshot,
// whatever its state, announces it; it also returns the regions hosts announce, quoted and
// sorted, for the refusal's message. With no host known at all it reports false: that is
// no_healthy_agents. Placement re-read the store before a refusal (PLC-6), so a host of a
// new region that has heartbeated is in the snapshot.
func (s *scheduler) unknownRegion(region string) (string, bool) {
	if region == "" {
		return "", false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	seen := map[string]bool{}
	for _, h := range s.hosts {
		if h.Region == region {
			return "", false
		}
		seen[strconv.Quote(h.Region)] = true
	}
	if len(seen) == 0 {
		return "", false
	}
	return strings.Join(slices.Sorted(maps.Keys(seen)), ", "), true
}

// neverFits reports whether sb's charge exceeds the total memory of every known host (in
// that host's admission mode), so that no host could admit it even when empty. It also
// returns the largest host total in MiB.
func (s *scheduler) neverFits(sb berth.Sandbox) (int64, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	largest := int64(0)
	for i, h := range s.hosts {
		largest = max(largest, s.totals[i])
		if admission.Charge(h.Mode, sb.MemoryMiB, sb.Stateful) <= s.totals[i] {
			return largest, false
		}
	}
	return largest, len(s.hosts) > 0
}

func refusalMessage(d placement.Decision) string {
	msg := fmt.Sprintf("%d hosts", d.Total)
	if d.Total == 1 {
		msg = "1 host"
	}
	sep := ": "
	for r, n := range d.Rejected {
		if n > 0 {
			msg += fmt.Sprintf("%s%d %s", sep, n, placement.Reason(r))
			sep = ", "
		}
	}
	return msg
}

// retryAfter estimates when a retry of a create charged chargeMiB on a working-set host
// (admission.Charge) may succeed (API-3). Hosts that could take work are the fresh ones not
// draining, quarantined or closed. The answer is the first that applies of:
//   - no_healthy_agents: a fixed 30 s, it waits for a human or a new host;
//   - one heartbeat (at least 1 s) when this replica stopped a sandbox on such a host since
//     its last heartbeat: a delete frees room the next heartbeat shows, long before any TTL;
//   - reserveHint (one heartbeat plus one measurement) when such a host in working-set mode
//     will have chargeMiB free once the reserves it holds are measured (reserveRoom; issue 16,
//     goal 6): a fleet full only of unmeasured reserves gets its room back at the next
//     measurement, not when the 60 s ledger TTL runs out (ADM-5, LED-4);
//   - the earliest moment a running sandbox's TTL or an outstanding reservation expires on
//     such a host, plus one heartbeat, clamped into [1 s, 60 s]; 5 s when nothing expires.
//
// The store is read at most once a second per replica, by one refusal at a time: refusals
// that find the figures older than a second while another is reading them wait for that read
// and use it (single flight), so a refusal storm does not scan the store once per refusal.
func (s *scheduler) retryAfter(ctx context.Context, code string, chargeMiB int64) time.Duration {
	if code == berth.ENoHealthyAgents {
		return 30 * time.Second
	}
	if d, soon, ok := s.keptRetryAfter(); ok {
		return s.soonerByReserves(d, soon, chargeMiB)
	}
	select {
	case s.raSem <- struct{}{}:
	case <-ctx.Done():
		return 5 * time.Second // the caller is gone; nobody reads this answer
	}
	defer func() { <-s.raSem }()
	if d, soon, ok := s.keptRetryAfter(); ok {
		return s.soonerByReserves(d, soon, chargeMiB) // read while this refusal waited
	}
	now := s.cfg.Clock()
	s.raMu.Lock()
	ended := maps.Clone(s.ended)
	s.raMu.Unlock()

	open := map[string]placement.Host{}
	var freed bool // a host this replica stopped a sandbox on has not heartbeated since
	s.mu.RLock()
	cutoff := now.Add(-s.cfg.StaleAfter).UnixNano()
	for _, h := range s.hosts {
		if h.LastSeenNano >= cutoff && !h.Draining && !h.Quarantined && h.IntakeOpen {
			open[h.ID] = h
			if t, ok := ended[h.ID]; ok && t.UnixNano() >= h.LastSeenNano {
				freed = true
			}
		}
	}
	s.mu.RUnlock()
	if freed {
		// The room shows at that host's next heartbeat.
		return s.keepRetryAfter(now, max(s.cfg.HeartbeatInterval, time.Second), -1)
	}
	// The estimate is every refusal's for the next second: it runs on a context of its own,
	// which this refusal's client going away does not cut, and one whose reads failed is
	// answered but not kept (found by an attack: a gone client's 5 s fallback was served for a
	// second to refusals whose true estimate was 40 s).
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), estimateTimeout)
	defer cancel()
	d, soon, complete := s.estimate(ectx, now, open)
	if complete {
		s.keepRetryAfter(now, d, soon)
	}
	return s.soonerByReserves(d, soon, chargeMiB)
}

// estimateTimeout bounds the store reads of one Retry-After estimate.
const estimateTimeout = 5 * time.Second

// keptRetryAfter returns the estimate and reserves' room kept by keepRetryAfter, and true,
// while they are less than a second old.
func (s *scheduler) keptRetryAfter() (time.Duration, int64, bool) {
	now := s.cfg.Clock()
	s.raMu.Lock()
	defer s.raMu.Unlock()
	if now.Sub(s.raAt) < time.Second && !now.Before(s.raAt) {
		return s.raVal, s.raSoon, true
	}
	return 0, 0, false
}

// estimate reads the store for retryAfter: the TTL estimate (the earliest expiry on the open
// hosts plus one heartbeat, clamped into [1 s, 60 s]; 5 s when nothing there expires) and the
// room reserves give back soon (reserveRoom). It reads the first expiries on open hosts
// (firstExpiry), the ledger, the unmeasured guests (Store.UnmeasuredHeld) and the sandboxes
// those two name (Store.SandboxesByID) — never every running sandbox, which at 10,000 hosts
// is half a million rows; the open hosts' modes and admittable MiB are the snapshot's.
// complete is false when a read failed: the figures stand on what was read.
func (s *scheduler) estimate(ctx context.Context, now time.Time, open map[string]placement.Host) (d time.Duration, soon int64, complete bool) {
	earliest := time.Time{}
	consider := func(agent string, t time.Time) {
		if _, ok := open[agent]; ok && t.After(now) && (earliest.IsZero() || t.Before(earliest)) {
			earliest = t
		}
	}
	first, err1 := s.firstExpiry(ctx, now, open)
	consider(first.AgentID, first.At)
	rs, err2 := s.store.Reservations(ctx)
	for _, r := range rs {
		consider(r.AgentID, r.ExpiresAt)
	}
	unmeasured, err3 := s.store.UnmeasuredHeld(ctx)
	live, err4 := s.liveNamed(ctx, rs, unmeasured)
	soon = -1
	if err3 == nil && err4 == nil {
		soon = reserveRoom(open, unmeasured, live, rs)
	}
	d = 5 * time.Second
	if !earliest.IsZero() {
		d = min(max(earliest.Sub(now)+s.cfg.HeartbeatInterval, time.Second), 60*time.Second)
	}
	return d, soon, err1 == nil && err2 == nil && err3 == nil && err4 == nil
}

// Pages of firstExpiry: expiryPage running sandboxes a read, at most expiryPages reads.
const (
	expiryPage  = 256
	expiryPages = 40
)

// firstExpiry returns the running sandbox on an open host whose TTL ends first after now (the
// zero Expiry when none does), reading sandboxes in order of expiry a page at a time. Past
// expiryPages pages — over 10,000 sandboxes that expire sooner, all on closed hosts, as in an
// evacuation — it stops and answers the zero Expiry: the estimate stands on the ledger alone
// and is kept for its second like any other. (Answered as a failed read, it was not kept, and
// the refusals of a storm, which estimate one at a time, each read the 40 pages in turn: 50
// concurrent refusals made 2,000 reads, found by an attack.) The error is a failed read.
func (s *scheduler) firstExpiry(ctx context.Context, now time.Time, open map[string]placement.Host) (berth.Expiry, error) {
	from := berth.Expiry{At: now}
	for range expiryPages {
		page, err := s.store.ExpiringFirst(ctx, from, expiryPage)
		if err != nil {
			return berth.Expiry{}, err
		}
		for _, e := range page {
			if _, ok := open[e.AgentID]; ok && e.At.After(now) {
				return e, nil
			}
		}
		if len(page) < expiryPage {
			return berth.Expiry{}, nil
		}
		from = page[len(page)-1]
	}
	return berth.Expiry{}, nil
}

// liveNamed reads the sandboxes the reservations rs and the unmeasured guests name and
// returns those running or starting, by id (reserveRoom's live).
func (s *scheduler) liveNamed(ctx context.Context, rs []berth.Reservation, unmeasured map[string][]string) (map[string]berth.Sandbox, error) {
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.SandboxID)
	}
	for _, guests := range unmeasured {
		ids = append(ids, guests...)
	}
	sbs, err := s.store.SandboxesByID(ctx, ids)
	live := make(map[string]berth.Sandbox, len(sbs))
	for _, sb := range sbs {
		if sb.State == berth.SandboxRunning || sb.State == berth.SandboxStarting {
			live[sb.ID] = sb
		}
	}
	return live, err
}

// reserveHint is how long until a reserve held now has been measured and reported: one
// measurement (agents measure every min(1 s, heartbeat) by default, ADM-5) and the
// heartbeat after it, at least 1 s, at most 60 s.
func (s *scheduler) reserveHint() time.Duration {
	hb := max(s.cfg.HeartbeatInterval, time.Second)
	return min(hb+min(hb, time.Second), 60*time.Second)
}

// soonerByReserves returns d, or reserveHint when that is sooner and a create charged
// chargeMiB fits the room soon MiB that reserves give back (soon < 0: none).
func (s *scheduler) soonerByReserves(d time.Duration, soon, chargeMiB int64) time.Duration {
	if soon >= 0 && chargeMiB <= soon {
		return min(d, s.reserveHint())
	}
	return d
}

// reserveRoom returns the most MiB any open working-set host will have free once the reserves
// it holds now are replaced by measurements (ADM-5, LED-4) — counting each measurement as
// 0 MiB, the most it could give back — or -1 when no open working-set host holds a reserve.
// A host's reserves are its ledger reservations for stateless sandboxes (netted at its next
// heartbeat, then charged as the agent's own reserve until measured) and the reserves of the
// stateless guests its last heartbeat listed unmeasured (unmeasured: sandbox ids by agent id).
// Stateful guests and committed hosts are charged in full whatever a measurement says, so
// they give nothing back. open maps the open hosts by id; live maps the running and starting
// sandboxes by id; a reservation or guest not in it counts as nothing.
func reserveRoom(open map[string]placement.Host, unmeasured map[string][]string, live map[string]berth.Sandbox, rs []berth.Reservation) int64 {
	pending := map[string]int64{} // ledger MiB per agent, as Pick subtracts it
	back := map[string]int64{}    // of which stateless creates' reserves
	for _, r := range rs {
		pending[r.AgentID] += r.MiB
		if sb, ok := live[r.SandboxID]; ok && !sb.Stateful {
			back[r.AgentID] += r.MiB
		}
	}
	best := int64(-1)
	for id, h := range open {
		if h.Mode != berth.AdmissionWorkingSet {
			continue
		}
		held := back[id]
		for _, g := range unmeasured[id] {
			if sb, ok := live[g]; ok && !sb.Stateful {
				held += admission.Reserve(sb.MemoryMiB)
			}
		}
		if held > 0 {
			best = max(best, h.AdmittableMiB-pending[id]+held)
		}
	}
	return best
}

// keepRetryAfter caches the estimate d and the reserves' room soon (reserveRoom) made at now
// for a second and returns d.
func (s *scheduler) keepRetryAfter(now time.Time, d time.Duration, soon int64) time.Duration {
	s.raMu.Lock()
	s.raAt, s.raVal, s.raSoon = now, d, soon
	s.raMu.Unlock()
	return d
}

// noteEnded records that this replica stopped a sandbox on agentID now, and drops the cached
// Retry-After estimate, so refusals until the agent's next heartbeat say "one heartbeat".
func (s *scheduler) noteEnded(agentID string) {
	s.raMu.Lock()
	s.ended[agentID] = s.cfg.Clock()
	s.raAt = time.Time{}
	s.raMu.Unlock()
}
