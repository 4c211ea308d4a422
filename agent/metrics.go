package agent

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The agent's own metrics live beside the code that moves them (STYLE habit 12): counters
// this agent counts since it booted, which never go down when a sandbox ends (issue 15).
// A new boot starts them at 0, which Prometheus' rate() and increase() read as a counter
// reset. Every berth_* series carries the label agent=<id>, so alerts name the host.
var (
	oomTotalDesc = prometheus.NewDesc("berth_agent_oom_kills_total",
		"Processes the kernel OOM killer killed in this agent's sandboxes since the agent booted (C09; ADM-9 keeps it at 0).",
		nil, nil)
	measureErrTotalDesc = prometheus.NewDesc("berth_agent_measurement_errors_total",
		"Resident readings this agent clamped into [0, total] since it booted (C07).", nil, nil)
)

// counterCollector reads the agent's counters under its lock at scrape time.
type counterCollector struct{ a *Agent }

func (c counterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- oomTotalDesc
	ch <- measureErrTotalDesc
}

func (c counterCollector) Collect(ch chan<- prometheus.Metric) {
	c.a.mu.Lock()
	oom, errs := c.a.oomKillsTotal, c.a.measureErrs
	c.a.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(oomTotalDesc, prometheus.CounterValue, float64(oom))
	ch <- prometheus.MustNewConstMetric(measureErrTotalDesc, prometheus.CounterValue, float64(errs))
}

// countOOMLocked adds the OOM kills a reading of a guest shows beyond the ones already
// counted for it (C09); a.mu is held. seen is what the guest's previous reading showed.
func (a *Agent) countOOMLocked(seen, now int64) {
	if now > seen {
		a.oomKillsTotal += now - seen
	}
}

// metricsRegistry builds the registry GET /metrics serves: the agent's counters (labelled
// with its id) and the Go and process collectors.
func (a *Agent) metricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	prometheus.WrapRegistererWith(prometheus.Labels{"agent": a.cfg.ID}, reg).MustRegister(counterCollector{a}, warmCollector{a})
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// public serves the two unauthenticated routes of the agent's listener and hands every other
// request to next (the node-token-checked internal API):
//
//	GET /healthz → 200 "ok" (text/plain) while the agent serves
//	GET /metrics → the Prometheus text format: berth_agent_oom_kills_total{agent},
//	               berth_agent_measurement_errors_total{agent},
//	               berth_agent_warm_pool_hits_total{agent,template},
//	               berth_agent_warm_pool_misses_total{agent,template},
//	               berth_agent_warm_pool_ready{agent,template} (one per --warm-pool
//	               template), go_*, process_*
//
// Neither names a sandbox or a tenant, so a load balancer's or Prometheus' probe needs no
// node token.
func (a *Agent) public(next http.Handler) http.Handler {
	metrics := promhttp.HandlerFor(a.metricsRegistry(), promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			switch r.URL.Path {
			case "/healthz":
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = w.Write([]byte("ok\n"))
				return
			case "/metrics":
				metrics.ServeHTTP(w, r)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
