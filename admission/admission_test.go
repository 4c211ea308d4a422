package admission

import (
	"math"
	"testing"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

const (
	committed  = berth.AdmissionCommitted
	workingSet = berth.AdmissionWorkingSet
	none       = berth.AdmissionNone
)

func TestADM1_ValidMode(t *testing.T) {
	tests := []struct {
		mode string
		want bool
	}{
		{committed, true},
		{workingSet, true},
		{none, true},
		{"", false},
		{"Committed", false},
		{"working_set", false},
	}
	for _, tt := range tests {
		if got := ValidMode(tt.mode); got != tt.want {
			t.Errorf("ValidMode(%q) = %v, want %v", tt.mode, got, tt.want)
		}
	}
}

// TestADM4_Reserve pins min(configured, max(⌈configured/4⌉, 512)) at and around its corners.
func TestADM4_Reserve(t *testing.T) {
	tests := []struct {
		name       string
		configured int64
		want       int64
	}{
		{"zero", 0, 0},
		{"one MiB is never charged more than it can use", 1, 1},
		{"below floor", 511, 511},
		{"at floor", 512, 512},
		{"just above floor", 513, 512},
		{"quarter below floor", 1000, 512},
		{"quarter equals floor", 2048, 512},
		{"quarter rounds up", 2049, 513},
		{"4 GiB", 4096, 1024},
		{"10000", 10000, 2500},
		{"10001 rounds up", 10001, 2501},
		{"1 TiB", 1 << 20, 1 << 18},
		{"2^62", 1 << 62, 1 << 60},
		{"max int64 does not overflow", math.MaxInt64, 1 << 61},
		{"max int64 minus 3 is a multiple of 4", math.MaxInt64 - 3, (math.MaxInt64 - 3) / 4},
		{"negative", -1, 0},
		{"negative large", -4096, 0},
		{"min int64", math.MinInt64, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Reserve(tt.configured)); diff != "" {
				t.Errorf("Reserve(%d) (-want +got):\n%s", tt.configured, diff)
			}
		})
	}
}

// TestADM4_Charge covers every mode × stateful: full size in committed mode or for stateful
// work, the reserve for stateless work on working-set hosts, nothing on none hosts.
func TestADM4_Charge(t *testing.T) {
	tests := []struct {
		name       string
		mode       string
		configured int64
		stateful   bool
		want       int64
	}{
		{"committed stateless", committed, 4096, false, 4096},
		{"committed stateful", committed, 4096, true, 4096},
		{"working-set stateless gets the reserve", workingSet, 4096, false, 1024},
		{"working-set stateless small gets the floor", workingSet, 1000, false, 512},
		{"working-set stateless tiny gets its size", workingSet, 256, false, 256},
		{"working-set stateful is charged in full (POOL-3)", workingSet, 4096, true, 4096},
		{"none stateless", none, 4096, false, 0},
		{"none stateful", none, 4096, true, 0},
		{"unknown mode is committed", "bogus", 4096, false, 4096},
		{"empty mode is committed", "", 4096, false, 4096},
		{"committed negative size", committed, -10, false, 0},
		{"working-set negative stateful", workingSet, -10, true, 0},
		{"working-set negative stateless", workingSet, -10, false, 0},
		{"committed zero", committed, 0, false, 0},
		{"working-set max int64", workingSet, math.MaxInt64, false, 1 << 61},
		{"committed max int64", committed, math.MaxInt64, false, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Charge(tt.mode, tt.configured, tt.stateful)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Charge(%q, %d, %v) (-want +got):\n%s", tt.mode, tt.configured, tt.stateful, diff)
			}
		})
	}
}

