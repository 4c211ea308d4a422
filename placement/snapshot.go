package placement

import (
	"math"
	"slices"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
)

// Snapshot is a host array with a coarse index over it, so that Pick need not visit every
// host (PLC-8, docs/PERFORMANCE.md "Placement: BenchmarkPick"). The index cuts the hosts, in
// slice order, into blocks of 64 and keeps for each block what an unconstrained request's
// verdict needs without its hosts: the counts of the request-independent rejections
// (draining, quarantined, intake closed, nothing admittable), the free memory (admittable −
// pending, MiB) of its eligible hosts in ascending order, its hosts' heartbeat times in
// ascending order, the oldest of those and the smallest positive free memory (so that the
// common case reads the orders not at all), and the largest spread score any of its hosts
// could reach. Pick's answers are the package Pick's (PLC-1, PLC-2, PLC-10).
//
// A Snapshot is not safe for concurrent use: Pick only reads, so many Picks may run at once,
// but Set needs the caller's exclusive lock. Set costs O(64) whatever the fleet size;
// NewSnapshot costs O(n·log 64).
type Snapshot struct {
	hosts []Host
	shift uint // blocks hold 1<<shift hosts; tests use smaller blocks
	// Per host, the admission mode as an index into Pick's charges (modeCommitted…).
	modes []uint8
	// Per host, the largest spread score it could reach (−Inf when a static filter rejects it).
	bnd    []float64
	blocks []block
	// Each block's segment [lo, hi) of seen holds its hosts by LastSeenNano ascending; the
	// first nElig entries of its segment of elig hold its eligible hosts by free ascending.
	seen []seenEnt
	elig []freeEnt
}

// blockShift is the default block size, 64 hosts: small enough that a block whose bound
// beats the best so far costs little to scan, large enough that the per-block summary is
// cheap beside its hosts (docs/PERFORMANCE.md).
const blockShift = 6

type block struct {
	// bound is the largest spread score any eligible host of the block could reach (the
	// score with a zero charge): −Inf when none is eligible, NaN when one's score is NaN.
	bound float64
	nElig int32
	// minSeen is the oldest heartbeat of the block, the first entry of its heartbeat order:
	// Pick reads that order only when minSeen is older than the cutoff.
	minSeen int64
	// minFree is the smallest positive free memory of an eligible host, the entry after the
	// full ones in the free-memory order (MaxInt64 for none): Pick reads that order only when
	// a charge exceeds it. Pick's common case thus reads nothing of a block but this struct.
	minFree int64
	// nZero counts the eligible hosts with no free memory (full hosts): the first entries of
	// the free-memory order. nZeroCharged counts those whose mode charges something for a
	// positive size (all but mode none): too small for any positive size.
	nZero, nZeroCharged int32
	// counts are the block's hosts per request-independent reason, first filter first:
	// draining, quarantined, intake closed, nothing admittable. Stale hosts are included;
	// Pick takes them out.
	counts [4]int32
}

// seenEnt is a host in a block's heartbeat order, with what Pick needs to take a stale host
// back out of the block's counts.
type seenEnt struct {
	seen int64
	free int64 // as in freeEnt, for an eligible host
	i    int32 // index into hosts
	slot int8  // staticSlot
	mode uint8
}

type freeEnt struct {
	free int64 // admittable − max(pending, 0), ≥ 0
	mode uint8
}

// Admission modes as indices into Pick's per-request charges.
const (
	modeCommitted  = iota // committed and any unknown mode: the full size (ADM-4)
	modeWorkingSet        // the working-set reserve for stateless work
	modeNone              // no charge
)

func modeOf(m string) uint8 {
	switch m {
	case berth.AdmissionWorkingSet:
		return modeWorkingSet
	case berth.AdmissionNone:
		return modeNone
	}
	return modeCommitted
}

// staticSlot returns where a host that is rejected whatever the request (short of
// staleness) is counted in block.counts, or −1 for an eligible host. The order is Pick's
// filter order.
func staticSlot(h *Host) int {
	switch {
	case h.Draining:
		return 0
	case h.Quarantined:
		return 1
	case !h.IntakeOpen:
		return 2
	case !admission.Fits(h.AdmittableMiB, h.PendingMiB, 0): // no charge fits: charges are ≥ 0
		return 3
	}
	return -1
}

