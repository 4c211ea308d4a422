package admission

import (
	"math"
	"math/big"
	"testing"

	"github.com/berth-dev/berth"
	"pgregory.net/rapid"
)

// oldReserve is ADM-4's formula as admission computed it before the reserve had knobs:
// min(configured, max(⌈configured/4⌉, 512)), in integers. The default policy must match it
// for every size.
func oldReserve(configured int64) int64 {
	if configured <= 0 {
		return 0
	}
	q := configured/4 + min(configured%4, 1)
	return min(configured, max(q, 512))
}

// exactReserve is min(c, max(⌈c × f⌉, floor)) in exact rational arithmetic: f as the exact
// binary fraction the float64 holds.
func exactReserve(c int64, f float64, floor int64) int64 {
	if c <= 0 {
		return 0
	}
	r := new(big.Rat).SetFloat64(f)
	r.Mul(r, new(big.Rat).SetInt64(c))
	q := new(big.Int).Quo(r.Num(), r.Denom()) // floor, as both are positive
	if new(big.Rat).SetInt(q).Cmp(r) != 0 {
		q.Add(q, big.NewInt(1))
	}
	return min(c, max(q.Int64(), floor))
}

// validPolicy draws a usable custom reserve policy: fractions in (0, 1] including the
// corners and tiny and subnormal ones, floors from 0 to huge.
func validPolicy() *rapid.Generator[ReservePolicy] {
	return rapid.Custom(func(t *rapid.T) ReservePolicy {
		f := rapid.OneOf(
			rapid.SampledFrom([]float64{1, 0.5, 0.25, 0.1, 1.0 / 3, 0.999999, math.SmallestNonzeroFloat64, 1e-300, 0x1p-60, math.Nextafter(1, 0)}),
			rapid.Float64Range(math.SmallestNonzeroFloat64, 1),
		).Draw(t, "fraction")
		floor := rapid.OneOf(rapid.Int64Range(0, 4096), rapid.SampledFrom([]int64{0, 1, 512, math.MaxInt64})).Draw(t, "floor")
		return ReservePolicy{Fraction: f, FloorMiB: floor}
	})
}

// TestADM4_DefaultReservePolicyIsTheOldFormula: the zero policy and the spelled-out
// ¼ / 512 MiB policy reserve exactly what ADM-4's integer formula did, for every size
// (edge cases, every size up to 64 Ki, random int64s), and Reserve, Charge and GuestCharge
// keep their results.
func TestADM4_DefaultReservePolicyIsTheOldFormula(t *testing.T) {
	check := func(c int64) {
		want := oldReserve(c)
		if got := Reserve(c); got != want {
			t.Fatalf("Reserve(%d) = %d, want %d", c, got, want)
		}
		if got := (ReservePolicy{}).Reserve(c); got != want {
			t.Fatalf("ReservePolicy{}.Reserve(%d) = %d, want %d", c, got, want)
		}
		if got := DefaultReservePolicy().Reserve(c); got != want {
			t.Fatalf("DefaultReservePolicy().Reserve(%d) = %d, want %d", c, got, want)
		}
		if got := Charge(workingSet, c, false); got != want {
			t.Fatalf("Charge(working-set, %d) = %d, want %d", c, got, want)
		}
		g := Guest{ConfiguredMiB: c}
		if got := GuestCharge(workingSet, g, 1<<20); got != want {
			t.Fatalf("GuestCharge(working-set, unmeasured %d) = %d, want %d", c, got, want)
		}
	}
	edges := []int64{math.MinInt64, -4096, -1, 0, 1, 2, 3, 4, 5, 511, 512, 513, 2047, 2048, 2049, 2050, 2051, 2052,
		1 << 20, 1<<53 - 1, 1 << 53, 1<<53 + 1, 1<<53 + 2, 1<<53 + 3, 1<<62 + 1,
		math.MaxInt64 / 4, math.MaxInt64/4 + 1, math.MaxInt64 - 3, math.MaxInt64 - 2, math.MaxInt64 - 1, math.MaxInt64}
	for _, c := range edges {
		check(c)
	}
	for c := int64(0); c <= 1<<16; c++ {
		check(c)
	}
	rapid.Check(t, func(t *rapid.T) { check(anyMiB().Draw(t, "configured")) })
}

