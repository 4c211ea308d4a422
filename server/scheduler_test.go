package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
	"github.com/berth-dev/berth/store/sqlite"
	"github.com/google/go-cmp/cmp"
)

// fakeAgent serves the agent's internal create/delete calls with a chosen answer.
type fakeAgent struct {
	srv         *httptest.Server
	refuse      string        // error code to refuse creates with; "" accepts
	refuseSetUp string        // error code to refuse an app's set-up (files, service) with; "" accepts
	delay       time.Duration // how long a create takes to answer
	appDown     bool          // the app behind /port/ never answers (app_unreachable)
	creates     atomic.Int64
	deletes     atomic.Int64
	created     chan struct{} // a token for each create call received (never blocks the call)
	mu          sync.Mutex
	asked       []int64  // memory_mb of each create, in order
	deleted     []string // the path and query of each delete, in order
}

// deletesAsked returns the path and query of each delete received, in order.
func (f *fakeAgent) deletesAsked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.deleted)
}

// sizes returns the memory_mb each create asked for, in order.
func (f *fakeAgent) sizes() []int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.asked...)
}

// fromServer reports whether r carries a server's call token and not the node token: these
// fakes do not know the id they were announced under, so they check the token's shape (the
// agent's own check is TestAgentCallTokenIsPerAddress; the server's, the TestTRUST_ tests).
func fromServer(r *http.Request, _ string) bool {
	tok := r.Header.Get(berth.HeaderAgentCall)
	_, err := hex.DecodeString(tok)
	return len(tok) == 64 && err == nil && r.Header.Get(berth.HeaderNodeToken) == ""
}

func newFakeAgent(t *testing.T, refuse string) *fakeAgent {
	return newSlowFakeAgent(t, refuse, 0)
}

func newSlowFakeAgent(t *testing.T, refuse string, delay time.Duration) *fakeAgent {
	f := &fakeAgent{refuse: refuse, delay: delay, created: make(chan struct{}, 64)}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !fromServer(r, f.srv.URL) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
			var ac berth.AgentCreate
			_ = json.NewDecoder(r.Body).Decode(&ac)
			f.mu.Lock()
			f.asked = append(f.asked, ac.MemoryMiB)
			f.mu.Unlock()
			f.creates.Add(1)
			select {
			case f.created <- struct{}{}:
			default:
			}
			select {
			case <-time.After(f.delay):
			case <-r.Context().Done():
				return
			}
			if f.refuse != "" {
				w.WriteHeader(httpjson.StatusFor(f.refuse))
				_ = json.NewEncoder(w).Encode(berth.ErrorBody{Error: berth.ErrorDetail{Code: f.refuse}})
				return
			}
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodDelete:
			f.mu.Lock()
			f.deleted = append(f.deleted, r.URL.RequestURI())
			f.mu.Unlock()
			f.deletes.Add(1)
			w.WriteHeader(http.StatusNoContent)
		case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/files"),
			r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/service"):
			if f.refuseSetUp != "" { // an app's set-up (APP-1) the agent refuses
				w.WriteHeader(httpjson.StatusFor(f.refuseSetUp))
				_ = json.NewEncoder(w).Encode(berth.ErrorBody{Error: berth.ErrorDetail{Code: f.refuseSetUp,
					Message: `bad environment variable "A": values without NUL`}})
				return
			}
			w.WriteHeader(http.StatusNoContent) // an app's set-up (APP-1)
		case strings.Contains(r.URL.Path, "/port/") && f.appDown:
			w.WriteHeader(http.StatusBadGateway)
			_ = json.NewEncoder(w).Encode(berth.ErrorBody{Error: berth.ErrorDetail{Code: berth.EUpstream, Message: "connect: connection refused"}})
		case strings.Contains(r.URL.Path, "/port/"):
			_, _ = io.WriteString(w, "app answer") // the app behind its port
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(f.srv.Close)
	return f
}

type harness struct {
	clock func() time.Time
	st    *sqlite.Store
	s     *Server
	srv   *httptest.Server
	key   string
}

func newHarness(t *testing.T, cacheTTL time.Duration) *harness {
	return newHarnessWith(t, func(c *Config) { c.CacheTTL = cacheTTL })
}

func newHarnessWith(t *testing.T, mutate func(*Config)) *harness {
	t.Helper()
	return newHarnessOn(t, nil, mutate)
}

