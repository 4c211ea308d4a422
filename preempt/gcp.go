package preempt

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"strings"
	"time"
)

// GCP watches instance/preempted and instance/maintenance-event with hanging GETs
// (wait_for_change, resumed by ETag) and header Metadata-Flavor: Google. BaseURL defaults to
// http://metadata.google.internal; Notice is the notice window (30 s on GCP).
type GCP struct {
	BaseURL string
	Notice  time.Duration
	Client  *http.Client
	Now     func() time.Time
}

// Watch implements Watcher. A 503, a dropped connection or any error re-issues the request
// after a short capped backoff and is never taken for a notice (C17). preempted=TRUE is a
// preemption; maintenance-event=TERMINATE_ON_HOST_MAINTENANCE an interruption too (MIGRATE
// is not).
func (g GCP) Watch(ctx context.Context, out chan<- Notice) error {
	now := cmpOrNow(g.Now)
	window := cmp.Or(max(g.Notice, 0), 30*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.watchKey(ctx, "instance/maintenance-event", func(v string) bool {
			if v != "TERMINATE_ON_HOST_MAINTENANCE" {
				return true
			}
			return send(ctx, out, Notice{Provider: "gcp", Kind: KindMaintenance, ID: "gcp-maintenance-terminate", Deadline: now().Add(window)})
		})
	}()
	g.watchKey(ctx, "instance/preempted", func(v string) bool {
		if v != "TRUE" {
			return true
		}
		return send(ctx, out, Notice{Provider: "gcp", Kind: KindPreempt, ID: "gcp-preempted", Deadline: now().Add(window)})
	})
	<-done
	return ctx.Err()
}

// watchKey follows one metadata key with hanging GETs until ctx ends or onValue says stop.
func (g GCP) watchKey(ctx context.Context, key string, onValue func(string) bool) {
	base := strings.TrimSuffix(cmp.Or(g.BaseURL, "http://metadata.google.internal"), "/")
	hc := cmp.Or(g.Client, defaultClient)
	etag, wait := "", time.Duration(0)
	for {
		if wait > 0 && !sleep(ctx, wait) {
			return
		}
		u := base + "/computeMetadata/v1/" + key + "?wait_for_change=true"
		if etag != "" {
			u += "&last_etag=" + etag
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return
		}
		req.Header.Set("Metadata-Flavor", "Google")
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait = backoff(wait, 5*time.Second)
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			wait = backoff(wait, 5*time.Second)
			continue
		}
		wait = 0
		etag = resp.Header.Get("ETag")
		if !onValue(strings.TrimSpace(string(body))) {
			return
		}
	}
}

func cmpOrNow(f func() time.Time) func() time.Time {
	if f == nil {
		return time.Now
	}
	return f
}
