package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/pgtest"
	"github.com/berth-dev/berth/store/postgres"
	"github.com/berth-dev/berth/store/sqlite"
)

// skewed is one agent clock of C32: skew(i) is how far the agent's clock is from the
// server's when it builds its i-th heartbeat.
type skewed struct {
	name string
	skew func(i int) time.Duration
}

var agentClocks = []skewed{
	{"a day ahead", func(int) time.Duration { return 24 * time.Hour }},
	{"a day behind", func(int) time.Duration { return -24 * time.Hour }},
	{"jumping", func(i int) time.Duration {
		return []time.Duration{24 * time.Hour, -24 * time.Hour, time.Hour, -48 * time.Hour, 0, -time.Minute}[i%6]
	}},
}

// clockHarness is one server over st whose clock the test moves, with real HTTP in front.
type clockHarness struct {
	clk *fakeClock
	st  berth.Store
	s   *Server
	url string
	key string
	// creds holds each agent's credential once joined (TRUST-1).
	creds map[string]string
}

func newClockHarness(t *testing.T, st berth.Store) *clockHarness {
	t.Helper()
	ctx := context.Background()
	h := &clockHarness{clk: &fakeClock{now: time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)}, st: st, key: NewKeySecret()}
	must(t, st.PutTemplate(ctx, berth.Template{Name: "python", MemoryMiB: 512, VCPUs: 1}))
	must(t, tenantErr(st.PutTenant(ctx, berth.Tenant{Name: "acme", CreatedAt: h.clk.Now()})))
	must(t, st.PutAPIKey(ctx, berth.APIKey{ID: "k1", Tenant: "acme", Role: berth.RoleAdmin, Hash: HashKey(h.key), CreatedAt: h.clk.Now()}))
	cfg := DefaultConfig()
	cfg.NodeToken = "node-token"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Clock, cfg.CacheTTL, cfg.UnheldEvery = h.clk.Now, time.Millisecond, 0
	h.s = New(cfg, st)
	srv := httptest.NewServer(h.s.Handler())
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// call sends body (JSON) with the bearer key and returns the status and the answer.
func (h *clockHarness) call(t *testing.T, method, path, key string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		must(t, err)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// cred returns agent id's credential, joining it the first time (TRUST-1).
func (h *clockHarness) cred(t *testing.T, id string) string {
	t.Helper()
	if h.creds == nil {
		h.creds = map[string]string{}
	}
	if h.creds[id] == "" {
		h.creds[id] = joinAs(t, h.url, id)
	}
	return h.creds[id]
}

// beat posts a heartbeat over HTTP as an agent does, with its credential.
func (h *clockHarness) beat(t *testing.T, hb berth.Heartbeat) {
	t.Helper()
	if code, b := h.call(t, http.MethodPost, "/v1/agents/heartbeat", h.cred(t, hb.AgentID), hb); code != http.StatusOK { // 200 with an acknowledgment since issue 16, goal 2
		t.Fatalf("heartbeat seq %d: %d %s", hb.Seq, code, b)
	}
}

// agent returns agent id as GET /v1/agents shows it.
func (h *clockHarness) agent(t *testing.T, id string) berth.Agent {
	t.Helper()
	code, b := h.call(t, http.MethodGet, "/v1/agents", h.key, nil)
	var out struct{ Agents []berth.Agent }
	if code != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Fatalf("GET /v1/agents: %d %s", code, b)
	}
	for _, a := range out.Agents {
		if a.AgentID == id {
			return a
		}
	}
	t.Fatalf("GET /v1/agents has no %s: %s", id, b)
	return berth.Agent{}
}

func (h *clockHarness) create(t *testing.T) (int, berth.Sandbox, berth.ErrorDetail) {
	t.Helper()
	code, b := h.call(t, http.MethodPost, "/v1/sandboxes", h.key, map[string]any{"template": "python"})
	var sb berth.Sandbox
	var eb berth.ErrorBody
	if code == http.StatusCreated {
		must(t, json.Unmarshal(b, &sb))
	} else {
		must(t, json.Unmarshal(b, &eb))
	}
	return code, sb, eb.Error
}

