// Package placement chooses the host for a create (PLC-1…4, PLC-10): it filters the hosts of
// an in-memory snapshot, scores the survivors and returns the best one together with why every
// other host was rejected. It is pure arithmetic over memory: no I/O, no locks, no clock
// (PLC-8). Reservations are taken by the caller (server's scheduler) after Pick, atomically
// with the fits check in the store (LED-1).
package placement

import (
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
type Host struct {
	ID            string
	LastSeenNano  int64
	Draining      bool
	Quarantined   bool
	IntakeOpen    bool
	Preemptible   bool
	StreamRestore bool
	Region        string
	Pool          string // "" means stateful (POOL-1)
	Mode          string // admission mode of the agent (ADM-1)
	AdmittableMiB int64  // the agent's published verdict (ADM-6)
	PendingMiB    int64  // reservations the agent has not netted yet (LED-4)
	CPUTotal      float64
	CPUUsed       float64
}

// Request is what Pick places. MemoryMiB is the configured size. Exclude lists indices into
// the hosts slice that already refused this request (PLC-7); they count as ReasonSaturated.
type Request struct {
	MemoryMiB  int64
	Stateful   bool
	Region     string
	Pool       string
	VolumeHost string // agent id a volume pins the sandbox to (POOL-2); "" for none
	Exclude    []int
}

// Options are the scheduler's knobs. StaleAfterNano is the staleness cutoff in nanoseconds
// (default 30 s, PLC-1); Strategy is Spread or Pack.
type Options struct {
	StaleAfterNano int64
	Strategy       string
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
// The loop is the scheduler's hot path (docs/PERFORMANCE.md): filters that depend on the
// request alone are decided once, and the rare rejections are classified out of line.
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
	constrained := req.Region != "" || req.Pool != "" || needStatefulPool || len(req.Exclude) > 0
	chargeFull := max(req.MemoryMiB, 0)
	chargeReserve := admission.Charge(berth.AdmissionWorkingSet, req.MemoryMiB, req.Stateful)

	var best float64
	ties := uint64(0)
	rng := seed
	for i := range hosts {
		h := &hosts[i]
		if h.LastSeenNano < cutoff {
			d.Rejected[ReasonStale]++
			continue
		}
		if h.Draining || h.Quarantined || !h.IntakeOpen || constrained {
			if r := ineligible(h, i, &req, needStatefulPool); r < numReasons {
				d.Rejected[r]++
				continue
			}
		}
		// charge = admission.Charge(h.Mode, req.MemoryMiB, req.Stateful), branch-free: a fleet
		// may mix modes host by host (ADM-1), and a switch on the string mispredicts on most
		// hosts of such a fleet. The mode is compared as three overlapping 4-byte words, which
		// for an 11-byte mode cover every byte of "working-set" and for a 4-byte mode are all
		// of "none" (TestModeChargeIsAdmissionCharge pins the equivalence).
		charge := chargeFull
		if m := h.Mode; len(m) >= 4 {
			n := len(m)
			w0 := le32(m[0:4])
			w1 := le32(m[n-4 : n])
			j := 4 & -b2i(n >= 8) // w2 = m[4:8], or m[0:4] when m is too short to be working-set
			w2 := le32(m[j : j+4])
			ws := b2i(n == 11) & b2i(w0 == wsWord0) & b2i(w1 == wsWord1) & b2i(w2 == wsWord2)
			none := b2i(n == 4) & b2i(w0 == noneWord)
			if ws != 0 {
				charge = chargeReserve
			}
			if none != 0 {
				charge = 0
			}
		}
		if !admission.Fits(h.AdmittableMiB, h.PendingMiB, charge) {
			d.Rejected[ReasonInsufficientMemory]++
			continue
		}
		left := float64(h.AdmittableMiB - max(h.PendingMiB, 0) - charge) // ≥ 0 once it fits
		var score float64
		if pack {
			score = -left
		} else {
			score = 0.6*(h.CPUTotal-h.CPUUsed) + 0.3*left/1024 + streamBonus[b2i(h.StreamRestore)]
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

// DefaultStaleAfterNano is the default staleness cutoff: 30 s against a 10 s heartbeat (PLC-1).
const DefaultStaleAfterNano int64 = 30e9

// streamBonus is the spread score's +5 for stream-restore hosts (PLC-2), indexed by b2i so
// the hot loop has no branch on it.
var streamBonus = [2]float64{0, 5}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Little-endian 4-byte words of the admission mode names (ADM-1) that Pick compares.
const (
	wsWord0  = 'w' | 'o'<<8 | 'r'<<16 | 'k'<<24 // working-set[0:4]
	wsWord1  = '-' | 's'<<8 | 'e'<<16 | 't'<<24 // working-set[7:11]
	wsWord2  = 'i' | 'n'<<8 | 'g'<<16 | '-'<<24 // working-set[4:8]
	noneWord = 'n' | 'o'<<8 | 'n'<<16 | 'e'<<24 // none[0:4]
)

// le32 reads the first four bytes of s (len(s) ≥ 4) as a little-endian word.
func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

// ineligible returns the first filter after staleness that host i fails for req, in the
// order of the Reason constants, or numReasons when it passes them all. It is kept out of
// Pick's loop, which calls it only for the few hosts that need it.
//
//go:noinline
func ineligible(h *Host, i int, req *Request, needStatefulPool bool) Reason {
	switch {
	case h.Draining:
		return ReasonDraining
	case h.Quarantined:
		return ReasonQuarantined
	case !h.IntakeOpen:
		return ReasonPressure
	case req.Region != "" && h.Region != req.Region:
		return ReasonRegionMismatch
	case !poolAllows(h, req, needStatefulPool):
		return ReasonPoolMismatch
	case excluded(req.Exclude, i):
		return ReasonSaturated
	}
	return numReasons
}

func poolAllows(h *Host, req *Request, needStatefulPool bool) bool {
	pool := h.Pool
	if pool == "" {
		pool = berth.PoolStateful
	}
	if req.Pool != "" && req.Pool != pool {
		return false
	}
	if needStatefulPool && (pool != berth.PoolStateful || h.Preemptible) {
		return false
	}
	return req.VolumeHost == "" || req.VolumeHost == h.ID
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
