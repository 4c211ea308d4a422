package preempt

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// GCP watches instance/preempted and instance/maintenance-event with hanging GETs
// (wait_for_change, resumed by ETag) and header Metadata-Flavor: Google.
//
// The metadata server answers only about the instance asking and the values are bare words
// with no instance field, so there is no target to check (C27 concerns Azure), and no time
// field: the deadline is the documented notice window from when the value is seen.
type GCP struct {
	BaseURL string        // default http://metadata.google.internal
	Notice  time.Duration // the notice window; default 30 s (GCP's)
	// Wait bounds each hanging GET on the server side, sent as timeout_sec (whole seconds,
	// rounded up; default 10 s): the server then answers with the current value even when it
	// did not change. It is well inside the 30 s window, so a GET that silently died is
	// replaced in time (C28).
	Wait time.Duration
	// Timeout is how much longer than Wait the client waits for an answer, body included;
	// default DefaultTimeout (2 s). A GET unanswered by then is cancelled and re-issued (C28).
	Timeout time.Duration
	Client  *http.Client
	Now     func() time.Time
	Log     *slog.Logger // nil: slog.Default()
}

// Watch implements Watcher. A 503, a dropped connection, a GET that outlives its deadline or
// any error re-issues the request after a short capped backoff and is never taken for a notice
// (C17, C28). preempted=TRUE is a preemption; maintenance-event=TERMINATE_ON_HOST_MAINTENANCE
// an interruption too (MIGRATE is not). A value GCP does not document is logged once per
// distinct value and not acted on.
func (g GCP) Watch(ctx context.Context, out chan<- Notice) error {
	now := cmpOrNow(g.Now)
	window := cmp.Or(max(g.Notice, 0), 30*time.Second)
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.watchKey(ctx, "instance/maintenance-event", func(v string) bool {
			switch v {
			case "TERMINATE_ON_HOST_MAINTENANCE":
				return send(ctx, out, Notice{Provider: "gcp", Kind: KindMaintenance, ID: "gcp-maintenance-terminate", Deadline: now().Add(window)})
			case "NONE", "MIGRATE_ON_HOST_MAINTENANCE":
				return true
			}
			return false
		})
	}()
	g.watchKey(ctx, "instance/preempted", func(v string) bool {
		switch v {
		case "TRUE":
			return send(ctx, out, Notice{Provider: "gcp", Kind: KindPreempt, ID: "gcp-preempted", Deadline: now().Add(window)})
		case "FALSE":
			return true
		}
		return false
	})
	<-done
	return ctx.Err()
}

// watchKey follows one metadata key with hanging GETs until ctx ends or onValue fails to send.
// onValue reports false for a value it does not know; that is logged when it first appears.
func (g GCP) watchKey(ctx context.Context, key string, onValue func(string) bool) {
	base := strings.TrimSuffix(cmp.Or(g.BaseURL, "http://metadata.google.internal"), "/")
	hc := cmp.Or(g.Client, defaultClient)
	log := logOr(g.Log)
	waitSec := max(int64((cmp.Or(max(g.Wait, 0), 10*time.Second)+time.Second-1)/time.Second), 1)
	deadline := time.Duration(waitSec)*time.Second + cmp.Or(max(g.Timeout, 0), DefaultTimeout)
	var health link
	etag, unknown, wait := "", "", time.Duration(0)
	for {
		if wait > 0 && !sleep(ctx, wait) {
			return
		}
		u := base + "/computeMetadata/v1/" + key + "?wait_for_change=true&timeout_sec=" + strconv.FormatInt(waitSec, 10)
		if etag != "" {
			u += "&last_etag=" + url.QueryEscape(etag)
		}
		rep, err := call(ctx, hc, deadline, http.MethodGet, u, nil, 1024, "Metadata-Flavor", "Google")
		if ctx.Err() != nil {
			return
		}
		if err == nil && rep.status != http.StatusOK {
			err = &statusError{rep.status}
		}
		if err != nil {
			health.fail(log, "gcp", "GET "+key, err)
			wait = backoff(wait, 5*time.Second)
			continue
		}
		health.ok(log, "gcp", "GET "+key)
		wait = 0
		etag = rep.header.Get("ETag")
		v := strings.TrimSpace(string(rep.body))
		if onValue(v) {
			unknown = ""
			continue
		}
		if ctx.Err() != nil {
			return // the notice could not be sent: the watch is over
		}
		if v != unknown {
			log.Warn("preemption watcher: undocumented metadata value; not acted on", "provider", "gcp", "key", key, "value", v)
		}
		unknown = v
	}
}

func cmpOrNow(f func() time.Time) func() time.Time {
	if f == nil {
		return time.Now
	}
	return f
}
