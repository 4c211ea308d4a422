package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/berth-dev/berth"
)

// retentionBatchesPerSweep bounds one sweep's retention work: at most this many batches
// (of Config.RetentionBatch rows each), so a large backlog drains over several sweeps
// without holding the sweeper.
const retentionBatchesPerSweep = 20

// newRetentionCounter registers berth_retention_rows_deleted_total{table}: rows retention
// deleted, per table (sandboxes, events, reservations).
func newRetentionCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "berth_retention_rows_deleted_total",
		Help: "Rows deleted by retention (--retention), by table: terminal sandboxes, their events and ended reservations' events.",
	}, []string{"table"})
	for _, table := range []string{"sandboxes", "events", "reservations"} {
		c.WithLabelValues(table) // exported at 0 from the start
	}
	reg.MustRegister(c)
	return c
}

// purgeEnded is the sweeper's retention part (issue 15, point 5): it deletes terminal
// sandboxes that ended more than Config.Retention ago, their events and the events of ended
// reservations, in batches of Config.RetentionBatch rows (one transaction each), at most
// retentionBatchesPerSweep batches per sweep. Live rows are never deleted; several replicas
// doing it at once only split the work. A negative Retention keeps everything.
func (s *Server) purgeEnded(ctx context.Context) {
	r, ok := s.store.(berth.Retainer)
	if !ok || s.cfg.Retention < 0 {
		return
	}
	cutoff := s.cfg.Clock().Add(-s.cfg.Retention)
	for range retentionBatchesPerSweep {
		p, err := r.PurgeEnded(ctx, cutoff, s.cfg.RetentionBatch)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("retention failed; the next sweep tries again", "err", err)
			}
			return
		}
		s.retained.WithLabelValues("sandboxes").Add(float64(p.Sandboxes))
		s.retained.WithLabelValues("events").Add(float64(p.Events))
		s.retained.WithLabelValues("reservations").Add(float64(p.Reservations))
		if p == (berth.Purged{}) {
			return
		}
	}
}