// TestADM4_ReservePolicyExact: any valid policy reserves min(c, max(⌈c × fraction⌉, floor))
// exactly (checked in big rational arithmetic), never more than the configured size and
// never negative.
func TestADM4_ReservePolicyExact(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := validPolicy().Draw(t, "policy")
		c := anyMiB().Draw(t, "configured")
		got := p.Reserve(c)
		if want := exactReserve(c, p.Fraction, p.FloorMiB); got != want {
			t.Fatalf("%+v.Reserve(%d) = %d, want %d", p, c, got, want)
		}
		if got < 0 || got > max(c, 0) {
			t.Fatalf("%+v.Reserve(%d) = %d outside [0, %d]", p, c, got, max(c, 0))
		}
		if c > 0 && got == 0 {
			t.Fatalf("%+v.Reserve(%d) = 0: a positive fraction of a positive size rounds up to ≥ 1", p, c)
		}
	})
}

// TestADM4_ReservePolicyMonotone: a larger guest never reserves less; a larger fraction or a
// larger floor never reserves less.
func TestADM4_ReservePolicyMonotone(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := validPolicy().Draw(t, "policy")
		a, b := anyMiB().Draw(t, "a"), anyMiB().Draw(t, "b")
		if a > b {
			a, b = b, a
		}
		if p.Reserve(a) > p.Reserve(b) {
			t.Fatalf("%+v: Reserve(%d) = %d > Reserve(%d) = %d", p, a, p.Reserve(a), b, p.Reserve(b))
		}
		q := validPolicy().Draw(t, "other")
		lo := ReservePolicy{Fraction: min(p.Fraction, q.Fraction), FloorMiB: min(p.FloorMiB, q.FloorMiB)}
		hi := ReservePolicy{Fraction: max(p.Fraction, q.Fraction), FloorMiB: max(p.FloorMiB, q.FloorMiB)}
		if lo.Reserve(b) > hi.Reserve(b) {
			t.Fatalf("Reserve(%d): %+v gives %d > %+v gives %d", b, lo, lo.Reserve(b), hi, hi.Reserve(b))
		}
	})
}

// TestADM4_ReservePolicyTable pins custom policies at their corners.
func TestADM4_ReservePolicyTable(t *testing.T) {
	for _, tc := range []struct {
		p          ReservePolicy
		configured int64
		want       int64
	}{
		{ReservePolicy{Fraction: 0.1, FloorMiB: 256}, 4096, 410}, // ⌈409.6⌉
		{ReservePolicy{Fraction: 0.1, FloorMiB: 256}, 2000, 256},
		{ReservePolicy{Fraction: 0.1, FloorMiB: 256}, 100, 100}, // never above configured
		{ReservePolicy{Fraction: 0.1}, 4096, 410},               // no floor
		{ReservePolicy{Fraction: 0.1}, 1, 1},                    // rounds up, never 0
		{ReservePolicy{Fraction: 0.5, FloorMiB: 1024}, 4096, 2048},
		{ReservePolicy{Fraction: 0.5, FloorMiB: 1024}, 1500, 1024},
		{ReservePolicy{Fraction: 1}, 4096, 4096}, // committed-like
		{ReservePolicy{Fraction: 0.25, FloorMiB: 512}, 2049, 513},
		{ReservePolicy{Fraction: 0.25, FloorMiB: 0}, 1000, 250},
		{ReservePolicy{Fraction: 0.1, FloorMiB: math.MaxInt64}, math.MaxInt64, math.MaxInt64},
		{ReservePolicy{Fraction: 1}, math.MaxInt64, math.MaxInt64},
		{ReservePolicy{Fraction: math.SmallestNonzeroFloat64}, math.MaxInt64, 1},
		// invalid knobs charge the full size (the charge that cannot lose)
		{ReservePolicy{Fraction: 0, FloorMiB: 256}, 4096, 4096},
		{ReservePolicy{Fraction: 1.5}, 4096, 4096},
		{ReservePolicy{Fraction: -0.1}, 4096, 4096},
		{ReservePolicy{Fraction: math.NaN()}, 4096, 4096},
		{ReservePolicy{Fraction: math.Inf(1)}, 4096, 4096},
		{ReservePolicy{Fraction: 0.1, FloorMiB: -1}, 4096, 4096},
		{ReservePolicy{Fraction: 0.1}, -5, 0},
	} {
		if got := tc.p.Reserve(tc.configured); got != tc.want {
			t.Errorf("%+v.Reserve(%d) = %d, want %d", tc.p, tc.configured, got, tc.want)
		}
	}
}

