// Package placement chooses the host for a create (PLC-1…4, PLC-10): it filters the hosts of
// an in-memory snapshot, scores the survivors and returns the best one together with why every
// other host was rejected. It is pure arithmetic over memory: no I/O, no locks, no clock
// (PLC-8). Reservations are taken by the caller (server's scheduler) after Pick, atomically
// with the fits check in the store (LED-1). A Snapshot keeps an index over the hosts so that
// its Pick, with the same answers, need not visit every host (docs/PERFORMANCE.md).
package placement

import (
	"math"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
)

// Reason is why a host was rejected for a request (PLC-10).
type Reason uint8

// Rejection reasons, in the order the filters run: a host is counted under the first filter
// it fails.
const (
	ReasonStale              Reason = iota // no heartbeat within the staleness cutoff (PLC-1, C10)
	ReasonDraining                         // status draining or cordoned (AGT-5)
	ReasonQuarantined                      // too many consecutive failed creates (PLC-9)
	ReasonPressure                         // intake closed: pressure gate (ADM-8)
	ReasonRegionMismatch                   // not in the requested region
	ReasonPoolMismatch                     // not an allowed pool, volume pinned elsewhere, preemptible for stateful (POOL-2/3)
	ReasonCannotRestore                    // its runtime cannot restore a checkpoint image, for a resume or a move (ISO-4, PAUSE-1)
	ReasonSaturated                        // refused this request already (starts saturated, lost race, unreachable) (PLC-7)
	ReasonInsufficientMemory               // live and eligible but the charge does not fit (ADM-7)
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonStale:              "stale",
	ReasonDraining:           "draining",
	ReasonQuarantined:        "quarantined",
	ReasonPressure:           "pressure",
	ReasonRegionMismatch:     "region_mismatch",
	ReasonPoolMismatch:       "pool_mismatch",
	ReasonCannotRestore:      "cannot_restore",
	ReasonSaturated:          "saturated",
	ReasonInsufficientMemory: "insufficient_memory",
}

// String returns the stable name used in refusal bodies and metrics labels.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Strategies (PLC-2).
const (
	Spread = "spread" // default: most free CPU and memory first
	Pack   = "pack"   // fullest host that fits first, so empty hosts can be turned off
)

// Host is one agent in the scheduler's snapshot. Memory is MiB, CPU is cores, LastSeenNano
// is the server's clock (unix nanoseconds) when the latest heartbeat arrived.
//
// The fields Pick reads for every host come first, so they share one or two cache lines;
// the strings only a constrained request looks at come last. Build a Host with field names.
type Host struct {
	LastSeenNano  int64
	AdmittableMiB int64 // the agent's published verdict (ADM-6)
	PendingMiB    int64 // reservations the agent has not netted yet (LED-4)
	CPUTotal      float64
	CPUUsed       float64
	Mode          string // admission mode of the agent (ADM-1)
	Draining      bool
	Quarantined   bool
	IntakeOpen    bool
	Preemptible   bool
	// CanRestore: its runtime restores checkpoint images (ISO-4). Only such hosts take a
	// resume or a moved guest, and they score PLC-2's restore bonus.
	CanRestore bool
	ID         string
	Region     string
	Pool       string // "" means stateful (POOL-1)
}

// Request is what Pick places. MemoryMiB is the configured size. Exclude lists indices into
// the hosts slice that already refused this request (PLC-7); they count as ReasonSaturated.
type Request struct {
	MemoryMiB  int64
	Stateful   bool
	Region     string
	Pool       string
	VolumeHost string // agent id a volume pins the sandbox to (POOL-2); "" for none
	// Restore is true for a resume or a snapshot move: only hosts that can restore a
	// checkpoint image qualify (PAUSE-1, SPOT-3).
	Restore bool
	Exclude []int
}

// Options are the scheduler's knobs. StaleAfterNano is the staleness cutoff in nanoseconds
// (default 30 s, PLC-1); Strategy is Spread or Pack.
type Options struct {
	StaleAfterNano int64
	Strategy       string
	// Reserve is the working-set reserve (ADM-4) of the agents in the snapshot: Pick charges a
	// stateless create on a working-set host Reserve.Charge. The zero value is ADM-4's
	// default, the reserve every real agent runs (they have no knob); only the simulator sets
	// another (SIM-1). It is fleet-wide rather than a Host field so the hosts the loop streams
	// through stay 112 bytes: a 16-byte Host field (128 bytes) slowed the bytes-bound
	// linear-scan floor by 7–33 % (docs/PERFORMANCE.md).
	Reserve admission.ReservePolicy
}

