package placement

import (
	"cmp"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// Sinks keep the compiler from eliminating the benchmarked work.
var (
	sinkDecision Decision
	sinkIndex    int
	sinkSum      int64
	sinkSnapshot *Snapshot
)

// benchFleet returns a deterministic, realistic fleet of n hosts: three regions, mostly
// ephemeral (some preemptible) with a stateful share, mixed admission modes, admittable
// memory from empty to full, a few hosts with pending reservations, and about 3 % draining,
// 2 % stale, 1 % quarantined and 2 % with intake closed. Hosts are in random order, so no
// attribute is predictable from its neighbour.
func benchFleet(n int, seed uint64) []Host {
	r := rand.New(rand.NewPCG(seed, 0x6265727468))
	regions := []string{"eu-west", "us-east", "ap-south"}
	hosts := make([]Host, n)
	for i := range hosts {
		h := Host{
			ID:           fmt.Sprintf("host-%05d", i),
			LastSeenNano: now - int64(r.IntN(10_000))*int64(time.Millisecond),
			IntakeOpen:   true,
			Region:       regions[r.IntN(len(regions))],
			CPUTotal:     64,
			CPUUsed:      float64(r.IntN(6400)) / 100,
		}
		switch p := r.IntN(10); {
		case p < 2:
			h.Pool = "" // stateful by default (POOL-1)
		case p < 3:
			h.Pool = berth.PoolStateful
		default:
			h.Pool = berth.PoolEphemeral
			h.Preemptible = r.IntN(2) == 0
		}
		switch m := r.IntN(20); {
		case m < 14:
			h.Mode = berth.AdmissionWorkingSet
		case m < 19:
			h.Mode = berth.AdmissionCommitted
		default:
			h.Mode = berth.AdmissionNone
		}
		if r.IntN(10) > 0 {
			h.AdmittableMiB = r.Int64N(256 << 10)
		}
		if r.IntN(5) == 0 {
			h.PendingMiB = r.Int64N(8 << 10)
		}
		h.CanRestore = r.IntN(4) == 0
		switch s := r.IntN(100); {
		case s < 3:
			h.Draining = true
		case s < 5:
			h.LastSeenNano = now - int64(time.Duration(1+r.IntN(30))*time.Minute)
		case s < 6:
			h.Quarantined = true
		case s < 8:
			h.IntakeOpen = false
		}
		// The scheduler builds its snapshot from decoded store rows, so every host owns its
		// strings: comparing them costs a load from the heap, not from a shared constant.
		h.Region, h.Pool, h.Mode = strings.Clone(h.Region), strings.Clone(h.Pool), strings.Clone(h.Mode)
		hosts[i] = h
	}
	return hosts
}

// benchRequest is a common create: 2 GiB stateless, any region, any pool.
var benchRequest = Request{MemoryMiB: 2048}

var benchSizes = []int{1000, 10000}

// BenchmarkPick measures one placement decision over the whole fleet, as the server makes
// it: Snapshot.Pick over an indexed snapshot (the index is built before the timer starts;
// BenchmarkSnapshotSet is its upkeep).
func BenchmarkPick(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			s := NewSnapshot(benchFleet(n, 42))
			b.ReportAllocs()
			var seed uint64
			for b.Loop() {
				seed++
				sinkDecision = s.Pick(benchRequest, now, Options{}, seed)
			}
			if sinkDecision.Index < 0 {
				b.Fatalf("benchmark fleet chose no host: %v", sinkDecision.Hosts())
			}
		})
	}
}

// pickRounds is how many rounds BenchmarkPickVsFloor runs.
var pickRounds = flag.Int("pick.rounds", 10, "rounds of BenchmarkPickVsFloor")

// BenchmarkPickVsFloor runs rounds of, for each fleet size, Snapshot.Pick ("pick"), the
// package Pick ("unindexed", the code before the index) and the linear-scan floor ("floor"),
// back to back: each round's ratios compare runs made within seconds of each other on this
// shared, noisy machine, where -count would run all rounds of one before the next
// (docs/PERFORMANCE.md). Use -count 1 and -pick.rounds for the number of rounds.
func BenchmarkPickVsFloor(b *testing.B) {
	for r := range *pickRounds {
		for _, n := range benchSizes {
			hosts := benchFleet(n, 42)
			s := NewSnapshot(slices.Clone(hosts))
			b.Run(fmt.Sprintf("round=%d/hosts=%d/pick", r, n), func(b *testing.B) {
				b.ReportAllocs()
				var seed uint64
				for b.Loop() {
					seed++
					sinkDecision = s.Pick(benchRequest, now, Options{}, seed)
				}
			})
			b.Run(fmt.Sprintf("round=%d/hosts=%d/unindexed", r, n), func(b *testing.B) {
				b.ReportAllocs()
				var seed uint64
				for b.Loop() {
					seed++
					sinkDecision = Pick(hosts, benchRequest, now, Options{}, seed)
				}
			})
			b.Run(fmt.Sprintf("round=%d/hosts=%d/floor", r, n), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					sinkIndex, sinkSum = linearScan(hosts)
				}
			})
		}
	}
}

