package server

import (
	"context"
	"time"

	"github.com/berth-dev/berth"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics live beside the code that moves them (STYLE habit 12); names follow
// berth_<subsystem>_<name>_<unit>.
type metrics struct {
	refusals     *prometheus.CounterVec   // MET-1: by code, never one aggregate
	pickSeconds  prometheus.Histogram     // MET-5
	createSecond *prometheus.HistogramVec // MET-5: by outcome
	expirations  prometheus.Counter       // LED-2
	firstRefusal prometheus.Histogram     // MET-4: first attempt → success of retried creates
}

func newMetrics(reg *prometheus.Registry, st berth.Store) *metrics {
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
		firstRefusal: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "berth_api_time_to_success_seconds", Help: "Time from a create's first attempt to its success (MET-4).",
			Buckets: prometheus.ExponentialBuckets(0.25, 2, 12),
		}),
	}
	reg.MustRegister(m.refusals, m.pickSeconds, m.createSecond, m.expirations, m.firstRefusal,
		&ledgerCollector{st: st})
	return m
}

// ledgerCollector exports outstanding reserved MiB per agent at scrape time (LED-3, MET-3).
type ledgerCollector struct{ st berth.Store }

var outstandingDesc = prometheus.NewDesc("berth_ledger_outstanding_reserved_mib",
	"Outstanding reserved MiB per agent (LED-3); returns to 0 on an idle fleet.", []string{"agent"}, nil)

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outstandingDesc }

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rs, err := c.st.Reservations(ctx)
	if err != nil {
		return
	}
	agents, err := c.st.Agents(ctx)
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
		ch <- prometheus.MustNewConstMetric(outstandingDesc, prometheus.GaugeValue, float64(v), id)
	}
}
