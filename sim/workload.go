package sim

import (
	"math"
	"slices"
	"time"

	"github.com/berth-dev/berth/admission"
)

// Arrival is one create a workload asks for (SIM-1). Times are virtual nanoseconds since
// the start of the run; memory is MiB.
type Arrival struct {
	At              int64 // when the create is first sent
	MemoryMiB       int64 // configured size
	Lifetime        int64 // how long it runs once started; 0: until the end of the run
	Stateful        bool  // charged in full, never evicted (ADM-4, ADM-9, POOL-3)
	Reconstructible bool  // authoritative copy outside the guest: an evacuation recreates it (SPOT-3)
	Key             uint64
}

// Workload is a stream of creates and the resident memory of the guests they start.
//
// Next returns the creates in non-decreasing At order and false when the stream ends.
// Resident returns a guest's resident MiB at age (nanoseconds since it first started) and the
// age at which it next changes, or −1 when it never changes again: resident memory is
// piecewise constant, so the engine visits a guest only when it changes.
type Workload interface {
	Next() (Arrival, bool)
	Resident(a *Arrival, age int64) (mib, next int64)
}

// IdleModel is the idle-sandbox workload (SIM-1 workload a): Poisson arrivals (or a fixed
// interval), lognormal lifetimes, guests that touch TouchMiB once started and grow by
// GrowthFrac of their configured size over GrowthOver, and a share of guests that spike
// toward their configured size for a while. Sizes MiB, durations as time.Duration.
type IdleModel struct {
	Creates    int
	RatePerSec float64       // Poisson arrival rate; ignored when Interval > 0
	Interval   time.Duration // fixed spacing between creates (the seed arithmetic)
	MemoryMiB  int64         // configured size of every guest

	LifetimeMedian time.Duration // lognormal median; 0: guests live until the end of the run
	LifetimeSigma  float64       // lognormal σ; 0: every guest lives exactly the median

	TouchMiB    int64   // resident right after start
	TouchJitter float64 // ± share of TouchMiB, uniform per guest

	GrowthFrac  float64       // touched size grows by this share of configured memory…
	GrowthOver  time.Duration // …over this long…
	GrowthSteps int           // …in this many steps (default 4)

	SpikeProb   float64       // share of guests that spike once
	SpikeFrac   float64       // a spiking guest's resident, as a share of configured memory
	SpikeFor    time.Duration // how long a spike lasts
	SpikeWithin time.Duration // a spike starts uniformly within this age (default 10 min)

	StatefulFrac        float64
	ReconstructibleFrac float64
	Seed                uint64
}

type idle struct {
	m   IdleModel
	rng rng
	n   int
	t   float64 // seconds
}

// NewIdle returns m's stream of creates; the same model gives the same stream.
func NewIdle(m IdleModel) Workload {
	if m.GrowthSteps <= 0 {
		m.GrowthSteps = 4
	}
	if m.SpikeWithin <= 0 {
		m.SpikeWithin = 10 * time.Minute
	}
	return &idle{m: m, rng: newRNG(m.Seed ^ 0x1d1e)}
}

// maxLifetime (ns, about 146 years) caps a lognormal lifetime draw: a guest drawn to live
// longer lives to the end of any run. Uncapped, a draw past 2^63 ns (a long median with a wide
// σ, or --lifetime 2562047h) converted to a negative int64 and the guest lived 1 s; the cap
// keeps a start time plus the lifetime inside an int64 as well.
const maxLifetime = float64(math.MaxInt64 / 2)

func (w *idle) Next() (Arrival, bool) {
	if w.n >= w.m.Creates {
		return Arrival{}, false
	}
	w.n++
	switch {
	case w.m.Interval > 0:
		if w.n > 1 {
			w.t += w.m.Interval.Seconds()
		}
	case w.m.RatePerSec > 0:
		w.t += w.rng.exp() / w.m.RatePerSec
	}
	// An arrival drawn past maxLifetime (146 years; a long run at a tiny --rate) arrives then:
	// converted unclamped, a time past 2^63 ns was negative and the guest arrived before the run.
	a := Arrival{At: int64(min(w.t*1e9, maxLifetime)), MemoryMiB: w.m.MemoryMiB, Key: w.rng.next()}
	if w.m.LifetimeMedian > 0 {
		l := float64(w.m.LifetimeMedian) * math.Exp(w.m.LifetimeSigma*w.rng.norm())
		a.Lifetime = max(int64(min(l, maxLifetime)), int64(time.Second))
	}
	a.Stateful = w.rng.float() < w.m.StatefulFrac
	a.Reconstructible = w.rng.float() < w.m.ReconstructibleFrac
	return a, true
}

