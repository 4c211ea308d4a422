package server

import (
	"context"
	"errors"
	"time"

	"github.com/berth-dev/berth"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics live beside the code that moves them (STYLE habit 12); names follow
// berth_<subsystem>_<name>_<unit>.
type metrics struct {
	refusals     *prometheus.CounterVec   // MET-1: by code, never one aggregate
	pickSeconds  prometheus.Histogram     // MET-5
	createSecond *prometheus.HistogramVec // MET-5: by outcome
	expirations  prometheus.Counter       // LED-2
	firstRefusal *prometheus.HistogramVec // MET-4: first refusal → success, by kind (sandbox create, app start)
	ended        *prometheus.CounterVec   // MET-5: sandboxes the agents ended, by state (evicted, failed, stopped…)
	httpRequests *prometheus.CounterVec   // by route and code (httpmetrics.go)
	httpSeconds  *prometheus.HistogramVec // by route (httpmetrics.go)
}

func newMetrics(reg *prometheus.Registry, st berth.Store, staleAfter, deadAfter time.Duration, clock func() time.Time) *metrics {
	m := &metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_scheduler_refusals_total", Help: "Create refusals by code (MET-1).",
		}, []string{"code"}),
		pickSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "berth_scheduler_pick_seconds", Help: "Placement Pick latency (MET-5).",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 10),
		}),
		createSecond: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "berth_api_create_seconds", Help: "Create latency by outcome code (MET-5).",
			Buckets: prometheus.ExponentialBuckets(1e-3, 2, 14),
		}, []string{"outcome"}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "berth_ledger_expirations_total", Help: "Reservations released by TTL instead of a release path (LED-2).",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "berth_agent_ended_sandboxes_total", Help: "Sandboxes agents ended on their own, by final state: evicted (ADM-9), failed (init died, OOM), stopped (TTL).",
		}, []string{"state"}),
		firstRefusal: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "berth_api_time_to_success_seconds",
			Help:    "Time from the first refusal to success (MET-4): kind=sandbox, a create retried by the SDK; kind=app, an app from waiting_capacity to running.",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}, []string{"kind"}),
	}
	m.httpRequests, m.httpSeconds = newHTTPMetrics()
	// Every series present at 0 from the start, so rates and alerts work before the first event.
	m.firstRefusal.WithLabelValues("sandbox")
	m.firstRefusal.WithLabelValues("app")
	for _, st := range []berth.SandboxState{berth.SandboxEvicted, berth.SandboxFailed, berth.SandboxStopped} {
		m.ended.WithLabelValues(string(st))
	}
	for _, code := range []string{berth.ENoCapacity, berth.ENoHealthyAgents, berth.EHostStartsSaturated} {
		m.refusals.WithLabelValues(code)
	}
	for _, outcome := range []string{"created", "replayed", berth.ENoCapacity, berth.ENoHealthyAgents} {
		m.createSecond.WithLabelValues(outcome)
	}
	reg.MustRegister(m.refusals, m.pickSeconds, m.createSecond, m.expirations, m.firstRefusal, m.ended,
		m.httpRequests, m.httpSeconds, &ledgerCollector{st: st}, &fleetCollector{st: st, staleAfter: staleAfter, deadAfter: deadAfter, clock: clock})
	registerRuntimeCollectors(reg)
	if rt, ok := st.(interface{ RoundTrips() int64 }); ok {
		// This replica's own requests to the store (issue 16, goal 1): a counter per replica,
		// so sum() over replicas is the fleet's.
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "berth_store_round_trips_total",
			Help: "Requests this replica sent to the store: statements, BEGIN, COMMIT and ROLLBACK (each one round trip to PostgreSQL).",
		}, func() float64 { return float64(rt.RoundTrips()) }))
	}
	if cs, ok := st.(berth.ConnStater); ok {
		reg.MustRegister(connCollector{cs})
	}
	return m
}

// connCollector exports this replica's store connection pool (berth.ConnStats) at scrape
// time: its own pool, so counters are summed over replicas and gauges read per replica.
type connCollector struct{ st berth.ConnStater }

var (
	connMaxDesc = prometheus.NewDesc("berth_store_connections_max",
		"Connections this replica's store pool may hold (0: no limit).", nil, nil)
	connInUseDesc = prometheus.NewDesc("berth_store_connections_in_use",
		"Connections of this replica's store pool in use now.", nil, nil)
	connWaitsDesc = prometheus.NewDesc("berth_store_connection_waits_total",
		"Store calls of this replica that found no free connection and waited for one (creates and heartbeats share the pool).", nil, nil)
	connWaitedDesc = prometheus.NewDesc("berth_store_connection_wait_seconds_total",
		"Total time this replica's store calls waited for a connection; its rate is how many wait at once on average.", nil, nil)
)

func (c connCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connMaxDesc
	ch <- connInUseDesc
	ch <- connWaitsDesc
	ch <- connWaitedDesc
}

func (c connCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.st.ConnStats()
	ch <- prometheus.MustNewConstMetric(connMaxDesc, prometheus.GaugeValue, float64(s.Max))
	ch <- prometheus.MustNewConstMetric(connInUseDesc, prometheus.GaugeValue, float64(s.InUse))
	ch <- prometheus.MustNewConstMetric(connWaitsDesc, prometheus.CounterValue, float64(s.Waits))
	ch <- prometheus.MustNewConstMetric(connWaitedDesc, prometheus.CounterValue, s.Waited.Seconds())
}

// registerRuntimeCollectors adds the Go (go_*) and process (process_*) collectors; a registry
// shared with another server, or that already has them, keeps the ones it has.
func registerRuntimeCollectors(reg prometheus.Registerer) {
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			var dup prometheus.AlreadyRegisteredError
			if !errors.As(err, &dup) {
				panic(err)
			}
		}
	}
}

