package agent

import "github.com/prometheus/client_golang/prometheus"

// The warm pool's metrics (issue 16, goal 5), one series per template of --warm-pool, so the
// label's values are the operator's own list. A create of a pooled template is a hit when a
// warm guest served it and a miss otherwise (none ready, another memory size, a volume).
var (
	warmHitsDesc = prometheus.NewDesc("berth_agent_warm_pool_hits_total",
		"Creates of a pooled template this agent served from its warm pool since it booted (issue 16, goal 5).",
		[]string{"template"}, nil)
	warmMissesDesc = prometheus.NewDesc("berth_agent_warm_pool_misses_total",
		"Creates of a pooled template this agent started cold since it booted: no warm guest was ready, or the create asked for another memory size, a volume or a restore.",
		[]string{"template"}, nil)
	warmReadyDesc = prometheus.NewDesc("berth_agent_warm_pool_ready",
		"Warm guests of the template started and waiting for a create now.",
		[]string{"template"}, nil)
)

// warmCollector reads the pool's figures under the agent's lock at scrape time.
type warmCollector struct{ a *Agent }

func (c warmCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- warmHitsDesc
	ch <- warmMissesDesc
	ch <- warmReadyDesc
}

func (c warmCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	a.mu.Lock()
	type row struct {
		template            string
		hits, misses, ready float64
	}
	rows := make([]row, 0, len(a.cfg.WarmPool))
	for _, e := range a.cfg.WarmPool {
		r := row{template: e.Template, hits: float64(a.warm.hits[e.Template]), misses: float64(a.warm.misses[e.Template])}
		for _, w := range a.warm.guests {
			if w.started && w.entry.Template == e.Template {
				r.ready++
			}
		}
		rows = append(rows, r)
	}
	a.mu.Unlock()
	for _, r := range rows {
		ch <- prometheus.MustNewConstMetric(warmHitsDesc, prometheus.CounterValue, r.hits, r.template)
		ch <- prometheus.MustNewConstMetric(warmMissesDesc, prometheus.CounterValue, r.misses, r.template)
		ch <- prometheus.MustNewConstMetric(warmReadyDesc, prometheus.GaugeValue, r.ready, r.template)
	}
}