func (h *clockHarness) state(t *testing.T, id string) berth.SandboxState {
	t.Helper()
	sb, err := h.st.Sandbox(context.Background(), id)
	must(t, err)
	return sb.State
}

// storeBackends opens a fresh store of each backend (SQLite in memory, PostgreSQL on the
// test cluster) for tests that run on both.
var storeBackends = []struct {
	name string
	open func(t *testing.T) berth.Store
}{
	{"sqlite", func(t *testing.T) berth.Store {
		st, err := sqlite.Open(context.Background(), ":memory:")
		must(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}},
	{"postgres", func(t *testing.T) berth.Store {
		st, err := postgres.Open(context.Background(), pgtest.Start(t).NewDatabase(t))
		must(t, err)
		t.Cleanup(func() { st.Close() })
		return st
	}},
}

// onEachStore runs fn as a subtest on a fresh store of each backend.
func onEachStore(t *testing.T, fn func(t *testing.T, st berth.Store)) {
	for _, sto := range storeBackends {
		t.Run(sto.name, func(t *testing.T) { fn(t, sto.open(t)) })
	}
}

// lastEvent returns the latest event of entity.
func (h *clockHarness) lastEvent(t *testing.T, entity string) berth.Event {
	t.Helper()
	evs, err := h.st.Events(context.Background(), berth.EventFilter{Entity: entity})
	must(t, err)
	if len(evs) == 0 {
		t.Fatalf("no events for %s", entity)
	}
	return evs[len(evs)-1]
}

// TestCase_C32_AgentClocksDecideNothing: agents whose clocks are a day ahead, a day behind, or
// jumping back and forth between heartbeats post real HTTP heartbeats into a real server
// (SQLite and PostgreSQL). Staleness, lease expiry, heartbeat order, event times and the
// evacuation deadline behave exactly as with a correct clock: only the server's receive time
// and the agent's sequence numbers count.
func TestCase_C32_AgentClocksDecideNothing(t *testing.T) {
	for _, sto := range storeBackends {
		for _, ck := range agentClocks {
			t.Run(sto.name+"/"+ck.name, func(t *testing.T) { testAgentClock(t, sto.open(t), ck) })
		}
	}
}

func testAgentClock(t *testing.T, st berth.Store, ck skewed) {
	h := newClockHarness(t, st)
	ctx := context.Background()
	doomed, spare := newFakeAgent(t, ""), newFakeAgent(t, "")
	seq := map[string]int64{}
	beat := func(id, addr string, i int, admittable int64, held []berth.HeldSandbox, ended []berth.EndedSandbox) berth.Heartbeat {
		seq[id]++
		hb := berth.Heartbeat{AgentID: id, Address: addr, Pool: berth.PoolEphemeral, Status: berth.AgentActive,
			IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 8192, MemoryMiBAdmittable: admittable,
			CPUTotal: 4, BootID: "boot-" + id, HeartbeatAt: h.clk.Now().Add(ck.skew(i)), Sandboxes: held, Ended: ended}
		hb.Seq = seq[id]
		h.beat(t, hb)
		return hb
	}

	// Event times: registration is stamped with the server's clock.
	beat("doomed", doomed.srv.URL, 0, 4096, nil, nil)
	if e := h.lastEvent(t, "agent/doomed"); e.To != string(berth.AgentActive) || !e.At.Equal(h.clk.Now()) {
		t.Fatalf("registration event %+v; want at the server's %v", e, h.clk.Now())
	}
	code, sb, e := h.create(t)
	if code != http.StatusCreated || sb.AgentID != "doomed" {
		t.Fatalf("create on a fresh agent: %d %+v", code, e)
	}
	held := []berth.HeldSandbox{{ID: sb.ID, ResidentMiB: 100, Measured: true}}

	// Ten heartbeats 20 s apart (200 s in all, past the 90 s ephemeral lease), each stamped
	// with the agent's clock: the agent stays fresh, its lease never ends, and every
	// heartbeat's figures are applied in order.
	var last berth.Heartbeat
	for i := 1; i <= 10; i++ {
		h.clk.Add(20 * time.Second)
		last = beat("doomed", doomed.srv.URL, i, 4096-int64(10*i), held, nil)
		h.s.sweep(ctx) // LED-2 and the lease check (LIF-2), as the sweeper runs them
		a := h.agent(t, "doomed")
		if a.Status != berth.AgentActive || a.LastSeenS != 0 || a.MemoryMiBAdmittable != last.MemoryMiBAdmittable {
			t.Fatalf("after heartbeat %d (agent clock %+v): status %s, last seen %.1f s ago, admittable %d; want active, 0 s, %d",
				i, ck.skew(i), a.Status, a.LastSeenS, a.MemoryMiBAdmittable, last.MemoryMiBAdmittable)
		}
		if got := h.state(t, sb.ID); got != berth.SandboxRunning {
			t.Fatalf("after heartbeat %d (agent clock %+v): sandbox %s, want running (the agent is not silent)", i, ck.skew(i), got)
		}
	}

	// Ordering: a slow POST of an older heartbeat (a lower Seq) arriving now changes no
	// figures, even stamped three days ahead of every other.
	old := last
	old.Seq, old.HeartbeatAt, old.MemoryMiBAdmittable, old.Sandboxes = 3, h.clk.Now().Add(72*time.Hour), 7, nil
	h.beat(t, old)
	if a := h.agent(t, "doomed"); a.MemoryMiBAdmittable != last.MemoryMiBAdmittable || len(a.Sandboxes) != 1 {
		t.Fatalf("an overtaken heartbeat rolled the figures back: admittable %d, held %v; want %d and the sandbox",
			a.MemoryMiBAdmittable, a.Sandboxes, last.MemoryMiBAdmittable)
	}

	// Ended times: an ended sandbox's transition is stamped with the server's clock, not the
	// agent's At.
	code, sb2, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("second create: %d %+v", code, e)
	}
	h.clk.Add(time.Second)
	beat("doomed", doomed.srv.URL, 11, last.MemoryMiBAdmittable, held, []berth.EndedSandbox{
		{ID: sb2.ID, State: berth.SandboxStopped, Reason: "ttl", At: h.clk.Now().Add(ck.skew(11))}})
	if e := h.lastEvent(t, "sandbox/"+sb2.ID); e.To != string(berth.SandboxStopped) || !e.At.Equal(h.clk.Now()) {
		t.Fatalf("ended event %+v; want stopped at the server's %v", e, h.clk.Now())
	}

	// Evacuation deadline: the plan's time is counted from its arrival on the server's
	// clock; the agent's wall-clock deadline (a day off) is not read. (Deadlines are
	// contexts, on the real clock: the agent's is skewed from that one.)
	beat("spare", spare.srv.URL, 12, 4096, nil, nil)
	plan := berth.EvacuateRequest{Deadline: time.Now().Add(ck.skew(12) + time.Minute), DeadlineInMS: 60_000,
		Steps: []berth.EvacuateStep{{SandboxID: sb.ID, Action: "reconstruct"}}}
	must(t, st.SetAgentDrain(ctx, "doomed", true, "preemption notice", "agent/doomed", h.clk.Now()))
	code, b := h.call(t, http.MethodPost, "/v1/agents/doomed/evacuate", h.cred(t, "doomed"), plan)
	var out struct{ Outcomes []berth.EvacuateOutcome }
	if code != http.StatusOK || json.Unmarshal(b, &out) != nil || len(out.Outcomes) != 1 ||
		out.Outcomes[0].State != berth.SandboxReconstructed {
		t.Fatalf("evacuation with the agent's clock %v off: %d %s; want the sandbox reconstructed", ck.skew(12), code, b)
	}
	repl := out.Outcomes[0].Replacement

	// Staleness and lease expiry, on the server's clock only: silent for StaleAfter + 1 s
	// the spare agent is stale and gets no placement; silent for its lease, its sandbox is
	// lost, and the event says so at the server's time.
	h.clk.Add(31 * time.Second)
	if a := h.agent(t, "spare"); a.Status != berth.AgentStale {
		t.Fatalf("spare agent silent for 31 s: %s, want stale", a.Status)
	}
	if code, _, e := h.create(t); code != http.StatusServiceUnavailable || e.Code != berth.ENoHealthyAgents {
		t.Fatalf("create with every agent silent or drained: %d %+v, want 503 no_healthy_agents", code, e)
	}
	h.s.sweep(ctx)
	if got := h.state(t, repl); got != berth.SandboxRunning {
		t.Fatalf("replacement after 31 s of silence: %s, want running (90 s lease)", got)
	}
	h.clk.Add(60 * time.Second)
	h.s.sweep(ctx)
	if got := h.state(t, repl); got != berth.SandboxLost {
		t.Fatalf("replacement after 91 s of silence: %s, want lost (lease expired)", got)
	}
	if e := h.lastEvent(t, "sandbox/"+repl); !strings.Contains(e.Reason, "lease expired") || !e.At.Equal(h.clk.Now()) {
		t.Fatalf("lease event %+v; want lease expired at the server's %v", e, h.clk.Now())
	}
}