// Decision is Pick's answer: the chosen host (Index −1 when none), the charge it was
// judged with, and the count of hosts per rejection reason. Live counts hosts with a fresh
// heartbeat: zero live hosts is no_healthy_agents, otherwise no fit is no_capacity (PLC-4).
type Decision struct {
	Index     int
	ChargeMiB int64
	Total     int
	Live      int
	Rejected  [numReasons]int
}

// Hosts returns the per-reason host counts for a refusal body (C21): {"total":N, reason:n…},
// omitting reasons with no host.
func (d *Decision) Hosts() map[string]int {
	m := map[string]int{"total": d.Total}
	for r, n := range d.Rejected {
		if n > 0 {
			m[Reason(r).String()] = n
		}
	}
	return m
}

// Code returns the refusal code for a decision that chose no host (PLC-4).
func (d *Decision) Code() string {
	if d.Live == 0 {
		return berth.ENoHealthyAgents
	}
	return berth.ENoCapacity
}

// Pick filters hosts, scores the survivors and returns the best (PLC-1, PLC-2, PLC-10).
// nowNano is the server's clock in unix nanoseconds; seed randomises tie-breaking so that
// replicas with the same snapshot do not herd onto one host (PLC-2): pass a different value
// per call (e.g. from a per-replica PRNG or a counter). Pick allocates nothing.
//
// The loop is the scheduler's hot path (docs/PERFORMANCE.md). It makes no calls, decides
// the request-only filters once, classifies the rare rejections behind one branch, and skips
// a fitting host without reading its mode when an upper bound of its score cannot reach the
// best so far. None of this changes the answer: a plain filter-then-score loop returns the
// same Decision for the same seed (placement's TestPick_MatchesReference).
func Pick(hosts []Host, req Request, nowNano int64, opt Options, seed uint64) Decision {
	d := Decision{Index: -1, Total: len(hosts)}
	staleAfter := opt.StaleAfterNano
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfterNano
	}
	cutoff := nowNano - staleAfter
	pack := opt.Strategy == Pack
	needStatefulPool := req.Stateful || req.VolumeHost != ""
	// A request that names no region, pool, volume or exclusion and is stateless passes the
	// region, pool and saturated filters on every host.
	slow := b2i(req.Region != "" || req.Pool != "" || needStatefulPool || req.Restore || len(req.Exclude) > 0)
	chargeFull := max(req.MemoryMiB, 0) // the largest charge any mode makes (ADM-4)
	reserve := opt.Reserve
	// A host's charge depends only on its mode: ask admission once per mode, not per host.
	chargeWS := reserve.Charge(berth.AdmissionWorkingSet, req.MemoryMiB, req.Stateful)
	chargeNone := reserve.Charge(berth.AdmissionNone, req.MemoryMiB, req.Stateful)
	chargeOther := reserve.Charge(berth.AdmissionCommitted, req.MemoryMiB, req.Stateful) // committed and unknown modes

	best := math.Inf(-1) // until the first fit; −∞ lets the bound below skip nothing
	ties := uint64(0)
	rng := seed
	for i := range hosts {
		h := &hosts[i]
		if h.LastSeenNano < cutoff {
			d.Rejected[ReasonStale]++
			continue
		}
		// One branch instead of four: few hosts are draining, quarantined or closed.
		if b2i(h.Draining)|b2i(h.Quarantined)|b2i(!h.IntakeOpen)|slow != 0 {
			r := numReasons
			switch {
			case h.Draining:
				r = ReasonDraining
			case h.Quarantined:
				r = ReasonQuarantined
			case !h.IntakeOpen:
				r = ReasonPressure
			case req.Region != "" && !eq(h.Region, req.Region):
				r = ReasonRegionMismatch
			case req.Pool != "" && !eq(req.Pool, poolOf(h)),
				needStatefulPool && (h.Preemptible || poolOf(h) != berth.PoolStateful), // POOL-2/3
				req.VolumeHost != "" && !eq(req.VolumeHost, h.ID):                      // POOL-2
				r = ReasonPoolMismatch
			case req.Restore && !h.CanRestore:
				r = ReasonCannotRestore
			case excluded(req.Exclude, i):
				r = ReasonSaturated
			}
			if r < numReasons {
				d.Rejected[r]++
				continue
			}
		}
		if !admission.Fits(h.AdmittableMiB, h.PendingMiB, 0) { // nothing fits: charges are ≥ 0
			d.Rejected[ReasonInsufficientMemory]++
			continue
		}
		free := h.AdmittableMiB - max(h.PendingMiB, 0) // ≥ 0 and exact once zero fits (ADM-7)
		// Every charge is at most the full size, so a host with free ≥ chargeFull fits
		// whatever its mode, and its score charged nothing (spread) or the full size (pack)
		// bounds its real score from above (rounding is monotone). When even that bound is
		// below the best score so far the host can neither win nor tie: skip it without
		// reading its mode. Most hosts of a large fleet leave here.
		if free >= chargeFull {
			var bound float64
			if pack {
				bound = -float64(free - chargeFull)
			} else {
				bound = spreadScore(h, float64(free))
			}
			if bound < best {
				continue
			}
		}
		charge := chargeOther
		switch h.Mode {
		case berth.AdmissionWorkingSet:
			charge = chargeWS
		case berth.AdmissionNone:
			charge = chargeNone
		}
		if !admission.Fits(h.AdmittableMiB, h.PendingMiB, charge) {
			d.Rejected[ReasonInsufficientMemory]++
			continue
		}
		left := float64(free - charge)
		var score float64
		if pack {
			score = -left
		} else {
			score = spreadScore(h, left)
		}
		switch {
		case d.Index < 0 || score > best:
			d.Index, best, ties, d.ChargeMiB = i, score, 1, charge
		case score == best:
			// Reservoir sampling over equal scores: each tied host wins with probability
			// 1/ties, so identical hosts share a burst instead of herding (PLC-2).
			// SplitMix64 rather than a bare xorshift of the seed: a counter or a shifted
			// value as seed must not leave some tied hosts never chosen.
			ties++
			rng += 0x9e3779b97f4a7c15
			if splitmix64(rng)%ties == 0 {
				d.Index, d.ChargeMiB = i, charge
			}
		}
	}
	d.Live = d.Total - d.Rejected[ReasonStale]
	return d
}

