package sim

import (
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
)

// BurstConfig is a burst of creates, all at one instant, spread round-robin over replicas
// whose snapshots of one host are equally stale (its last heartbeat's admittable), to compare
// a shared reservation ledger with per-replica ledgers (LED-1). Sizes are MiB.
type BurstConfig struct {
	Replicas      int
	AdmittableMiB int64 // the host's published admittable
	Mode          string
	GuestMiB      int64
	Creates       int
}

// BurstReports runs the burst once per ledger, side by side in one comparison, with the
// agents' local gate off so that what each ledger grants is what starts (TrustScheduler).
// The per-replica report's OverGrants counts the grants the shared ledger refused in that
// same run.
func BurstReports(cfg BurstConfig) []Report {
	s := Scenario{Hosts: 1, HostMiB: cfg.AdmittableMiB, Replicas: cfg.Replicas, RefreshEvery: time.Hour, Tail: time.Second}
	mode := cfg.Mode
	if mode == "" {
		mode = berth.AdmissionCommitted
	}
	touch := admission.Charge(mode, cfg.GuestMiB, false)
	ps := []Policy{
		{Name: "shared", Mode: mode, TrustScheduler: true},
		{Name: "per-replica", Mode: mode, PerReplicaLedger: true, TrustScheduler: true},
	}
	return Compare(s, ps, func() Workload {
		return NewIdle(IdleModel{Creates: cfg.Creates, MemoryMiB: cfg.GuestMiB, TouchMiB: touch})
	})
}

// Burst returns how many creates a shared ledger admits and how many per-replica ledgers
// admit, through placement.Pick and admission.Fits in the engine. With per-replica ledgers
// each replica subtracts only its own reservations, so together they admit up to Replicas
// times the room: the failure the shared ledger exists to prevent.
func Burst(cfg BurstConfig) (shared, perReplica int) {
	r := BurstReports(cfg)
	return r[0].Admitted, r[1].Admitted
}
