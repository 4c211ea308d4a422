package placement

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestPLC2_SpreadAndPack: spread takes the host with the most free memory and CPU, pack the
// fullest host that still fits.
func TestPLC2_SpreadAndPack(t *testing.T) {
	cpu := func(used float64) func(*Host) { return func(h *Host) { h.CPUUsed = used } }
	stream := func(h *Host) { h.CanRestore = true }
	tests := []struct {
		name     string
		hosts    []Host
		strategy string
		want     string // ID of the chosen host
	}{
		{"spread prefers free memory", []Host{host("4g", admittable(4096)), host("64g", admittable(65536)), host("16g", admittable(16384))}, Spread, "64g"},
		{"empty strategy is spread", []Host{host("4g", admittable(4096)), host("64g", admittable(65536))}, "", "64g"},
		{"pack prefers the fullest host that fits", []Host{host("16g", admittable(16384)), host("1g", admittable(1024)), host("4g", admittable(4096)), host("64g", admittable(65536))}, Pack, "4g"},
		{"pack judges free after pending", []Host{host("a", admittable(8192), pending(5000)), host("b", admittable(4096))}, Pack, "a"},
		{"spread judges free after pending", []Host{host("a", admittable(65536), pending(60000)), host("b", admittable(16384))}, Spread, "b"},
		{"spread prefers free CPU at equal memory", []Host{host("busy", cpu(15)), host("idle", cpu(1))}, Spread, "idle"},
		{"spread weighs 1 GiB at 0.3 and a core at 0.6", []Host{host("mem", admittable(65536+3072), cpu(10)), host("cpu", cpu(8))}, Spread, "cpu"},
		{"spread adds 5 for a host that restores", []Host{host("plain", admittable(65536+10<<10)), host("stream", stream)}, Spread, "stream"},
		{"pack sees a host fuller by less than the charge", []Host{host("a", admittable(65536)), host("b", admittable(65536), pending(1536))}, Pack, "b"},
		{"pack sees a working-set host fuller by less than the charge", []Host{host("a", admittable(65536)), host("b", mode(berth.AdmissionWorkingSet), admittable(63900))}, Pack, "b"},
		{"spread sees a none host with less free memory but no charge", []Host{host("a", admittable(65536)), host("b", mode(berth.AdmissionNone), admittable(65536-1024))}, Spread, "b"},
		{"pack ignores CPU", []Host{host("idle", admittable(8192), cpu(0)), host("busy", admittable(4096), cpu(16))}, Pack, "busy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Pick(tt.hosts, Request{MemoryMiB: 2048}, now, Options{Strategy: tt.strategy}, 11)
			if d.Index < 0 {
				t.Fatalf("Pick chose no host: %v", d.Hosts())
			}
			if diff := cmp.Diff(tt.want, tt.hosts[d.Index].ID); diff != "" {
				t.Errorf("chosen host (-want +got):\n%s", diff)
			}
		})
	}
}

// burst places n creates one after the other, adding each charge to the chosen host's
// pending reservations as the scheduler's ledger does, and returns how many each host got.
func burst(t *testing.T, hosts []Host, req Request, n int, opt Options, seed uint64) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		d := Pick(hosts, req, now, opt, seed+uint64(i))
		if d.Index < 0 {
			t.Fatalf("pick %d: no host: %v", i, d.Hosts())
		}
		hosts[d.Index].PendingMiB += d.ChargeMiB
		got[hosts[d.Index].ID]++
	}
	return got
}

// TestPLC2_BurstSpreads: pending reservations subtract from free memory, so a burst of 8 onto
// 4 identical hosts lands 2 on each instead of piling onto one.
func TestPLC2_BurstSpreads(t *testing.T) {
	for _, m := range []string{berth.AdmissionCommitted, berth.AdmissionWorkingSet} {
		for seed := uint64(0); seed < 20; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", m, seed), func(t *testing.T) {
				hosts := []Host{host("a", mode(m)), host("b", mode(m)), host("c", mode(m)), host("d", mode(m))}
				got := burst(t, hosts, Request{MemoryMiB: 4096}, 8, Options{}, seed*1000)
				want := map[string]int{"a": 2, "b": 2, "c": 2, "d": 2}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("creates per host (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestPLC2_PackBurstFillsOneHost is the counterpart: pack keeps filling the fullest host.
func TestPLC2_PackBurstFillsOneHost(t *testing.T) {
	hosts := []Host{host("big", admittable(65536)), host("small", admittable(16384))}
	got := burst(t, hosts, Request{MemoryMiB: 4096}, 4, Options{Strategy: Pack}, 5)
	if diff := cmp.Diff(map[string]int{"small": 4}, got); diff != "" {
		t.Errorf("creates per host (-want +got):\n%s", diff)
	}
}

// TestPLC2_TiesDoNotHerd: among identical hosts every one is chosen a fair share across
// seeds, in every admission mode and strategy, for seeds from a PRNG and for plain counters
// (a replica may pass either).
func TestPLC2_TiesDoNotHerd(t *testing.T) {
	const nHosts, picks = 5, 5000
	// Each share is Binomial(5000, 0.2): mean 1000, sd ≈ 28. The bounds are > 10 sd away,
	// so a fair tie-break fails this with negligible probability; a herding one cannot pass.
	const lo, hi = 700, 1300
	seeders := map[string]func(prng *rand.Rand, i int) uint64{
		"prng":        func(prng *rand.Rand, _ int) uint64 { return prng.Uint64() },
		"counter":     func(_ *rand.Rand, i int) uint64 { return uint64(i) },
		"counter<<32": func(_ *rand.Rand, i int) uint64 { return uint64(i) << 32 },
	}
	for _, m := range []string{berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone} {
		for _, strategy := range []string{Spread, Pack} {
			for name, seed := range seeders {
				t.Run(m+"/"+strategy+"/"+name, func(t *testing.T) {
					hosts := make([]Host, nHosts)
					for i := range hosts {
						hosts[i] = host(fmt.Sprintf("h%d", i), mode(m))
					}
					prng := rand.New(rand.NewPCG(1, 2))
					counts := make([]int, nHosts)
					for i := range picks {
						d := Pick(hosts, Request{MemoryMiB: 1024}, now, Options{Strategy: strategy}, seed(prng, i))
						counts[d.Index]++
					}
					for i, n := range counts {
						if n < lo || n > hi {
							t.Errorf("host %d chosen %d of %d times, want within [%d, %d]; all: %v", i, n, picks, lo, hi, counts)
						}
					}
				})
			}
		}
	}
}

// TestPLC8_PickAllocatesNothing: Pick is arithmetic over memory (PLC-8).
func TestPLC8_PickAllocatesNothing(t *testing.T) {
	hosts := benchFleet(500, 1)
	req := Request{MemoryMiB: 2048, Exclude: []int{3, 9}}
	var seed uint64
	allocs := testing.AllocsPerRun(50, func() {
		seed++
		sinkDecision = Pick(hosts, req, now, Options{}, seed)
	})
	if allocs != 0 {
		t.Errorf("Pick allocates %v times per call, want 0", allocs)
	}
}
