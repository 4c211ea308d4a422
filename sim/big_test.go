package sim

import (
	"os"
	"testing"
	"time"
)

// TestSIM1_TenThousandHosts is the scale point of SIM-1: 10,000 hosts and 1,000,000 creates
// per policy, committed and working-set side by side — the run of docs/PERFORMANCE.md's
// `berth sim --hosts 10000 --creates 1000000 …` command. It takes minutes, so it runs only with
// BERTH_SIM_BIG=1 (BERTH_SIM_BIG=small: 1,000 hosts × 100,000 creates); it asserts what must
// hold at scale, never a time.
func TestSIM1_TenThousandHosts(t *testing.T) {
	hosts, creates := 10000, 1000000
	switch os.Getenv("BERTH_SIM_BIG") {
	case "":
		t.Skip("set BERTH_SIM_BIG=1 to simulate 10,000 hosts × 1,000,000 creates")
	case "small":
		hosts, creates = 1000, 100000
	}
	s := Scenario{Hosts: hosts, HostMiB: 256 << 10, HeadroomMiB: 8 << 10, Replicas: 4, Retry: true, RetryAfter: true, Seed: 1,
		Failures: Failures{LossPerHostHour: 0.01, NoticeFrac: 1, Notices: []time.Duration{30 * time.Second, 120 * time.Second},
			LinkMiBps: 100, CanSnapshot: true}}
	m := IdleModel{Creates: creates, RatePerSec: float64(creates) / 1000, MemoryMiB: 4 << 10, TouchMiB: 300, TouchJitter: 0.5,
		LifetimeMedian: 15 * time.Minute, LifetimeSigma: 1, GrowthFrac: 0.05, GrowthOver: 10 * time.Minute,
		SpikeProb: 0.02, SpikeFrac: 0.8, SpikeFor: 2 * time.Minute, ReconstructibleFrac: 0.5, Seed: 1}
	ps, _ := ParsePolicies("committed,working-set")
	start := time.Now()
	r := Compare(s, ps, func() Workload { return NewIdle(m) })
	t.Logf("%d hosts × %d creates, two policies in parallel, in %s", hosts, creates, time.Since(start))
	for _, x := range r {
		t.Logf("%s: %d admitted, %.1f per host (peak %.1f), %d OOM kills, %d evictions, evacuation saved %.0f %%",
			x.Policy, x.Admitted, x.MeanPerHost, x.PeakPerHost, x.OOMKills, x.Evictions, x.EvacSavedPct)
		if x.Creates != creates || x.Admitted+x.GaveUp != creates {
			t.Fatalf("%+v", x)
		}
	}
	if r[0].OOMKills != 0 || r[0].Evictions != 0 || r[1].Admitted < r[0].Admitted || r[1].MeanPerHost < r[0].MeanPerHost {
		t.Fatalf("committed %+v\nworking-set %+v", r[0], r[1])
	}
}
