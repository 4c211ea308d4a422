package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// gatedAgent is an agent over real HTTP whose first create takes until the test opens its
// gate (a start slower than the reservation TTL); the creates that come while it is in flight
// are refused by its own local gate (AGT-2: the memory is booked), as a real agent's are.
type gatedAgent struct {
	srv     *httptest.Server
	gate    chan struct{}
	creates atomic.Int64
	first   chan string // the id of the first create, once it arrived
	open    func()      // lets the first create finish; idempotent
}

func newGatedAgent(t *testing.T) *gatedAgent {
	g := &gatedAgent{gate: make(chan struct{}), first: make(chan string, 1)}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromServer(r, g.srv.URL) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
			var ac berth.AgentCreate
			_ = json.NewDecoder(r.Body).Decode(&ac)
			if g.creates.Add(1) > 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(berth.ErrorBody{Error: berth.ErrorDetail{Code: berth.ENoCapacity,
					Message: "agent a1: admittable 0 MiB < charge 512 MiB"}})
				return
			}
			g.first <- ac.ID
			select {
			case <-g.gate:
			case <-r.Context().Done():
				return
			}
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodDelete:
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(g.gate) }); g.srv.Close() })
	g.open = func() { once.Do(func() { close(g.gate) }) }
	return g
}

// TestCase_C31_ReservationLivesUntilItsCreateEnds: reservation TTL 3 s, a start that takes longer
// than that, no heartbeat meanwhile (C31). Past the TTL (and a sweep), two more creates
// against the same host, whose memory fits one, are refused by the scheduler: they are never
// reserved or sent to the host, because the first create's reservation is renewed while it
// is in flight. Once the create ends the reservation still counts the sandbox until the
// agent's heartbeat lists it (LED-4), then it is netted and the ledger is empty (LED-3).
// The loop is the one resumes and snapshot moves use (placeWith), so they are covered too.
func TestCase_C31_ReservationLivesUntilItsCreateEnds(t *testing.T) {
	const ttl = 3 * time.Second
	h := newHarnessWith(t, func(c *Config) {
		c.ReservationTTL, c.HeartbeatInterval = ttl, time.Second
		c.SweepInterval, c.CacheTTL = time.Hour, 10*time.Millisecond
	})
	ag := newGatedAgent(t)
	h.heartbeat(t, "a1", ag.srv.URL, 512) // room for exactly one python sandbox
	ctx := context.Background()

	firstDone := make(chan int, 1)
	go func() {
		code, _, _ := tryCreate(h)
		firstDone <- code
	}()
	var firstID string
	select {
	case firstID = <-ag.first:
	case <-time.After(20 * time.Second):
		t.Fatal("the first create never reached the agent")
	}
	rs, err := h.st.Reservations(ctx)
	must(t, err)
	if len(rs) != 1 || rs[0].SandboxID != firstID {
		t.Fatalf("ledger while the first create is in flight: %+v, want one reservation for %s", rs, firstID)
	}
	firstExpiry := rs[0].ExpiresAt
	// Wait for the wall clock to pass the reservation's first expiry by a second ("the
	// reservation expires at 4 s"), then sweep as the server's sweeper would.
	waitUntil(t, "the reservation TTL to pass", func() (bool, string) {
		return time.Now().After(firstExpiry.Add(time.Second)), "not yet"
	})
	h.s.sweep(ctx)

	var wg sync.WaitGroup
	codes := make([]int, 2)
	errs := make([]berth.ErrorDetail, 2)
	for i := range codes {
		wg.Go(func() { codes[i], errs[i], _ = tryCreate(h) })
	}
	wg.Wait()
	if n := ag.creates.Load(); n != 1 {
		t.Fatalf("%d creates were sent to the host whose memory fits one, while the first was in flight past the "+
			"reservation TTL; want 1 (the later ones answered %v %+v)", n, codes, errs)
	}
	for i := range codes {
		if codes[i] != http.StatusServiceUnavailable || errs[i].Code != berth.ENoCapacity {
			t.Errorf("create #%d during the slow start: %d %+v, want 503 no_capacity", i+2, codes[i], errs[i])
		}
	}
	rs, err = h.st.Reservations(ctx)
	must(t, err)
	if len(rs) != 1 || rs[0].SandboxID != firstID || !rs[0].ExpiresAt.After(firstExpiry) {
		t.Fatalf("ledger past the TTL: %+v, want the first create's reservation, renewed past %v", rs, firstExpiry)
	}

	ag.open()
	if code := <-firstDone; code != http.StatusCreated {
		t.Fatalf("first create: %d, want 201", code)
	}
	// Still counted until the agent's heartbeat lists the sandbox (LED-4)...
	if p, err := h.st.Pending(ctx, time.Now()); err != nil || p["a1"] != 512 {
		t.Fatalf("pending after the create ended, before a heartbeat listed it: %v, %v; want a1: 512", p, err)
	}
	// ...and netted by the heartbeat that does: nothing outstanding (LED-3).
	_, err = h.st.ApplyHeartbeat(ctx, berth.Heartbeat{
		AgentID: "a1", Address: ag.srv.URL, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, CPUTotal: 2,
		Sandboxes: []berth.HeldSandbox{{ID: firstID}},
	}, time.Now())
	must(t, err)
	if rs, err := h.st.Reservations(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("ledger after the heartbeat listed the sandbox: %+v, %v; want empty", rs, err)
	}
}

// tryCreate is harness.create for other goroutines than the test's: it reports a transport
// failure as status 0 instead of failing the test.
func tryCreate(h *harness) (int, berth.ErrorDetail, error) {
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, berth.ErrorDetail{}, err
	}
	defer resp.Body.Close()
	var eb berth.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb.Error, nil
}

// TestCase_C31_ConfigRefusesATTLShorterThanTwoHeartbeats: the case's own settings (TTL 3 s,
// heartbeats every 20 s) are refused at startup with an error naming both flags; the
// defaults of `berth server` and `berth dev` pass.
func TestCase_C31_ConfigRefusesATTLShorterThanTwoHeartbeats(t *testing.T) {
	err := Config{ReservationTTL: 3 * time.Second, HeartbeatInterval: 20 * time.Second}.Validate()
	if err == nil || berth.ErrorCode(err) != berth.EInvalidRequest ||
		!strings.Contains(err.Error(), "--reservation-ttl (3s)") || !strings.Contains(err.Error(), "--heartbeat-interval (20s)") {
		t.Fatalf("Validate(TTL 3s, heartbeat 20s) = %v; want invalid_request naming --reservation-ttl and --heartbeat-interval", err)
	}
	err = Config{HeartbeatInterval: 20 * time.Second, ReservationTTL: time.Minute, StaleAfter: 30 * time.Second}.Validate()
	if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), "--stale-after (30s)") {
		t.Fatalf("Validate(heartbeat 20s, stale-after 30s) = %v; want invalid_request naming --stale-after", err)
	}
	for _, c := range []Config{
		DefaultConfig(),
		{}, // zero fields are their defaults
		{ReservationTTL: 60 * time.Second, HeartbeatInterval: 2 * time.Second},  // berth dev's
		{ReservationTTL: 20 * time.Second, HeartbeatInterval: 10 * time.Second}, // exactly twice
	} {
		if err := c.Validate(); err != nil {
			t.Errorf("Validate(TTL %s, heartbeat %s) = %v, want nil", c.ReservationTTL, c.HeartbeatInterval, err)
		}
	}
}
