// Package sim is `berth sim` (SIM-1): a deterministic discrete-event simulation of a fleet
// that calls the very admission, placement and evacuation functions the server and agents
// run (ADM-6), never a second copy of the arithmetic.
//
// The engine (Scenario.Run) keeps a virtual clock over an event heap; hosts whose agents
// heartbeat their admission verdict (admission.Admittable over their books) every 10 s;
// scheduler replicas that pick (placement.Pick) over snapshots refreshed on their own period;
// a reservation ledger, shared or per replica, checked with admission.Fits and netted by
// heartbeats; sandboxes whose resident memory follows a Workload; the pressure gate
// (admission.PressureGate) and the agent's eviction policy; kernel OOM kills; host losses with
// and without a preemption notice, evacuated by evacuate.Triage; and creates retried with the
// SDK's backoff (berth.Backoff) or the server's Retry-After. Compare runs several policies
// side by side; Run, Burst and Replay are fixed configurations of the engine.
package sim

import (
	"time"

	"github.com/berth-dev/berth/placement"
)

// Config is the seed arithmetic's run: Hosts identical hosts of HostMiB with HeadroomMiB
// kept free, Creates creates of GuestMiB each (one every 11 s per host, so each is judged on
// measured guests), guests that touch TouchMiB once started and live forever. Sizes are MiB.
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

// Result counts what happened: creates admitted, refusals by code (no retries), kernel OOM
// kills (guests' resident memory would exceed a host), ADM-9 evictions, and admitted per host.
type Result struct {
	Admitted  int
	Refused   map[string]int
	OOMEvents int
	Evictions int
	PerHost   float64
}

// Run simulates cfg on the engine with the pressure gate on and no retries; the same cfg
// gives the same Result (SIM-1's seed arithmetic).
func Run(cfg Config) Result {
	s := Scenario{Hosts: cfg.Hosts, HostMiB: cfg.HostMiB, HeadroomMiB: cfg.HeadroomMiB, Seed: cfg.Seed}
	spacing := (11 * time.Second) / time.Duration(max(cfg.Hosts, 1))
	w := NewIdle(IdleModel{Creates: cfg.Creates, Interval: max(spacing, time.Microsecond), MemoryMiB: cfg.GuestMiB,
		TouchMiB: cfg.TouchMiB, Seed: cfg.Seed})
	rep := s.Run(Policy{Mode: cfg.Mode, Strategy: placement.Spread, Gate: true}, w)
	res := Result{Admitted: rep.Admitted, Refused: rep.Refusals, OOMEvents: rep.OOMKills, Evictions: rep.Evictions}
	if cfg.Hosts > 0 {
		res.PerHost = float64(res.Admitted) / float64(cfg.Hosts)
	}
	return res
}
