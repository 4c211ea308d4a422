package preempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// azureEvents is a Scheduled Events document in Azure's documented shape.
func azureEvents(events ...string) string {
	return `{"DocumentIncarnation": 8, "Events": [` + strings.Join(events, ",") + `]}`
}

func azureEv(id, typ, resources, notBefore string) string {
	return fmt.Sprintf(`{"EventId": %q, "EventType": %q, "ResourceType": "VirtualMachine", "Resources": %s,
		"EventStatus": "Scheduled", "NotBefore": %s, "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}`,
		id, typ, resources, notBefore)
}

// azureServer serves Scheduled Events (doc) and compute/name (name: status and body per call
// number), checks the documented headers and query, and reports each ack on acked.
func azureServer(t *testing.T, doc string, name func(call int64, r *http.Request) (int, string)) (*httptest.Server, chan string) {
	acked := make(chan string, 8)
	var nameCalls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata") != "true" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		switch q := r.URL.Query(); {
		case r.URL.Path == "/metadata/instance/compute/name" && q.Get("api-version") == "2021-02-01" && q.Get("format") == "text":
			status, body := name(nameCalls.Add(1), r)
			w.WriteHeader(status)
			io.WriteString(w, body)
		case r.URL.Path == "/metadata/scheduledevents" && r.Method == http.MethodPost:
			var body struct{ StartRequests []struct{ EventId string } }
			_ = json.NewDecoder(r.Body).Decode(&body)
			for _, s := range body.StartRequests {
				acked <- s.EventId
			}
		case r.URL.Path == "/metadata/scheduledevents" && q.Get("api-version") != "":
			io.WriteString(w, doc)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, acked
}

// TestCase_C27_AzureEventForAnotherVM: Scheduled Events reach every VM of a scale set. On VM
// myscaleset_2, an event whose Resources lists only myscaleset_5 is never sent and never
// acknowledged; one listing this VM (in any letter case) and one with empty Resources are.
// While this VM's name cannot be read, events naming VMs are logged at error level once each
// and not acted on, and an event with empty Resources still is (SPOT-1, C27).
func TestCase_C27_AzureEventForAnotherVM(t *testing.T) {
	const nb = `"Mon, 30 Nov 2026 10:00:30 GMT"`
	doc := azureEvents(azureEv("ev-sibling", "Preempt", `["myscaleset_5"]`, nb),
		azureEv("ev-mine", "Preempt", `["MyScaleSet_2"]`, nb),
		azureEv("ev-all", "Terminate", `[]`, nb))
	t.Run("sibling event ignored and never acked", func(t *testing.T) {
		srv, acked := azureServer(t, doc, func(int64, *http.Request) (int, string) { return 200, "myscaleset_2\n" })
		log, rec := newLog()
		z := Azure{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Log: log}
		ch := watch(t, z)
		seen := map[string]int{}
		for range 8 { // four polls or more
			seen[within(t, ch, 5*time.Second).ID]++
		}
		if seen["ev-sibling"] > 0 || seen["ev-mine"] == 0 || seen["ev-all"] == 0 {
			t.Fatalf("notices by id %v: want ev-mine and ev-all, never ev-sibling", seen)
		}
		if n := rec.count(slog.LevelInfo, "id", "ev-sibling"); n != 1 {
			t.Errorf("the sibling's event logged %d times over several polls, want once", n)
		}
		if err := z.Ack(context.Background(), "ev-sibling"); !errors.Is(err, ErrNotThisVM) {
			t.Fatalf("Ack of the sibling's event: %v, want ErrNotThisVM", err)
		}
		if err := z.Ack(context.Background(), "ev-mine"); err != nil {
			t.Fatal(err)
		}
		if got := <-acked; got != "ev-mine" || len(acked) != 0 {
			t.Fatalf("acked %q (and %d more): want only ev-mine", got, len(acked))
		}
	})
	t.Run("name not readable yet", func(t *testing.T) {
		hang, release := hangUntilCut()
		var named atomic.Bool
		srv, _ := azureServer(t, doc, func(call int64, r *http.Request) (int, string) {
			switch call {
			case 1:
				return http.StatusInternalServerError, "try later"
			case 2:
				hang(r)
				return http.StatusOK, ""
			case 3:
				return http.StatusOK, `{"error": "not a name"}`
			}
			named.Store(true)
			return http.StatusOK, "myscaleset_2"
		})
		t.Cleanup(release) // before the server's Close, which waits for hung handlers
		log, rec := newLog()
		ch := watch(t, Azure{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Log: log})
		mine, all := false, 0
		for i := 0; !mine || i < 12; i++ {
			if i == 60 {
				t.Fatal("no notice for ev-mine in 60 notices")
			}
			switch n := within(t, ch, 5*time.Second); n.ID {
			case "ev-all":
				all++
			case "ev-mine":
				if !named.Load() {
					t.Fatal("ev-mine acted on before this VM's name was read")
				}
				mine = true
			default:
				t.Fatalf("notice %+v: another VM's event", n)
			}
		}
		if all < 3 {
			t.Errorf("ev-all (empty Resources) sent %d times: want it on every poll, name or not", all)
		}
		for _, id := range []string{"ev-sibling", "ev-mine"} {
			if n := rec.count(slog.LevelError, "id", id); n != 1 {
				t.Errorf("%s unattributable over three polls: %d error records, want 1", id, n)
			}
		}
	})
}