// TestCase_C32_BadSeqAndDeadlineRefused: a negative heartbeat Seq or evacuation deadline_in_ms
// (or one beyond a day) is a 400 invalid_request, never a 500.
func TestCase_C32_BadSeqAndDeadlineRefused(t *testing.T) {
	st, err := sqlite.Open(context.Background(), ":memory:")
	must(t, err)
	t.Cleanup(func() { st.Close() })
	h := newClockHarness(t, st)
	hb := berth.Heartbeat{AgentID: "a1", Status: berth.AgentActive, MemoryAdmission: berth.AdmissionCommitted, Seq: -1}
	for _, tc := range []struct {
		path string
		body any
	}{
		{"/v1/agents/heartbeat", hb},
		{"/v1/agents/a1/evacuate", berth.EvacuateRequest{DeadlineInMS: -1}},
		{"/v1/agents/a1/evacuate", berth.EvacuateRequest{DeadlineInMS: 1 << 62}},
	} {
		code, b := h.call(t, http.MethodPost, tc.path, h.cred(t, "a1"), tc.body)
		var eb berth.ErrorBody
		_ = json.Unmarshal(b, &eb)
		if code != http.StatusBadRequest || eb.Error.Code != berth.EInvalidRequest {
			t.Errorf("POST %s %s: %d %s; want 400 invalid_request", tc.path, fmt.Sprint(tc.body), code, b)
		}
	}
}

// TestCase_C32_CreateCarriesTheTTLLeft: the create sent to an agent carries the TTL left on the
// server's clock (ttl_ms), which the agent counts on its own monotonic clock; a TTL already
// over is 1 ms (stop at once), none is none.
func TestCase_C32_CreateCarriesTheTTLLeft(t *testing.T) {
	now := time.Date(2031, 3, 14, 15, 9, 26, 0, time.UTC)
	for _, tc := range []struct {
		expires time.Time
		want    int64
	}{
		{now.Add(time.Hour), time.Hour.Milliseconds()},
		{now.Add(-time.Hour), 1},
		{time.Time{}, 0},
	} {
		if got := withTTLLeft(berth.AgentCreate{ExpiresAt: tc.expires}, now).TTLMS; got != tc.want {
			t.Errorf("ttl_ms for expires_at %v at %v = %d, want %d", tc.expires, now, got, tc.want)
		}
	}
}