// TestADM4_ReservePolicyValidate: fractions in (0, 1] and floors ≥ 0 pass, as does the zero
// value; everything else is invalid_request.
func TestADM4_ReservePolicyValidate(t *testing.T) {
	for _, p := range []ReservePolicy{{}, {Fraction: 1}, {Fraction: 0.1, FloorMiB: 256}, {Fraction: 0.25, FloorMiB: 512},
		{Fraction: math.SmallestNonzeroFloat64}, {Fraction: 0.5, FloorMiB: math.MaxInt64}} {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	for _, p := range []ReservePolicy{{FloorMiB: 256}, {Fraction: 1.0000001}, {Fraction: -0.5}, {Fraction: math.NaN()},
		{Fraction: math.Inf(1)}, {Fraction: 0.1, FloorMiB: -1}} {
		if err := p.Validate(); berth.ErrorCode(err) != berth.EInvalidRequest {
			t.Errorf("%+v: %v, want invalid_request", p, err)
		}
	}
}

// TestADM3_ReservePolicyInAdmittable: a host's policy is what Admittable charges its
// unmeasured stateless guests; measured, stateful and non-working-set guests do not care;
// the zero policy gives what Admittable always gave.
func TestADM3_ReservePolicyInAdmittable(t *testing.T) {
	guests := []Guest{{ConfiguredMiB: 4096}, {ConfiguredMiB: 4096, ResidentMiB: 300, Measured: true}, {ConfiguredMiB: 2048, Stateful: true}}
	h := Host{Mode: workingSet, TotalMiB: 32 << 10, HeadroomMiB: 4 << 10, IntakeOpen: true, Guests: guests}
	base := int64(28<<10) - 300 - 2048
	if got := Admittable(h); got != base-1024 {
		t.Fatalf("default: %d, want %d", got, base-1024)
	}
	h.Reserve = ReservePolicy{Fraction: 0.1, FloorMiB: 256}
	if got := Admittable(h); got != base-410 {
		t.Fatalf("0.1/256: %d, want %d", got, base-410)
	}
	h.Reserve = ReservePolicy{Fraction: 0.5, FloorMiB: 1024}
	if got := Admittable(h); got != base-2048 {
		t.Fatalf("0.5/1024: %d, want %d", got, base-2048)
	}
	h.Mode = committed // the reserve is working-set's alone
	if got, want := Admittable(h), int64(28<<10)-4096-4096-2048; got != want {
		t.Fatalf("committed with a policy: %d, want %d", got, want)
	}
	p := ReservePolicy{Fraction: 0.1, FloorMiB: 256}
	if p.Charge(workingSet, 4096, true) != 4096 || p.Charge(committed, 4096, false) != 4096 || p.Charge(none, 4096, false) != 0 ||
		p.Charge(workingSet, 4096, false) != 410 || p.Charge("bogus", -3, false) != 0 {
		t.Fatal("a policy changes only working-set stateless charges")
	}
	allocs := testing.AllocsPerRun(100, func() { _ = Admittable(h) + p.Charge(workingSet, 4096, false) })
	if allocs != 0 {
		t.Errorf("custom policy allocates %v times per run", allocs)
	}
}