// ledgerCollector exports outstanding reserved bytes per agent at scrape time (LED-3, MET-3).
// Like every series of fleetCollector it is a fleet view read from the shared store: each
// replica exports the same value, so dashboards aggregate it with max, never sum
// (docs/DECISIONS.md, "Metrics").
type ledgerCollector struct{ st berth.Store }

var outstandingDesc = prometheus.NewDesc("berth_ledger_outstanding_reserved_bytes",
	"Outstanding reserved bytes per agent (LED-3); returns to 0 on an idle fleet. A fleet view: every replica exports the same value, aggregate with max.", []string{"agent"}, nil)

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outstandingDesc }

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rs, err := c.st.Reservations(ctx)
	if err != nil {
		return
	}
	agents, err := fleetAgents(ctx, c.st)
	if err != nil {
		return
	}
	sum := map[string]int64{}
	for _, a := range agents {
		sum[a.AgentID] = 0
	}
	for _, r := range rs {
		sum[r.AgentID] += r.MiB
	}
	for id, v := range sum {
		ch <- prometheus.MustNewConstMetric(outstandingDesc, prometheus.GaugeValue, float64(v)*mib, id)
	}
}

// fleetAgents reads every agent without its held list, for the fleet series: a scrape costs
// the agent table, not the fleet's held sandboxes. With the held lists, 10,000 agents holding
// 50 sandboxes each took longer than a collector's 2 s, and every fleet series — heartbeat
// ages and agents by status, which alerts read — was missing from every scrape
// (BenchmarkMetricsScrape).
func fleetAgents(ctx context.Context, st berth.Store) ([]berth.Agent, error) {
	all, err := st.AgentsChangedSince(ctx, "")
	return all.Agents, err
}

// mib is bytes per MiB: metrics are in base units (bytes), the store in MiB.
const mib = 1 << 20

// fleetCollector exports, at scrape time from the store: the fleet-wide resident ÷ committed
// ratio (MET-2), each agent's heartbeat age and the agents by status, derived stale, dead
// and quarantined included (MET-5). These are fleet views: every replica reads the same
// store and exports the same values, so a sum() over replicas would count them once per
// replica; dashboards and alerts aggregate them with max (docs/DECISIONS.md, "Metrics").
// The agents' own counters (OOM kills, clamped readings) are exported by each agent on its
// GET /metrics, not here.
type fleetCollector struct {
	st                    berth.Store
	staleAfter, deadAfter time.Duration
	clock                 func() time.Time
}

var (
	ratioDesc = prometheus.NewDesc("berth_fleet_resident_committed_ratio",
		"Σ resident ÷ Σ committed MiB over agents with a fresh heartbeat (MET-2).", nil, nil)
	hbAgeDesc = prometheus.NewDesc("berth_agent_heartbeat_age_seconds",
		"Seconds since each agent's last heartbeat (MET-5).", []string{"agent"}, nil)
	agentsDesc = prometheus.NewDesc("berth_agents",
		"Agents by status, derived stale, dead and quarantined included (MET-5).", []string{"status"}, nil)
	appsDesc = prometheus.NewDesc("berth_apps",
		"Apps by actual state (APP-1); waiting_capacity is a fleet too full to start them, error needs their owner.", []string{"state"}, nil)
	appWaitDesc = prometheus.NewDesc("berth_app_waiting_capacity_seconds_max",
		"The longest an app now in waiting_capacity has waited since its first refusal (APP-2), seconds; 0 when none waits.", nil, nil)
)

var appStates = []berth.AppState{berth.AppHibernated, berth.AppWaking, berth.AppDeploying, berth.AppRunning,
	berth.AppWaitingCapacity, berth.AppStopped, berth.AppError}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- ratioDesc
	ch <- hbAgeDesc
	ch <- agentsDesc
	ch <- appsDesc
	ch <- appWaitDesc
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	agents, err := fleetAgents(ctx, c.st)
	if err != nil {
		return
	}
	now := c.clock()
	var used, committed float64
	byStatus := map[string]int{}
	for _, s := range []berth.AgentStatus{berth.AgentActive, berth.AgentDraining, berth.AgentStale, berth.AgentDead, berth.AgentQuarantined} {
		byStatus[string(s)] = 0
	}
	for _, a := range agents {
		age := now.Sub(a.LastSeen)
		ch <- prometheus.MustNewConstMetric(hbAgeDesc, prometheus.GaugeValue, age.Seconds(), a.AgentID)
		status := derivedStatus(a, now, c.staleAfter, c.deadAfter)
		byStatus[string(status)]++
		if age < c.staleAfter {
			used += float64(a.MemoryMiBUsed)
			committed += float64(a.MemoryMiBCommitted)
		}
	}
	ratio := 0.0
	if committed > 0 {
		ratio = used / committed
	}
	ch <- prometheus.MustNewConstMetric(ratioDesc, prometheus.GaugeValue, ratio)
	for s, n := range byStatus {
		ch <- prometheus.MustNewConstMetric(agentsDesc, prometheus.GaugeValue, float64(n), s)
	}
	apps, err := c.st.Apps(ctx, "")
	if err != nil {
		return
	}
	byState := map[berth.AppState]int{}
	longest := 0.0
	for _, a := range apps {
		byState[a.State]++
		if a.State == berth.AppWaitingCapacity && !a.WaitingSince.IsZero() {
			longest = max(longest, now.Sub(a.WaitingSince).Seconds())
		}
	}
	for _, st := range appStates {
		ch <- prometheus.MustNewConstMetric(appsDesc, prometheus.GaugeValue, float64(byState[st]), string(st))
	}
	ch <- prometheus.MustNewConstMetric(appWaitDesc, prometheus.GaugeValue, longest)
}
