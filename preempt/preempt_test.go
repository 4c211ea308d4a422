package preempt

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// next waits (bounded) for the next notice.
func next(t *testing.T, ch <-chan Notice) Notice {
	t.Helper()
	select {
	case n := <-ch:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no notice arrived")
		return Notice{}
	}
}

func watch(t *testing.T, w Watcher) <-chan Notice {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan Notice, 16)
	done := make(chan error, 1)
	go func() { done <- w.Watch(ctx, ch) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Watch returned %v, want context.Canceled", err)
		}
	})
	return ch
}

// TestCase_C17_GCPSurvivesErrors: the metadata server answers 503 and drops the connection in
// the middle of the hanging GET; the watcher re-issues it, reports nothing until the value
// really is TRUE, and sends the notice with the 30 s window (SPOT-1).
func TestCase_C17_GCPSurvivesErrors(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" || !strings.Contains(r.URL.RawQuery, "wait_for_change=true") {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if strings.HasSuffix(r.URL.Path, "/maintenance-event") {
			select { // a live migration is no interruption; then the value holds still
			case <-r.Context().Done():
			case <-time.After(50 * time.Millisecond):
				io.WriteString(w, "MIGRATE_ON_HOST_MAINTENANCE")
			}
			return
		}
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close() // dropped mid-GET
		case 3:
			w.Header().Set("ETag", "e1")
			io.WriteString(w, "FALSE")
		default:
			if r.URL.Query().Get("last_etag") != "e1" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			io.WriteString(w, "TRUE")
		}
	}))
	defer srv.Close()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	n := next(t, watch(t, GCP{BaseURL: srv.URL, Now: func() time.Time { return now }}))
	if n.Kind != KindPreempt || n.ID != "gcp-preempted" || !n.Deadline.Equal(now.Add(30*time.Second)) || n.Soft {
		t.Fatalf("notice %+v", n)
	}
	if calls.Load() < 4 {
		t.Fatalf("a notice after %d calls: the errors were taken for notices", calls.Load())
	}
}

// TestCase_C13_AWSNoticeRepeatsWithOneID: the same instance-action body on consecutive polls
// yields the same notice ID (the agent acts once); an expired token is refreshed; the
// rebalance recommendation arrives as a soft notice (SPOT-1, C13, C15).
func TestCase_C13_AWSNoticeRepeatsWithOneID(t *testing.T) {
	var tokens, polls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
			if r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			io.WriteString(w, "tok-"+string(rune('0'+tokens.Add(1))))
		case r.URL.Path == "/latest/meta-data/spot/instance-action":
			p := polls.Add(1)
			switch {
			case p == 1 && r.Header.Get("X-aws-ec2-metadata-token") == "tok-1":
				w.WriteHeader(http.StatusUnauthorized) // the first token expired
			case p < 4:
				w.WriteHeader(http.StatusNotFound)
			default:
				io.WriteString(w, `{"action": "terminate", "time": "2030-01-01T00:02:00Z"}`)
			}
		case r.URL.Path == "/latest/meta-data/events/recommendations/rebalance":
			io.WriteString(w, `{"noticeTime": "2030-01-01T00:00:00Z"}`)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ch := watch(t, AWS{BaseURL: srv.URL, Poll: 20 * time.Millisecond})
	var terminate []Notice
	sawRebalance := false
	for len(terminate) < 2 {
		n := next(t, ch)
		switch n.Kind {
		case KindRebalance:
			sawRebalance = n.Soft && n.ID == "aws-rebalance-2030-01-01T00:00:00Z"
		case KindTerminate:
			terminate = append(terminate, n)
		}
	}
	if !sawRebalance {
		t.Fatal("no soft rebalance notice")
	}
	want := time.Date(2030, 1, 1, 0, 2, 0, 0, time.UTC)
	if terminate[0].ID != terminate[1].ID || !terminate[0].Deadline.Equal(want) {
		t.Fatalf("repeated notices %+v: want one ID and the deadline from the body", terminate)
	}
	if tokens.Load() < 2 {
		t.Fatal("the expired token was not refreshed")
	}
}