// newHarnessOn is newHarnessWith whose server sees the store through wrap (nil: as it is),
// e.g. a store that holds one call up.
func newHarnessOn(t *testing.T, wrap func(berth.Store) berth.Store, mutate func(*Config)) *harness {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &harness{st: st, key: NewKeySecret()}
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: time.Now()})))
	must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(h.key), CreatedAt: time.Now()}))
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	mutate(&cfg)
	h.clock = time.Now
	if cfg.Clock != nil {
		h.clock = cfg.Clock
	}
	var served berth.Store = st
	if wrap != nil {
		served = wrap(st)
	}
	s := New(cfg, served)
	h.s = s
	h.srv = httptest.NewServer(s.Handler())
	t.Cleanup(h.srv.Close)
	return h
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// tenantErr is the error of a PutTenant whose created answer a test does not need.
func tenantErr(_ bool, err error) error { return err }

// call sends one request to the server at base with bearer as its Authorization and
// returns the status and body.
func call(t *testing.T, base, method, path, bearer string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, body)
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// heartbeat writes an agent's heartbeat straight into the store, behind the server's back.
func (h *harness) heartbeat(t *testing.T, id, addr string, admittable int64) {
	t.Helper()
	_, err := h.st.ApplyHeartbeat(context.Background(), berth.Heartbeat{
		AgentID: id, Address: addr, Status: berth.AgentActive, IntakeOpen: true,
		MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: max(4096, admittable), MemoryMiBAdmittable: admittable,
		CPUTotal: 2, HeartbeatAt: h.clock(),
	}, h.clock())
	must(t, err)
}

func (h *harness) create(t *testing.T) (int, berth.Sandbox, berth.ErrorDetail) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb berth.Sandbox
	var eb berth.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusCreated {
		must(t, json.Unmarshal(b, &sb))
	} else {
		must(t, json.Unmarshal(b, &eb))
	}
	return resp.StatusCode, sb, eb.Error
}

// TestCase_C22_RereadBeforeRefusal: the cached table says no host fits, but a host freed
// memory since; the replica re-reads the store and places the sandbox (PLC-6).
func TestCase_C22_RereadBeforeRefusal(t *testing.T) {
	h := newHarness(t, time.Hour) // the cache never expires by age in this test
	a := newFakeAgent(t, "")
	h.heartbeat(t, "a1", a.srv.URL, 0)
	if code, _, e := h.create(t); code != http.StatusServiceUnavailable || e.Code != berth.ENoCapacity {
		t.Fatalf("full host: %d %+v, want 503 no_capacity", code, e)
	}
	h.heartbeat(t, "a1", a.srv.URL, 4096) // the host freed memory; the server's cache does not know
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.AgentID != "a1" {
		t.Fatalf("after the host freed memory: %d %+v %+v, want 201 on a1", code, sb, e)
	}
}

// TestPLC7_AgentRefusalTriesNextHost: when the chosen agent refuses, its reservation is
// released and the next host is tried (PLC-7).
func TestPLC7_AgentRefusalTriesNextHost(t *testing.T) {
	h := newHarness(t, time.Second)
	busy := newFakeAgent(t, berth.EHostStartsSaturated)
	ok := newFakeAgent(t, "")
	h.heartbeat(t, "busy", busy.srv.URL, 4096) // more room: Pick prefers it
	h.heartbeat(t, "ok", ok.srv.URL, 1024)
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.AgentID != "ok" {
		t.Fatalf("create: %d %+v %+v, want 201 on ok", code, sb, e)
	}
	if busy.creates.Load() != 1 {
		t.Fatalf("busy agent got %d creates, want 1", busy.creates.Load())
	}
	rs, err := h.st.Reservations(context.Background())
	must(t, err)
	var got []string
	for _, r := range rs {
		got = append(got, r.AgentID+"/"+r.SandboxID)
	}
	if diff := cmp.Diff([]string{"ok/" + sb.ID}, got); diff != "" {
		t.Fatalf("ledger after refusal (-want +got):\n%s", diff)
	}
}

// TestPLC4_AllAgentsSaturated: every live host refused with host_starts_saturated, so the
// answer carries that code and the host counts (ADM-10, C21).
func TestPLC4_AllAgentsSaturated(t *testing.T) {
	h := newHarness(t, time.Second)
	for _, id := range []string{"s1", "s2"} {
		h.heartbeat(t, id, newFakeAgent(t, berth.EHostStartsSaturated).srv.URL, 4096)
	}
	code, _, e := h.create(t)
	if code != http.StatusServiceUnavailable || e.Code != berth.EHostStartsSaturated {
		t.Fatalf("create: %d %+v, want 503 host_starts_saturated", code, e)
	}
	if diff := cmp.Diff(map[string]int{"total": 2, "saturated": 2}, e.Hosts); diff != "" {
		t.Fatalf("hosts (-want +got):\n%s", diff)
	}
	rs, err := h.st.Reservations(context.Background())
	must(t, err)
	if len(rs) != 0 {
		t.Fatalf("refused creates left reservations: %+v", rs)
	}
}