// TestADM3_GuestCharge pins what a live guest costs per mode, including C07's clamping of
// out-of-range resident readings.
func TestADM3_GuestCharge(t *testing.T) {
	const total = 65536
	tests := []struct {
		name  string
		mode  string
		guest Guest
		want  int64
	}{
		{"committed charges configured", committed, Guest{ConfiguredMiB: 4096, ResidentMiB: 100, Measured: true}, 4096},
		{"committed ignores resident above configured", committed, Guest{ConfiguredMiB: 4096, ResidentMiB: 9000, Measured: true}, 4096},
		{"committed negative configured", committed, Guest{ConfiguredMiB: -1}, 0},
		{"unknown mode is committed", "bogus", Guest{ConfiguredMiB: 4096, ResidentMiB: 100, Measured: true}, 4096},
		{"working-set measured charges resident", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: 700, Measured: true}, 700},
		{"working-set unmeasured charges reserve (ADM-5)", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: 700}, 1024},
		{"working-set unmeasured small charges floor", workingSet, Guest{ConfiguredMiB: 1000}, 512},
		{"working-set stateful charges configured", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: 700, Stateful: true, Measured: true}, 4096},
		{"working-set stateful negative configured", workingSet, Guest{ConfiguredMiB: -5, Stateful: true}, 0},
		{"C07 negative resident clamps to 0", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: -1, Measured: true}, 0},
		{"C07 resident above total clamps to total", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: total + 1, Measured: true}, total},
		{"C07 max int64 resident clamps to total", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: math.MaxInt64, Measured: true}, total},
		{"C07 min int64 resident clamps to 0", workingSet, Guest{ConfiguredMiB: 4096, ResidentMiB: math.MinInt64, Measured: true}, 0},
		{"resident above configured is charged as measured", workingSet, Guest{ConfiguredMiB: 1024, ResidentMiB: 2048, Measured: true}, 2048},
		{"none charges nothing", none, Guest{ConfiguredMiB: 4096, ResidentMiB: 4096, Stateful: true, Measured: true}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := GuestCharge(tt.mode, tt.guest, total)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("GuestCharge(%q, %+v, %d) (-want +got):\n%s", tt.mode, tt.guest, total, diff)
			}
		})
	}
}

// TestADM2_ADM3_Admittable pins the formula of each mode and the clamping into [0, total].
func TestADM2_ADM3_Admittable(t *testing.T) {
	mixed := []Guest{
		{ConfiguredMiB: 4096, ResidentMiB: 1000, Measured: true}, // ws: 1000
		{ConfiguredMiB: 2048, ResidentMiB: 0, Measured: false},   // ws: reserve 512
		{ConfiguredMiB: 8192, ResidentMiB: 100, Stateful: true},  // ws: 8192
		{ConfiguredMiB: 1024, ResidentMiB: 300, Measured: true},  // ws: 300
	} // committed: 4096+2048+8192+1024 = 15360
	tests := []struct {
		name string
		host Host
		want int64
	}{
		{"committed empty", Host{Mode: committed, TotalMiB: 65536, HeadroomMiB: 4096, IntakeOpen: true}, 61440},
		{"committed mixed", Host{Mode: committed, TotalMiB: 65536, HeadroomMiB: 4096, IntakeOpen: true, Guests: mixed}, 61440 - 15360},
		{"working-set mixed", Host{Mode: workingSet, TotalMiB: 65536, HeadroomMiB: 4096, IntakeOpen: true, Guests: mixed}, 61440 - 1000 - 512 - 8192 - 300},
		{"none ignores guests", Host{Mode: none, TotalMiB: 65536, HeadroomMiB: 4096, IntakeOpen: true, Guests: mixed}, 61440},
		{"unknown mode is committed", Host{Mode: "bogus", TotalMiB: 65536, HeadroomMiB: 4096, IntakeOpen: true, Guests: mixed}, 61440 - 15360},
		{"ADM-8 intake closed publishes 0", Host{Mode: none, TotalMiB: 65536, HeadroomMiB: 0, IntakeOpen: false}, 0},
		{"committed exactly full", Host{Mode: committed, TotalMiB: 16384, HeadroomMiB: 1024, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: 15360}}}, 0},
		{"committed over-full clamps to 0", Host{Mode: committed, TotalMiB: 16384, HeadroomMiB: 1024, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: 15360}, {ConfiguredMiB: 4096}}}, 0},
		{"headroom above total clamps to 0", Host{Mode: none, TotalMiB: 1024, HeadroomMiB: 4096, IntakeOpen: true}, 0},
		{"negative headroom is no headroom", Host{Mode: none, TotalMiB: 1024, HeadroomMiB: -4096, IntakeOpen: true}, 1024},
		{"zero total", Host{Mode: none, TotalMiB: 0, IntakeOpen: true}, 0},
		{"negative total", Host{Mode: none, TotalMiB: -1, IntakeOpen: true}, 0},
		{"C07 negative resident does not add room", Host{Mode: workingSet, TotalMiB: 8192, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: 1024, ResidentMiB: -1 << 40, Measured: true}}}, 8192},
		{"C07 huge resident clamps, never wraps", Host{Mode: workingSet, TotalMiB: 8192, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: 1024, ResidentMiB: math.MaxInt64, Measured: true}, {ConfiguredMiB: 1024, ResidentMiB: math.MaxInt64, Measured: true}}}, 0},
		{"committed max int64 guests never wrap", Host{Mode: committed, TotalMiB: math.MaxInt64, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: math.MaxInt64}, {ConfiguredMiB: math.MaxInt64}}}, 0},
		{"max total with negative guests", Host{Mode: committed, TotalMiB: math.MaxInt64, HeadroomMiB: math.MinInt64, IntakeOpen: true, Guests: []Guest{{ConfiguredMiB: math.MinInt64}}}, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Admittable(tt.host)); diff != "" {
				t.Errorf("Admittable (-want +got):\n%s", diff)
			}
		})
	}
}

