package placement

import (
	"math"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"pgregory.net/rapid"
)

// anyMiB draws memory figures that stress the arithmetic, extremes included.
func anyMiB() *rapid.Generator[int64] {
	return rapid.OneOf(
		rapid.Int64Range(0, 1<<18),
		rapid.Int64Range(-4, 4096),
		rapid.SampledFrom([]int64{math.MinInt64, -1, 0, 511, 512, 2048, math.MaxInt64}),
		rapid.Int64(),
	)
}

var hostGen = rapid.Custom(func(t *rapid.T) Host {
	return Host{
		ID:            rapid.SampledFrom([]string{"a", "b", "c", "vol"}).Draw(t, "id"),
		LastSeenNano:  now - rapid.Int64Range(-int64(time.Second), int64(time.Hour)).Draw(t, "age"),
		Draining:      rapid.Float64Range(0, 1).Draw(t, "draining") < 0.15,
		Quarantined:   rapid.Float64Range(0, 1).Draw(t, "quarantined") < 0.1,
		IntakeOpen:    rapid.Float64Range(0, 1).Draw(t, "open") < 0.85,
		Preemptible:   rapid.Bool().Draw(t, "preemptible"),
		StreamRestore: rapid.Bool().Draw(t, "stream"),
		Region:        rapid.SampledFrom([]string{"", "eu", "us"}).Draw(t, "region"),
		Pool:          rapid.SampledFrom([]string{"", berth.PoolStateful, berth.PoolEphemeral}).Draw(t, "pool"),
		Mode:          rapid.SampledFrom([]string{berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone, ""}).Draw(t, "mode"),
		AdmittableMiB: anyMiB().Draw(t, "admittable"),
		PendingMiB:    anyMiB().Draw(t, "pending"),
		CPUTotal:      float64(rapid.IntRange(0, 64).Draw(t, "cpuTotal")),
		CPUUsed:       float64(rapid.IntRange(0, 64).Draw(t, "cpuUsed")),
	}
})

// reference is the reason the SPEC gives for rejecting h (PLC-1, POOL-2/3, PLC-7, ADM-7),
// written independently of Pick; ok is true (and r is numReasons) when h is a feasible
// candidate.
func reference(hosts []Host, i int, req Request, cutoff int64) (r Reason, ok bool) {
	h := hosts[i]
	pool := h.Pool
	if pool == "" {
		pool = berth.PoolStateful
	}
	pending := big.NewInt(max(h.PendingMiB, 0))
	free := new(big.Int).Sub(big.NewInt(h.AdmittableMiB), pending)
	charge := big.NewInt(admission.Charge(h.Mode, req.MemoryMiB, req.Stateful))
	switch {
	case h.LastSeenNano < cutoff:
		return ReasonStale, false
	case h.Draining:
		return ReasonDraining, false
	case h.Quarantined:
		return ReasonQuarantined, false
	case !h.IntakeOpen:
		return ReasonPressure, false
	case req.Region != "" && req.Region != h.Region:
		return ReasonRegionMismatch, false
	case req.Pool != "" && req.Pool != pool,
		(req.Stateful || req.VolumeHost != "") && (pool != berth.PoolStateful || h.Preemptible),
		req.VolumeHost != "" && req.VolumeHost != h.ID:
		return ReasonPoolMismatch, false
	case slices.Contains(req.Exclude, i):
		return ReasonSaturated, false
	case free.Cmp(charge) < 0:
		return ReasonInsufficientMemory, false
	}
	return numReasons, true
}

// TestPLC10_PickNeverChoosesARejectedHost: over random fleets and requests, the chosen host
// passes every filter, its charge is the ADM-4 charge, every other host is counted under
// exactly the reason the SPEC gives, and a refusal accounts for all Total hosts.
func TestPLC10_PickNeverChoosesARejectedHost(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hosts := rapid.SliceOfN(hostGen, 0, 24).Draw(t, "hosts")
		req := Request{
			MemoryMiB:  anyMiB().Draw(t, "memory"),
			Stateful:   rapid.Bool().Draw(t, "stateful"),
			Region:     rapid.SampledFrom([]string{"", "eu", "us"}).Draw(t, "region"),
			Pool:       rapid.SampledFrom([]string{"", berth.PoolStateful, berth.PoolEphemeral}).Draw(t, "pool"),
			VolumeHost: rapid.SampledFrom([]string{"", "", "vol", "gone"}).Draw(t, "volume"),
			Exclude:    rapid.SliceOfN(rapid.IntRange(-1, 25), 0, 4).Draw(t, "exclude"),
		}
		opt := Options{
			StaleAfterNano: rapid.SampledFrom([]int64{0, int64(10 * time.Second), int64(10 * time.Minute)}).Draw(t, "staleAfter"),
			Strategy:       rapid.SampledFrom([]string{"", Spread, Pack}).Draw(t, "strategy"),
		}
		staleAfter := opt.StaleAfterNano
		if staleAfter == 0 {
			staleAfter = DefaultStaleAfterNano
		}
		d := Pick(hosts, req, now, opt, rapid.Uint64().Draw(t, "seed"))

		var want [numReasons]int
		live, feasible := 0, 0
		for i := range hosts {
			r, ok := reference(hosts, i, req, now-staleAfter)
			if r != ReasonStale {
				live++
			}
			if ok {
				feasible++
			} else {
				want[r]++
			}
		}
		if d.Total != len(hosts) || d.Live != live || d.Rejected != want {
			t.Fatalf("Total/Live/Rejected = %d/%d/%v, want %d/%d/%v", d.Total, d.Live, d.Rejected, len(hosts), live, want)
		}
		sum := 0
		for _, n := range d.Rejected {
			sum += n
		}
		if d.Index < 0 {
			if feasible > 0 || sum != d.Total {
				t.Fatalf("refused with %d feasible hosts; rejected sum %d, total %d", feasible, sum, d.Total)
			}
			return
		}
		if _, ok := reference(hosts, d.Index, req, now-staleAfter); !ok {
			t.Fatalf("chose host %d (%+v) which fails a filter", d.Index, hosts[d.Index])
		}
		if c := admission.Charge(hosts[d.Index].Mode, req.MemoryMiB, req.Stateful); d.ChargeMiB != c {
			t.Fatalf("ChargeMiB = %d, want admission.Charge = %d", d.ChargeMiB, c)
		}
		if sum != d.Total-feasible {
			t.Fatalf("rejected sum %d, want total %d − feasible %d", sum, d.Total, feasible)
		}
	})
}