// BenchmarkPickUnindexed is the package-level Pick over the plain host slice: the code the
// server ran before the snapshot index, and what Snapshot.Pick falls back to for a
// constrained request.
func BenchmarkPickUnindexed(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			hosts := benchFleet(n, 42)
			b.ReportAllocs()
			var seed uint64
			for b.Loop() {
				seed++
				sinkDecision = Pick(hosts, benchRequest, now, Options{}, seed)
			}
			if sinkDecision.Index < 0 {
				b.Fatalf("benchmark fleet chose no host: %v", sinkDecision.Hosts())
			}
		})
	}
}

// BenchmarkSnapshotSet is the index's upkeep: one host replaced (a heartbeat folded in, or a
// reservation's pending MiB changed), at 10,000 hosts.
func BenchmarkSnapshotSet(b *testing.B) {
	hosts := benchFleet(10000, 42)
	spare := benchFleet(1000, 43)
	s := NewSnapshot(hosts)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		s.Set(i*7919%len(hosts), spare[i%len(spare)])
	}
}

// BenchmarkPickRegion places a request that names a region: every host then takes the
// branch that classifies the request-dependent filters.
func BenchmarkPickRegion(b *testing.B) {
	hosts := benchFleet(10000, 42)
	req := Request{MemoryMiB: 2048, Region: "eu-west"}
	s := NewSnapshot(hosts)
	b.Run("hosts=10000", func(b *testing.B) {
		b.ReportAllocs()
		var seed uint64
		for b.Loop() {
			seed++
			sinkDecision = s.Pick(req, now, Options{}, seed) // the package Pick: a constrained request
		}
	})
}

// BenchmarkPickAscending is Pick's worst case: hosts ordered by ascending free memory, so
// nearly every host beats the best so far and none is skipped by the score bound (nor any
// block by the index). "unindexed" is the package Pick over the same slice.
func BenchmarkPickAscending(b *testing.B) {
	hosts := benchFleet(10000, 42)
	slices.SortFunc(hosts, func(x, y Host) int { return cmp.Compare(x.AdmittableMiB-x.PendingMiB, y.AdmittableMiB-y.PendingMiB) })
	s := NewSnapshot(slices.Clone(hosts))
	b.Run("hosts=10000", func(b *testing.B) {
		b.ReportAllocs()
		var seed uint64
		for b.Loop() {
			seed++
			sinkDecision = s.Pick(benchRequest, now, Options{}, seed)
		}
	})
	b.Run("unindexed/hosts=10000", func(b *testing.B) {
		b.ReportAllocs()
		var seed uint64
		for b.Loop() {
			seed++
			sinkDecision = Pick(hosts, benchRequest, now, Options{}, seed)
		}
	})
}

// BenchmarkNewSnapshot is the index's construction, as a full refresh of the server's
// snapshot makes it, at 10,000 hosts.
func BenchmarkNewSnapshot(b *testing.B) {
	hosts := benchFleet(10000, 42)
	b.ReportAllocs()
	for b.Loop() {
		sinkSnapshot = NewSnapshot(hosts)
	}
}

// BenchmarkLinearScan is the floor Pick is measured against: one pass over the same host
// array that touches each Host once (sum of admittable and the index of the largest).
func BenchmarkLinearScan(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			hosts := benchFleet(n, 42)
			b.ReportAllocs()
			for b.Loop() {
				sinkIndex, sinkSum = linearScan(hosts)
			}
		})
	}
}

func linearScan(hosts []Host) (int, int64) {
	best, bestMiB, sum := -1, int64(-1), int64(0)
	for i := range hosts {
		a := hosts[i].AdmittableMiB
		sum += a
		if a > bestMiB {
			best, bestMiB = i, a
		}
	}
	return best, sum
}
