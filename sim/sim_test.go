package sim

import (
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestSIM1_SeedArithmetic: out of the engine, a 32 GiB host with 4 GiB guests and 4 GiB
// headroom admits 7 under committed admission; with idle guests touching ~300 MB,
// working-set admission admits many times more with zero OOM events — through the real
// admission and placement code, with the pressure gate and ADM-9 eviction on.
func TestSIM1_SeedArithmetic(t *testing.T) {
	base := Config{Hosts: 1, HostMiB: 32 << 10, HeadroomMiB: 4 << 10, GuestMiB: 4 << 10, TouchMiB: 300, Creates: 200, Seed: 1}
	committed := base
	committed.Mode = berth.AdmissionCommitted
	rc := Run(committed)
	if rc.Admitted != 7 || rc.OOMEvents != 0 || rc.Evictions != 0 || rc.Refused[berth.ENoCapacity] != 193 {
		t.Fatalf("committed: %+v, want 7 admitted and 193 no_capacity", rc)
	}
	ws := base
	ws.Mode = berth.AdmissionWorkingSet
	rw := Run(ws)
	if rw.Admitted < 5*rc.Admitted || rw.OOMEvents != 0 || rw.Evictions != 0 {
		t.Fatalf("working-set: %+v, want many times committed's 7 with zero OOM events", rw)
	}
	t.Logf("one 32 GiB host, 4 GiB guests touching 300 MiB: committed admits %d, working-set %d", rc.Admitted, rw.Admitted)
	if again := Run(ws); !cmp.Equal(again, rw) {
		t.Fatalf("same seed, different result: %+v vs %+v", again, rw)
	}
}

// TestSIM1_PerReplicaLedgersOverAdmit: in one comparison of the same 4-replica burst against
// room for 4, the shared ledger admits exactly 4 and per-replica ledgers admit 16 (LED-1's
// failure mode); the per-replica run itself counts the 12 grants the shared ledger refused,
// and with the agents trusting the scheduler those become kernel OOM kills.
func TestSIM1_PerReplicaLedgersOverAdmit(t *testing.T) {
	shared, per := Burst(BurstConfig{Replicas: 4, AdmittableMiB: 4 * 512, Mode: berth.AdmissionCommitted, GuestMiB: 512, Creates: 40})
	if shared != 4 || per != 16 {
		t.Fatalf("shared ledger admitted %d, per-replica %d; want 4 and 16", shared, per)
	}
	r := BurstReports(BurstConfig{Replicas: 4, AdmittableMiB: 4 * 512, Mode: berth.AdmissionCommitted, GuestMiB: 512, Creates: 40})
	if r[0].OverGrants != 0 || r[0].OOMKills != 0 || r[1].OverGrants != 12 || r[1].OOMKills == 0 {
		t.Fatalf("shared %+v\nper-replica %+v\nwant 0 and 12 over-grants, OOM kills only per-replica", r[0], r[1])
	}
}

// TestSIM1_PerReplicaLedgersInAFleet: on a fleet with 4 replicas whose caches are stale, the
// same run of per-replica ledgers grants reservations the shared ledger would refuse, and the
// agents' local gate (AGT-2) has to turn them away; the shared ledger never over-grants.
func TestSIM1_PerReplicaLedgersInAFleet(t *testing.T) {
	s := Scenario{Hosts: 8, HostMiB: 16 << 10, HeadroomMiB: 2 << 10, Replicas: 4, RefreshEvery: 10 * time.Second, Seed: 3}
	w := func() Workload {
		return NewIdle(IdleModel{Creates: 400, RatePerSec: 50, MemoryMiB: 2 << 10, TouchMiB: 2 << 10})
	}
	r := Compare(s, []Policy{
		{Name: "shared", Mode: berth.AdmissionCommitted, Gate: true},
		{Name: "per-replica", Mode: berth.AdmissionCommitted, Gate: true, PerReplicaLedger: true},
	}, w)
	if r[0].OverGrants != 0 || r[1].OverGrants == 0 || r[1].AgentRefusals <= r[0].AgentRefusals {
		t.Fatalf("shared %+v\nper-replica %+v", r[0], r[1])
	}
	if r[0].OOMKills != 0 || r[1].OOMKills != 0 {
		t.Fatalf("committed admission with the local gate on lost the bet: %d, %d OOM kills", r[0].OOMKills, r[1].OOMKills)
	}
}

// TestSIM1_AlibabaTraces replays the Alibaba pod list with the measured utilisation series
// under committed and working-set admission (gate on and off) and logs the density gain of
// working-set over committed and the OOM kills and evictions it costs (docs/PERFORMANCE.md).
// It asserts what must hold whatever the figures: working-set is at least as dense,
// committed never loses the bet, and a replay is deterministic. It reads the original CSVs
// where they are beside this checkout, else the copy built into the binary.
func TestSIM1_AlibabaTraces(t *testing.T) {
	pods, _, err := LoadPods("../../shared/data/alibaba-2023-openb-pod-list.csv")
	var util [][]float64
	if err == nil {
		util, err = LoadUtil("../../shared/data/alibaba-2026-genai-pod-memory-util.csv.gz")
	}
	if err != nil {
		t.Logf("the original Alibaba traces are not beside this checkout (%v): replaying the built-in copy", err)
		if pods, util, err = Alibaba(); err != nil {
			t.Fatal(err)
		}
	}
	s := Scenario{Hosts: 2, HostMiB: 256 << 10, HeadroomMiB: 8 << 10, Replicas: 1, Seed: 1}
	w := func() Workload { return NewTrace(TraceWorkload{Pods: pods, Util: util, Step: 5 * time.Minute}) }
	ps := []Policy{
		{Name: "committed", Mode: berth.AdmissionCommitted, Gate: true},
		{Name: "working-set", Mode: berth.AdmissionWorkingSet, Gate: true},
		{Name: "working-set:nogate", Mode: berth.AdmissionWorkingSet},
	}
	r := Compare(s, ps, w)
	com, ws, ng := r[0], r[1], r[2]
	t.Logf("Alibaba openb pods (%d) on %d × 256 GiB hosts: committed %d admitted, %.2f live/host; working-set %d, %.2f live/host (%+.0f %%), %d OOM kills, %d evictions; without the gate %d OOM kills",
		len(pods), s.Hosts, com.Admitted, com.MeanPerHost, ws.Admitted, ws.MeanPerHost, 100*(ws.MeanPerHost/com.MeanPerHost-1), ws.OOMKills, ws.Evictions, ng.OOMKills)
	if ws.MeanPerHost < com.MeanPerHost || com.OOMKills != 0 || com.Evictions != 0 || ng.Evictions != 0 {
		t.Fatalf("committed %+v\nworking-set %+v\nno gate %+v", com, ws, ng)
	}
	if again := s.Run(ps[1], w()); !cmp.Equal(again, ws) {
		t.Fatalf("same input, different replay:\n%s", cmp.Diff(ws, again))
	}
	tr := Replay(TraceConfig{Hosts: 2, HostMiB: 256 << 10, HeadroomMiB: 8 << 10, Mode: berth.AdmissionCommitted, TickSeconds: 300}, pods, util)
	if tr.Admitted == 0 || tr.OOMEvents != 0 {
		t.Fatalf("Replay, committed: %+v", tr)
	}
}
