package server

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
	"weak"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Refusal window (issue 17, point 4: the dashboard's "refusals by code over the last hour").
// berth_scheduler_refusals_total (MET-1) counts refusals by code since the replica started;
// Prometheus turns it into rates, but the dashboard must draw the last hour without one. A
// refusalWindow samples that counter every refusalSample and adds each code's increase to
// the bucket of the minute the sample fell in, keeping refusalBuckets minutes. A refusal is
// therefore counted in its own minute or, when it happened in the last refusalSample before
// a minute boundary, in the next one. It is this replica's view: each replica counts the
// creates it refused, so a fleet behind a load balancer sums the replicas' windows (or asks
// Prometheus: sum by (code) (increase(berth_scheduler_refusals_total[1m]))).
const (
	refusalBucket  = time.Minute
	refusalBuckets = 60
	refusalSample  = 5 * time.Second
)

// refusalWindow is the per-minute ring of one replica's refusals by code.
type refusalWindow struct {
	vec     *prometheus.CounterVec
	clock   func() time.Time
	mu      sync.Mutex
	started time.Time                    // first sample: no bucket before it holds data
	last    map[string]float64           // the counter per code at the latest sample
	ring    [refusalBuckets]minuteCounts // indexed by minute number mod refusalBuckets
	stopped chan struct{}                // closed when the sampling goroutine ends
}

// minuteCounts is one bucket: the refusals per code in the minute numbered minute (Unix
// seconds ÷ 60).
type minuteCounts struct {
	minute int64
	counts map[string]int64
}

// newRefusalWindow starts a window over vec (label "code") from its value now, and a
// goroutine that samples it every period (refusalSample). The goroutine holds the window
// only weakly and ends once the window is unreachable (the handler that reads it is gone),
// so a Server needs no Close for it; it closes the window's stopped channel then.
func newRefusalWindow(vec *prometheus.CounterVec, clock func() time.Time, period time.Duration) *refusalWindow {
	stopped := make(chan struct{})
	w := &refusalWindow{vec: vec, clock: clock, started: clock(), last: counterByCode(vec), stopped: stopped}
	wp := weak.Make(w)
	go func() {
		defer close(stopped)
		t := time.NewTicker(period)
		defer t.Stop()
		for range t.C {
			w := wp.Value()
			if w == nil {
				return
			}
			w.sample()
		}
	}()
	return w
}

// counterByCode reads vec's current value per "code" label.
func counterByCode(vec *prometheus.CounterVec) map[string]float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { vec.Collect(ch); close(ch) }()
	out := map[string]float64{}
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil || d.Counter == nil {
			continue
		}
		for _, l := range d.Label {
			if l.GetName() == "code" {
				out[l.GetValue()] = d.Counter.GetValue()
			}
		}
	}
	return out
}

// sample adds the counter's increase since the previous sample to the current minute.
func (w *refusalWindow) sample() {
	cur := counterByCode(w.vec)
	now := w.clock()
	w.mu.Lock()
	defer w.mu.Unlock()
	minute := now.Unix() / 60
	b := &w.ring[minute%refusalBuckets]
	if b.minute != minute {
		*b = minuteCounts{minute: minute, counts: map[string]int64{}}
	}
	for code, v := range cur {
		if d := int64(v - w.last[code]); d > 0 {
			b.counts[code] += d
		}
	}
	w.last = cur
}

// RefusalBucket is one minute of GET /v1/refusals: Start is the minute's first instant
// (UTC) and Counts the refusals per code in it (codes with none are left out).
type RefusalBucket struct {
	Start  time.Time        `json:"start"`
	Counts map[string]int64 `json:"counts"`
}

// RefusalWindow is the answer of GET /v1/refusals: Buckets, oldest first, are the WindowS ÷
// BucketS whole minutes ending with the current one (which is still filling); Totals sums
// them per code; Codes lists every code seen in the window, sorted. Replica names the
// replica that counted them (the window is per replica), and Since is when it started
// counting: buckets before it hold no data rather than no refusals.
type RefusalWindow struct {
	Replica string           `json:"replica"`
	Since   time.Time        `json:"since"`
	WindowS int              `json:"window_s"`
	BucketS int              `json:"bucket_s"`
	Codes   []string         `json:"codes"`
	Totals  map[string]int64 `json:"totals"`
	Buckets []RefusalBucket  `json:"buckets"`
}

// read samples once (so the current minute is up to date) and returns the last n minutes.
func (w *refusalWindow) read(n int) (buckets []RefusalBucket, since time.Time) {
	w.sample()
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clock().Unix() / 60
	for m := now - int64(n) + 1; m <= now; m++ {
		b := RefusalBucket{Start: time.Unix(m*60, 0).UTC(), Counts: map[string]int64{}}
		if r := w.ring[((m%refusalBuckets)+refusalBuckets)%refusalBuckets]; r.minute == m {
			maps.Copy(b.Counts, r.counts)
		}
		buckets = append(buckets, b)
	}
	return buckets, w.started.UTC()
}

// refusals is GET /v1/refusals?window=<seconds> (admin; issue 17, point 4): this replica's
// create refusals by code per minute over the last window seconds (60…3600, default 3600,
// rounded up to whole minutes), as a RefusalWindow. Errors: 400 invalid_request for a window
// that is not an integer in range.
func (s *Server) refusals(w *refusalWindow) apiFunc {
	return func(rw http.ResponseWriter, r *http.Request, _ principal) error {
		window := refusalBuckets * int(refusalBucket/time.Second)
		if v := r.URL.Query().Get("window"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 60 || n > window {
				return berth.Errorf(berth.EInvalidRequest, "window must be whole seconds, 60..%d", window)
			}
			window = n
		}
		n := (window + 59) / 60
		buckets, since := w.read(n)
		out := RefusalWindow{Replica: s.cfg.ReplicaID, Since: since, WindowS: n * 60, BucketS: 60,
			Totals: map[string]int64{}, Buckets: buckets}
		for _, b := range buckets {
			for code, c := range b.Counts {
				out.Totals[code] += c
			}
		}
		out.Codes = append([]string{}, slices.Sorted(maps.Keys(out.Totals))...) // [] when none, never null
		httpjson.WriteJSON(rw, http.StatusOK, out)
		return nil
	}
}
