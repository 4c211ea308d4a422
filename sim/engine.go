package sim

import (
	"slices"
	"strconv"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/admission"
	"github.com/berth-dev/berth/placement"
)

// Scenario is the fleet and the control plane's timing: everything but the policy under test
// (SIM-1). Memory is MiB; durations are virtual time. Zero values take the defaults noted.
type Scenario struct {
	Hosts       int
	HostMiB     int64
	HeadroomMiB int64

	Replicas     int           // scheduler replicas (default 1); creates go round-robin
	Heartbeat    time.Duration // agent heartbeat period (AGT-1, default 10 s)
	MeasureAfter time.Duration // first measurement of a new guest (ADM-5, default 1 s)
	RefreshEvery time.Duration // a replica's cache of the agent table and ledger (PLC-5, default 1 s)
	// CordonDelay is how long a cordon takes to reach every replica's placement through the
	// push path (PLC-5, default 0.5 s); negative: no push, replicas learn at their next refresh.
	CordonDelay time.Duration
	ReserveTTL  time.Duration // ledger reservation TTL (LED-2, default 60 s)
	StaleAfter  time.Duration // staleness cutoff (PLC-1, default 30 s)
	MaxHosts    int           // hosts tried per create (PLC-7, default 3)

	// Retry makes a refused create retry like the SDK (SDK-1): Retry-After when RetryAfter
	// (the server's API-3 estimate), else full jitter over berth.Backoff; until SDKDeadline
	// (default 90 s). Without Retry a refused create is dropped.
	Retry       bool
	RetryAfter  bool
	SDKDeadline time.Duration

	// PressureKnee is the share of a host's memory in use where memory pressure (PSI some
	// avg10) starts; it rises linearly to 100 % at a full host (default 0.9).
	PressureKnee float64

	Failures Failures

	SampleEvery time.Duration // density and refusal samples for the report (default: 200 per run)
	Tail        time.Duration // the run ends this long after the last arrival (default 5 min)
	Seed        uint64
}

// Failures are host losses (SPOT-3, SPOT-5). Losses arrive as a Poisson process at
// LossPerHostHour per live host; a share NoticeFrac come with a preemption notice whose
// window cycles through Notices; the rest vanish silently. Evacuation under a notice is
// planned by evacuate.Triage over a link of LinkMiBps, with a hard deadline Margin inside
// the window; CanSnapshot says whether the runtime can snapshot guests (SPOT-4).
type Failures struct {
	LossPerHostHour float64
	NoticeFrac      float64
	Notices         []time.Duration
	LinkMiBps       float64
	Margin          time.Duration // default 5 s
	CanSnapshot     bool
	// Scheduled are losses at fixed times on fixed hosts, besides the Poisson process.
	Scheduled []ScheduledLoss
}

// ScheduledLoss loses host Host (an index) at At, after a preemption notice of Notice
// (0: silently).
type ScheduledLoss struct {
	At     time.Duration
	Host   int
	Notice time.Duration
}

// Policy is one column of the side-by-side comparison (SIM-1).
type Policy struct {
	Name     string
	Mode     string // admission mode of every agent (ADM-1)
	Strategy string // placement.Spread or placement.Pack (PLC-2)
	// PerReplicaLedger gives each replica a ledger of its own instead of the shared one
	// (LED-1's failure mode): each replica subtracts only its own reservations.
	PerReplicaLedger bool
	// Gate turns on the agent's pressure gate (ADM-8) and eviction past the critical line
	// (ADM-9); off, hosts that lose the bet meet the kernel OOM killer.
	Gate bool
	// TrustScheduler turns the agent's local gate (AGT-2) off, so what the ledger admits is
	// what starts: it shows what a ledger alone would let through.
	TrustScheduler bool
	// Reserve is the working-set reserve's fraction and floor (ADM-4) on every host: what the
	// agents' Admittable and local gate (admission.Host.Reserve) and the scheduler's Pick
	// (placement.Options.Reserve) charge an unmeasured stateless guest. The zero value is
	// ADM-4's default (¼, 512 MiB), as on real agents.
	Reserve admission.ReservePolicy
}