// slotReason maps a block.counts slot to its Reason.
var slotReason = [4]Reason{ReasonDraining, ReasonQuarantined, ReasonPressure, ReasonInsufficientMemory}

// NewSnapshot indexes hosts for Pick. The Snapshot takes the slice: change a host only
// through Set afterwards (reading hosts, or Hosts(), stays fine).
func NewSnapshot(hosts []Host) *Snapshot {
	return newSnapshot(hosts, blockShift)
}

func newSnapshot(hosts []Host, shift uint) *Snapshot {
	n := len(hosts)
	s := &Snapshot{
		hosts:  hosts,
		shift:  shift,
		modes:  make([]uint8, n),
		bnd:    make([]float64, n),
		blocks: make([]block, (n+1<<shift-1)>>shift),
		seen:   make([]seenEnt, n),
		elig:   make([]freeEnt, n),
	}
	for k := range s.blocks {
		s.rebuild(k)
	}
	return s
}

// Hosts returns the indexed hosts; Decision.Index is an index into it. Do not modify it:
// use Set.
func (s *Snapshot) Hosts() []Host { return s.hosts }

// Set replaces host i (0 ≤ i < len(Hosts())) and brings the index up to date: one pass over
// i's block and an insertion into its two sorted segments, O(64).
func (s *Snapshot) Set(i int, h Host) {
	k := i >> s.shift
	lo := k << s.shift
	hi := min(lo+1<<s.shift, len(s.hosts))
	old := &s.hosts[i]
	oldElig := staticSlot(old) < 0
	oldEnt := freeEnt{old.AdmittableMiB - max(old.PendingMiB, 0), s.modes[i]}
	s.hosts[i] = h
	e := entry(&h, i)
	s.modes[i] = e.mode

	// The heartbeat order: move i's entry to its new place.
	seen := s.seen[lo:hi]
	p := 0
	for seen[p].i != int32(i) {
		p++
	}
	seen[p] = e
	for ; p > 0 && seen[p-1].seen > seen[p].seen; p-- {
		seen[p-1], seen[p] = seen[p], seen[p-1]
	}
	for ; p+1 < len(seen) && seen[p+1].seen < seen[p].seen; p++ {
		seen[p+1], seen[p] = seen[p], seen[p+1]
	}

	// The free-memory order of the eligible hosts: entries are values, so any entry equal to
	// the old host's stands for it.
	n := int(s.blocks[k].nElig)
	elig := s.elig[lo : lo+n]
	newEnt := freeEnt{e.free, e.mode}
	switch {
	case oldElig:
		p = 0
		for elig[p] != oldEnt {
			p++
		}
		if e.slot >= 0 {
			copy(elig[p:], elig[p+1:])
			break
		}
		elig[p] = newEnt
		for ; p > 0 && elig[p-1].free > elig[p].free; p-- {
			elig[p-1], elig[p] = elig[p], elig[p-1]
		}
		for ; p+1 < len(elig) && elig[p+1].free < elig[p].free; p++ {
			elig[p+1], elig[p] = elig[p], elig[p+1]
		}
	case e.slot < 0:
		elig = s.elig[lo : lo+n+1]
		p = n
		elig[p] = newEnt
		for ; p > 0 && elig[p-1].free > elig[p].free; p-- {
			elig[p-1], elig[p] = elig[p], elig[p-1]
		}
	}
	s.blocks[k] = s.summary(lo, hi)
}

// entry returns host i's heartbeat-order entry.
func entry(h *Host, i int) seenEnt {
	e := seenEnt{seen: h.LastSeenNano, i: int32(i), slot: int8(staticSlot(h)), mode: modeOf(h.Mode)}
	if e.slot < 0 {
		e.free = h.AdmittableMiB - max(h.PendingMiB, 0) // ≥ 0: a zero charge fits
	}
	return e
}

