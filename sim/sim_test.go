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

// TestSIM1_AlibabaTraces replays the Alibaba pod list with the measured utilisation series
// under each admission mode and logs the density gain of working-set over committed and the
// OOM events it costs (figures for docs/PERFORMANCE.md). It asserts what must hold whatever
// the figures: working-set admits at least as much as committed, committed never loses the
// bet, and a replay is deterministic.
func TestSIM1_AlibabaTraces(t *testing.T) {
	pods, _, err := LoadPods("../../shared/data/alibaba-2023-openb-pod-list.csv")
	if err != nil {
		t.Skipf("the Alibaba traces are not beside this checkout (../shared/data): %v", err)
	}
	util, err := LoadUtil("../../shared/data/alibaba-2026-genai-pod-memory-util.csv.gz")
	if err != nil {
		t.Skipf("no utilisation series: %v", err)
	}
	cfg := TraceConfig{Hosts: 2, HostMiB: 256 << 10, HeadroomMiB: 8 << 10, TickSeconds: 3600}
	results := map[string]TraceResult{}
	for _, mode := range []string{berth.AdmissionCommitted, berth.AdmissionWorkingSet} {
		c := cfg
		c.Mode = mode
		results[mode] = Replay(c, pods, util)
	}
	com, ws := results[berth.AdmissionCommitted], results[berth.AdmissionWorkingSet]
	t.Logf("Alibaba openb pods (%d) on %d × 256 GiB hosts: committed admitted %d (%.1f live/host), working-set %d (%.1f live/host, %+.0f %%), OOM host-hours %d vs %d",
		len(pods), cfg.Hosts, com.Admitted, com.MeanPerHost, ws.Admitted, ws.MeanPerHost, 100*(ws.MeanPerHost/com.MeanPerHost-1), com.OOMEvents, ws.OOMEvents)
	if ws.Admitted < com.Admitted || com.OOMEvents != 0 {
		t.Fatalf("committed %+v, working-set %+v", com, ws)
	}
	c := cfg
	c.Mode = berth.AdmissionWorkingSet
	if again := Replay(c, pods, util); again != ws {
		t.Fatalf("same input, different replay: %+v vs %+v", again, ws)
	}
}