// TestSweepFailsAbandonedStarting: a sandbox left starting by a replica that died, and never
// listed by its agent, ends failed after the grace, which frees its Idempotency-Key; a young
// one is left alone.
func TestSweepFailsAbandonedStarting(t *testing.T) {
	h := newHarness(t, time.Second)
	a := newFakeAgent(t, "")
	h.heartbeat(t, "a1", a.srv.URL, 4096)
	ctx := context.Background()
	now := time.Now()
	for id, created := range map[string]time.Time{"old": now.Add(-10 * time.Minute), "young": now} {
		must(t, h.st.CreateSandbox(ctx, berth.Sandbox{ID: id, Template: "python", Tenant: "acme", AgentID: "a1",
			State: berth.SandboxStarting, MemoryMiB: 512, VCPUs: 1, CreatedAt: created, ExpiresAt: now.Add(time.Hour),
			IdempotencyKey: "key-" + id}, "test", created))
	}
	h.s.sweep(ctx)
	for id, want := range map[string]berth.SandboxState{"old": berth.SandboxFailed, "young": berth.SandboxStarting} {
		sb, err := h.st.Sandbox(ctx, id)
		if err != nil || sb.State != want {
			t.Errorf("%s = %v, %v; want %s", id, sb.State, err, want)
		}
	}
	if _, err := h.st.SandboxByIdempotencyKey(ctx, "acme", "key-old"); err == nil {
		t.Errorf("the failed create still holds its Idempotency-Key")
	}
}

// TestLIF2_LeaseExpiry: sandboxes of an agent silent for longer than its pool's lease TTL
// become lost, each with an event; a stateful agent's longer lease is not yet over.
func TestLIF2_LeaseExpiry(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, a := range []struct{ id, pool string }{{"eph", berth.PoolEphemeral}, {"stf", berth.PoolStateful}} {
		_, err := st.ApplyHeartbeat(ctx, berth.Heartbeat{AgentID: a.id, Pool: a.pool, Status: berth.AgentActive, IntakeOpen: true,
			MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096, HeartbeatAt: t0}, t0)
		must(t, err)
		must(t, st.CreateSandbox(ctx, berth.Sandbox{ID: "sb-" + a.id, Template: "python", Tenant: "acme", AgentID: a.id,
			State: berth.SandboxRunning, MemoryMiB: 512, VCPUs: 1, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}, "test", t0))
	}
	now := t0
	cfg := DefaultConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Clock = func() time.Time { return now }
	s := New(cfg, st)
	state := func(id string) berth.SandboxState {
		sb, err := st.Sandbox(ctx, id)
		must(t, err)
		return sb.State
	}
	now = t0.Add(80 * time.Second)
	s.sweep(ctx)
	if state("sb-eph") != berth.SandboxRunning {
		t.Fatalf("lost before the 90 s ephemeral lease ran out")
	}
	now = t0.Add(91 * time.Second)
	s.sweep(ctx)
	if got := state("sb-eph"); got != berth.SandboxLost {
		t.Fatalf("ephemeral sandbox after 91 s of silence: %s, want lost", got)
	}
	if got := state("sb-stf"); got != berth.SandboxRunning {
		t.Fatalf("stateful sandbox after 91 s: %s, want running (10 min lease)", got)
	}
	now = t0.Add(5*time.Minute + time.Second)
	s.sweep(ctx)
	if got := state("sb-stf"); got != berth.SandboxLost {
		t.Fatalf("stateful sandbox of an agent dead for 5 min: %s, want lost (dead_after settles it before its 10 min lease)", got)
	}
	evs, err := st.Events(ctx, berth.EventFilter{Entity: "sandbox/sb-eph"})
	must(t, err)
	if last := evs[len(evs)-1]; last.To != "lost" || !strings.Contains(last.Reason, "lease expired") {
		t.Fatalf("last event %+v, want running → lost for an expired lease", last)
	}
}

