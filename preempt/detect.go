package preempt

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"
)

// Probe names the metadata services Detect tries; empty URLs take each provider's own.
type Probe struct {
	GCP, AWS, Azure string
	Timeout         time.Duration // for the three probes at once; default 500 ms (C28)
	Client          *http.Client
	Log             *slog.Logger // given to the watcher Detect returns; nil: slog.Default()
}

// Detect finds the cloud the agent runs on by asking the three metadata services at once,
// each under one short deadline (SPOT-1, C28: a probe that never answers ends with it, so
// Detect itself never hangs), and returns that provider's watcher and name; off any
// cloud it returns nil and "none", a valid answer.
func Detect(ctx context.Context, p Probe) (Watcher, string) {
	timeout := cmp.Or(max(p.Timeout, 0), 500*time.Millisecond)
	hc := cmp.Or(p.Client, defaultClient)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	type hit struct {
		name string
		w    Watcher
	}
	found := make(chan hit, 3)
	try := func(name, method, url string, header [2]string, w Watcher, ok func(*http.Response) bool) {
		req, err := http.NewRequestWithContext(ctx, method, url, nil)
		if err != nil {
			found <- hit{}
			return
		}
		req.Header.Set(header[0], header[1])
		resp, err := hc.Do(req)
		if err != nil {
			found <- hit{}
			return
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK && ok(resp) {
			found <- hit{name, w}
			return
		}
		found <- hit{}
	}
	gcp := strings.TrimSuffix(cmp.Or(p.GCP, "http://metadata.google.internal"), "/")
	aws := strings.TrimSuffix(cmp.Or(p.AWS, "http://169.254.169.254"), "/")
	azure := strings.TrimSuffix(cmp.Or(p.Azure, "http://169.254.169.254"), "/")
	go try("gcp", http.MethodGet, gcp+"/computeMetadata/v1/instance/id", [2]string{"Metadata-Flavor", "Google"},
		GCP{BaseURL: gcp, Log: p.Log}, func(r *http.Response) bool { return r.Header.Get("Metadata-Flavor") == "Google" })
	go try("aws", http.MethodPut, aws+"/latest/api/token", [2]string{"X-aws-ec2-metadata-token-ttl-seconds", "60"},
		AWS{BaseURL: aws, Log: p.Log}, func(*http.Response) bool { return true })
	go try("azure", http.MethodGet, azure+azurePath, [2]string{"Metadata", "true"},
		Azure{BaseURL: azure, Log: p.Log}, func(*http.Response) bool { return true })
	for range 3 {
		if h := <-found; h.w != nil {
			return h.w, h.name
		}
	}
	return nil, "none"
}