// spreadScore is PLC-2's spread score of h with left MiB free after the charge:
// 0.6·freeCPU + 0.3·freeGiB (+5 for stream-restore). perGiB·left is bit-for-bit 0.3·left/1024,
// since scaling by 2⁻¹⁰ commutes with rounding. It is monotone in left, which the score
// bounds of Pick and Snapshot rest on. Inlined: Pick's loop stays call-free.
func spreadScore(h *Host, left float64) float64 {
	return 0.6*(h.CPUTotal-h.CPUUsed) + perGiB*left + restoreBonus[b2i(h.CanRestore)]
}

// DefaultStaleAfterNano is the default staleness cutoff: 30 s against a 10 s heartbeat (PLC-1).
const DefaultStaleAfterNano int64 = 30e9

// perGiB is the spread score's weight of one free MiB: 0.3 per GiB (PLC-2).
const perGiB = 0.3 / 1024

// restoreBonus is the spread score's +5 for hosts that restore checkpoint images (PLC-2's
// stream-restore bonus; here restore is whole-image, and a guest there can be moved by
// snapshot under a notice), indexed by b2i so the hot loop has no branch on it.
var restoreBonus = [2]float64{0, 5}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// poolOf returns the host's pool; an agent that reports none is stateful (POOL-1).
func poolOf(h *Host) string {
	if h.Pool == "" {
		return berth.PoolStateful
	}
	return h.Pool
}

// eq is a == b without the call to runtime.memequal that == makes for two variable strings,
// so Pick's loop stays call-free and keeps its state in registers; it is for the short
// region, pool and agent-id strings.
func eq(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// splitmix64 is SplitMix64's output function: it spreads every input bit over the result.
func splitmix64(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func excluded(ex []int, i int) bool {
	for _, e := range ex {
		if e == i {
			return true
		}
	}
	return false
}