// TestCase_C20_FailedCreatesReleaseTheirReservation: a create that fails on the host after
// admission (the runtime errs, the agent times out, the client goes away) leaves no
// reservation and no starting row behind, at once, not after a TTL (LED-3).
func TestCase_C20_FailedCreatesReleaseTheirReservation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		refuse     string
		delay      time.Duration
		clientGone bool               // the client leaves once the agent has the create
		wantDelete bool               // the agent's side is unknown: it is told to stop the sandbox
		wantState  berth.SandboxState // how the attempt ends; failed when empty
	}{
		{name: "runtime error", refuse: berth.EInternal, wantDelete: true},
		{name: "agent refuses", refuse: berth.EHostStartsSaturated},
		{name: "agent times out", delay: 3 * time.Second, wantDelete: true},
		{name: "client gone, agent times out", delay: 3 * time.Second, clientGone: true, wantDelete: true},
		{name: "client gone, start completes", delay: 400 * time.Millisecond, clientGone: true,
			wantDelete: true, wantState: berth.SandboxStopped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, func(c *Config) { c.AgentTimeout = time.Second })
			a := newSlowFakeAgent(t, tc.refuse, tc.delay)
			h.heartbeat(t, "a1", a.srv.URL, 4096)
			ctx := context.Background()
			if tc.clientGone {
				// The client leaves once the agent has the create: the row is written and the
				// start under way, however slowly a loaded machine got there (a fixed client
				// deadline could end before the server wrote anything).
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer cancel()
				go func() {
					select {
					case <-a.created:
						cancel()
					case <-ctx.Done():
					}
				}()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/sandboxes", strings.NewReader(`{"template":"python"}`))
			req.Header.Set("Authorization", "Bearer "+h.key)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusCreated {
					t.Fatalf("a create that failed on the host answered 201")
				}
			}
			// Wait for the server's side of the request to finish (the client may have left).
			deadline := time.Now().Add(10 * time.Second)
			for {
				rs, err := h.st.Reservations(context.Background())
				must(t, err)
				sbs, err := h.st.Sandboxes(context.Background(), berth.SandboxFilter{})
				must(t, err)
				want := tc.wantState
				if want == "" {
					want = berth.SandboxFailed
				}
				settled := len(sbs) == 1 && sbs[0].State == want
				// A failed row releases its reservation in its own transaction, before the
				// agent is told to stop: wait for the stop too when one is due.
				if len(rs) == 0 && settled && (!tc.wantDelete || a.deletes.Load() > 0) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the failed create: reservations %+v, sandboxes %+v; want none and one %s", rs, sbs, want)
				}
				time.Sleep(20 * time.Millisecond) // real: the server's handler finishing behind a loopback HTTP server
			}
			if got := a.deletes.Load() > 0; got != tc.wantDelete {
				t.Fatalf("agent told to stop the sandbox: %v, want %v", got, tc.wantDelete)
			}
		})
	}
}

// TestCase_C19_SickHostQuarantined: a host whose agent accepts creates but fails every one
// is quarantined after 3 consecutive failures (with an event) while the creates land
// elsewhere, is let back in on probation after the back-off, and a success there lifts it
// (PLC-9).
func TestCase_C19_SickHostQuarantined(t *testing.T) {
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarnessWith(t, func(c *Config) {
		c.Quarantine = berth.QuarantinePolicy{After: 3, Backoff: 30 * time.Second, MaxBackoff: time.Minute}
		c.Clock = clock
	})
	sick := newFakeAgent(t, berth.EInternal)
	healthy := newFakeAgent(t, "")
	h.heartbeat(t, "sick", sick.srv.URL, 8192) // more room: placement prefers it
	h.heartbeat(t, "healthy", healthy.srv.URL, 8192-1024)
	for i := range 6 {
		code, sb, e := h.create(t)
		if code != http.StatusCreated || sb.AgentID != "healthy" {
			t.Fatalf("create %d: %d %+v %+v, want 201 on healthy", i, code, sb, e)
		}
	}
	if n := sick.creates.Load(); n != 3 {
		t.Fatalf("the sick host got %d creates, want exactly 3 before its quarantine", n)
	}
	a, err := h.st.Agent(context.Background(), "sick")
	must(t, err)
	if a.CreateFailures != 3 || a.QuarantinedUntil.IsZero() {
		t.Fatalf("sick agent: failures %d, until %v", a.CreateFailures, a.QuarantinedUntil)
	}
	// Probation: once the back-off passes the host is tried again; now it is healthy.
	sick.refuse = ""
	code, sb, _ := h.create(t)
	if code != http.StatusCreated || sb.AgentID != "healthy" {
		t.Fatalf("during the back-off: %d on %q, want healthy", code, sb.AgentID)
	}
	mu.Lock()
	now = now.Add(31 * time.Second) // the back-off passes
	mu.Unlock()
	h.heartbeat(t, "sick", sick.srv.URL, 8192) // both hosts stay fresh on the advanced clock
	h.heartbeat(t, "healthy", healthy.srv.URL, 8192-1024)
	code, sb, _ = h.create(t)
	if code != http.StatusCreated || sb.AgentID != "sick" {
		t.Fatalf("after the back-off: %d on %q, want the host back on probation", code, sb.AgentID)
	}
	a, err = h.st.Agent(context.Background(), "sick")
	must(t, err)
	if a.CreateFailures != 0 || !a.QuarantinedUntil.IsZero() {
		t.Fatalf("after a success on probation: failures %d, until %v", a.CreateFailures, a.QuarantinedUntil)
	}
	evs, err := h.st.Events(context.Background(), berth.EventFilter{Entity: "agent/sick"})
	must(t, err)
	var path []string
	for _, e := range evs {
		path = append(path, e.From+">"+e.To)
	}
	if diff := cmp.Diff([]string{">active", "active>quarantined", "quarantined>active"}, path); diff != "" {
		t.Fatalf("events (-want +got):\n%s", diff)
	}
}

