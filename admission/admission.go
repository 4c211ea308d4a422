// Package admission holds Berth's one memory-admission formula (ADM-6): what a create is
// charged (ADM-4), what a host can still admit (ADM-2, ADM-3) and whether a request fits
// (ADM-7). The agent's local gate, its published heartbeat verdict, the scheduler and the
// simulator all call these functions; no other package does this arithmetic.
//
// Every quantity is MiB as int64. The functions are pure and allocation-free.
package admission

import (
	"math"
	"math/bits"

	"github.com/berth-dev/berth"
)

// ReserveFloorMiB is the floor of the default working-set reserve (ADM-4): a quarter of the
// configured size, but never less than 512 MiB (and never more than the configured size).
const ReserveFloorMiB int64 = 512

// ReserveFraction is the share of the configured size the default working-set reserve
// charges (ADM-4): a quarter, rounded up to whole MiB.
const ReserveFraction = 0.25

// ValidMode reports whether mode is one of the ADM-1 modes.
func ValidMode(mode string) bool {
	switch mode {
	case berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone:
		return true
	}
	return false
}

// ReservePolicy is the working-set reserve's two knobs (ADM-4): a create of configured MiB
// is charged min(configured, max(⌈configured × Fraction⌉, FloorMiB)) until a measurement sees
// it (ADM-3, ADM-5). Fraction is a share of the configured size, in (0, 1]; FloorMiB is MiB,
// ≥ 0 (0: no floor). The ceiling is exact for every int64 size and every Fraction.
//
// The zero value is the ADM-4 default, ¼ and 512 MiB: agents and servers never set a policy,
// so they charge exactly what ADM-4 says. Any other value is taken as given (both fields), so
// {Fraction: 0.1} means 10 % with no floor. Only `berth sim` sets one, to compare reserves
// side by side (SIM-1); the arithmetic is the same function either way (ADM-6).
//
// A policy that fails Validate (a fraction outside (0, 1] or NaN, a negative floor) charges
// the full configured size, the charge that cannot lose the bet.
type ReservePolicy struct {
	Fraction float64 // share of the configured size, (0, 1]
	FloorMiB int64   // MiB, ≥ 0
}

// DefaultReservePolicy returns the ADM-4 reserve with its knobs spelled out: ¼ and 512 MiB.
// It charges exactly what the zero ReservePolicy charges.
func DefaultReservePolicy() ReservePolicy {
	return ReservePolicy{Fraction: ReserveFraction, FloorMiB: ReserveFloorMiB}
}

// IsDefault reports whether p is the zero value, the ADM-4 default.
func (p ReservePolicy) IsDefault() bool { return p == ReservePolicy{} }

// Validate reports whether p's knobs are usable (ADM-4): the zero value, or a fraction in
// (0, 1] and a floor ≥ 0. Errors are invalid_request.
func (p ReservePolicy) Validate() error {
	if p.IsDefault() {
		return nil
	}
	if !(p.Fraction > 0 && p.Fraction <= 1) { // also refuses NaN
		return berth.Errorf(berth.EInvalidRequest, "reserve fraction %v must lie in (0, 1]", p.Fraction)
	}
	if p.FloorMiB < 0 {
		return berth.Errorf(berth.EInvalidRequest, "reserve floor %d MiB must be ≥ 0", p.FloorMiB)
	}
	return nil
}

// Reserve returns the working-set reserve of a guest configured with configuredMiB under p:
// min(configured, max(⌈configured × fraction⌉, floor)) (ADM-4). Non-positive sizes reserve 0.
// This is the one implementation of the reserve (ADM-6); the package-level Reserve is the
// zero policy's.
func (p ReservePolicy) Reserve(configuredMiB int64) int64 {
	if configuredMiB <= 0 {
		return 0
	}
	f, floor := p.Fraction, p.FloorMiB
	if f == 0 && floor == 0 {
		f, floor = ReserveFraction, ReserveFloorMiB
	}
	if !(f > 0 && f <= 1) || floor < 0 {
		return configuredMiB // invalid knobs: the full size, which cannot lose the bet
	}
	return min(configuredMiB, max(ceilMul(configuredMiB, f), floor))
}

// ceilMul returns ⌈n × f⌉ exactly for n > 0 and f in (0, 1], without overflow: f is
// m × 2^e with an integer m < 2^53, so n × f is the 117-bit product n × m shifted right by
// −e, rounded up. For f = ¼ this is ⌈n/4⌉ for every int64 n, as ADM-4 was always computed.
func ceilMul(n int64, f float64) int64 {
	b := math.Float64bits(f)
	m := b & (1<<52 - 1)
	exp := int(b >> 52 & 0x7ff)
	if exp == 0 {
		exp = 1 // subnormal: no implicit bit
	} else {
		m |= 1 << 52
	}
	shift := uint(1075 - exp) // f = m × 2^(exp−1075); f ≤ 1 makes the shift ≥ 52
	hi, lo := bits.Mul64(uint64(n), m)
	if shift >= 128 {
		return 1 // 0 < n × f < 1
	}
	var q, rest uint64
	if shift >= 64 {
		q = hi >> (shift - 64)
		rest = hi&(1<<(shift-64)-1) | lo
	} else {
		q = hi<<(64-shift) | lo>>shift
		rest = lo & (1<<shift - 1)
	}
	if rest != 0 {
		q++
	}
	return int64(q) // ≤ n since f ≤ 1
}

