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

// rare is true about one time in 20. rapid favours small draws, so the rare outcome is the
// largest value, and the common case (a feasible host or request) stays common.
func rare(t *rapid.T, label string) bool { return rapid.IntRange(0, 19).Draw(t, label) == 19 }

var hostGen = rapid.Custom(func(t *rapid.T) Host {
	age := rapid.Int64Range(-int64(time.Second), int64(20*time.Second)).Draw(t, "age")
	if rare(t, "stale") {
		age = rapid.Int64Range(0, int64(time.Hour)).Draw(t, "staleAge")
	}
	return Host{
		ID:           rapid.SampledFrom([]string{"a", "b", "c", "vol"}).Draw(t, "id"),
		LastSeenNano: now - age,
		Draining:     rare(t, "draining"),
		Quarantined:  rare(t, "quarantined"),
		IntakeOpen:   !rare(t, "closed"),
		Preemptible:  rapid.Bool().Draw(t, "preemptible"),
		CanRestore:   rapid.Bool().Draw(t, "canRestore"),
		Region:       rapid.SampledFrom([]string{"eu", "us", ""}).Draw(t, "region"),
		Pool:         rapid.SampledFrom([]string{"", berth.PoolStateful, berth.PoolEphemeral}).Draw(t, "pool"),
		Mode:         rapid.SampledFrom([]string{berth.AdmissionCommitted, berth.AdmissionWorkingSet, berth.AdmissionNone, "", "working-sex", "nonE"}).Draw(t, "mode"),
		// Few distinct values as often as arbitrary ones, so that scores tie.
		AdmittableMiB: rapid.OneOf(rapid.SampledFrom([]int64{65536, 4096, 2048, 512, 0}), anyMiB()).Draw(t, "admittable"),
		PendingMiB:    rapid.OneOf(rapid.SampledFrom([]int64{0, 1536}), anyMiB()).Draw(t, "pending"),
		CPUTotal:      float64(rapid.SampledFrom([]int{8, 64, 0}).Draw(t, "cpuTotal")),
		CPUUsed:       float64(rapid.IntRange(0, 8).Draw(t, "cpuUsed")),
	}
})

// reference is the reason the SPEC gives for rejecting h (PLC-1, POOL-2/3, PLC-7, ADM-7),
// written independently of Pick; ok is true (and r is numReasons) when h is a feasible
// candidate.
func reference(hosts []Host, i int, req Request, cutoff int64, reserve admission.ReservePolicy) (r Reason, ok bool) {
	h := hosts[i]
	pool := h.Pool
	if pool == "" {
		pool = berth.PoolStateful
	}
	pending := big.NewInt(max(h.PendingMiB, 0))
	free := new(big.Int).Sub(big.NewInt(h.AdmittableMiB), pending)
	charge := big.NewInt(reserve.Charge(h.Mode, req.MemoryMiB, req.Stateful))
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
	case req.Restore && !h.CanRestore:
		return ReasonCannotRestore, false
	case slices.Contains(req.Exclude, i):
		return ReasonSaturated, false
	case free.Cmp(charge) < 0:
		return ReasonInsufficientMemory, false
	}
	return numReasons, true
}

// fleetGen draws fleets of up to 24 hosts, either all different or copies of a small palette
// (so that many hosts tie on score).
var fleetGen = rapid.Custom(func(t *rapid.T) []Host {
	if rapid.Bool().Draw(t, "distinct") {
		return rapid.SliceOfN(hostGen, 0, 24).Draw(t, "hosts")
	}
	palette := rapid.SliceOfN(hostGen, 1, 3).Draw(t, "palette")
	picks := rapid.SliceOfN(rapid.IntRange(0, len(palette)-1), 0, 24).Draw(t, "picks")
	hosts := make([]Host, len(picks))
	for i, p := range picks {
		hosts[i] = palette[p]
	}
	return hosts
})