func TestTTLCache(t *testing.T) {
	c := ttlCache[int]{ttl: time.Second, max: 2}
	t0 := time.Now()
	if _, ok := c.get("a", t0); ok {
		t.Fatal("empty cache hit")
	}
	c.put("a", 1, t0)
	if v, ok := c.get("a", t0.Add(999*time.Millisecond)); !ok || v != 1 {
		t.Fatalf("fresh entry: %v, %v", v, ok)
	}
	if _, ok := c.get("a", t0.Add(time.Second)); ok {
		t.Fatal("expired entry served")
	}
	c.put("b", 2, t0)
	c.put("c", 3, t0) // full: starts over
	if _, ok := c.get("a", t0); ok {
		t.Fatal("the cache grew past its bound")
	}
	c.forget("c")
	if _, ok := c.get("c", t0); ok {
		t.Fatal("forgotten entry served")
	}
}

// TestAPI3_RetryAfterCountsADelete: a fleet full of sandboxes that live an hour answers
// Retry-After 60 s; once this replica deleted one, refusals until that host's next heartbeat
// say one heartbeat (the room the delete freed shows then), not the TTL estimate.
func TestAPI3_RetryAfterCountsADelete(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) { c.HeartbeatInterval = 2 * time.Second })
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 512)
	code, sb, _ := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	h.heartbeat(t, "a1", agent.srv.URL, 0) // the agent reports itself full
	code, _, e := h.create(t)
	if code != http.StatusServiceUnavailable || e.RetryAfterS != 60 {
		t.Fatalf("full fleet: %d, Retry-After %d s; want 503 and 60 s (the hour-long TTL, clamped)", code, e.RetryAfterS)
	}
	req, _ := http.NewRequest(http.MethodDelete, h.srv.URL+"/v1/sandboxes/"+sb.ID, nil)
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete: %v %v", resp, err)
	}
	resp.Body.Close()
	code, _, e = h.create(t)
	if code != http.StatusServiceUnavailable || e.RetryAfterS != 2 {
		t.Fatalf("after a delete, before the next heartbeat: %d, Retry-After %d s; want 503 and 2 s (one heartbeat)", code, e.RetryAfterS)
	}
}

// TestLIF2_LeaseEndsOnTime: with the sweep an hour apart, a silent host's sandboxes are still
// lost when its lease ends (the lease timer is its own), not at the next sweep.
func TestLIF2_LeaseEndsOnTime(t *testing.T) {
	h := newHarnessWith(t, func(c *Config) {
		c.SweepInterval, c.LeaseStateful, c.LeaseEphemeral, c.CacheTTL = time.Hour, 300*time.Millisecond, 300*time.Millisecond, 10*time.Millisecond
	})
	agent := newFakeAgent(t, "")
	h.heartbeat(t, "a1", agent.srv.URL, 4096)
	code, sb, _ := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go h.s.Run(ctx)
	waitUntil(t, "the sandbox lost at its lease's end", func() (bool, string) {
		cur, err := h.st.Sandbox(context.Background(), sb.ID)
		must(t, err)
		return cur.State == berth.SandboxLost, string(cur.State)
	})
}
