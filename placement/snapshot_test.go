package placement

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"pgregory.net/rapid"
)

// TestSnapshotPick_MatchesPick: a Snapshot's Pick returns exactly the reference's Decision,
// and the package Pick's (chosen index for the same seed, charge, live count, every
// rejection count), on random fleets full of ties and extreme values cut into blocks of 1…64
// hosts, for any request and both strategies, after random Set calls (PLC-2, PLC-10).
func TestSnapshotPick_MatchesPick(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		hosts := fleetGen.Draw(t, "hosts")
		if rapid.Bool().Draw(t, "more") {
			hosts = append(hosts, rapid.SliceOfN(hostGen, 0, 80).Draw(t, "extra")...)
		}
		shift := uint(rapid.SampledFrom([]int{0, 1, 2, 3, blockShift}).Draw(t, "shift"))
		s := newSnapshot(append([]Host(nil), hosts...), shift)
		if len(hosts) > 0 {
			for range rapid.IntRange(0, 6).Draw(t, "sets") {
				i := rapid.IntRange(0, len(hosts)-1).Draw(t, "i")
				h := hostGen.Draw(t, "h")
				if rapid.Bool().Draw(t, "pendingOnly") {
					h = s.Hosts()[i]
					h.PendingMiB = anyMiB().Draw(t, "pending")
				}
				s.Set(i, h)
				hosts[i] = h
			}
		}
		if err := sameIndex(s, newSnapshot(append([]Host(nil), hosts...), shift)); err != "" {
			t.Fatalf("after Set: %s", err)
		}
		req := requestGen().Draw(t, "req")
		opt := optionsGen().Draw(t, "opt")
		seed := rapid.Uint64().Draw(t, "seed")
		want := pickReference(hosts, req, now, opt, seed)
		if got := Pick(hosts, req, now, opt, seed); got != want {
			t.Fatalf("Pick = %+v, reference = %+v", got, want)
		}
		if got := s.Pick(req, now, opt, seed); got != want {
			t.Fatalf("Snapshot.Pick = %+v, reference = %+v", got, want)
		}
	})
}

// TestSnapshotPick_LargeFleetMatchesPick: on the benchmark's fleet of 5,000 hosts (blocks of
// 64 and of 16), with some hosts whose CPU figures make a NaN or infinite score, 600 random
// unconstrained requests (sizes from 0 to beyond any host, both strategies, cutoffs that make
// from none to most hosts stale) get the package Pick's Decision, while hosts change through
// Set between requests.
func TestSnapshotPick_LargeFleetMatchesPick(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 16))
	for _, shift := range []uint{blockShift, 4} {
		hosts := benchFleet(5000, 42)
		spare := benchFleet(500, 43)
		for i := 0; i < len(hosts); i += 997 {
			hosts[i].CPUUsed = math.NaN()
			hosts[i+1].CPUTotal = math.Inf(1)
			hosts[i+2].CPUUsed = math.Inf(1)
		}
		s := newSnapshot(hosts, shift)
		policies := []admission.ReservePolicy{{}, {Fraction: 0.5, FloorMiB: 1024}, {Fraction: 1}}
		for n := range 600 {
			switch i := r.IntN(len(hosts)); r.IntN(3) {
			case 0:
				h := s.Hosts()[i]
				h.PendingMiB = max(h.PendingMiB+r.Int64N(8192)-4096, 0)
				s.Set(i, h)
			case 1:
				s.Set(i, spare[r.IntN(len(spare))])
			}
			req := Request{MemoryMiB: []int64{0, 512, 2048, 8192, 200 << 10, 1 << 40}[r.IntN(6)]}
			opt := Options{
				Strategy:       []string{Spread, Pack}[r.IntN(2)],
				StaleAfterNano: []int64{0, int64(2 * time.Second), int64(5 * time.Second), int64(time.Hour)}[r.IntN(4)],
				Reserve:        policies[r.IntN(len(policies))],
			}
			seed := r.Uint64()
			want := Pick(s.Hosts(), req, now, opt, seed)
			if got := s.Pick(req, now, opt, seed); got != want {
				t.Fatalf("shift %d, request %d %+v %+v: Snapshot.Pick = %+v, Pick = %+v", shift, n, req, opt, got, want)
			}
		}
		if err := sameIndex(s, newSnapshot(append([]Host(nil), s.Hosts()...), shift)); err != "" {
			t.Fatalf("shift %d after Set: %s", shift, err)
		}
	}
}

