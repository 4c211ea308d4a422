// Package admission holds Berth's one memory-admission formula (ADM-6): what a create is
// charged (ADM-4), what a host can still admit (ADM-2, ADM-3) and whether a request fits
// (ADM-7). The agent's local gate, its published heartbeat verdict, the scheduler and the
// simulator all call these functions; no other package does this arithmetic.
//
// Every quantity is MiB as int64. The functions are pure and allocation-free.
package admission

import "github.com/berth-dev/berth"

// ReserveFloorMiB is the floor of the working-set reserve (ADM-4): a quarter of the configured
// size, but never less than 512 MiB (and never more than the configured size).
const ReserveFloorMiB int64 = 512

// ValidMode reports whether mode is one of the ADM-1 modes.
func ValidMode(mode string) bool {
	switch mode {
	case berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone:
		return true
	}
	return false
}

// Reserve returns the working-set reserve of a guest configured with configuredMiB:
// min(configured, max(⌈configured/4⌉, 512)) (ADM-4). Non-positive sizes reserve 0.
func Reserve(configuredMiB int64) int64 {
	if configuredMiB <= 0 {
		return 0
	}
	q := configuredMiB/4 + min(configuredMiB%4, 1) // ⌈configured/4⌉ without overflow
	return min(configuredMiB, max(q, ReserveFloorMiB))
}

// Charge returns what a create of configuredMiB is charged on a host in the given mode
// (ADM-4): the full size in committed mode or for stateful work, the reserve otherwise, and
// nothing in none mode. An unknown mode is treated as committed, the mode that cannot lose.
func Charge(mode string, configuredMiB int64, stateful bool) int64 {
	configuredMiB = max(configuredMiB, 0)
	switch mode {
	case berth.AdmissionNone:
		return 0
	case berth.AdmissionWorkingSet:
		if stateful {
			return configuredMiB
		}
		return Reserve(configuredMiB)
	default:
		return configuredMiB
	}
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
}

// GuestCharge returns what one live guest costs on a host in mode: committed charges the
// configured size; working-set charges stateful guests in full, measured ones their resident
// size (clamped into [0, total], C07) and unmeasured ones
// their reserve (ADM-3); none charges nothing.
func GuestCharge(mode string, g Guest, totalMiB int64) int64 {
	switch mode {
	case berth.AdmissionNone:
		return 0
	case berth.AdmissionWorkingSet:
		if g.Stateful {
			return max(g.ConfiguredMiB, 0)
		}
		if !g.Measured {
			return Reserve(g.ConfiguredMiB)
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
//	             − Σ reserve(unmeasured stateless)
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
		left -= GuestCharge(h.Mode, g, h.TotalMiB)
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