func (s Scenario) withDefaults() Scenario {
	s.Replicas = max(s.Replicas, 1)
	s.Heartbeat = orDur(s.Heartbeat, 10*time.Second)
	s.MeasureAfter = orDur(s.MeasureAfter, time.Second)
	s.RefreshEvery = orDur(s.RefreshEvery, time.Second)
	if s.CordonDelay == 0 {
		s.CordonDelay = 500 * time.Millisecond
	}
	s.ReserveTTL = orDur(s.ReserveTTL, 60*time.Second)
	s.StaleAfter = orDur(s.StaleAfter, 30*time.Second)
	if s.MaxHosts <= 0 {
		s.MaxHosts = 3
	}
	s.SDKDeadline = orDur(s.SDKDeadline, 90*time.Second)
	if s.PressureKnee <= 0 || s.PressureKnee >= 1 {
		s.PressureKnee = 0.9
	}
	s.Tail = orDur(s.Tail, 5*time.Minute)
	s.Failures.Margin = orDur(s.Failures.Margin, 5*time.Second)
	s.Failures.Notices = slices.Clone(s.Failures.Notices)
	for _, l := range s.Failures.Scheduled {
		if l.Notice > 0 && !slices.Contains(s.Failures.Notices, l.Notice) {
			s.Failures.Notices = append(s.Failures.Notices, l.Notice)
		}
	}
	return s
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// guest is a running sandbox.
type guest struct {
	create   int32
	host     int32
	bi       int32 // index in its host's books
	resident int64
	born     int64 // started on this host
	end      int64 // lifetime ends (0: never)
	ageBase  int64 // workload age at start: an evacuated guest carries on where it was
	dead     bool
	saved    bool // its evacuation recreate started elsewhere
}

// createReq is one create as the SDK sends it, with its retries.
type createReq struct {
	a            Arrival
	first        int64
	firstRefusal int64 // −1 until refused once
	attempt      int32
	ageBase      int64
	evac         int8  // 0: a client's create; k+1: an evacuation recreate after a loss of kind k
	src          int32 // an evacuation recreate's guest on the lost host
}

// simHost is a host and its agent. books is the agent's view (AGT-2): every guest it holds,
// charged by admission.Admittable exactly as the real agent's local gate does.
type simHost struct {
	books       []admission.Guest
	gids        []int32
	born        []int64
	resident    int64
	alive       bool
	draining    bool
	gate        admission.PressureGate
	phase       int64
	diedAt      int64
	hbPending   bool
	tickPending bool
	critTicks   int
	noticeKind  int     // loss kind + 1 while under a preemption notice
	unnetted    []int32 // reservations the agent's next heartbeat nets out (LED-4)
}

type reservation struct {
	host    int32
	owner   int32
	mib     int64
	expires int64
	live    bool
}

// replica is one scheduler replica: its cached snapshot of the agent table and ledger
// (refreshed on its own period), its per-replica ledger when the policy has one, and its
// own tie-breaking seed (PLC-2).
type replica struct {
	snap        []placement.Host
	pend        []int64
	refreshedAt int64
	logPos      int
	seed        uint64
}

const fresh = int64(1) << 62 // LastSeenNano of a live host: its heartbeats always beat the cutoff

// engine is one run of one policy.
type engine struct {
	s   Scenario
	p   Policy
	w   Workload
	now int64
	end int64
	q   eventHeap
	rng rng

	hosts    []simHost
	store    []placement.Host // the agent table as the last heartbeats published it
	pending  []int64          // shared ledger: Σ live reservations per host (LED-1)
	log      []int32          // hosts whose store row or ledger changed, for incremental refresh
	logBase  int
	reps     []replica
	res      []reservation
	resFIFO  int
	guests   []guest
	creates  []createReq
	departs  eventHeap // departure times of guests, for the Retry-After estimate (API-3)
	alive    []int32   // live hosts, for the loss process
	live     int
	lastArr  int64
	arrDone  bool
	critLine int64 // ADM-9 floor of available MiB

	r      Report
	tts    []int64
	sample sampleAcc
}

func newEngine(s Scenario, p Policy, w Workload) *engine {
	s = s.withDefaults()
	if p.Mode == "" {
		p.Mode = berth.AdmissionWorkingSet
	}
	if p.Strategy == "" {
		p.Strategy = placement.Spread
	}
	if p.Name == "" {
		p.Name = p.Mode
	}
	e := &engine{s: s, p: p, w: w, rng: newRNG(s.Seed), end: -1}
	e.hosts = make([]simHost, s.Hosts)
	e.store = make([]placement.Host, s.Hosts)
	e.pending = make([]int64, s.Hosts)
	e.critLine = max(s.HostMiB/20, 64) // the agent's default EvictFloorMiB
	for i := range e.hosts {
		h := &e.hosts[i]
		h.alive = true
		h.gate = admission.DefaultPressureGate()
		h.phase = int64(e.rng.next() % uint64(s.Heartbeat))
		e.store[i] = placement.Host{ID: "h" + strconv.Itoa(i), LastSeenNano: fresh, Mode: p.Mode, IntakeOpen: true,
			AdmittableMiB: e.agentAdmittable(i)}
		e.alive = append(e.alive, int32(i))
	}
	e.reps = make([]replica, s.Replicas)
	for i := range e.reps {
		r := &e.reps[i]
		r.snap = make([]placement.Host, s.Hosts)
		copy(r.snap, e.store)
		if p.PerReplicaLedger {
			r.pend = make([]int64, s.Hosts)
		}
		r.seed = mix(s.Seed + uint64(i)*0x51ed27)
	}
	e.r = Report{Policy: p.Name, Hosts: s.Hosts, Refusals: map[string]int{}, Reasons: map[string]int{}}
	for range len(s.Failures.Notices) + 1 {
		e.r.Losses = append(e.r.Losses, LossStat{})
	}
	for i := range e.r.Losses {
		e.r.Losses[i].Kind = "silent"
		if i > 0 {
			e.r.Losses[i].Kind = "notice " + s.Failures.Notices[i-1].String()
		}
	}
	return e
}

// Run simulates policy p on scenario s with workload w and returns the report (SIM-1). The
// same inputs give the same report, field for field.
func (s Scenario) Run(p Policy, w Workload) Report {
	e := newEngine(s, p, w)
	e.run()
	return e.r
}

func (e *engine) run() {
	e.nextArrival()
	if e.s.Failures.LossPerHostHour > 0 {
		e.scheduleLoss()
	}
	for i, l := range e.s.Failures.Scheduled {
		if l.Host >= 0 && l.Host < len(e.hosts) {
			e.q.push(int64(l.At), evLoss, int32(i+1))
		}
	}
	for e.q.len() > 0 {
		ev := e.q.top()
		if e.end >= 0 && ev.at > e.end {
			break
		}
		e.q.pop()
		e.advance(ev.at)
		switch ev.kind {
		case evArrive:
			e.arrive(ev.id)
		case evAttempt:
			e.attempt(ev.id)
		case evChange:
			e.change(ev.id)
		case evDepart:
			if g := &e.guests[ev.id]; !g.dead {
				if k := e.hosts[g.host].noticeKind; k > 0 && !g.saved {
					e.r.Losses[k-1].Ended++ // finished its work inside the window: not lost
				}
				e.removeGuest(ev.id)
			}
		case evHeartbeat:
			e.heartbeat(int(ev.id))
		case evTick:
			e.tick(int(ev.id))
		case evDeath:
			e.death(int(ev.id))
		case evCordon:
			for r := range e.reps {
				e.reps[r].snap[ev.id].Draining = true
			}
		case evLoss:
			e.loss(int(ev.id))
		case evExpire:
			e.release(ev.id)
		}
	}
	if e.end < 0 {
		e.end = e.now
	}
	e.advance(e.end)
	e.finish()
}

// advance moves the clock, taking the density samples that fall on the way.
func (e *engine) advance(t int64) {
	e.sample.advance(e, t)
	e.now = t
}

func (e *engine) nextArrival() {
	a, ok := e.w.Next()
	if !ok {
		e.arrDone = true
		e.end = e.lastArr + int64(e.s.Tail)
		return
	}
	a.At = max(a.At, e.lastArr)
	e.lastArr = a.At
	e.creates = append(e.creates, createReq{a: a, first: a.At, firstRefusal: -1})
	e.q.push(a.At, evArrive, int32(len(e.creates)-1))
}

// arrive sends create c, the workload's latest (an evacuation may have queued creates of its
// own since it was read), and reads the next one.
func (e *engine) arrive(c int32) {
	e.r.Creates++
	e.attempt(c)
	e.nextArrival()
}

// agentAdmittable is the agent's verdict for host i now (ADM-6): the one formula over its
// books, with every guest a measurement has seen marked measured (ADM-5), and the policy's
// reserve for the others (ADM-4).
func (e *engine) agentAdmittable(i int) int64 {
	h := &e.hosts[i]
	seen := e.now - int64(e.s.MeasureAfter)
	for j := range h.books {
		if !h.books[j].Measured && h.born[j] <= seen {
			h.books[j].Measured = true
		}
	}
	return admission.Admittable(admission.Host{Mode: e.p.Mode, TotalMiB: e.s.HostMiB, HeadroomMiB: e.s.HeadroomMiB,
		IntakeOpen: h.alive && !h.draining && !h.gate.Closed(), Guests: h.books, Reserve: e.p.Reserve})
}
