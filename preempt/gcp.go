package preempt

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"
)

// GCP watches instance/preempted with a hanging GET (wait_for_change, resumed by ETag) and
// header Metadata-Flavor: Google. BaseURL defaults to http://metadata.google.internal; Notice
// is the notice window (30 s on GCP).
type GCP struct {
	BaseURL string
	Notice  time.Duration
	Client  *http.Client
	Now     func() time.Time
}

// Watch implements Watcher. A 503, a dropped connection or any error re-issues the request
// after a short capped backoff and is never taken for a notice (C17).
func (g GCP) Watch(ctx context.Context, out chan<- Notice) error {
	base := strings.TrimSuffix(cmpOr(g.BaseURL, "http://metadata.google.internal"), "/")
	hc := cmpOrClient(g.Client)
	now := cmpOrNow(g.Now)
	etag, wait := "", time.Duration(0)
	for {
		if wait > 0 && !sleep(ctx, wait) {
			return ctx.Err()
		}
		u := base + "/computeMetadata/v1/instance/preempted?wait_for_change=true"
		if etag != "" {
			u += "&last_etag=" + etag
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Metadata-Flavor", "Google")
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
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
		if strings.TrimSpace(string(body)) == "TRUE" {
			n := Notice{Provider: "gcp", Kind: KindPreempt, ID: "gcp-preempted", Deadline: now().Add(cmpOrDur(g.Notice, 30*time.Second))}
			if !send(ctx, out, n) {
				return ctx.Err()
			}
		}
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cmpOrDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

func cmpOrClient(c *http.Client) *http.Client {
	if c == nil {
		return defaultClient
	}
	return c
}

func cmpOrNow(f func() time.Time) func() time.Time {
	if f == nil {
		return time.Now
	}
	return f
}
