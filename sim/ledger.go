package sim

import (
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// BurstConfig is a burst of creates spread round-robin over replicas that all see the same
// stale snapshot of one host (its last heartbeat's admittable), to compare a shared
// reservation ledger with per-replica ledgers (LED-1).
type BurstConfig struct {
	Replicas      int
	AdmittableMiB int64 // the host's published admittable
	Mode          string
	GuestMiB      int64
	Creates       int
}

// Burst returns how many creates a shared ledger admits and how many per-replica ledgers
// admit, through placement.Pick and admission.Fits. With per-replica ledgers each replica
// only subtracts its own reservations, so together they admit up to Replicas times the room:
// the quarter-amplitude failure the shared ledger exists to prevent.
func Burst(cfg BurstConfig) (shared, perReplica int) {
	run := func(sharedLedger bool) int {
		pending := make([]int64, max(cfg.Replicas, 1)) // per replica; index 0 is the shared one
		admitted := 0
		for c := 0; c < cfg.Creates; c++ {
			r := c % max(cfg.Replicas, 1)
			slot := r
			if sharedLedger {
				slot = 0
			}
			host := []placement.Host{{ID: "h", LastSeenNano: 1, IntakeOpen: true, Mode: cfg.Mode, CPUTotal: 1,
				AdmittableMiB: cfg.AdmittableMiB, PendingMiB: pending[slot]}}
			d := placement.Pick(host, placement.Request{MemoryMiB: cfg.GuestMiB}, 1, placement.Options{}, uint64(c)+1)
			if d.Index < 0 {
				continue
			}
			// The ledger's own check, atomic in the store (LED-1): the same Fits.
			if !admission.Fits(cfg.AdmittableMiB, pending[slot], d.ChargeMiB) {
				continue
			}
			pending[slot] += d.ChargeMiB
			admitted++
		}
		return admitted
	}
	return run(true), run(false)
}