// summary sets the spread bounds of hosts [lo, hi) and returns their block summary.
func (s *Snapshot) summary(lo, hi int) block {
	b := block{bound: math.Inf(-1), minSeen: math.MaxInt64, minFree: math.MaxInt64}
	nan := false
	for i := lo; i < hi; i++ {
		h := &s.hosts[i]
		b.minSeen = min(b.minSeen, h.LastSeenNano)
		if slot := staticSlot(h); slot >= 0 {
			b.counts[slot]++
			s.bnd[i] = math.Inf(-1)
			continue
		}
		b.nElig++
		free := h.AdmittableMiB - max(h.PendingMiB, 0)
		if free == 0 {
			b.nZero++
			if s.modes[i] != modeNone {
				b.nZeroCharged++
			}
		} else {
			b.minFree = min(b.minFree, free)
		}
		// The spread score with a zero charge: every charge is ≥ 0 and rounding is monotone, so
		// no real score of this host exceeds it.
		bound := spreadScore(h, float64(free))
		s.bnd[i] = bound
		switch {
		case bound != bound:
			nan = true
		case bound > b.bound:
			b.bound = bound
		}
	}
	if nan {
		b.bound = math.NaN() // never below the best: the block is always searched
	}
	return b
}

// rebuild recomputes block k's summary and sorted segments from its hosts.
func (s *Snapshot) rebuild(k int) {
	lo := k << s.shift
	hi := min(lo+1<<s.shift, len(s.hosts))
	n := 0
	for i := lo; i < hi; i++ {
		e := entry(&s.hosts[i], i)
		s.modes[i] = e.mode
		s.seen[i] = e
		if e.slot < 0 {
			s.elig[lo+n] = freeEnt{e.free, e.mode}
			n++
		}
	}
	slices.SortFunc(s.seen[lo:hi], func(x, y seenEnt) int {
		switch {
		case x.seen < y.seen:
			return -1
		case x.seen > y.seen:
			return 1
		}
		return 0
	})
	slices.SortFunc(s.elig[lo:lo+n], func(x, y freeEnt) int {
		switch {
		case x.free < y.free:
			return -1
		case x.free > y.free:
			return 1
		}
		return 0
	})
	s.blocks[k] = s.summary(lo, hi)
}

// Pick is the package's Pick over the snapshot's hosts: the same Decision for the same
// arguments and seed (TestSnapshotPick_MatchesPick), allocation-free, and read-only on s.
//
// A request that names a region, pool, volume, restore or exclusions, or is stateful, takes
// the package's Pick (every host is visited). Any other request is decided block by block.
// The counts come from the block's summary: its static rejections, its stale hosts (the
// prefix of its heartbeat order older than the cutoff, taken back out of those counts), and
// its eligible hosts too small for their charge (the prefix of its free-memory order below
// the largest charge). Only a block whose bound reaches the best score so far is searched for
// the best host, in slice order, skipping each host whose own bound is below the best, as the
// package's Pick does; a host skipped either way can neither win nor tie, so the tie-break
// random stream is unchanged.
func (s *Snapshot) Pick(req Request, nowNano int64, opt Options, seed uint64) Decision {
	if req.Region != "" || req.Pool != "" || req.Stateful || req.VolumeHost != "" || req.Restore || len(req.Exclude) > 0 {
		return Pick(s.hosts, req, nowNano, opt, seed)
	}
	d := Decision{Index: -1, Total: len(s.hosts)}
	staleAfter := opt.StaleAfterNano
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfterNano
	}
	st := pickState{cutoff: nowNano - staleAfter, pack: opt.Strategy == Pack, best: math.Inf(-1), rng: seed}
	st.charges[modeCommitted] = opt.Reserve.Charge(berth.AdmissionCommitted, req.MemoryMiB, false)
	st.charges[modeWorkingSet] = opt.Reserve.Charge(berth.AdmissionWorkingSet, req.MemoryMiB, false)
	st.charges[modeNone] = opt.Reserve.Charge(berth.AdmissionNone, req.MemoryMiB, false)
	st.chargeMax = max(st.charges[0], st.charges[1], st.charges[2])
	// A full host is too small exactly when its mode charges something: true of committed and
	// working-set for any positive size (ADM-4), which settle relies on to skip them.
	st.zeroSmall = st.charges[modeCommitted] > 0 && st.charges[modeWorkingSet] > 0
	for k := range s.blocks {
		if s.settle(k, &st) && !(s.bound(k, &st) < st.best) {
			s.search(k, &st, &d)
		}
	}
	for slot, n := range st.counts {
		d.Rejected[slotReason[slot]] += n
	}
	d.Rejected[ReasonStale] += st.stale
	d.Rejected[ReasonInsufficientMemory] += st.small
	d.Live = d.Total - d.Rejected[ReasonStale]
	return d
}