func (w *idle) Resident(a *Arrival, age int64) (int64, int64) {
	m, c := &w.m, a.MemoryMiB
	next := int64(-1)
	soonest := func(t int64) {
		if t > age && (next < 0 || t < next) {
			next = t
		}
	}
	base := float64(m.TouchMiB) * (1 + m.TouchJitter*(2*unit(a.Key, 1)-1))
	if m.GrowthFrac > 0 && m.GrowthOver > 0 {
		step := int64(m.GrowthOver) / int64(m.GrowthSteps)
		k := min(age/max(step, 1), int64(m.GrowthSteps))
		base += m.GrowthFrac * float64(c) * float64(k) / float64(m.GrowthSteps)
		if k < int64(m.GrowthSteps) {
			soonest((k + 1) * step)
		}
	}
	if m.SpikeProb > 0 && unit(a.Key, 2) < m.SpikeProb {
		s0 := int64(unit(a.Key, 3) * float64(m.SpikeWithin))
		s1 := s0 + int64(m.SpikeFor)
		if age >= s0 && age < s1 {
			base = max(base, m.SpikeFrac*float64(c))
		}
		soonest(s0)
		soonest(s1)
	}
	return min(max(int64(base), 0), c), next
}

// TraceWorkload replays the Alibaba pod list (arrivals, lifetimes, configured sizes) with each
// pod's resident ÷ configured following one measured utilisation series (pod i follows series
// i mod len), one sample per Step (SIM-1 workload b). Negative readings clamp to 0 (C07).
type TraceWorkload struct {
	Pods                []Pod
	Util                [][]float64
	Step                time.Duration // default 300 s
	ReconstructibleFrac float64
	Seed                uint64
}

type trace struct {
	w    TraceWorkload
	pods []int // indices into w.Pods, by arrival
	i    int
	step int64
}

// NewTrace returns the trace's stream of creates.
func NewTrace(w TraceWorkload) Workload {
	t := &trace{w: w, step: int64(w.Step)}
	if t.step <= 0 {
		t.step = int64(300 * time.Second)
	}
	t.pods = make([]int, len(w.Pods))
	for i := range t.pods {
		t.pods[i] = i
	}
	slices.SortStableFunc(t.pods, func(a, b int) int {
		return int(min(max(w.Pods[a].Arrival-w.Pods[b].Arrival, -1), 1))
	})
	return t
}

func (t *trace) Next() (Arrival, bool) {
	if t.i >= len(t.pods) {
		return Arrival{}, false
	}
	i := t.pods[t.i]
	t.i++
	p := t.w.Pods[i]
	a := Arrival{At: p.Arrival * 1e9, MemoryMiB: p.MemoryMiB, Key: uint64(i)}
	if p.Departure > p.Arrival {
		a.Lifetime = (p.Departure - p.Arrival) * 1e9
	}
	a.Reconstructible = unit(uint64(i)^t.w.Seed, 4) < t.w.ReconstructibleFrac
	return a, true
}

func (t *trace) Resident(a *Arrival, age int64) (int64, int64) {
	if len(t.w.Util) == 0 {
		return a.MemoryMiB, -1
	}
	s := t.w.Util[a.Key%uint64(len(t.w.Util))]
	if len(s) == 0 {
		return a.MemoryMiB, -1
	}
	k := age / t.step
	r, _ := admission.ClampResident(int64(s[k%int64(len(s))]*float64(a.MemoryMiB)), a.MemoryMiB)
	return r, (k + 1) * t.step
}

// rng is a small deterministic PRNG (SplitMix64): the same seed gives the same run.
type rng struct{ s uint64 }

func newRNG(seed uint64) rng { return rng{s: seed} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix(r.s)
}

// float returns a uniform value in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// exp returns an exponential variate with mean 1.
func (r *rng) exp() float64 { return -math.Log(1 - r.float()) }

// norm returns a standard normal variate (Box–Muller).
func (r *rng) norm() float64 {
	u1, u2 := 1-r.float(), r.float()
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

func mix(x uint64) uint64 {
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// unit returns a uniform value in [0, 1) drawn from a guest's key: the i-th independent
// property of that guest, the same every time it is asked.
func unit(key uint64, i uint64) float64 {
	return float64(mix(key+i*0x9e3779b97f4a7c15)>>11) / (1 << 53)
}
