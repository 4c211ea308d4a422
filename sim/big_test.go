package sim

import (
	"os"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestSIM1_TenThousandHosts is the scale point of SIM-1: 10,000 hosts and 1,000,000 creates
// per policy. It takes minutes, so it runs only with BERTH_SIM_BIG=1 (docs/PERFORMANCE.md
// gives the command and the measured time); it asserts what must hold at scale, never a time.
func TestSIM1_TenThousandHosts(t *testing.T) {
	if os.Getenv("BERTH_SIM_BIG") == "" {
		t.Skip("set BERTH_SIM_BIG=1 to simulate 10,000 hosts × 1,000,000 creates")
	}
	hosts, creates := 10000, 1000000
	if os.Getenv("BERTH_SIM_BIG") == "small" {
		hosts, creates = 1000, 100000
	}
	s := Scenario{Hosts: hosts, HostMiB: 256 << 10, HeadroomMiB: 8 << 10, Replicas: 4, Retry: true, RetryAfter: true, Seed: 1}
	m := IdleModel{Creates: creates, RatePerSec: float64(creates) / 1000, MemoryMiB: 4 << 10, TouchMiB: 300, TouchJitter: 0.5,
		LifetimeMedian: 5 * time.Minute, LifetimeSigma: 1, Seed: 1}
	start := time.Now()
	r := s.Run(Policy{Mode: berth.AdmissionWorkingSet, Gate: true}, NewIdle(m))
	t.Logf("%d hosts × %d creates, working-set: %d admitted, %.1f per host, %d OOM kills, in %s", hosts, creates, r.Admitted, r.MeanPerHost, r.OOMKills, time.Since(start))
	if r.Creates != creates || r.Admitted == 0 || r.OOMKills != 0 {
		t.Fatalf("%+v", r)
	}
}
