package evacuate

import "math"

// Workload describes a kind of sandbox for `berth plan` (PLAN-1). Memory in MiB, unit length
// (how long one unit of work runs) and notice window in seconds, interruption rate per host
// per hour, link rate in MiB/s, AuthoritativeOutside true when the authoritative copy of the
// work lives outside the guest (a CI job's repository, a request's input).
type Workload struct {
	MemoryMiB            float64
	UnitSeconds          float64
	AuthoritativeOutside bool
	InterruptionsPerHour float64
	NoticeSeconds        float64
	LinkMiBps            float64
	GuestsPerHost        int
	CordonSeconds        float64 // how long a cordon takes to reach every replica (PLC-5)
}

// SpotAnswer is PLAN-1's seven answers.
type SpotAnswer struct {
	// ExpectedLossPerHour is interruption rate × work in flight × redo cost, in guest-seconds
	// of work redone per host per hour (half a unit is in flight on average).
	ExpectedLossPerHour float64 `json:"expected_loss_guest_seconds_per_hour"`
	// PerGuestMiBps and PerHostMiBps are the rates needed to move guests out inside the window.
	PerGuestMiBps float64 `json:"per_guest_mibps"`
	PerHostMiBps  float64 `json:"per_host_mibps"`
	// GuestsThatFit is how many of the host's guests the link moves inside the window.
	GuestsThatFit int `json:"guests_that_fit"`
	// CordonBeatsNotice is whether placement stops before the notice ends.
	CordonBeatsNotice bool `json:"cordon_beats_notice"`
	// Pool is where the workload belongs: ephemeral (spot) or stateful.
	Pool   string `json:"pool"`
	Reason string `json:"reason"`
}

// Spot answers PLAN-1 for a workload.
func Spot(w Workload) SpotAnswer {
	a := SpotAnswer{}
	if w.NoticeSeconds > 0 {
		a.PerGuestMiBps = w.MemoryMiB / w.NoticeSeconds
		a.PerHostMiBps = a.PerGuestMiBps * float64(max(w.GuestsPerHost, 0))
	} else {
		a.PerGuestMiBps, a.PerHostMiBps = math.Inf(1), math.Inf(1)
	}
	if w.MemoryMiB > 0 {
		a.GuestsThatFit = guestsThatFit(w.LinkMiBps*w.NoticeSeconds/w.MemoryMiB, max(w.GuestsPerHost, 0))
	}
	redo := w.UnitSeconds / 2 // on average half a unit of work is lost per interrupted guest
	a.ExpectedLossPerHour = w.InterruptionsPerHour * float64(max(w.GuestsPerHost, 0)) * redo
	a.CordonBeatsNotice = w.CordonSeconds < w.NoticeSeconds
	switch {
	case w.AuthoritativeOutside:
		a.Pool, a.Reason = "ephemeral", "the authoritative copy lives outside the guest: a lost guest is rebuilt, spot capacity fits"
	case a.GuestsThatFit >= w.GuestsPerHost && w.GuestsPerHost > 0:
		a.Pool, a.Reason = "ephemeral", "every guest can be snapshotted out inside the notice window"
	default:
		a.Pool, a.Reason = "stateful", "irreproducible guests that cannot all leave inside the notice window: keep them off spot"
	}
	return a
}

// guestsThatFit is ⌊moves⌋ guests, at most guests and at least 0, compared as floats first: a
// fast link or a tiny guest makes moves larger than an int holds (or +Inf), and converting
// that to int gave -9223372036854775808. NaN moves none.
func guestsThatFit(moves float64, guests int) int {
	switch {
	case moves >= float64(guests):
		return guests
	case moves >= 1:
		return int(moves)
	}
	return 0
}