// pickState is Snapshot.Pick's request (cutoff, charges per mode), its running counts and its
// search state (the best score so far and the tie-break's reservoir).
type pickState struct {
	cutoff    int64
	charges   [3]int64
	chargeMax int64
	zeroSmall bool
	pack      bool
	counts    [4]int // by block.counts slot
	stale     int
	small     int // eligible and live, too small for its charge
	best      float64
	ties, rng uint64
}

// settle adds block k's rejections to st's counts and reports whether some eligible host of
// the block fits its charge (stale hosts included: they only make the answer "maybe").
func (s *Snapshot) settle(k int, st *pickState) bool {
	b := &s.blocks[k]
	lo := k << s.shift
	for slot, n := range b.counts {
		st.counts[slot] += int(n)
	}
	// Eligible hosts too small for their own charge: the full ones (unless the size is zero or
	// their mode charges nothing), then those in the free-memory order up to the largest
	// charge. Every host past that prefix fits whatever its mode.
	elig := s.elig[lo : lo+int(b.nElig)]
	small := 0
	switch {
	case st.chargeMax <= 0: // every host fits
	case st.zeroSmall:
		small = int(b.nZeroCharged)
		if b.minFree < st.chargeMax {
			for j := int(b.nZero); j < len(elig) && elig[j].free < st.chargeMax; j++ {
				small += b2i(elig[j].free < st.charges[elig[j].mode])
			}
		}
	default:
		for j := 0; j < len(elig) && elig[j].free < st.chargeMax; j++ {
			small += b2i(elig[j].free < st.charges[elig[j].mode])
		}
	}
	st.small += small
	// Stale hosts count as stale only (the first filter).
	if b.minSeen < st.cutoff {
		for _, e := range s.seen[lo:min(lo+1<<s.shift, len(s.hosts))] {
			if e.seen >= st.cutoff {
				break
			}
			st.stale++
			if e.slot >= 0 {
				st.counts[e.slot]--
			} else if e.free < st.charges[e.mode] {
				st.small--
			}
		}
	}
	return small < len(elig)
}

// bound returns an upper bound of the score of any host of block k that fits: the block's
// spread bound, or for pack −(free − chargeMax) at the smallest free memory that fits (pack
// scores −(free − charge) and no charge exceeds chargeMax).
func (s *Snapshot) bound(k int, st *pickState) float64 {
	b := &s.blocks[k]
	if !st.pack {
		return b.bound
	}
	lo := k << s.shift
	for _, e := range s.elig[lo : lo+int(b.nElig)] {
		if e.free >= st.charges[e.mode] {
			return -float64(e.free - st.chargeMax)
		}
	}
	return math.Inf(1) // not reached after settle said a host fits; +Inf searches the block
}

// search is the package Pick's scoring for an unconstrained request over block k, in slice
// order: each live, eligible host that fits and whose bound reaches the best so far is
// scored, and equal scores are sampled. It counts nothing: settle did.
func (s *Snapshot) search(k int, st *pickState, d *Decision) {
	lo := k << s.shift
	best, ties, rng := st.best, st.ties, st.rng
	bnd := s.bnd[lo:min(lo+1<<s.shift, len(s.hosts))]
	for j := range bnd {
		if !st.pack && bnd[j] < best {
			continue // cannot win nor tie
		}
		i := lo + j
		h := &s.hosts[i]
		if h.LastSeenNano < st.cutoff || staticSlot(h) >= 0 {
			continue
		}
		free := h.AdmittableMiB - max(h.PendingMiB, 0) // ≥ 0: a zero charge fits
		charge := st.charges[s.modes[i]]
		if free < charge {
			continue
		}
		score := -float64(free - charge)
		if !st.pack {
			score = spreadScore(h, float64(free-charge))
		}
		switch {
		case d.Index < 0 || score > best:
			d.Index, best, ties, d.ChargeMiB = i, score, 1, charge
		case score == best:
			ties++ // reservoir sampling, as in Pick (PLC-2)
			rng += 0x9e3779b97f4a7c15
			if splitmix64(rng)%ties == 0 {
				d.Index, d.ChargeMiB = i, charge
			}
		}
	}
	st.best, st.ties, st.rng = best, ties, rng
}
