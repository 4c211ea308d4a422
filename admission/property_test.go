package admission

import (
	"math"
	"math/big"
	"testing"

	"pgregory.net/rapid"
)

// anyMiB draws int64 quantities that stress the arithmetic: ordinary sizes, small values
// around zero, extremes and anything at all.
func anyMiB() *rapid.Generator[int64] {
	return rapid.OneOf(
		rapid.Int64Range(0, 1<<20),
		rapid.Int64Range(-16, 16),
		rapid.SampledFrom([]int64{math.MinInt64, math.MinInt64 + 1, -1, 0, 1, 511, 512, 513, 2048, 2049,
			math.MaxInt64 / 4, math.MaxInt64/2 + 1, math.MaxInt64 - 1, math.MaxInt64}),
		rapid.Int64(),
	)
}

// TestADM2_CommittedNeverOverAdmits models a committed host that admits a create only if
// Fits(Admittable(host), 0, Charge(...)) and then holds the guest; deletes remove random
// guests. At every step Σ configured(admitted) ≤ total − headroom, and a refused create
// really would not have fitted (the host is exact, not merely safe).
func TestADM2_CommittedNeverOverAdmits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.Int64Range(1, 1<<20).Draw(t, "total")
		headroom := rapid.Int64Range(0, total).Draw(t, "headroom")
		budget := total - headroom
		h := Host{Mode: committed, TotalMiB: total, HeadroomMiB: headroom, IntakeOpen: true}
		var sum int64
		steps := rapid.IntRange(1, 100).Draw(t, "steps")
		for step := 0; step < steps; step++ {
			if len(h.Guests) > 0 && rapid.IntRange(0, 3).Draw(t, "op") == 0 {
				i := rapid.IntRange(0, len(h.Guests)-1).Draw(t, "victim")
				sum -= h.Guests[i].ConfiguredMiB
				h.Guests = append(h.Guests[:i], h.Guests[i+1:]...)
			} else {
				size := rapid.OneOf(rapid.Int64Range(0, budget+1), rapid.Int64Range(0, 2*total)).Draw(t, "size")
				stateful := rapid.Bool().Draw(t, "stateful")
				adm := Admittable(h)
				if adm != budget-sum {
					t.Fatalf("step %d: Admittable = %d, want total−headroom−Σ = %d", step, adm, budget-sum)
				}
				fits := Fits(adm, 0, Charge(committed, size, stateful))
				if fits {
					h.Guests = append(h.Guests, Guest{ConfiguredMiB: size, Stateful: stateful})
					sum += size
				} else if sum+size <= budget {
					t.Fatalf("step %d: refused %d MiB with Σ=%d of budget %d", step, size, sum, budget)
				}
			}
			if sum > budget {
				t.Fatalf("step %d: Σ configured %d > total−headroom %d", step, sum, budget)
			}
		}
	})
}

// TestCase_C07_AdmittableNeverNegative feeds arbitrary guests (resident readings negative,
// above total or near MaxInt64; any configured size, flags and headroom) and checks that the
// published admittable stays in [0, total], never grows when a guest is added, and equals the
// formula of ADM-2/ADM-3 evaluated in exact (big-integer) arithmetic.
func TestCase_C07_AdmittableNeverNegative(t *testing.T) {
	guestGen := rapid.Custom(func(t *rapid.T) Guest {
		return Guest{
			ConfiguredMiB: anyMiB().Draw(t, "configured"),
			ResidentMiB:   anyMiB().Draw(t, "resident"),
			Stateful:      rapid.Bool().Draw(t, "stateful"),
			Measured:      rapid.Bool().Draw(t, "measured"),
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		h := Host{
			Mode:        rapid.SampledFrom([]string{workingSet, workingSet, committed, none, "bogus"}).Draw(t, "mode"),
			TotalMiB:    anyMiB().Draw(t, "total"),
			HeadroomMiB: anyMiB().Draw(t, "headroom"),
			IntakeOpen:  rapid.Float64Range(0, 1).Draw(t, "open") < 0.9,
		}
		guests := rapid.SliceOfN(guestGen, 0, 12).Draw(t, "guests")
		prev := int64(math.MaxInt64)
		for n := 0; n <= len(guests); n++ {
			h.Guests = guests[:n]
			got := Admittable(h)
			if got < 0 || got > max(h.TotalMiB, 0) {
				t.Fatalf("%d guests: Admittable = %d outside [0, %d]", n, got, h.TotalMiB)
			}
			if got > prev {
				t.Fatalf("adding guest %+v raised admittable from %d to %d", guests[n-1], prev, got)
			}
			if want := exactAdmittable(h); got != want {
				t.Fatalf("%d guests: Admittable = %d, exact formula gives %d", n, got, want)
			}
			prev = got
		}
	})
}

// exactAdmittable is the SPEC's formula in big-integer arithmetic, written independently of
// the package: it is the oracle for Admittable.
func exactAdmittable(h Host) int64 {
	if !h.IntakeOpen || h.TotalMiB <= 0 {
		return 0
	}
	total := big.NewInt(h.TotalMiB)
	left := new(big.Int).Sub(total, big.NewInt(max(h.HeadroomMiB, 0)))
	for _, g := range h.Guests {
		cfg := big.NewInt(max(g.ConfiguredMiB, 0))
		var charge *big.Int
		switch {
		case h.Mode == none:
			charge = new(big.Int)
		case h.Mode != workingSet || g.Stateful:
			charge = cfg
		case !g.Measured:
			// min(cfg, max(⌈cfg/4⌉, 512))
			q := new(big.Int).Add(cfg, big.NewInt(3))
			q.Quo(q, big.NewInt(4))
			if q.Cmp(big.NewInt(512)) < 0 {
				q.SetInt64(512)
			}
			if q.Cmp(cfg) > 0 {
				q.Set(cfg)
			}
			charge = q
		default:
			charge = big.NewInt(min(max(g.ResidentMiB, 0), h.TotalMiB))
		}
		left.Sub(left, charge)
	}
	if left.Sign() < 0 {
		return 0
	}
	if left.Cmp(total) > 0 {
		return h.TotalMiB
	}
	return left.Int64()
}

// TestADM4_ChargeNeverExceedsConfigured: neither the charge nor the reserve can exceed what
// the guest could ever use, and both are non-negative; the reserve honours its quarter and
// its floor.
func TestADM4_ChargeNeverExceedsConfigured(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		cfg := anyMiB().Draw(t, "configured")
		mode := rapid.SampledFrom([]string{committed, workingSet, none, "", "bogus"}).Draw(t, "mode")
		stateful := rapid.Bool().Draw(t, "stateful")
		ceiling := max(cfg, 0)

		r := Reserve(cfg)
		if r < 0 || r > ceiling {
			t.Fatalf("Reserve(%d) = %d outside [0, %d]", cfg, r, ceiling)
		}
		if cfg > 0 && (r < min(cfg, ReserveFloorMiB) || r < cfg/4) {
			t.Fatalf("Reserve(%d) = %d below its quarter or floor", cfg, r)
		}
		c := Charge(mode, cfg, stateful)
		if c < 0 || c > ceiling {
			t.Fatalf("Charge(%q, %d, %v) = %d outside [0, %d]", mode, cfg, stateful, c, ceiling)
		}
		if mode == workingSet && !stateful && c != r {
			t.Fatalf("working-set stateless charge %d != reserve %d", c, r)
		}
	})
}