func requestGen() *rapid.Generator[Request] {
	return rapid.Custom(func(t *rapid.T) Request {
		var req Request
		req.MemoryMiB = rapid.OneOf(rapid.SampledFrom([]int64{2048, 512, 4096, 0}), anyMiB()).Draw(t, "memory")
		req.Stateful = rare(t, "stateful")
		if rapid.IntRange(0, 3).Draw(t, "constrained") == 3 {
			req.Region = rapid.SampledFrom([]string{"", "eu", "us"}).Draw(t, "region")
			req.Pool = rapid.SampledFrom([]string{"", berth.PoolStateful, berth.PoolEphemeral}).Draw(t, "pool")
			req.VolumeHost = rapid.SampledFrom([]string{"", "vol", "gone"}).Draw(t, "volume")
			req.Exclude = rapid.SliceOfN(rapid.IntRange(-1, 25), 0, 4).Draw(t, "exclude")
			req.Restore = rare(t, "restore")
		}
		return req
	})
}

func optionsGen() *rapid.Generator[Options] {
	return rapid.Custom(func(t *rapid.T) Options {
		return Options{
			StaleAfterNano: rapid.SampledFrom([]int64{0, int64(10 * time.Second), int64(10 * time.Minute)}).Draw(t, "staleAfter"),
			Strategy:       rapid.SampledFrom([]string{"", Spread, Pack}).Draw(t, "strategy"),
			// Mostly ADM-4's default reserve, as on every real agent; sometimes the simulator's
			// knobs (SIM-1), invalid ones included (they charge the full size).
			Reserve: rapid.SampledFrom([]admission.ReservePolicy{{}, {}, {}, {Fraction: 0.1, FloorMiB: 256},
				{Fraction: 0.5, FloorMiB: 1024}, {Fraction: 1}, {Fraction: 0.1}, {FloorMiB: 64}}).Draw(t, "reserve"),
		}
	})
}

// pickReference is Pick as the SPEC states it, without the hot-path work: every host goes
// through the filters in reason order, every fitting host is scored with the PLC-2 formula,
// and equal scores are broken by the same reservoir sampling.
func pickReference(hosts []Host, req Request, nowNano int64, opt Options, seed uint64) Decision {
	d := Decision{Index: -1, Total: len(hosts)}
	staleAfter := opt.StaleAfterNano
	if staleAfter <= 0 {
		staleAfter = DefaultStaleAfterNano
	}
	var best float64
	ties, rng := uint64(0), seed
	for i, h := range hosts {
		r, ok := reference(hosts, i, req, nowNano-staleAfter, opt.Reserve)
		if r != ReasonStale {
			d.Live++
		}
		if !ok {
			d.Rejected[r]++
			continue
		}
		charge := opt.Reserve.Charge(h.Mode, req.MemoryMiB, req.Stateful)
		left := h.AdmittableMiB - max(h.PendingMiB, 0) - charge // ≥ 0: it fits
		var score float64
		if opt.Strategy == Pack {
			score = -float64(left)
		} else {
			score = 0.6*(h.CPUTotal-h.CPUUsed) + 0.3*float64(left)/1024
			if h.CanRestore {
				score += 5
			}
		}
		switch {
		case d.Index < 0 || score > best:
			d.Index, best, ties, d.ChargeMiB = i, score, 1, charge
		case score == best:
			ties++
			rng += 0x9e3779b97f4a7c15
			if splitmix64(rng)%ties == 0 {
				d.Index, d.ChargeMiB = i, charge
			}
		}
	}
	return d
}

// TestPick_MatchesReference: the optimised Pick returns exactly the reference's Decision
// (chosen index for the same seed, charge, live count, every rejection count) on random
// fleets full of ties and extreme values, for both strategies and any request.
func TestPick_MatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hosts := fleetGen.Draw(t, "hosts")
		req := requestGen().Draw(t, "req")
		opt := optionsGen().Draw(t, "opt")
		seed := rapid.Uint64().Draw(t, "seed")
		want := pickReference(hosts, req, now, opt, seed)
		got := Pick(hosts, req, now, opt, seed)
		if want != got {
			t.Fatalf("Pick = %+v, reference = %+v", got, want)
		}
	})
}