// TestCase_C28_MetadataCallThatNeverAnswers: each provider's metadata calls hang (until the
// client gives up) the first few times — AWS's token PUT and GET, Azure's events and name
// GETs and the ack POST, GCP's hanging GET past its timeout_sec, Detect's probes. Every call
// times out, the watcher keeps polling, and a notice that is there later is delivered within
// a bounded time (SPOT-1, C28).
func TestCase_C28_MetadataCallThatNeverAnswers(t *testing.T) {
	t.Run("aws", func(t *testing.T) {
		hang, release := hangUntilCut()
		var puts, gets atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodPut && r.URL.Path == "/latest/api/token":
				if puts.Add(1) <= 3 { // hop limit 1: the reply never comes back
					hang(r)
					return
				}
				io.WriteString(w, "tok")
			case r.URL.Path == awsActionPath && r.Header.Get("X-aws-ec2-metadata-token") == "tok":
				if gets.Add(1) <= 2 {
					hang(r)
					return
				}
				io.WriteString(w, `{"action": "terminate", "time": "2030-01-01T00:02:00Z"}`)
			default:
				w.WriteHeader(http.StatusNotFound)
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(release) // before Close, which waits for hung handlers
		start := time.Now()
		log, rec := newLog()
		n := within(t, watch(t, AWS{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Log: log}), 5*time.Second)
		if n.Kind != KindTerminate || puts.Load() < 4 || gets.Load() < 3 {
			t.Fatalf("notice %+v after %d PUTs, %d GETs", n, puts.Load(), gets.Load())
		}
		if f, ok := rec.count(slog.LevelWarn, "call", "token PUT"), rec.count(slog.LevelInfo, "call", "token PUT"); f != 1 || ok != 1 {
			t.Errorf("three failed PUTs in a row logged %d times and their end %d times, want once each", f, ok)
		}
		t.Logf("notice after 3 hung PUTs and 2 hung GETs in %v", time.Since(start))
	})
	t.Run("azure", func(t *testing.T) {
		hang, release := hangUntilCut()
		var gets, names, posts atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == "/metadata/instance/compute/name":
				if names.Add(1) <= 2 {
					hang(r)
				}
				io.WriteString(w, "vm-1")
			case r.Method == http.MethodPost:
				if posts.Add(1) == 1 {
					hang(r)
				}
			default:
				if gets.Add(1) <= 3 {
					hang(r)
					return
				}
				io.WriteString(w, azureEvents(azureEv("ev-1", "Preempt", `["vm-1"]`, `"Mon, 30 Nov 2026 10:00:30 GMT"`)))
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(release) // before Close, which waits for hung handlers
		log, rec := newLog()
		z := Azure{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, Log: log}
		if n := within(t, watch(t, z), 5*time.Second); n.ID != "ev-1" || gets.Load() < 4 || names.Load() < 3 {
			t.Fatalf("notice %+v after %d events GETs, %d name GETs", n, gets.Load(), names.Load())
		}
		if n := rec.count(slog.LevelWarn, "call", "GET scheduledevents"); n != 1 {
			t.Errorf("three failed events GETs in a row logged %d times, want once", n)
		}
		start := time.Now()
		if err := z.Ack(context.Background(), "ev-1"); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
			t.Fatalf("Ack whose POST never answers: %v after %v, want a deadline error at once", err, time.Since(start))
		}
		if err := z.Ack(context.Background(), "ev-1"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("gcp", func(t *testing.T) {
		hang, release := hangUntilCut()
		var preempted atomic.Int64
		var badQuery atomic.Value
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if q := r.URL.Query(); q.Get("timeout_sec") != "1" || q.Get("wait_for_change") != "true" {
				badQuery.Store(r.URL.RawQuery)
			}
			if strings.HasSuffix(r.URL.Path, "/maintenance-event") {
				if r.URL.Query().Get("last_etag") == "m1" { // unchanged: hold for timeout_sec, as GCP does
					select {
					case <-r.Context().Done():
						return
					case <-time.After(time.Second):
					}
				}
				w.Header().Set("ETag", "m1")
				io.WriteString(w, "NONE")
				return
			}
			if preempted.Add(1) <= 2 { // ignores timeout_sec: only the client's deadline ends it
				hang(r)
				return
			}
			io.WriteString(w, "TRUE")
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(release) // before Close, which waits for hung handlers
		now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		log, rec := newLog()
		g := GCP{BaseURL: srv.URL, Wait: time.Second, Timeout: 100 * time.Millisecond, Now: func() time.Time { return now }, Log: log}
		n := within(t, watch(t, g), 10*time.Second)
		if n.ID != "gcp-preempted" || !n.Deadline.Equal(now.Add(30*time.Second)) || preempted.Load() < 3 {
			t.Fatalf("notice %+v after %d GETs", n, preempted.Load())
		}
		if q := badQuery.Load(); q != nil {
			t.Fatalf("hanging GET without its server-side bound: %v", q)
		}
		if n := rec.count(slog.LevelWarn, "call", "GET instance/preempted"); n != 1 {
			t.Errorf("two hung GETs in a row logged %d times, want once", n)
		}
	})
	t.Run("detect", func(t *testing.T) {
		hang, release := hangUntilCut()
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { hang(r) }))
		t.Cleanup(srv.Close)
		t.Cleanup(release) // before Close, which waits for hung handlers
		start := time.Now()
		if w, name := Detect(context.Background(), Probe{GCP: srv.URL, AWS: srv.URL, Azure: srv.URL, Timeout: 100 * time.Millisecond}); w != nil || name != "none" || time.Since(start) > 2*time.Second {
			t.Fatalf("Detect against silent services: %q after %v", name, time.Since(start))
		}
	})
}