// TestADM7_Fits pins admittable − pending ≥ charge, including inputs that would overflow a
// naive subtraction.
func TestADM7_Fits(t *testing.T) {
	tests := []struct {
		name                        string
		admittable, pending, charge int64
		want                        bool
	}{
		{"plenty", 8192, 0, 1024, true},
		{"exact fit", 8192, 7168, 1024, true},
		{"one short", 8192, 7169, 1024, false},
		{"zero charge fits empty host", 0, 0, 0, true},
		{"zero charge on over-reserved host", 0, 1, 0, false},
		{"negative pending counts as 0", 1024, -4096, 1024, true},
		{"negative charge counts as 0", 0, 0, -1, true},
		{"negative admittable never fits", -1, 0, 0, false},
		{"min int64 admittable with pending does not wrap", math.MinInt64, 1, 0, false},
		{"negative admittable with max pending does not wrap", -5, math.MaxInt64, 0, false},
		{"max admittable max charge", math.MaxInt64, 0, math.MaxInt64, true},
		{"max admittable max pending", math.MaxInt64, math.MaxInt64, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Fits(tt.admittable, tt.pending, tt.charge)
			if got != tt.want {
				t.Errorf("Fits(%d, %d, %d) = %v, want %v", tt.admittable, tt.pending, tt.charge, got, tt.want)
			}
		})
	}
}

// TestCase_C07_ClampResident pins the clamping of resident readings and the out-of-range flag
// the agent counts as a measurement error.
func TestCase_C07_ClampResident(t *testing.T) {
	type result struct {
		MiB      int64
		OutRange bool
	}
	tests := []struct {
		name            string
		resident, total int64
		want            result
	}{
		{"in range", 1000, 8192, result{1000, false}},
		{"zero", 0, 8192, result{0, false}},
		{"exactly total", 8192, 8192, result{8192, false}},
		{"one over total", 8193, 8192, result{8192, true}},
		{"negative (trace value -1.2e-05 rounds to a tiny negative)", -1, 8192, result{0, true}},
		{"min int64", math.MinInt64, 8192, result{0, true}},
		{"max int64", math.MaxInt64, 8192, result{8192, true}},
		{"unknown total leaves positives alone", 1 << 40, 0, result{1 << 40, false}},
		{"unknown total still clamps negatives", -7, 0, result{0, true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got result
			got.MiB, got.OutRange = ClampResident(tt.resident, tt.total)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ClampResident(%d, %d) (-want +got):\n%s", tt.resident, tt.total, diff)
			}
		})
	}
}

func TestAdmittableAllocatesNothing(t *testing.T) {
	h := Host{Mode: workingSet, TotalMiB: 65536, HeadroomMiB: 2048, IntakeOpen: true,
		Guests: []Guest{{ConfiguredMiB: 4096, ResidentMiB: 900, Measured: true}, {ConfiguredMiB: 2048}}}
	var sink int64
	allocs := testing.AllocsPerRun(100, func() {
		sink += Admittable(h) + Charge(workingSet, 4096, false)
	})
	if allocs != 0 {
		t.Errorf("Admittable+Charge allocate %v times per run, want 0", allocs)
	}
	_ = sink
}