// TestCase_C13_AzureEventRepeatedEveryPoll: the same Preempt event on every poll keeps its
// EventId as the notice ID; Terminate counts, other event types do not; Ack posts
// StartRequests for the event (SPOT-1).
func TestCase_C13_AzureEventRepeatedEveryPoll(t *testing.T) {
	var polls atomic.Int64
	acked := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata") != "true" || r.URL.Query().Get("api-version") == "" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if r.Method == http.MethodPost {
			var body struct {
				StartRequests []struct{ EventId string } `json:"StartRequests"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			if len(body.StartRequests) == 1 {
				acked <- body.StartRequests[0].EventId
			}
			return
		}
		if polls.Add(1) == 1 {
			io.WriteString(w, `{"DocumentIncarnation": 7, "Events": []}`)
			return
		}
		io.WriteString(w, `{"DocumentIncarnation": 8, "Events": [
			{"EventId": "ev-freeze", "EventType": "Freeze", "NotBefore": "Mon, 30 Nov 2026 10:00:30 GMT"},
			{"EventId": "5b4f0c2e", "EventType": "Preempt", "NotBefore": "Mon, 30 Nov 2026 10:00:30 GMT"}]}`)
	}))
	defer srv.Close()
	z := Azure{BaseURL: srv.URL, Poll: 20 * time.Millisecond}
	ch := watch(t, z)
	a, b := next(t, ch), next(t, ch)
	if a.ID != "5b4f0c2e" || b.ID != a.ID || a.Kind != KindPreempt || a.Deadline.IsZero() {
		t.Fatalf("notices %+v %+v: want the Preempt event, same id each poll, Freeze ignored", a, b)
	}
	if err := z.Ack(context.Background(), a.ID); err != nil {
		t.Fatal(err)
	}
	if got := <-acked; got != a.ID {
		t.Fatalf("acked %q", got)
	}
}

// TestDetect: the provider whose metadata service answers is chosen; off any cloud the
// answer is none, quickly (SPOT-1).
func TestDetect(t *testing.T) {
	notHere := httptest.NewServer(http.NotFoundHandler())
	defer notHere.Close()
	gcp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		io.WriteString(w, "1234")
	}))
	defer gcp.Close()
	if _, name := Detect(context.Background(), Probe{GCP: gcp.URL, AWS: notHere.URL, Azure: notHere.URL}); name != "gcp" {
		t.Fatalf("detected %q on GCP", name)
	}
	aws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/latest/api/token" {
			io.WriteString(w, "tok")
			return
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer aws.Close()
	if w, name := Detect(context.Background(), Probe{GCP: notHere.URL, AWS: aws.URL, Azure: notHere.URL}); name != "aws" || w == nil {
		t.Fatalf("detected %q on AWS", name)
	}
	if w, name := Detect(context.Background(), Probe{GCP: notHere.URL, AWS: notHere.URL, Azure: notHere.URL, Timeout: 200 * time.Millisecond}); w != nil || name != "none" {
		t.Fatalf("detected %q off any cloud", name)
	}
}

// TestGCPMaintenanceTerminate: TERMINATE_ON_HOST_MAINTENANCE is an interruption notice;
// MIGRATE_ON_HOST_MAINTENANCE is not (SPOT-1).
func TestGCPMaintenanceTerminate(t *testing.T) {
	var maint atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/preempted") {
			io.WriteString(w, "FALSE")
			time.Sleep(20 * time.Millisecond) // real: paces a real HTTP handler (a hanging GET)
			return
		}
		if maint.Add(1) == 1 {
			io.WriteString(w, "MIGRATE_ON_HOST_MAINTENANCE")
			return
		}
		io.WriteString(w, "TERMINATE_ON_HOST_MAINTENANCE")
	}))
	defer srv.Close()
	n := next(t, watch(t, GCP{BaseURL: srv.URL}))
	if n.Kind != KindMaintenance || n.ID != "gcp-maintenance-terminate" || maint.Load() < 2 {
		t.Fatalf("notice %+v after %d maintenance answers: want the terminate, not the migrate", n, maint.Load())
	}
}
