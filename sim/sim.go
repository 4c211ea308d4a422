// Package sim is the start of `berth sim` (SIM-1): a deterministic fleet simulation that calls
// the very admission and placement functions the server and agents run (ADM-6), never a
// second copy of the arithmetic. This first slice places a stream of identical creates on a
// fleet whose guests touch a fixed share of their memory, measuring them between creates,
// and counts admissions, refusals and would-be OOM events (resident above a host's total).
package sim

import (
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// Config is one simulated run. Sizes are MiB.
type Config struct {
	Hosts       int
	HostMiB     int64
	HeadroomMiB int64
	Mode        string // ADM-1
	GuestMiB    int64  // configured size of every guest
	TouchMiB    int64  // what an idle guest really touches once measured
	Creates     int
	Seed        uint64
}

// Result counts what happened. OOMEvents counts hosts whose guests' resident memory would
// exceed the host's total (a kernel OOM on a real host).
type Result struct {
	Admitted  int
	Refused   map[string]int
	OOMEvents int
	PerHost   float64
}

type simHost struct {
	guests []admission.Guest
}

// Run simulates cfg; the same cfg gives the same Result.
func Run(cfg Config) Result {
	hosts := make([]simHost, cfg.Hosts)
	snap := make([]placement.Host, cfg.Hosts)
	res := Result{Refused: map[string]int{}}
	rng := cfg.Seed | 1
	refresh := func(i int) { // only the host that changed is re-judged: O(hosts) per create
		snap[i] = placement.Host{
			ID: "h", LastSeenNano: 1, IntakeOpen: true, Mode: cfg.Mode, CPUTotal: 1,
			AdmittableMiB: admission.Admittable(admission.Host{Mode: cfg.Mode, TotalMiB: cfg.HostMiB,
				HeadroomMiB: cfg.HeadroomMiB, IntakeOpen: true, Guests: hosts[i].guests}),
		}
	}
	for i := range hosts {
		refresh(i)
	}
	for c := 0; c < cfg.Creates; c++ {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		d := placement.Pick(snap, placement.Request{MemoryMiB: cfg.GuestMiB}, 1, placement.Options{}, rng)
		if d.Index < 0 {
			res.Refused[d.Code()]++
			continue
		}
		res.Admitted++
		h := &hosts[d.Index]
		h.guests = append(h.guests, admission.Guest{ConfiguredMiB: cfg.GuestMiB})
		// The next measurement sees every guest at its touched size (ADM-5 releases reserves).
		for j := range h.guests {
			h.guests[j].ResidentMiB, h.guests[j].Measured = min(cfg.TouchMiB, cfg.GuestMiB), true
		}
		refresh(d.Index)
	}
	for _, h := range hosts {
		var resident int64
		for _, g := range h.guests {
			resident += g.ResidentMiB
		}
		if resident > cfg.HostMiB {
			res.OOMEvents++
		}
	}
	if cfg.Hosts > 0 {
		res.PerHost = float64(res.Admitted) / float64(cfg.Hosts)
	}
	return res
}
