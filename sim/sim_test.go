package sim

import (
	"testing"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestSIM1_SeedArithmetic: a 32 GiB host with 4 GiB guests and 4 GiB headroom admits 7 under
// committed admission; with idle guests touching ~300 MB, working-set admission admits many
// times more with zero OOM events — through the real admission and placement code.
func TestSIM1_SeedArithmetic(t *testing.T) {
	base := Config{Hosts: 1, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, GuestMiB: 4 << 10, TouchMiB: 300, Creates: 200, Seed: 1}
	committed := base
	committed.Mode = berth.AdmissionCommitted
	rc := Run(committed)
	if rc.Admitted != 7 || rc.OOMEvents != 0 {
		t.Fatalf("committed: %+v, want 7 admitted", rc)
	}
	ws := base
	ws.Mode = berth.AdmissionWorkingSet
	rw := Run(ws)
	if rw.Admitted < 5*rc.Admitted || rw.OOMEvents != 0 {
		t.Fatalf("working-set: %+v, want many times committed's 7 with zero OOM events", rw)
	}
	t.Logf("one 32 GiB host, 4 GiB guests touching 300 MiB: committed admits %d, working-set %d", rc.Admitted, rw.Admitted)
	if again := Run(ws); !cmp.Equal(again, rw) {
		t.Fatalf("same seed, different result: %+v vs %+v", again, rw)
	}
}

// TestSIM1_PerReplicaLedgersOverAdmit: in the same 4-replica burst against room for 4, the
// shared ledger admits exactly 4 and per-replica ledgers admit 16 (LED-1's failure mode).
func TestSIM1_PerReplicaLedgersOverAdmit(t *testing.T) {
	shared, per := Burst(BurstConfig{Replicas: 4, AdmittableMiB: 4 * 512, Mode: berth.AdmissionCommitted, GuestMiB: 512, Creates: 40})
	if shared != 4 || per != 16 {
		t.Fatalf("shared ledger admitted %d, per-replica %d; want 4 and 16", shared, per)
	}
}