// TestPLC10_PickNeverChoosesARejectedHost: over random fleets and requests, the chosen host
// passes every filter, its charge is the ADM-4 charge with the options' reserve policy, every other host is counted under
// exactly the reason the SPEC gives, and a refusal accounts for all Total hosts.
func TestPLC10_PickNeverChoosesARejectedHost(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hosts := fleetGen.Draw(t, "hosts")
		req := requestGen().Draw(t, "req")
		opt := optionsGen().Draw(t, "opt")
		staleAfter := opt.StaleAfterNano
		if staleAfter == 0 {
			staleAfter = DefaultStaleAfterNano
		}
		d := Pick(hosts, req, now, opt, rapid.Uint64().Draw(t, "seed"))

		var want [numReasons]int
		live, feasible := 0, 0
		for i := range hosts {
			r, ok := reference(hosts, i, req, now-staleAfter, opt.Reserve)
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
		if _, ok := reference(hosts, d.Index, req, now-staleAfter, opt.Reserve); !ok {
			t.Fatalf("chose host %d (%+v) which fails a filter", d.Index, hosts[d.Index])
		}
		if c := opt.Reserve.Charge(hosts[d.Index].Mode, req.MemoryMiB, req.Stateful); d.ChargeMiB != c {
			t.Fatalf("ChargeMiB = %d, want the host's ADM-4 charge = %d", d.ChargeMiB, c)
		}
		if sum != d.Total-feasible {
			t.Fatalf("rejected sum %d, want total %d − feasible %d", sum, d.Total, feasible)
		}
	})
}

// TestEq: the call-free string comparison of Pick's loop is ==.
func TestEq(t *testing.T) {
	short := rapid.StringOfN(rapid.RuneFrom([]rune("ab")), 0, 4, -1)
	rapid.Check(t, func(t *rapid.T) {
		a, b := short.Draw(t, "a"), short.Draw(t, "b")
		if got := eq(a, b); got != (a == b) {
			t.Fatalf("eq(%q, %q) = %v", a, b, got)
		}
	})
}

// TestPOOL2_StatefulNeverOnEphemeralOrPreemptible: over random fleets and requests, a stateful
// or volume request is placed only on a non-preemptible host of the stateful pool (a host
// reporting no pool counts as stateful), and a volume request only on its volume's host
// (POOL-1…3).
func TestPOOL2_StatefulNeverOnEphemeralOrPreemptible(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hosts := rapid.SliceOfN(hostGen, 0, 24).Draw(t, "hosts")
		req := Request{
			MemoryMiB:  rapid.SampledFrom([]int64{256, 512, 2048}).Draw(t, "memory"),
			Stateful:   rapid.Bool().Draw(t, "stateful"),
			Pool:       rapid.SampledFrom([]string{"", berth.PoolStateful, berth.PoolEphemeral}).Draw(t, "pool"),
			VolumeHost: rapid.SampledFrom([]string{"", "vol", "a"}).Draw(t, "volume"),
		}
		if !req.Stateful && req.VolumeHost == "" {
			req.Stateful = true // this property is about stateful and volume work
		}
		d := Pick(hosts, req, now, Options{}, rapid.Uint64().Draw(t, "seed"))
		if d.Index < 0 {
			return
		}
		h := hosts[d.Index]
		if h.Preemptible || (h.Pool != "" && h.Pool != berth.PoolStateful) {
			t.Fatalf("%+v placed on host %+v (pool %q, preemptible %v)", req, h, h.Pool, h.Preemptible)
		}
		if req.VolumeHost != "" && h.ID != req.VolumeHost {
			t.Fatalf("volume of %s placed on %s", req.VolumeHost, h.ID)
		}
	})
}