// TestSnapshotPick_TiesAcrossBlocks: identical hosts in many blocks tie; the snapshot draws
// the same winner as Pick for every seed, so a burst still spreads over all of them (PLC-2).
func TestSnapshotPick_TiesAcrossBlocks(t *testing.T) {
	hosts := make([]Host, 40)
	for i := range hosts {
		hosts[i] = host("h", mode(berth.AdmissionWorkingSet))
	}
	hosts[17].Draining = true
	s := newSnapshot(hosts, 2)
	seen := map[int]bool{}
	for seed := range uint64(2000) {
		want := Pick(hosts, Request{MemoryMiB: 2048}, now, Options{}, seed)
		got := s.Pick(Request{MemoryMiB: 2048}, now, Options{}, seed)
		if got != want {
			t.Fatalf("seed %d: Snapshot.Pick = %+v, Pick = %+v", seed, got, want)
		}
		seen[got.Index] = true
	}
	if len(seen) != len(hosts)-1 {
		t.Errorf("%d of %d tied hosts ever chosen", len(seen), len(hosts)-1)
	}
}

// TestPLC8_SnapshotPickAllocatesNothing: Snapshot.Pick is arithmetic over memory (PLC-8),
// on its indexed path and on its fallback.
func TestPLC8_SnapshotPickAllocatesNothing(t *testing.T) {
	s := NewSnapshot(benchFleet(500, 1))
	for _, req := range []Request{{MemoryMiB: 2048}, {MemoryMiB: 2048, Exclude: []int{3, 9}}} {
		var seed uint64
		allocs := testing.AllocsPerRun(50, func() {
			seed++
			sinkDecision = s.Pick(req, now, Options{}, seed)
		})
		if allocs != 0 {
			t.Errorf("Snapshot.Pick(%+v) allocates %v times per call, want 0", req, allocs)
		}
	}
}

// sameIndex reports how the index of got differs from want's ("" when it does not): block
// summaries, per-host modes, and each block's sorted segments as multisets in order.
func sameIndex(got, want *Snapshot) string {
	if !slices.Equal(got.modes, want.modes) {
		return fmt.Sprintf("modes %v, want %v", got.modes, want.modes)
	}
	for k := range want.blocks {
		g, w := got.blocks[k], want.blocks[k]
		if g.counts != w.counts || g.nElig != w.nElig || !(g.bound == w.bound || g.bound != g.bound && w.bound != w.bound) {
			return fmt.Sprintf("block %d = %+v, want %+v", k, g, w)
		}
		lo := k << want.shift
		hi := min(lo+1<<want.shift, len(want.hosts))
		bySeen := func(x, y seenEnt) int { return cmp.Or(cmp.Compare(x.seen, y.seen), cmp.Compare(x.i, y.i)) }
		gs, ws := slices.Clone(got.seen[lo:hi]), slices.Clone(want.seen[lo:hi])
		if !slices.IsSortedFunc(gs, func(x, y seenEnt) int { return cmp.Compare(x.seen, y.seen) }) {
			return fmt.Sprintf("block %d heartbeat order not sorted: %v", k, gs)
		}
		slices.SortFunc(gs, bySeen)
		slices.SortFunc(ws, bySeen)
		if !slices.Equal(gs, ws) {
			return fmt.Sprintf("block %d heartbeat entries %v, want %v", k, gs, ws)
		}
		byFree := func(x, y freeEnt) int { return cmp.Or(cmp.Compare(x.free, y.free), cmp.Compare(x.mode, y.mode)) }
		gf, wf := slices.Clone(got.elig[lo:lo+int(g.nElig)]), slices.Clone(want.elig[lo:lo+int(w.nElig)])
		if !slices.IsSortedFunc(gf, func(x, y freeEnt) int { return cmp.Compare(x.free, y.free) }) {
			return fmt.Sprintf("block %d free order not sorted: %v", k, gf)
		}
		slices.SortFunc(gf, byFree)
		slices.SortFunc(wf, byFree)
		if !slices.Equal(gf, wf) {
			return fmt.Sprintf("block %d free entries %v, want %v", k, gf, wf)
		}
	}
	return ""
}