// Reserve returns the default working-set reserve of a guest configured with configuredMiB:
// min(configured, max(⌈configured/4⌉, 512)) (ADM-4). Non-positive sizes reserve 0.
func Reserve(configuredMiB int64) int64 {
	return ReservePolicy{}.Reserve(configuredMiB)
}

// Charge returns what a create of configuredMiB is charged on a host in the given mode
// (ADM-4) with the default reserve: the full size in committed mode or for stateful work,
// the reserve otherwise, and nothing in none mode. An unknown mode is treated as committed,
// the mode that cannot lose.
func Charge(mode string, configuredMiB int64, stateful bool) int64 {
	return ReservePolicy{}.Charge(mode, configuredMiB, stateful)
}

// Charge is the package-level Charge with p's reserve for stateless work on working-set
// hosts (ADM-4).
func (p ReservePolicy) Charge(mode string, configuredMiB int64, stateful bool) int64 {
	switch {
	case mode == berth.AdmissionNone:
		return 0
	case mode == berth.AdmissionWorkingSet && !stateful:
		return p.Reserve(configuredMiB)
	}
	return max(configuredMiB, 0)
}

// Guest is one sandbox as admission sees it. ResidentMiB is the latest working-set
// measurement; Measured is false until a measurement saw the guest (or its reserve's TTL
// ran out, ADM-5), and while false the guest is charged its reserve.
type Guest struct {
	ConfiguredMiB int64
	ResidentMiB   int64
	Stateful      bool
	Measured      bool
}

// Host is the input of Admittable: the host's mode and budget and the guests it holds,
// including creates admitted but not started yet (the local reservations of ADM-2).
type Host struct {
	Mode        string
	TotalMiB    int64
	HeadroomMiB int64
	// IntakeOpen false (pressure gate closed, ADM-8, or draining) makes admittable 0.
	IntakeOpen bool
	Guests     []Guest
	// Reserve is the working-set reserve charged for unmeasured stateless guests (ADM-3,
	// ADM-4); the zero value is ADM-4's default, which every agent uses.
	Reserve ReservePolicy
}

// GuestCharge returns what one live guest costs on a host in mode with the default reserve:
// committed charges the configured size; working-set charges stateful guests in full,
// measured ones their resident size (clamped into [0, total], C07) and unmeasured ones
// their reserve (ADM-3); none charges nothing.
func GuestCharge(mode string, g Guest, totalMiB int64) int64 {
	return ReservePolicy{}.GuestCharge(mode, g, totalMiB)
}

// GuestCharge is the package-level GuestCharge with p's reserve for unmeasured stateless
// guests on working-set hosts (ADM-3, ADM-4).
func (p ReservePolicy) GuestCharge(mode string, g Guest, totalMiB int64) int64 {
	switch mode {
	case berth.AdmissionNone:
		return 0
	case berth.AdmissionWorkingSet:
		if g.Stateful {
			return max(g.ConfiguredMiB, 0)
		}
		if !g.Measured {
			return p.Reserve(g.ConfiguredMiB)
		}
		r, _ := ClampResident(g.ResidentMiB, totalMiB)
		return r
	default:
		return max(g.ConfiguredMiB, 0)
	}
}

// Admittable returns the MiB the host can still admit (ADM-2, ADM-3), clamped into
// [0, total]: it never publishes a negative or wrapped-around figure (C07).
//
//	committed:   total − headroom − Σ configured(all guests)
//	working-set: total − headroom − Σ resident(measured stateless) − Σ configured(stateful)
//	             − Σ reserve(unmeasured stateless), reserve by h.Reserve
//	none:        total − headroom
func Admittable(h Host) int64 {
	if !h.IntakeOpen || h.TotalMiB <= 0 {
		return 0
	}
	left := h.TotalMiB - max(h.HeadroomMiB, 0)
	for _, g := range h.Guests {
		if left <= 0 {
			return 0
		}
		left -= h.Reserve.GuestCharge(h.Mode, g, h.TotalMiB)
	}
	return min(max(left, 0), h.TotalMiB)
}

// Fits reports whether a request charged chargeMiB fits a host that published admittableMiB
// and has pendingMiB of reservations it has not netted yet (ADM-7):
// admittable − pending ≥ charge. Negative pending and charge count as 0. The comparison is
// exact for every int64 input: a negative or huge figure never wraps around into a fit (C07).
func Fits(admittableMiB, pendingMiB, chargeMiB int64) bool {
	pending := max(pendingMiB, 0)
	// admittable < pending means admittable − pending < 0 ≤ charge; otherwise the difference
	// lies in [0, MaxInt64] and cannot overflow.
	return admittableMiB >= pending && admittableMiB-pending >= max(chargeMiB, 0)
}

// ClampResident clamps a resident reading into [0, totalMiB] (C07). It reports whether the
// reading was out of range, so the caller can count a measurement error.
func ClampResident(residentMiB, totalMiB int64) (int64, bool) {
	switch {
	case residentMiB < 0:
		return 0, true
	case totalMiB > 0 && residentMiB > totalMiB:
		return totalMiB, true
	}
	return residentMiB, false
}