// TestCase_C29_UnreadableNoticeTime: a notice whose time field is empty, null, a number,
// prose, or a whole body that is no JSON is still a notice, with the provider's documented
// minimum window from first sight as its deadline (AWS two minutes; Azure Preempt 30 s,
// Terminate 5 min); a time without a zone is read as UTC. Either way the field is logged once
// (not on every poll), and the ID and deadline stay the same on every poll (SPOT-1, C13, C29).
func TestCase_C29_UnreadableNoticeTime(t *testing.T) {
	base := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	zoneless := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	cases := []struct {
		name, provider, path, body string
		id, field                  string
		kind                       string
		window                     time.Duration // from first sight; 0: want the parsed time (or none, if soft)
		at                         time.Time
	}{
		{"aws empty", "aws", awsActionPath, `{"action":"terminate","time":""}`, "aws-terminate-", "time", KindTerminate, 2 * time.Minute, time.Time{}},
		{"aws no zone", "aws", awsActionPath, `{"action":"terminate","time":"2026-12-01T10:00:00"}`, "aws-terminate-2026-12-01T10:00:00", "time", KindTerminate, 0, zoneless},
		{"aws null", "aws", awsActionPath, `{"action":"stop","time":null}`, "aws-stop-", "time", KindTerminate, 2 * time.Minute, time.Time{}},
		{"aws number", "aws", awsActionPath, `{"action":"hibernate","time":1796119320}`, "aws-hibernate-1796119320", "time", KindTerminate, 2 * time.Minute, time.Time{}},
		{"aws prose", "aws", awsActionPath, `{"action":"terminate","time":"in two minutes"}`, "aws-terminate-in two minutes", "time", KindTerminate, 2 * time.Minute, time.Time{}},
		{"aws not json", "aws", awsActionPath, `terminate soon`, "aws-instance-action-terminate soon", "time", KindTerminate, 2 * time.Minute, time.Time{}},
		{"aws rebalance empty", "aws", awsRebalancePath, `{"noticeTime":""}`, "aws-rebalance-", "noticeTime", KindRebalance, 0, time.Time{}},
		{"aws rebalance no zone", "aws", awsRebalancePath, `{"noticeTime":"2026-12-01T10:00:00"}`, "aws-rebalance-2026-12-01T10:00:00", "noticeTime", KindRebalance, 0, time.Time{}},
		{"azure empty", "azure", "", azureEvents(azureEv("ev-e", "Preempt", `[]`, `""`)), "ev-e", "NotBefore", KindPreempt, 30 * time.Second, time.Time{}},
		{"azure prose", "azure", "", azureEvents(azureEv("ev-p", "Terminate", `[]`, `"soon"`)), "ev-p", "NotBefore", KindTerminate, 5 * time.Minute, time.Time{}},
		{"azure number", "azure", "", azureEvents(azureEv("ev-n", "Preempt", `[]`, `30`)), "ev-n", "NotBefore", KindPreempt, 30 * time.Second, time.Time{}},
		{"azure no zone", "azure", "", azureEvents(azureEv("ev-z", "Preempt", `[]`, `"Tue, 01 Dec 2026 10:00:00"`)), "ev-z", "NotBefore", KindPreempt, 0, zoneless},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.URL.Path == "/latest/api/token":
					io.WriteString(w, "tok")
				case r.URL.Path == "/metadata/scheduledevents" || r.URL.Path == c.path:
					io.WriteString(w, c.body)
				default:
					w.WriteHeader(http.StatusNotFound)
				}
			}))
			t.Cleanup(srv.Close)
			var ticks atomic.Int64 // a clock that moves a second per reading: deadlines must not
			clock := func() time.Time { return base.Add(time.Duration(ticks.Add(1)) * time.Second) }
			log, rec := newLog()
			var w Watcher = AWS{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Log: log, Now: clock}
			if c.provider == "azure" {
				w = Azure{BaseURL: srv.URL, Poll: 10 * time.Millisecond, Log: log, Now: clock}
			}
			ch := watch(t, w)
			var got []Notice
			for len(got) < 3 {
				got = append(got, within(t, ch, 5*time.Second))
			}
			for _, n := range got {
				if n.ID != c.id || n.Kind != c.kind || !n.Deadline.Equal(got[0].Deadline) {
					t.Fatalf("notices %+v: want kind %s, ID %q and one deadline on every poll", got, c.kind, c.id)
				}
			}
			switch d := got[0].Deadline; {
			case c.window > 0 && (d.Before(base.Add(c.window)) || d.After(base.Add(c.window+10*time.Second))):
				t.Fatalf("deadline %v: want first sight (%v…) plus %v", d, base, c.window)
			case c.window == 0 && !d.Equal(c.at):
				t.Fatalf("deadline %v, want %v", d, c.at)
			}
			if n := rec.count(slog.LevelWarn, "id", c.id, "field", c.field); n != 1 {
				t.Fatalf("the unreadable %s was logged %d times over three polls, want once", c.field, n)
			}
		})
	}
}
