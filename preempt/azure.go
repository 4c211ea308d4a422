package preempt

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
)

// Azure polls Scheduled Events (SPOT-1); Preempt and Terminate are interruptions. The same
// event comes back on every poll until it happens: its EventId is the Notice.ID, so the agent
// acts once (C13). Ack tells Azure the host is ready (StartRequests). BaseURL defaults to
// http://169.254.169.254; Poll to 1 s.
type Azure struct {
	BaseURL string
	Poll    time.Duration
	Client  *http.Client
}

const azurePath = "/metadata/scheduledevents?api-version=2020-07-01"

// Watch implements Watcher.
func (z Azure) Watch(ctx context.Context, out chan<- Notice) error {
	base := strings.TrimSuffix(cmp.Or(z.BaseURL, "http://169.254.169.254"), "/")
	hc := cmp.Or(z.Client, defaultClient)
	poll := cmp.Or(max(z.Poll, 0), time.Second)
	for {
		var doc struct {
			Events []struct {
				EventID   string `json:"EventId"`
				EventType string `json:"EventType"`
				NotBefore string `json:"NotBefore"`
			} `json:"Events"`
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+azurePath, nil)
		if err != nil {
			return err
		}
		req.Header.Set("Metadata", "true")
		if resp, err := hc.Do(req); err == nil {
			if resp.StatusCode == http.StatusOK {
				_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&doc)
			}
			resp.Body.Close()
		}
		for _, e := range doc.Events {
			if e.EventType != "Preempt" && e.EventType != "Terminate" {
				continue
			}
			deadline, _ := time.Parse(time.RFC1123, e.NotBefore)
			kind := KindPreempt
			if e.EventType == "Terminate" {
				kind = KindTerminate
			}
			if !send(ctx, out, Notice{Provider: "azure", Kind: kind, ID: e.EventID, Deadline: deadline}) {
				return ctx.Err()
			}
		}
		if !sleep(ctx, poll) {
			return ctx.Err()
		}
	}
}

// Ack acknowledges an event so Azure may start it (StartRequests), after evacuation.
func (z Azure) Ack(ctx context.Context, eventID string) error {
	base := strings.TrimSuffix(cmp.Or(z.BaseURL, "http://169.254.169.254"), "/")
	body, _ := json.Marshal(map[string]any{"StartRequests": []map[string]string{{"EventId": eventID}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+azurePath, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Metadata", "true")
	req.Header.Set("Content-Type", "application/json")
	resp, err := cmp.Or(z.Client, defaultClient).Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
