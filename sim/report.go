package sim

import (
	"slices"
	"time"
)

// Report is one policy's outcome (SIM-1). Counts are events over the whole run; densities are
// live sandboxes per live host; times are seconds of virtual time.
type Report struct {
	Policy string
	Hosts  int

	Creates  int // creates the workload sent (evacuation recreates not included)
	Admitted int // creates that started, at the first try or after retries
	GaveUp   int // creates refused until the SDK's deadline (CapacityUnavailable, SDK-2) or never retried

	MeanPerHost float64 // time-averaged over the run
	PeakPerHost float64
	BusiestHost int // the most sandboxes one host held at once (pack fills hosts, spread levels them)

	// Refusals counts 503 answers by code (API-2; a create refused three times counts three);
	// Reasons counts them by the rejection reason most hosts gave (PLC-10).
	Refusals map[string]int
	Reasons  map[string]int

	// Hops the scheduler took inside one create (PLC-7): the ledger said no (another create
	// took the room), the agent's local gate said no (AGT-2: a stale verdict), Pick chose a
	// cordoned host (the replica's cache had not seen the cordon, PLC-5), or its agent was gone.
	LedgerRaces   int
	AgentRefusals int
	CordonMisses  int
	Unreachable   int
	// OverGrants counts reservations a per-replica ledger granted that the shared ledger,
	// holding every replica's reservations, would have refused (LED-1's failure mode).
	OverGrants int

	OOMKills  int // kernel OOM kills: guests' resident memory would exceed the host
	Evictions int // ADM-9 evictions by the agent before the kernel had to act

	RefusedThenOK int     // creates refused at least once that then started
	TTSP50        float64 // time from first refusal to success, seconds (MET-4)
	TTSP99        float64

	Losses       []LossStat // [0] silent losses, then one per notice window
	EvacSavedPct float64    // guests saved ÷ guests on lost hosts, all losses

	Series []Sample
}

// LossStat is what host losses of one kind cost: guests on those hosts when the loss began
// (the notice, or the silent end), guests the evacuation plan saved (recreated from their
// template or snapshot-moved, and started elsewhere through the scheduler, SPOT-3), guests
// that ended on their own inside the window, and the rest, lost (a planned loss, a recreate
// refused until the SDK's deadline, killed before it could leave, or no notice at all).
type LossStat struct {
	Kind   string
	Hosts  int
	Guests int
	Saved  int
	Ended  int // finished their work on their own inside the notice window
	Lost   int
}

// SavedPct is Saved ÷ Guests in percent (0 with no guests).
func (l LossStat) SavedPct() float64 {
	if l.Guests == 0 {
		return 0
	}
	return 100 * float64(l.Saved) / float64(l.Guests)
}

// Sample is one point of the density and refusal series: at T seconds, live sandboxes per
// live host, and refusals, kernel OOM kills and evictions since the previous sample.
type Sample struct {
	T         float64
	PerHost   float64
	Refused   int
	OOMKills  int
	Evictions int
}

// maxSamples bounds a series: past it, neighbouring samples merge and the period doubles.
const maxSamples = 2000

type sampleAcc struct {
	every, next              int64
	refused, ooms, evictions int
	series                   []Sample
	sumPerHost, peak         float64
	weight                   float64
	started                  bool
	lastT                    int64
	lastPerHost              float64
	hostsUp                  int
}

// advance records the samples due before t, and integrates density over time.
func (a *sampleAcc) advance(e *engine, t int64) {
	if !a.started {
		a.started = true
		a.every = int64(e.s.SampleEvery)
		if a.every <= 0 {
			a.every = int64(10 * time.Second)
		}
		a.next = a.every
		a.hostsUp = e.s.Hosts
	}
	perHost := 0.0
	if a.hostsUp > 0 {
		perHost = float64(e.live) / float64(a.hostsUp)
	}
	if t > a.lastT {
		dt := float64(t - a.lastT)
		a.sumPerHost += perHost * dt
		a.weight += dt
		a.lastT = t
	}
	a.peak = max(a.peak, perHost)
	for a.next <= t {
		a.series = append(a.series, Sample{T: float64(a.next) / 1e9, PerHost: perHost, Refused: a.refused, OOMKills: a.ooms, Evictions: a.evictions})
		a.refused, a.ooms, a.evictions = 0, 0, 0
		a.next += a.every
		if len(a.series) >= maxSamples {
			a.halve()
		}
	}
}

// halve merges neighbouring samples and doubles the sampling period.
func (a *sampleAcc) halve() {
	n := len(a.series) / 2
	for i := range n {
		x, y := a.series[2*i], a.series[2*i+1]
		a.series[i] = Sample{T: y.T, PerHost: (x.PerHost + y.PerHost) / 2, Refused: x.Refused + y.Refused,
			OOMKills: x.OOMKills + y.OOMKills, Evictions: x.Evictions + y.Evictions}
	}
	a.series = a.series[:n]
	a.every *= 2
	a.next = int64(n+1) * a.every
}

func (r *Report) lossCount() int {
	n := 0
	for _, l := range r.Losses[1:] {
		n += l.Hosts
	}
	return n
}

// finish computes the report's summaries.
func (e *engine) finish() {
	r := &e.r
	a := &e.sample
	if a.weight > 0 {
		r.MeanPerHost = a.sumPerHost / a.weight
	}
	r.PeakPerHost = a.peak
	r.Series = a.series
	r.RefusedThenOK = len(e.tts)
	if len(e.tts) > 0 {
		slices.Sort(e.tts)
		pct := func(p float64) float64 {
			i := min(int(p*float64(len(e.tts))), len(e.tts)-1)
			return float64(e.tts[i]) / 1e9
		}
		r.TTSP50, r.TTSP99 = pct(0.50), pct(0.99)
	}
	var guests, saved int
	for i := range r.Losses {
		l := &r.Losses[i]
		l.Lost = l.Guests - l.Saved - l.Ended
		guests += l.Guests
		saved += l.Saved
	}
	if guests > 0 {
		r.EvacSavedPct = 100 * float64(saved) / float64(guests)
	}
}
